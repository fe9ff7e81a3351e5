"""A GPU machine as vendors ship it (issue 29): Python with torch and torchvision, no Horovod, no launcher. One
process of either PyTorch payload trains alone there (backends.Single) and says so; a launcher's several processes
without Horovod are refused; and the paths that depend on the torch version take the older torch's way.

How Horovod is hidden: `no_horovod` writes a folder holding a sitecustomize.py and puts it first on PYTHONPATH.
Python's site module imports the first sitecustomize on sys.path at start-up; this one puts a finder at the head of
sys.meta_path that raises ModuleNotFoundError (name "horovod") for `horovod` and every `horovod.*`, which is what
`import horovod.torch` raises in a Python where Horovod was never installed. Everything else is this .venv's: the
same torch, the same packages."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT, TINY, env, horovodrun, metrics

from payloads.pytorch import backends, runtime

HIDE_HOROVOD = '''\
"""Hides Horovod from this Python (tests/test_without_horovod.py)."""
import sys


class NoHorovod:
    def find_spec(self, name, path=None, target=None):
        if name == "horovod" or name.startswith("horovod."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoHorovod())
'''
ALONE = "Horovod is not installed: training alone in one process (no collectives)"


@pytest.fixture
def no_horovod(tmp_path) -> dict:
    """The environment of a process whose `import horovod` fails (the module docstring says how)."""
    hook = tmp_path / "no-horovod"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HIDE_HOROVOD)
    e = env()
    e["PYTHONPATH"] = str(hook) + os.pathsep + e["PYTHONPATH"]
    for key, _ in backends.LAUNCHER_COUNTS:  # started by no launcher, whatever ran pytest
        e.pop(key, None)
    return e


def run(args: list[str], environ: dict, payload: str = "pytorch", timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m payloads.<payload>.train ARGS`: one plain process, as on a machine without any launcher."""
    cmd = [sys.executable, "-m", f"payloads.{payload}.train", "--no-mlflow", *args]
    return subprocess.run(cmd, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout)


def first_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.splitlines()[0] if proc.stdout else ""


@pytest.mark.launches
@pytest.mark.one_core
def test_the_hook_hides_horovod_and_nothing_else(no_horovod):
    """The premise: under the hook `import horovod.torch` fails as where Horovod is absent, torch imports."""
    code = (
        "import importlib.util, torch\n"
        "try:\n    import horovod.torch\nexcept ModuleNotFoundError as e:\n    print('missing', e.name)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=no_horovod, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "missing horovod", proc.stdout + proc.stderr


@pytest.mark.launches
@pytest.mark.one_core
def test_one_process_trains_alone_resumes_and_matches_horovod(no_horovod, tmp_path):
    """fp16 with its loss scaler and 2 backward passes per step: every Single method on the way (averaged, accumulate,
    the identities in the metrics, restore's broadcasts on resume). The same run under `horovodrun -np 1` ends
    with bitwise the same parameters: one rank's average is its own gradient, in either backend."""
    out = tmp_path / "alone"
    args = TINY + ["--amp", "--amp-dtype", "fp16", "--backward-passes-per-step", "2", "--output-dir", str(out)]
    first = run(args + ["--epochs", "1"], no_horovod)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert first_line(first).endswith(ALONE), first.stdout[:500]
    resumed = run(args + ["--epochs", "2"], no_horovod)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert first_line(resumed).endswith(ALONE) and "resuming from" in resumed.stdout
    assert "Total images/sec:" in resumed.stdout
    m = metrics(out)
    world = m["run"]["world"]
    assert (world["backend"], world["alone"], world["processes"], world["collectives"]) == ("single", True, 1, "none")
    assert world["why_alone"] == "No module named 'horovod'"
    assert (world["precision"], world["loss_scaler"]) == ("fp16", True)
    assert [e["epoch"] for e in m["epochs"]] == [1, 2] and m["summary"]["ranks_identical"] is True

    # The control: the same two runs with Horovod, one process under horovodrun.
    hvd_out = tmp_path / "horovod"
    hvd_args = TINY + ["--amp", "--amp-dtype", "fp16", "--backward-passes-per-step", "2", "--output-dir", str(hvd_out)]
    for epochs in ("1", "2"):
        cmd = horovodrun(1, ["--no-mlflow", *hvd_args, "--epochs", epochs])
        proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    h = metrics(hvd_out)
    assert h["run"]["world"]["backend"] == "horovod"
    assert h["summary"]["parameters_sha256"] == m["summary"]["parameters_sha256"]
    assert [e["train_loss"] for e in h["epochs"]] == [e["train_loss"] for e in m["epochs"]]


@pytest.mark.launches
@pytest.mark.one_core
def test_the_land_cover_payload_trains_alone(no_horovod, tmp_path):
    from datatools.landcover import prepare, synthetic

    pairs = synthetic.write_tiles(tmp_path / "raw", 2, 128, 128, 6)
    prepare.prepare(tmp_path / "prepared", pairs[:1], [pairs[1]], block_size=64)
    out = tmp_path / "out"
    args = [
        "--model",
        "unet_tiny",
        "--image-size",
        "32",
        "--patches-per-epoch",
        "32",
        "--batch-size",
        "8",
        "--threads",
        "1",
        "--no-progress",
        "--warmup-epochs",
        "0",
        "--epochs",
        "1",
        "--data-dir",
        str(tmp_path / "prepared"),
        "--output-dir",
        str(out),
    ]
    proc = run(args, no_horovod, payload="segmentation")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert first_line(proc).endswith(ALONE), proc.stdout[:500]
    assert "Total images/sec:" in proc.stdout
    m = metrics(out)
    assert (m["run"]["world"]["backend"], m["run"]["world"]["alone"], m["run"]["world"]["processes"]) == (
        "single",
        True,
        1,
    )
    assert m["epochs"][0]["val_miou"] is not None and m["summary"]["ranks_identical"] is True


@pytest.mark.launches
@pytest.mark.one_core
def test_several_processes_without_horovod_are_refused(no_horovod, tmp_path):
    """horovodrun's variables for rank 0 of 2 and no Horovod: each process would train its own model. Exit 2 before
    anything is written, naming the variable and the fixes."""
    out = tmp_path / "out"
    proc = run(TINY + ["--epochs", "1", "--output-dir", str(out)], dict(no_horovod, HOROVOD_RANK="0", HOROVOD_SIZE="2"))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "error: Horovod is not installed in this Python" in proc.stderr
    assert "(HOROVOD_SIZE=2)" in proc.stderr and "--backend ddp" in proc.stderr
    assert ALONE not in proc.stdout and not (out / "metrics.json").exists()


@pytest.mark.launches
@pytest.mark.one_core
@pytest.mark.parametrize("flag", ["--adasum", "--fp16-allreduce"])
def test_reduction_options_are_refused_alone(no_horovod, tmp_path, flag):
    """--adasum and --fp16-allreduce change how processes combine gradients: alone they would do nothing, so the run
    refuses them instead of accepting an option that does nothing."""
    out = tmp_path / "out"
    proc = run(TINY + ["--epochs", "1", flag, "--output-dir", str(out)], no_horovod)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"error: {flag} combines the gradients of several processes" in proc.stderr
    assert f"drop {flag}" in proc.stderr and not (out / "metrics.json").exists()


@pytest.mark.launches
@pytest.mark.one_core
@pytest.mark.parametrize(
    "variables, several",
    [
        ({}, None),
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"}, None),  # horovodrun -np 1
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, None),  # torchrun --nproc-per-node 1
        ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}, None),  # mpirun -np 1
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, "HOROVOD_SIZE=2"),
        ({"HOROVOD_RANK": "1"}, "HOROVOD_RANK=1"),
        ({"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "3"}, "OMPI_COMM_WORLD_SIZE=8"),
        ({"PMI_SIZE": "4", "PMI_RANK": "0"}, "PMI_SIZE=4"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "WORLD_SIZE=2"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two'"),
    ],
)
def test_which_launcher_variables_mean_several_processes(variables, several):
    assert backends.several_processes(variables) == several


def test_single_collectives_are_identities_on_new_tensors():
    alone = backends.Single()
    t = torch.arange(6.0).reshape(1, 2, 3, 1).contiguous(memory_format=torch.channels_last)
    for out in (alone.allreduce_sum(t, "x"), alone.allreduce_mean(t, "y")):
        assert torch.equal(out, t) and out.data_ptr() != t.data_ptr() and out.is_contiguous()
    assert alone.broadcast_object({"a": 1}, "o") == {"a": 1} and alone.allgather_object(3, "g") == [3]
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert alone.wrap(model, opt, SimpleNamespace(), torch.device("cpu")) == (model, opt)
    assert (alone.rank(), alone.size(), alone.local_rank(), alone.local_size()) == (0, 1, 0, 1)


# The torch-version-dependent paths (docs/pytorch-gpu.md#which-torch): this .venv has torch 2.14, a vendor image
# an older one; each path is taken here with torch's side replaced by the older one's.


def test_ddp_keeps_buffers_per_rank_with_the_argument_each_torch_has(monkeypatch):
    """torch 2.13 added DistributedDataParallel(forward_sync_buffers=) and deprecated broadcast_buffers; torch 2.4 to
    2.12 know only broadcast_buffers. Both mean: no buffer broadcast before each forward."""
    import torch.nn.parallel

    assert "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    seen = {}

    class OldDDP:  # the start of DistributedDataParallel's signature before torch 2.13
        def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True):
            seen.update(device_ids=device_ids, broadcast_buffers=broadcast_buffers)

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", OldDDP)
    assert backends.no_forward_buffer_sync() == {"broadcast_buffers": False}
    model = torch.nn.Linear(2, 2)
    cfg = SimpleNamespace(fp16_allreduce=False)
    backends.DDP().wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, torch.device("cpu"))
    assert seen == {"device_ids": None, "broadcast_buffers": False}
    monkeypatch.undo()
    assert backends.no_forward_buffer_sync() == {"forward_sync_buffers": False}


def test_sgd_without_a_fused_kernel_falls_back_to_foreach(monkeypatch, caplog):
    """torch before 2.2 has no SGD(fused=) (TypeError), and a device without the kernel refuses it (RuntimeError):
    the payload's optimizer is then the foreach one, with the same groups."""
    real = torch.optim.SGD

    class NoFusedSGD(real):
        def __init__(self, params, *args, fused=None, **kwargs):
            if fused is not None:
                raise TypeError("SGD.__init__() got an unexpected keyword argument 'fused'")
            super().__init__(params, *args, **kwargs)

    monkeypatch.setattr(torch.optim, "SGD", NoFusedSGD)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    cfg = SimpleNamespace(momentum=0.9, weight_decay=1e-4)
    with caplog.at_level("INFO", logger="payloads.pytorch"):
        opt = runtime.optimizer(cfg, model, 0.1, torch.device("cpu"))
    assert isinstance(opt, NoFusedSGD) and opt.defaults["foreach"] is True and not opt.defaults.get("fused")
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]
    assert "fused SGD unavailable" in caplog.text


@pytest.mark.parametrize(
    "version, parsed",
    [("2.14.1+cu130", (2, 14)), ("2.11.0a0+git6c8c5ad", (2, 11)), ("2.4.1", (2, 4)), ("2.3.1+cu121", (2, 3))],
)
def test_torch_versions_are_read_as_released(version, parsed):
    assert runtime.torch_version(version) == parsed
    assert (parsed >= runtime.OLDEST_TORCH) == (parsed != (2, 3))


def test_a_torch_older_than_supported_is_named_at_start(monkeypatch, caplog):
    from payloads.common.config import TrainConfig

    monkeypatch.setattr(torch, "__version__", "2.3.1+cu121")
    cfg = TrainConfig(threads=torch.get_num_threads())
    with caplog.at_level("INFO", logger="payloads.pytorch"):
        device, prec, _ = runtime.resolve(cfg, backends.Single())
    assert device.type == "cpu" and prec.name == "fp32"
    assert "torch 2.3.1+cu121 is older than 2.4, the oldest these payloads support" in caplog.text


def test_the_fp16_loss_scaler_is_built_with_the_device_argument():
    """torch.amp.GradScaler(device) (torch 2.3; torch.cuda.amp.GradScaler is deprecated since 2.4): the CUDA one is
    constructed here without a GPU (it disables itself, warning), so the call's form is checked on this CPU."""
    from payloads.pytorch.precision import Precision

    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = Precision("fp16", "cuda").grad_scaler(1024.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "cuda"
    assert Precision("bf16", "cuda").grad_scaler() is None
