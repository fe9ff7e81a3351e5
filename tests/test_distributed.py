"""Two real Horovod processes over Gloo: gradients are averaged, ranks agree, a dead rank ends the job. (Resume
equals a straight run: test_outputs_without_rename.py, on a folder where rename raises.)"""

import os
import signal
import subprocess
import time

import psutil
import pytest
import same_numbers
import torch
from helpers import FP32_REFERENCE_ARGS, ROOT, TINY, env, final_weights, horovodrun, max_diff, metrics, train

from payloads.pytorch.models import parameters_digest

pytestmark = pytest.mark.launches  # starts training processes: serial under xdist (tests/conftest.py)


def test_two_processes_average_gradients_exactly(tmp_path, fp32_references, monkeypatch):
    two = tmp_path / "two"
    one, unaveraged = fp32_references  # 1 process x 32 and x 16 on the same data (conftest.py)
    # The CPU's defaults, spelled out: the GPU's values of these flags run in test_device_defaults.py.
    args = TINY + FP32_REFERENCE_ARGS + ["--batch-size", "16", "--base-lr", "0.05"]
    timeline = tmp_path / "timeline.json"  # Horovod's timeline, where HOROVOD_TIMELINE asks for it
    monkeypatch.setenv("HOROVOD_TIMELINE", str(timeline))
    proc = train(2, args + ["--output-dir", str(two)])
    monkeypatch.delenv("HOROVOD_TIMELINE")
    assert "ALLREDUCE" in timeline.read_text().upper() and "Horovod timeline" in proc.stdout
    m = metrics(two)

    # Learns: the loss falls.
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < 0.8 * losses[0], losses
    assert m["run"]["world"]["processes"] == 2
    # Steady-state throughput counts both ranks' images after the first --startup-steps (10) of 12 steps.
    assert m["summary"]["steady_state"] is True and m["summary"]["all_images"] == 3 * 128
    assert m["summary"]["images"] == 2 * 16 * (3 * 4 - 10), m["summary"]
    assert 0 < m["summary"]["startup_seconds"] and m["summary"]["train_seconds"] < m["summary"]["all_train_seconds"]
    # Ranks end bitwise identical (digests gathered from both processes), and rank 0's digest is
    # that of the checkpoint on disk.
    assert m["summary"]["ranks_identical"] is True
    assert m["summary"]["parameters_sha256"] == parameters_digest(_as_module(final_weights(two)))
    assert "Total images/sec:" in proc.stdout

    # Same global batch (32) in one process, same effective LR (2 x 0.05): equal within float error.
    diff = max_diff(final_weights(two), final_weights(one))
    assert diff < 1e-5, f"2-process weights differ from the 1-process run by {diff}"

    # Control: what no averaging would look like (each rank stepping on its own half-batch).
    control = max_diff(final_weights(unaveraged), final_weights(one))
    print(f"max |2-process - 1-process| = {diff:.3g}; unaveraged control = {control:.3g}")
    assert control > 100 * max(diff, 1e-7), (control, diff)
    same_numbers.check("classification/alone/fp32", one)
    same_numbers.check("classification/horovod/fp32", two)

    # The same run with rank 1's weights one ulp off in one element (tests/nudge): the check sees a single bit,
    # so every `ranks_identical is True` in the suite can fail.
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests" / "nudge") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("NUDGE_RANK", "1")
    nudged = tmp_path / "nudged"
    train(2, args + ["--output-dir", str(nudged)])
    assert metrics(nudged)["summary"]["ranks_identical"] is False
    assert metrics(nudged)["summary"]["parameters_sha256"] == m["summary"]["parameters_sha256"]  # rank 0 untouched


def _as_module(state):
    from payloads.pytorch import models

    model = models.build("tiny_cnn", 4, 16)
    model.load_state_dict(state)
    return model


def _rank_pid(launcher: psutil.Process, rank: int) -> int | None:
    for child in launcher.children(recursive=True):
        try:
            if child.environ().get("HOROVOD_RANK") == str(rank) and "payloads.pytorch.train" in " ".join(
                child.cmdline()
            ):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_a_killed_worker_ends_the_job_and_the_last_checkpoint_resumes(tmp_path):
    out = tmp_path / "run"
    args = TINY + ["--synthetic-samples", "2048", "--batch-size", "8", "--epochs", "200", "--output-dir", str(out)]
    job = subprocess.Popen(
        horovodrun(2, args),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 120
        while not list((out / "checkpoints").glob(".checkpoint-epoch-*.pt.complete")):  # the marker comes last
            assert job.poll() is None, job.stdout.read()
            assert time.time() < deadline, "no checkpoint within 120 s"
            time.sleep(0.2)
        pid = _rank_pid(psutil.Process(job.pid), 1)
        assert pid, "rank 1 not found"
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        code = job.wait(timeout=90)
        waited = time.time() - killed
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert code != 0, "the job must fail when a worker dies"
    assert waited < 90
    print(f"job exited {code} {waited:.1f}s after rank 1 was killed")
    # The newest checkpoint is whole and resumable.
    state = final_weights(out)
    assert state
    from payloads.common import checkpoint

    done, _ = checkpoint.latest(out / "checkpoints", ".pt")
    proc = train(2, args[:-4] + ["--epochs", str(done + 1), "--output-dir", str(out)])
    assert "resuming from" in proc.stdout


def test_backward_passes_per_step_accumulate_then_average_across_processes(tmp_path):
    """--backward-passes-per-step N: each rank accumulates N micro-batches locally, then one allreduce.
    2 processes x 2 micro-batches x 8 = 1 process x 32 (the same 32 samples per step, see ShardedBatchSampler)
    and the same LR (base x processes x passes), so the weights must agree within float error. Horovod's
    hooks exist only with 2+ processes: a 1-process run cannot see an optimizer built for the wrong N.
    The two processes run in channels_last (a GPU's default), the references in the CPU's contiguous layout: Horovod
    0.28.1 refused every channels_last tensor ("Tensor is required to be contiguous"); the patch reduces them in
    logical order, so the layout changes nothing beyond float error."""
    two, one, micro = tmp_path / "two", tmp_path / "one", tmp_path / "micro"
    common = TINY + ["--epochs", "2"]
    train(
        2,
        common
        + ["--batch-size", "8", "--backward-passes-per-step", "2", "--base-lr", "0.05", "--channels-last"]
        + ["--output-dir", str(two)],
    )
    m = metrics(two)
    assert m["summary"]["ranks_identical"] is True
    assert m["run"]["world"]["memory_format"] == "channels_last" and m["run"]["config"]["channels_last"] is True
    assert m["epochs"][0]["images"] == 128, "every sample once per epoch, micro-batches included"
    train(1, common + ["--batch-size", "32", "--base-lr", "0.2", "--output-dir", str(one)])
    diff = max_diff(final_weights(two), final_weights(one))
    assert diff < 1e-5, f"2 processes x 2 passes differ from 1 process x 32 by {diff}"
    # The local half: 4 micro-batches of 8 in one process is the same step as one batch of 32
    # (each micro-batch's mean loss is weighted by its share of the batch).
    train(
        1,
        common
        + ["--batch-size", "8", "--backward-passes-per-step", "4", "--base-lr", "0.05", "--output-dir", str(micro)],
    )
    local = max_diff(final_weights(micro), final_weights(one))
    assert local < 1e-5, f"1 process x 4 passes differs from 1 process x 32 by {local}"
    print(f"max |2x2x8 - 1x32| = {diff:.3g}; |1x4x8 - 1x32| = {local:.3g}")
    same_numbers.check("classification/horovod/backward-passes-2", two)


def _mpi(cmd: list[str]) -> list[str]:
    """The same horovodrun command under Horovod's MPI controller (Adasum exists only there)."""
    i = cmd.index("--gloo")
    return cmd[:i] + ["--mpi", "--mpi-args=--bind-to none"] + cmd[i + 1 :]


def _adasum_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two ranks' tensors (Maleki et al. 2020; horovod/common/ops/adasum/adasum.h, ScaledAdd:
    per tensor, dot products and norms in double, a coefficient left at 1 when its norm^2 < 1e-8)."""
    a64, b64 = a.double(), b.double()
    dot, aa, bb = (a64 * b64).sum(), (a64 * a64).sum(), (b64 * b64).sum()
    ca = 1 - dot / aa / 2 if aa >= 1e-8 else 1.0
    cb = 1 - dot / bb / 2 if bb >= 1e-8 else 1.0
    return (ca * a64 + cb * b64).to(a.dtype)


def _reference_two_ranks(combine, epochs: int, batch: int, base_lr: float) -> dict:
    """What Horovod's Adasum optimizer does with 2 ranks, in one process: each rank steps its own SGD
    (own momentum) from the shared weights on its own shard, and the weights move by combine(delta0, delta1)."""
    import torch.nn.functional as F

    from payloads.common import schedule
    from payloads.pytorch import data, models

    cfg = dict(samples=128, classes=4, size=16, seed=42)
    dataset = data.SyntheticImages(cfg["samples"], cfg["classes"], cfg["size"], cfg["seed"])
    torch.manual_seed(cfg["seed"])
    shared = models.build("tiny_cnn", cfg["classes"], cfg["size"])
    replicas = [models.build("tiny_cnn", cfg["classes"], cfg["size"]) for _ in range(2)]
    # The payload's decay (Goyal et al.): 1e-4 on kernels and dense matrices, none on BatchNorm or biases.
    sgd = [
        torch.optim.SGD(
            [
                {"params": [p for p in r.parameters() if p.ndim > 1], "weight_decay": 1e-4},
                {"params": [p for p in r.parameters() if p.ndim <= 1], "weight_decay": 0.0},
            ],
            lr=base_lr,
            momentum=0.9,
        )
        for r in replicas
    ]
    samplers = [data.ShardedBatchSampler(cfg["samples"], r, 2, batch, cfg["seed"]) for r in range(2)]
    for epoch in range(epochs):
        for s in samplers:
            s.set_epoch(epoch)
        shards = [list(s) for s in samplers]
        for step, indices in enumerate(zip(*shards)):
            lr = schedule.learning_rate(base_lr, 1, epoch, step, len(shards[0]), 0, (30, 60, 80))
            deltas = []
            for replica, opt, idx in zip(replicas, sgd, indices):
                replica.load_state_dict(shared.state_dict())
                images, labels, _ = data.collate([dataset[i] for i in idx])
                opt.zero_grad()
                F.cross_entropy(replica(images), labels).backward()
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.step()
                deltas.append({k: v - shared.state_dict()[k] for k, v in replica.state_dict().items()})
            with torch.no_grad():
                for k, w in shared.state_dict().items():
                    w.add_(combine(deltas[0][k], deltas[1][k]))
    return shared.state_dict()


def test_adasum_two_processes_follow_adasums_definition(tmp_path):
    out = tmp_path / "adasum"
    args = TINY + ["--epochs", "2", "--batch-size", "16", "--adasum", "--output-dir", str(out)]
    e = env()
    e["OMPI_MCA_mpi_yield_when_idle"] = "1"  # 2 ranks on 2 shared cores (launcher/interconnect.py)
    proc = subprocess.run(_mpi(horovodrun(2, args)), cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = metrics(out)
    assert m["summary"]["ranks_identical"] is True
    assert m["run"]["world"]["horovod_controller"] == "mpi"
    assert m["run"]["config"]["amp"] is False
    got = final_weights(out)
    adasum = _reference_two_ranks(_adasum_pair, 2, 16, 0.05)
    diff = max_diff(got, adasum)
    # Controls: the other ways two deltas could have been combined are measurably elsewhere.
    mean = max_diff(got, _reference_two_ranks(lambda a, b: (a + b) / 2, 2, 16, 0.05))
    total = max_diff(got, _reference_two_ranks(lambda a, b: a + b, 2, 16, 0.05))
    print(f"max |payload - Adasum reference| = {diff:.3g}; vs mean of deltas {mean:.3g}; vs sum {total:.3g}")
    assert diff < 1e-5, f"Adasum run differs from Adasum's definition by {diff}"
    assert min(mean, total) > 100 * max(diff, 1e-7), (diff, mean, total)

    # With 2 micro-batches of 8 per step, Horovod's Adasum optimizer steps after the second backward pass on
    # their mean gradient: the same updates at half the base LR (the LR scales by the passes).
    micro = tmp_path / "adasum-micro"
    args = TINY + [
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--backward-passes-per-step",
        "2",
        "--base-lr",
        "0.025",
        "--adasum",
        "--output-dir",
        str(micro),
    ]
    proc = subprocess.run(_mpi(horovodrun(2, args)), cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert metrics(micro)["summary"]["ranks_identical"] is True
    assert metrics(micro)["run"]["config"]["backward_passes_per_step"] == 2
    micro_diff = max_diff(final_weights(micro), adasum)
    print(f"Adasum with 2 passes x 8 vs the reference: {micro_diff:.3g}")
    assert micro_diff < 1e-5, micro_diff
