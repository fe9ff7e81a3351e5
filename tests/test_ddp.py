"""PyTorch DDP (--backend ddp): two real processes under torchrun, over Gloo on this CPU.

The assertions are test_distributed.py's, for the other backend: the ranks end bitwise equal, the 2-process run
equals a 1-process run on the same global batch within a tolerance, and a control run that skips the averaging
(one process stepping on a half batch) lands beyond it; resume equals a straight run; and a Horovod run and a
DDP run of the same seed agree within the same tolerance, and resume each other's checkpoints.
"""

import shutil
import subprocess
import sys

import pytest
import same_numbers
import torch
from helpers import FP32_REFERENCE_ARGS, ROOT, TINY, env, final_weights, max_diff, metrics, python_m, train

from payloads.common import options
from payloads.common.config import TrainConfig
from payloads.common.errors import ConfigError

FP32 = TINY + FP32_REFERENCE_ARGS  # the arguments of the session's 1-process references (conftest.fp32_references)


def ddp(np_: int, args: list[str], **kw):
    return train(np_, args, backend="ddp", **kw)


def _averaging_run(tmp_path, flags: list[str]) -> dict:
    """2 DDP processes x 16 at base LR 0.05 (the job's LR 0.1): the averaged step of a 1 x 32 run at LR 0.1."""
    out = tmp_path / "ddp"
    ddp(2, flags + ["--batch-size", "16", "--base-lr", "0.05", "--output-dir", str(out)])
    m = metrics(out)
    assert m["summary"]["ranks_identical"] is True, "ranks ended with different weights"
    assert m["run"]["world"]["backend"] == "ddp" and m["run"]["world"]["process_group"] == "gloo"
    assert m["run"]["world"]["processes"] == 2 and all(e["images"] == 128 for e in m["epochs"])
    return out


def _references(tmp_path, flags: list[str]) -> tuple[dict, dict]:
    """(1 process x 32 at LR 0.1, the control: 1 process x 16 at LR 0.1, no averaging to speak of)."""
    one, control = tmp_path / "one", tmp_path / "control"
    ddp(1, flags + ["--batch-size", "32", "--base-lr", "0.1", "--output-dir", str(one)])
    ddp(1, flags + ["--batch-size", "16", "--base-lr", "0.1", "--output-dir", str(control)])
    return final_weights(one), final_weights(control)


@pytest.fixture(scope="module")
def fp32(tmp_path_factory, fp32_references):
    """The fp32 runs the tests below compare against: DDP 2 x 16, and the 1-process reference and control (one
    process trains alone under either backend: the Horovod tests' references)."""
    two = final_weights(_averaging_run(tmp_path_factory.mktemp("fp32"), FP32))
    return two, *(final_weights(out) for out in fp32_references)


@pytest.mark.launches
@pytest.mark.one_core  # DDP ranks wait without spinning: about one core (tests/README.md)
def test_two_ddp_processes_average_exactly_and_agree_with_horovod(fp32, tmp_path):
    two, one, control = fp32
    diff = max_diff(two, one)
    away = max_diff(control, one)
    # The same run under Horovod, from the same seed and shards.
    train(2, FP32 + ["--batch-size", "16", "--base-lr", "0.05", "--output-dir", str(tmp_path / "horovod")])
    m = metrics(tmp_path / "horovod")
    assert m["run"]["world"]["backend"] == "horovod" and m["summary"]["ranks_identical"] is True
    between = max_diff(two, final_weights(tmp_path / "horovod"))
    print(f"max |DDP 2 - 1 process| = {diff:.3g}; |DDP - Horovod| = {between:.3g}; unaveraged control {away:.3g}")
    assert diff < 1e-5, f"2 DDP processes differ from 1 process by {diff}"
    assert between < 1e-5, f"DDP and Horovod runs of the same seed differ by {between}"
    assert away > 100 * max(diff, between, 1e-7), (away, diff, between)


@pytest.mark.launches
@pytest.mark.one_core  # DDP ranks wait without spinning: about one core (tests/README.md)
def test_backward_passes_per_step_accumulate_then_average(fp32, tmp_path):
    """2 processes x 2 micro-batches of 8 (no_sync on the first) = 1 process x 32, at the same LR: base 0.025 x 2
    processes x 2 passes = 0.1."""
    _, one, control = fp32
    out = tmp_path / "micro"
    ddp(
        2,
        FP32 + ["--batch-size", "8", "--backward-passes-per-step", "2", "--base-lr", "0.025", "--output-dir", str(out)],
    )
    m = metrics(out)
    assert m["summary"]["ranks_identical"] is True
    assert m["epochs"][0]["images"] == 128, "every sample once per epoch, micro-batches included"
    assert m["run"]["config"]["backward_passes_per_step"] == 2
    diff = max_diff(final_weights(out), one)
    print(f"max |DDP 2 x 2 x 8 - 1 x 32| = {diff:.3g}")
    assert diff < 1e-5, diff


@pytest.mark.launches
@pytest.mark.one_core  # DDP ranks wait without spinning: about one core (tests/README.md)
def test_fp16_allreduce_averages_through_the_compression_hook(fp32, tmp_path):
    """--fp16-allreduce: DDP's fp16_compress_hook rounds each gradient bucket to fp16 on the wire (11 significant
    bits), so the run is near the 1-process one, not at it; and not at the uncompressed DDP run either."""
    two, one, control = fp32
    out = _averaging_run(tmp_path, FP32 + ["--fp16-allreduce"])
    got = final_weights(out)
    diff, away = max_diff(got, one), max_diff(control, one)
    compressed = max_diff(got, two)
    print(
        f"fp16 allreduce: max |DDP 2 - 1 process| = {diff:.3g}; vs fp32 allreduce {compressed:.3g}; control {away:.3g}"
    )
    assert diff < 2e-3, diff
    assert away > 10 * 2e-3, away
    assert compressed > 0, "the compression hook changed nothing: it did not run"


@pytest.mark.launches
@pytest.mark.one_core  # DDP ranks wait without spinning: about one core (tests/README.md)
def test_device_defaults_channels_last_and_bf16_autocast_average(tmp_path):
    """What a GPU switches on by default, here on the CPU: channels_last and mixed precision (bf16 on a CPU, no
    loss scaler), across two DDP processes. bf16 keeps 8 significant bits: the tolerance is
    test_device_defaults.py's for bf16."""
    flags = TINY + ["--epochs", "2", "--channels-last", "--amp", "--amp-dtype", "bf16"]
    out = _averaging_run(tmp_path, flags)
    world = metrics(out)["run"]["world"]
    assert world["memory_format"] == "channels_last" and world["precision"] == "bf16" and not world["loss_scaler"]
    one, control = _references(tmp_path, flags)
    diff, away = max_diff(final_weights(out), one), max_diff(control, one)
    print(f"channels_last + bf16: max |DDP 2 - 1 process| = {diff:.3g}; control {away:.3g}")
    assert diff < 5e-3, diff
    assert away > 10 * 5e-3, away
    same_numbers.check("classification/ddp/channels-last-bf16", out)


@pytest.mark.launches
@pytest.mark.one_core  # DDP ranks wait without spinning: about one core (tests/README.md)
def test_resume_equals_straight_and_checkpoints_cross_backends(tmp_path):
    """fp16 with its loss scaler (the T4/V100 path), started at 2^24 so that the scale backs off in epoch 1: a rank
    resumed at another scale would unscale the averaged gradient by another factor and drift from the others.
    DDP 1 epoch + resume 1 = DDP 2 epochs, bitwise; a Horovod checkpoint resumes under DDP and a DDP one under
    Horovod, each within the averaging tolerance of the straight run."""
    init = 2.0**24
    args = TINY + [
        "--batch-size",
        "8",
        "--warmup-epochs",
        "1",
        "--amp",
        "--amp-dtype",
        "fp16",
        "--loss-scale-init",
        str(init),
    ]
    straight, resumed, from_horovod, from_ddp = (tmp_path / n for n in ("straight", "resumed", "hvd-ddp", "ddp-hvd"))
    ddp(2, args + ["--epochs", "2", "--output-dir", str(straight)])
    ddp(2, args + ["--epochs", "1", "--output-dir", str(resumed)])
    saved = torch.load(resumed / "checkpoints" / "checkpoint-epoch-0001.pt", map_location="cpu", weights_only=False)
    assert saved["scaler"]["scale"] < init, "the scale never backed off: a fresh scaler would look the same"
    assert not any(k.startswith("module.") for k in saved["model"]), "DDP's wrapper leaked into the checkpoint"
    assert saved["backend"] == "ddp"
    shutil.copytree(resumed, from_ddp)

    proc = ddp(2, args + ["--epochs", "2", "--output-dir", str(resumed)])
    assert "resuming from" in proc.stdout
    m = metrics(resumed)
    assert m["summary"]["ranks_identical"] is True and m["summary"]["epochs_run"] == 1
    assert m["run"]["world"]["precision"] == "fp16" and m["run"]["world"]["loss_scaler"] is True
    a, b = final_weights(straight), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), f"max diff {max_diff(a, b)}"
    same_numbers.check("classification/ddp/fp16-scaler", straight)
    same_numbers.check("classification/ddp/fp16-scaler-resumed", resumed)

    train(2, args + ["--epochs", "1", "--output-dir", str(from_horovod)])  # Horovod's checkpoint ...
    proc = ddp(2, args + ["--epochs", "2", "--output-dir", str(from_horovod)])  # ... resumed under DDP
    proc_back = train(2, args + ["--epochs", "2", "--output-dir", str(from_ddp)])  # and DDP's under Horovod
    for out, p, backend in ((from_horovod, proc, "ddp"), (from_ddp, proc_back, "horovod")):
        assert "resuming from" in p.stdout, out.name
        m = metrics(out)
        assert m["summary"]["ranks_identical"] is True and m["summary"]["epochs_run"] == 1, out.name
        assert m["run"]["world"]["backend"] == backend
        diff = max_diff(final_weights(out), a)
        print(f"{out.name}: max |resumed across backends - straight DDP| = {diff:.3g}")
        assert diff < 1e-5, (out.name, diff)


@pytest.mark.launches
@pytest.mark.one_core  # DDP ranks wait without spinning: about one core (tests/README.md)
def test_options_ddp_lacks_are_refused_naming_the_backend(tmp_path):
    proc = subprocess.run(
        [*python_m("payloads.pytorch.train"), "--backend", "ddp", "--adasum"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--adasum is a Horovod option: PyTorch DDP (--backend ddp) has no Adasum reduction" in proc.stderr
    with pytest.raises(ConfigError, match="--backend is an option of the PyTorch payloads"):  # TensorFlow, Keras
        options.parse(
            ["--backend", "ddp", "--output-dir", str(tmp_path / "tf")],
            "tf",
            "tf",
            ["resnet50"],
            groups=(*options.COMMON, options.CLASSIFICATION_INPUT, options.HOROVOD, options.TENSORFLOW),
        )
    # A DDP process that mpirun started (no rendezvous variables) would train alone: refused before training.
    e = env()
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    e["OMPI_COMM_WORLD_SIZE"] = "2"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "payloads.pytorch.train",
            "--backend",
            "ddp",
            *TINY,
            "--output-dir",
            str(tmp_path / "out"),
        ],
        cwd=ROOT,
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "--backend ddp in a process started by mpirun or horovodrun" in proc.stderr
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_cuda_branches_of_the_backends_follow_horovods_and_pytorchs_rules(monkeypatch):
    """The CUDA-only choices, on this CPU with fakes at the library boundary (the NCCL process group itself needs
    a GPU: docs/status.md#ddp-on-gpus). Adasum on GPUs scales the LR by the GPUs of a node, which NCCL averages
    before Adasum adds the nodes (Horovod's pytorch_imagenet_resnet50.py: `hvd.local_size() if args.cuda and
    hvd.nccl_built() else 1`); DDP takes device_ids=[the process's GPU] for a one-GPU module and None for a CPU
    one (DistributedDataParallel's documentation)."""
    from types import SimpleNamespace

    import torch.nn.parallel

    from payloads.pytorch import backends

    hvd = SimpleNamespace(local_size=lambda: 8, nccl_built=lambda: True)
    horovod = backends.Horovod(hvd)
    assert horovod.adasum_lr_scale(torch.device("cuda", 3)) == 8
    assert horovod.adasum_lr_scale(torch.device("cpu")) == 1
    hvd.nccl_built = lambda: False  # a Horovod without NCCL reduces GPU tensors through MPI: Adasum alone
    assert horovod.adasum_lr_scale(torch.device("cuda", 3)) == 1

    seen = {}

    class RecordingDDP:
        def __init__(self, module, **kw):
            seen.update(kw)

        def register_comm_hook(self, state, hook):
            seen["hook"] = state.hook.__name__  # backends._exchanged, through which the sentinel sees each bucket

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", RecordingDDP)
    model, cfg = torch.nn.Linear(2, 2), TrainConfig(fp16_allreduce=True)
    backends.DDP().wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, torch.device("cuda", 3))
    assert seen == {"device_ids": [3], "forward_sync_buffers": False, "hook": "fp16_compress_hook"}
    backends.DDP().wrap(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, torch.device("cpu"))
    assert seen["device_ids"] is None
