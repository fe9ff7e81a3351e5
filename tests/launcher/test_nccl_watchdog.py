"""DDP jobs carry NCCL's own watchdog settings (issue 30 item 2: launcher/jobspec.py DDP_WATCHDOG_ENV), Horovod
jobs do not; the payload gives init_process_group its collective timeout and points the flight recorder's dump
at the output folder (payloads/pytorch/runtime.collective_timeout); and every variable named is one the installed
torch reads (a renamed variable would be ignored without a word)."""

import dataclasses
import mmap
import pathlib

import pytest

from azureaccess import stack
from launcher import jobspec, target
from payloads.common import config, watchdog
from payloads.pytorch import backends, runtime

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "jobs" / "pytorch-resnet50-synthetic.yaml"


def _render(dev_outputs, backend: str, cluster: str = "gpu-ib", template=None) -> dict:
    template = jobspec.with_backend(template or jobspec.read_template(SOURCE), backend, SOURCE)
    outs = stack.load_file(dev_outputs)
    filled = jobspec.fill(template, outs, target.resolve(outs, cluster, 2, None), [])
    return jobspec.validate(filled, SOURCE).environment_variables


@pytest.mark.parametrize("cluster", ["gpu-ib", "cpu-smoke"])
def test_a_ddp_job_carries_nccls_watchdog_and_a_horovod_job_does_not(dev_outputs, cluster):
    ddp = _render(dev_outputs, "ddp", cluster)
    assert ddp["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert (
        int(ddp["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
        and ddp["TORCH_FR_BUFFER_SIZE"] == ddp["TORCH_NCCL_TRACE_BUFFER_SIZE"]
    )
    assert ddp["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    horovod = _render(dev_outputs, "horovod", cluster)
    assert not [k for k in horovod if k.startswith(("TORCH_NCCL_", "TORCH_FR_"))], horovod
    assert horovod["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]  # Horovod's own stall inspector instead


def test_the_job_files_own_setting_wins(dev_outputs):
    template = jobspec.read_template(SOURCE)
    template["environment_variables"] = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    assert _render(dev_outputs, "ddp", template=template)["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0"


def test_the_installed_torch_reads_every_variable_named():
    import torch

    lib = pathlib.Path(torch.__file__).parent / "lib"
    names = {*jobspec.DDP_WATCHDOG_ENV, *runtime.FLIGHT_RECORDER_FILE}
    missing = set(names)
    for so in ("libtorch_python.so", "libtorch_cpu.so", "libtorch_cuda.so"):
        if not missing or not (lib / so).is_file():
            continue
        with open(lib / so, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            missing = {n for n in missing if m.find(n.encode()) < 0}
    assert not missing, f"torch {torch.__version__} has none of {sorted(missing)}"


def test_the_payload_times_collectives_out_beyond_the_watchdog_and_dumps_to_the_outputs(tmp_path):
    cfg = config.TrainConfig(output_dir=tmp_path, stall_timeout="auto")
    environ = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert runtime.collective_timeout(cfg, environ) == watchdog.STARTUP_SECONDS + 300
    for key in runtime.FLIGHT_RECORDER_FILE:
        assert environ[key] == str(tmp_path / "stalls" / "nccl-trace-rank")
    assert (tmp_path / "stalls").is_dir()  # NCCL writes the file, not the folder
    cfg = dataclasses.replace(cfg, stall_timeout=7200.0)
    chosen = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/trace"}
    assert runtime.collective_timeout(cfg, chosen) == 7500
    assert chosen == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/trace"}
    cfg = dataclasses.replace(cfg, stall_timeout=0.0)
    assert runtime.collective_timeout(cfg, {}) is None  # the watchdog off: torch's own default


def test_ddp_hands_its_timeout_to_init_process_group(monkeypatch):
    """DDP.init as one process (no launcher variables): the timeout reaches torch.distributed's call."""
    import datetime

    import torch.distributed as dist

    seen = {}
    for name in (*backends.RENDEZVOUS, *backends.MPI_MARKERS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: seen.update(kw))
    backends.DDP(2100.0).init()
    assert seen["timeout"] == datetime.timedelta(seconds=2100)
    seen.clear()
    backends.DDP().init()
    assert "timeout" not in seen
