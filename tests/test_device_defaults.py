"""Every default that a GPU switches on, switched on here on the CPU, in two real Horovod processes.

The rule (tests/README.md): a flag whose default depends on the device is tested with both values. Each test
below checks the same three things as test_distributed.py for one such flag: the two ranks end bitwise equal,
the 2-process run equals a 1-process run on the same global batch within a tolerance, and a control run that
skips the averaging lands farther away than that tolerance (so the tolerance could catch gradients never
averaged); resume equals a straight run where the flag has state worth restoring.
"""

import subprocess

import pytest
import torch
from helpers import (
    FP32_REFERENCE_ARGS,
    ROOT,
    TINY,
    env,
    final_weights,
    horovodrun,
    max_diff,
    metrics,
    one_process_references,
    train,
)

pytestmark = pytest.mark.launches  # starts training processes: serial under xdist (tests/conftest.py)


def _averaging_holds(tmp_path, flags: list[str], tolerance: float, references, margin: float = 10.0) -> dict:
    """2 processes x 16 with `flags` vs 1 process x 32 (same LR: base x processes), and 1 process x 16 as the
    control: `references`, the (one, control) output folders (conftest.fp32_references: float32, the flags left
    out, or runs with them where they change the 1-process numbers)."""
    two = tmp_path / "two"
    one, control = references
    train(2, TINY + FP32_REFERENCE_ARGS + flags + ["--batch-size", "16", "--base-lr", "0.05", "--output-dir", str(two)])
    m = metrics(two)
    assert m["summary"]["ranks_identical"] is True, "ranks ended with different weights"
    diff = max_diff(final_weights(two), final_weights(one))
    away = max_diff(final_weights(control), final_weights(one))
    print(f"{flags}: max |2-process - 1-process| = {diff:.3g} (tolerance {tolerance:g}); unaveraged control {away:.3g}")
    assert diff < tolerance, f"2 processes differ from 1 process by {diff} with {flags}"
    assert away > margin * tolerance, f"the control ({away}) is not beyond the tolerance: the test could not see it"
    return m


def test_channels_last_and_the_fp16_loss_scaler_resume_equal_a_straight_run(tmp_path, cuda_fused_sgd_rule):
    """Two states a resume must restore on every rank, in one run (fp16 with GradScaler, the T4/V100 path, in
    channels_last):
    - the loss scaler: started at 2^24 the scale backs off on the first overflowing steps, so a rank restarted at
      2^24 would overflow where the others do not, then unscale the averaged gradient by another factor;
    - channels_last momentum: resume gives every rank rank 0's optimizer state in each parameter's layout, with no
      optimizer step. Horovod's broadcast_optimizer_state first stepped the other ranks on default-layout zero
      gradients, which CUDA's fused SGD refuses for channels_last weights: every fused SGD call of the three runs is
      held to the CUDA kernel's layout rule (tests/gpu_rules).
    Resumed equals straight, bitwise, and the ranks agree."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    init = 2.0**24
    args = TINY + ["--batch-size", "8", "--warmup-epochs", "1", "--channels-last"]
    args += ["--amp", "--amp-dtype", "fp16", "--loss-scale-init", str(init)]
    train(2, args + ["--epochs", "3", "--output-dir", str(straight)])
    train(2, args + ["--epochs", "1", "--output-dir", str(resumed)])
    saved = torch.load(resumed / "checkpoints" / "checkpoint-epoch-0001.pt", map_location="cpu", weights_only=False)
    assert saved["scaler"] and saved["scaler"]["scale"] < init, (
        f"the scale never left {init}: this test could not tell a restored scaler from a fresh one"
    )
    proc = train(2, args + ["--epochs", "3", "--output-dir", str(resumed)])
    assert "resuming from" in proc.stdout
    m = metrics(resumed)
    assert m["summary"]["ranks_identical"] is True
    world = m["run"]["world"]
    assert (world["precision"], world["loss_scaler"], world["memory_format"]) == ("fp16", True, "channels_last")
    a, b = final_weights(straight), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), f"max diff {max_diff(a, b)}"
    checked = cuda_fused_sgd_rule()
    assert len(checked) == 6 and min(checked) > 0, f"fused SGD calls checked per process: {checked}"


@pytest.mark.parametrize(
    "flags,tolerance",
    [
        # fp16 compression rounds each gradient to 11 significant bits on the wire.
        (["--fp16-allreduce"], 2e-3),
    ],
)
def test_channels_last_with_fp16_allreduce(tmp_path, flags, tolerance, fp32_references):
    """Against the float32 contiguous references: the layout changes rounding only (test_distributed.py's
    backward-passes run holds channels_last to them at 1e-5)."""
    _averaging_holds(tmp_path, ["--channels-last", *flags], tolerance, fp32_references)


def test_channels_last_with_adasum_equals_the_contiguous_adasum_run(tmp_path):
    """Adasum's dot products and norms are per tensor, so the layout must not change the result: the
    channels_last run equals the contiguous one (test_distributed.py checks that one against Adasum's definition)."""
    e = env()
    e["OMPI_MCA_mpi_yield_when_idle"] = "1"
    runs = {}
    for layout in ("--channels-last", "--no-channels-last"):
        out = tmp_path / layout.strip("-")
        cmd = horovodrun(
            2, TINY + ["--epochs", "2", "--batch-size", "16", "--adasum", layout, "--output-dir", str(out)]
        )
        i = cmd.index("--gloo")
        cmd[i : i + 1] = ["--mpi", "--mpi-args=--bind-to none"]
        proc = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert metrics(out)["summary"]["ranks_identical"] is True
        runs[layout] = final_weights(out)
    diff = max_diff(runs["--channels-last"], runs["--no-channels-last"])
    assert diff < 1e-5, diff


def test_bf16_autocast_on_the_cpu_averages_and_records_its_precision(tmp_path):  # bf16 1-process references
    """--amp on a CPU runs bfloat16 autocast, the path a GPU of compute capability 8.0+ takes by default, without
    a loss scaler. bf16 keeps 8 significant bits, so 1 and 2 processes (different per-rank batches through bf16
    matmuls) agree less closely than in fp32; the unaveraged control is still far beyond that."""
    flags = ["--amp", "--amp-dtype", "bf16"]
    m = _averaging_holds(tmp_path, flags, 5e-3, one_process_references(tmp_path / "references", flags))
    assert m["run"]["world"]["precision"] == "bf16" and m["run"]["world"]["loss_scaler"] is False


def test_compiled_model_averages_like_the_eager_one(tmp_path, fp32_references):
    """--compile (torch.compile with inductor's CPU backend here): Horovod's gradient hooks sit on the leaf
    parameters' accumulators, outside the compiled graph, so averaging must hold as in eager mode: the compiled
    2-process run against eager 1-process runs (compiling those too compared compiled with compiled only, and took
    47.5 s alone with a cold cache against 37.7 s)."""
    m = _averaging_holds(tmp_path, ["--compile"], 1e-4, fp32_references)
    assert m["run"]["world"]["compiled"] is True
