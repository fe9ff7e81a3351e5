"""The replica sentinel (issue 44, items 5-7; payloads/pytorch/sentinel.py), with two real processes: a bit flipped in
rank 1's weights and NaN gradients on rank 1 (under Horovod and DDP) are each found within --replica-check-every
steps, naming rank 1 and its host; the run rolls back to the last agreed checkpoint and ends bitwise equal to a run
never disturbed; a fault that comes back stops the run with exit code 70; a run without a fault finds nothing.
tests/fault injects the faults."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
import torch
from helpers import (
    ROOT,
    TINY,
    ending_of,
    final_weights,
    hook_env,
    horovodrun,
    metrics,
    record_launch,
    torchrun,
    train,
)

from launcher import autoresume, endings
from payloads.pytorch import sentinel

HOST = socket.gethostname()
# 8 steps per epoch (128 samples, 2 x 8), 3 epochs; checks every 3 steps (3, 6, 9, 12, ...) and before each epoch's
# checkpoint. A fault in forward pass 11 (epoch 2, its third step) is found at the check after step 12; the last
# agreed checkpoint is epoch 1's, and epoch 2 is trained again from its start.
ARGS = TINY + ["--epochs", "3", "--batch-size", "8", "--replica-check-every", "3"]


def faulty(tmp_path, name: str, kind: str, at: str, backend: str = "horovod") -> subprocess.CompletedProcess:
    out = tmp_path / name
    args = ARGS + ["--output-dir", str(out)]
    cmd = horovodrun(2, args) if backend == "horovod" else torchrun(2, args)
    e = hook_env("fault", FAULT=kind, FAULT_RANK="1", FAULT_AT=at)
    proc = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=240)
    record_launch(2, args, "pytorch", proc.returncode)
    return proc


def assert_equal_weights(a, b) -> None:
    a, b = final_weights(a), final_weights(b)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


@pytest.mark.launches
def test_a_flipped_bit_is_named_rolled_back_and_nan_gradients_that_return_stop_the_run(tmp_path):
    clean = tmp_path / "clean"
    proc = train(2, ARGS + ["--output-dir", str(clean)])
    assert "replica check" not in proc.stdout + proc.stderr and not (clean / "replicas.json").exists()

    flipped = faulty(tmp_path, "flipped", "flip", "11")
    text = flipped.stdout + flipped.stderr
    assert flipped.returncode == 0, text[-4000:]
    assert "tests/fault: rank 1 flipped a bit before its forward pass 11" in text
    assert f"replica check: rank 1 on {HOST}: parameters differ from the other ranks' (first: " in text, text[-3000:]
    assert "replica check: rolled back to checkpoint-epoch-0001.pt" in text
    assert "set aside" not in text  # epoch 2's checkpoint was never written: nothing after the agreed one
    report = json.loads((tmp_path / "flipped" / "replicas.json").read_text())
    (finding,) = report["findings"]
    assert (finding["kind"], finding["ranks"], finding["hosts"], finding["steps_trained"]) == (
        "parameters differ",
        [1],
        [HOST],
        12,
    )
    assert report["stopped"] is None
    assert_equal_weights(flipped_out := tmp_path / "flipped", clean)
    assert metrics(flipped_out)["summary"]["ranks_identical"] is True

    # NaN gradients on rank 1, and again 3 steps after the rollback: not transient, the run stops, every rank saying
    # why. Rank 1 alone is named: Horovod's groups of its own gradients were checked before their exchange.
    again = faulty(tmp_path, "again", "nan", "11,14")
    text = again.stdout + again.stderr
    assert again.returncode != 0, text[-3000:]
    lines = [ln for ln in text.splitlines() if "error: replica check: the replicas went wrong again" in ln]
    assert len(lines) == 2 and all(f"rank 1 on {HOST}" in ln and "(exit 70)" in ln for ln in lines), text[-3000:]
    assert all("rank 0 on" not in ln and "not finite in its loss or gradients" in ln for ln in lines), lines
    assert json.loads((tmp_path / "again" / "replicas.json").read_text())["stopped"].startswith("the replicas went")
    ending, decision = ending_of(tmp_path / "again", again.returncode)  # the launcher's auto-resume reads it so
    assert (ending.kind, ending.exit_code, ending.hosts) == (endings.NODE_FAULT, 70, (HOST,)), ending
    assert decision.action == autoresume.CHECK_THEN_RESUME, decision


@pytest.mark.launches
def test_nan_gradients_on_one_rank_are_named_before_the_average_under_ddp(tmp_path):
    """Rank 1's gradients are NaN in one step; rank 0's become NaN only through the average, a step later: the
    hook on each parameter sees rank 1's before DDP's allreduce does, so rank 1 alone is named."""
    clean = tmp_path / "clean"
    train(2, ARGS + ["--output-dir", str(clean)], backend="ddp")
    proc = faulty(tmp_path, "nan", "nan", "11", backend="ddp")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    assert (
        f"replica check: rank 1 on {HOST}: a value that is not finite in its loss or gradients, first in its step 11"
        in text
    )
    assert "rank 0 on" not in text.split("replica check:", 1)[1].splitlines()[0]
    assert "replica check: rolled back to checkpoint-epoch-0001.pt" in text
    assert_equal_weights(tmp_path / "nan", clean)


def test_the_judgement_names_the_odd_rank_out_and_the_first_tensor():
    names, hosts = ["a.weight", "b.weight"], ["h0", "h1", "h2"]
    ok = {"fingerprint": [1, 2], "first_bad": -1}
    assert sentinel.judge([ok, ok, ok], names, hosts) is None
    odd = sentinel.judge([ok, {"fingerprint": [1, 3], "first_bad": -1}, ok], names, hosts)
    assert (
        odd["ranks"] == [1] and odd["line"] == "rank 1 on h1: parameters differ from the other ranks' (first: b.weight)"
    )
    tie = sentinel.judge([ok, {"fingerprint": [0, 2], "first_bad": -1}], names, hosts[:2])
    assert tie["ranks"] == [1]  # two ranks: rank 0's is the reference
    nan = sentinel.judge([{**ok, "first_bad": 5}, {**ok, "first_bad": 4}, ok], names, hosts)
    assert nan["ranks"] == [1] and nan["kind"] == "not finite"


def test_one_flipped_bit_changes_the_fingerprint_in_any_layout():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    before = sentinel.fingerprint(model)
    assert sentinel.fingerprint(model.to(memory_format=torch.channels_last)) == before  # logical order
    with torch.no_grad():
        model[0].weight.view(torch.int32)[1, 2, 0, 1].bitwise_xor_(1 << 30)  # channels_last: no flat view
    after = sentinel.fingerprint(model)
    assert after != before and [i for i, (a, b) in enumerate(zip(before, after)) if a != b] == [1]  # 0.weight (by name)
    model[1].running_mean.add_(1.0)  # running statistics are each rank's own: not fingerprinted
    assert sentinel.fingerprint(model) == after
