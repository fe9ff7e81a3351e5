"""The PyTorch payload on an output folder where rename raises (tests/no_rename, conftest.py's
processes_without_rename): two real Horovod processes train, save, resume, and the resumed run equals a straight
one bitwise. This is the suite's PyTorch resume test (the TensorFlow and Keras one, under the same hook, is in
test_tensorflow.py)."""

import pytest
import torch
from helpers import TINY, final_weights, metrics, train

pytestmark = pytest.mark.launches  # starts training processes: serial under xdist (tests/conftest.py)


def test_pytorch_resume_equals_a_straight_run_where_rename_raises(processes_without_rename):
    """Passes through checkpoint.write (rename-free) and MetricsFile on every save."""
    runs, hooked = processes_without_rename
    straight, resumed = runs / "straight", runs / "resumed"
    args = TINY + ["--batch-size", "8", "--warmup-epochs", "1"]
    train(2, args + ["--epochs", "2", "--output-dir", str(straight)])
    train(2, args + ["--epochs", "1", "--output-dir", str(resumed)])
    proc = train(2, args + ["--epochs", "2", "--output-dir", str(resumed)])
    assert hooked("payloads.pytorch.train") == 6, "both ranks of all three runs ran under the hook"
    assert "resuming from" in proc.stdout + proc.stderr
    a, b = final_weights(straight), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), f"max diff {max((a[k] - b[k]).abs().max().item() for k in a)}"
    assert [e["epoch"] for e in metrics(resumed)["epochs"]] == [1, 2]
    assert metrics(resumed)["summary"]["epochs_run"] == 1
