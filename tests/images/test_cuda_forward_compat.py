"""images/cuda_forward_compat.py: the PyTorch image loads CUDA 13's forward-compatibility driver only on a
host whose driver branch is older, with fake /proc/driver/nvidia/version contents and a fake compat folder."""

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cuda_forward_compat", ROOT / "images/cuda_forward_compat.py")
compat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compat)

# /proc/driver/nvidia/version as the proprietary and the open kernel modules write it
PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Fri Mar 14 04:12:31 UTC 2025\n"
    "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
)
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@U16)  Sun Aug 31\n"
COMPAT = "580.82.07"  # the driver cuda-compat-13-0 (CUDA 13.0 Update 1) is built from


@pytest.fixture
def compat_dir(tmp_path):
    d = tmp_path / "compat"
    d.mkdir()
    for name in [
        f"libcuda.so.{COMPAT}",
        "libcuda.so.1",
        "libcuda.so",
        f"libnvidia-ptxjitcompiler.so.{COMPAT}",
        "libnvidia-ptxjitcompiler.so.1",
        "libnvidia-nvvm.so.4",
    ]:
        (d / name).write_text("")
    return d


def _activate(tmp_path, compat_dir, proc_text, environ=None):
    version = tmp_path / "version"
    if proc_text is not None:
        version.write_text(proc_text)
    loaded, environ = [], {} if environ is None else environ
    result = compat.activate(str(version), str(compat_dir), environ, loaded.append)
    return result, [pathlib.Path(p).name for p in loaded], environ


@pytest.mark.parametrize("text", [PROPRIETARY, OPEN])
def test_an_older_host_driver_gets_the_compat_driver_with_its_companions_first(tmp_path, compat_dir, text):
    result, loaded, environ = _activate(tmp_path, compat_dir, text.format(v="570.133.20"))
    assert loaded == ["libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4", "libcuda.so.1"]
    assert result == environ[compat.ENV] == f"libcuda {COMPAT} from {compat_dir} (host driver 570.133.20)"


@pytest.mark.parametrize("host", ["580.65.06", "580.126.16", "595.12.01"])
def test_a_host_driver_of_the_same_or_a_newer_branch_keeps_its_own(tmp_path, compat_dir, host):
    """An older compat libcuda on a newer kernel module fails with CUDA error 803 (NVIDIA, CUDA Compatibility,
    forward compatibility: the compat package is for older base drivers only)."""
    result, loaded, environ = _activate(tmp_path, compat_dir, PROPRIETARY.format(v=host))
    assert (result, loaded, environ) == (None, [], {})


def test_no_gpu_no_compat_folder_or_switched_off_loads_nothing(tmp_path, compat_dir):
    assert _activate(tmp_path, compat_dir, None)[1] == []  # CPU node
    assert _activate(tmp_path, tmp_path / "absent", PROPRIETARY.format(v="535.247.01"))[1] == []
    off = {compat.ENV: "off"}
    assert _activate(tmp_path, compat_dir, PROPRIETARY.format(v="535.247.01"), off)[1] == []


def test_a_failing_load_never_fails_the_interpreter(tmp_path, compat_dir):
    (tmp_path / "version").write_text(PROPRIETARY.format(v="550.54.15"))

    def broken(path):
        raise OSError(f"{path}: wrong ELF class")

    assert compat.activate(str(tmp_path / "version"), str(compat_dir), {}, broken) is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_preloaded_soname_serves_later_dlopens_of_that_name(tmp_path):
    """The mechanism activate() relies on: after CDLL(path, RTLD_GLOBAL), dlopen("libcuda.so.1") by name returns
    the loaded library, not the one the search path (here LD_LIBRARY_PATH, on a node the host's mount) finds."""
    for which in ("compat", "host"):
        d = tmp_path / which
        d.mkdir()
        src = d / "lib.c"
        src.write_text(f'const char *which(void) {{ return "{which}"; }}\n')
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-Wl,-soname,libfakecuda.so.1", "-o", str(d / "libfakecuda.so.1"), str(src)],
            check=True,
        )
    probe = (
        "import ctypes, sys; sys.path.insert(0, sys.argv[2]); import cuda_forward_compat as c; "
        "c.COMPANIONS = []; "
        "import os; os.rename(sys.argv[1] + '/libfakecuda.so.1', sys.argv[1] + '/libcuda.so.1'); "
        "c.activate(sys.argv[3], sys.argv[1], {}); "
        "lib = ctypes.CDLL('libfakecuda.so.1'); lib.which.restype = ctypes.c_char_p; print(lib.which().decode())"
    )
    compat_d = tmp_path / "compat"
    (compat_d / f"libcuda.so.{COMPAT}").write_text("")
    version = tmp_path / "version"
    env = {"LD_LIBRARY_PATH": str(tmp_path / "host"), "PATH": "/usr/bin:/bin"}
    for host, expected in (("570.133.20", "compat"), ("580.95.05", "host")):
        version.write_text(PROPRIETARY.format(v=host))
        if not (compat_d / "libfakecuda.so.1").exists():
            shutil.copy(compat_d / "libcuda.so.1", compat_d / "libfakecuda.so.1")
        out = subprocess.run(
            [sys.executable, "-c", probe, str(compat_d), str(ROOT / "images"), str(version)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected, (host, out.stdout, out.stderr)
