"""payloads/common/devices.py: the start-up report of driver and CUDA versions, and the mismatch it names,
with fake /proc/driver/nvidia/version contents."""

import pytest

from payloads.common import devices

PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Fri Mar 14 04:12:31 UTC 2025\n"
    "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
)
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@U16)\n"


def _file(tmp_path, text):
    path = tmp_path / "version"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text", [PROPRIETARY, OPEN])
def test_driver_version_reads_both_kernel_modules(tmp_path, text):
    assert devices.driver_version(_file(tmp_path, text.format(v="570.133.20"))) == "570.133.20"
    assert devices.driver_version(str(tmp_path / "absent")) is None
    assert devices.driver_version(_file(tmp_path, "garbage\n")) is None


# NVIDIA, CUDA Compatibility (minor version compatibility): CUDA 13.x needs a driver >= 580, CUDA 12.x >= 525;
# the drivers are ones Azure/azhpc-images has shipped (535, 550, 560, 570, 580 branches).
@pytest.mark.parametrize(
    "driver, cuda, bad",
    [
        ("570.133.20", "13.0", True),
        ("535.247.01", "13.0", True),
        ("580.65.05", "13.0", True),
        ("580.65.06", "13.0", False),
        ("580.126.16", "13.0", False),
        ("595.12.01", "13.0", False),
        ("535.247.01", "12.2", False),
        ("525.60.13", "12.2", False),
        ("470.256.02", "12.2", True),
    ],
)
def test_mismatch_follows_nvidias_minimum_drivers(driver, cuda, bad):
    problem = devices.mismatch(driver, cuda)
    assert (problem is not None) == bad, problem
    if bad:
        assert driver in problem and devices.MIN_DRIVER[int(cuda.split(".")[0])] in problem


def test_report_names_the_driver_the_cuda_and_the_mismatch(tmp_path):
    line = devices.report("PyTorch", "13.0", _file(tmp_path, PROPRIETARY.format(v="570.133.20")), environ={})
    assert line.startswith("PyTorch: CUDA 13.0; NVIDIA driver 570.133.20; MISMATCH: ")
    assert "older than CUDA 13.0 in the image needs (driver >= 580.65.06)" in line
    assert "no forward-compatibility driver" in line


def test_report_says_when_the_forward_compatibility_driver_serves_an_older_host(tmp_path):
    env = {devices.FORWARD_COMPAT: "libcuda 580.82.07 from /usr/local/cuda/compat (host driver 570.133.20)"}
    line = devices.report("PyTorch", "13.0", _file(tmp_path, OPEN.format(v="570.133.20")), environ=env)
    assert "forward compatibility: libcuda 580.82.07" in line
    assert "MISMATCH" in line and "data-centre GPUs" in line  # it may still fail: say on which condition


@pytest.mark.parametrize("driver, cuda", [("580.126.16", "13.0"), ("535.247.01", "12.2")])
def test_report_of_a_matching_driver_names_no_mismatch(tmp_path, driver, cuda):
    line = devices.report("TensorFlow", cuda, _file(tmp_path, PROPRIETARY.format(v=driver)), environ={})
    assert line == f"TensorFlow: CUDA {cuda}; NVIDIA driver {driver}"


def test_report_on_a_cpu_node_or_cpu_build(tmp_path):
    line = devices.report("PyTorch", "13.0", str(tmp_path / "absent"), environ={})
    assert "NVIDIA driver none" in line and "MISMATCH" not in line
    line = devices.report("TensorFlow", None, _file(tmp_path, PROPRIETARY.format(v="470.256.02")), environ={})
    assert "CUDA none (CPU build)" in line and "MISMATCH" not in line


def test_missing_gpus_with_a_new_enough_driver_point_at_gpu_access(monkeypatch):
    monkeypatch.setattr(devices, "driver_version", lambda: "580.126.16")
    with pytest.raises(devices.GpuError) as e:
        devices.require_gpus(0, 2, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "2"})
    assert "new enough for CUDA 13.0" in str(e.value) and "NVIDIA_VISIBLE_DEVICES" in str(e.value)
