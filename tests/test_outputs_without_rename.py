"""The payloads on an output folder where rename raises (as on a blob mount without it: BlobFuse documents
renames as a copy and a delete, learn.microsoft.com/azure/storage/blobs/blobfuse2-compare-linux-file-system):
two real Horovod processes train, save, resume, and the resumed run equals a straight one."""

import errno
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import TINY, env, final_weights, metrics, train

pytestmark = pytest.mark.launches  # starts training processes: serial under xdist (tests/conftest.py)

HOOK = pathlib.Path(__file__).with_name("no_rename")


@pytest.fixture
def no_rename(tmp_path, monkeypatch):
    """Every process the test starts loads tests/no_rename/sitecustomize.py: rename under tmp_path/runs raises."""
    runs, log = tmp_path / "runs", tmp_path / "hooked"
    runs.mkdir()
    log.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(HOOK) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("NO_RENAME_UNDER", str(runs))
    monkeypatch.setenv("NO_RENAME_LOG", str(log))
    # The hook bites: a process under it cannot rename inside the output folder.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; open(sys.argv[1], 'w').close(); os.replace(sys.argv[1], sys.argv[1] + '.b')",
            str(runs / "probe"),
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode != 0 and f"[Errno {errno.EXDEV}]" in probe.stderr, probe.stderr
    return runs, log


def _ranks_hooked(log: pathlib.Path, module: str) -> int:
    """Training processes (not the horovodrun launcher, whose command line names the module too) that loaded it."""
    lines = [p.read_text() for p in log.iterdir()]
    return sum(f"-m {module}" in line and "horovodrun" not in line for line in lines)


def _npz_weights(out: pathlib.Path) -> list[np.ndarray]:
    from payloads.common import checkpoint

    _, path = checkpoint.latest(out / "checkpoints", ".npz")
    with np.load(path) as z:
        return [z[k] for k in sorted(z.files) if k.startswith("model/")]


@pytest.mark.parametrize("payload", ["tensorflow", "keras"])
def test_tensorflow_payloads_save_and_resume_where_rename_raises(no_rename, payload):
    runs, log = no_rename
    straight, resumed = runs / "straight", runs / "resumed"
    args = TINY + ["--batch-size", "8", "--warmup-epochs", "1"]
    train(2, args + ["--epochs", "2", "--output-dir", str(straight)], payload=payload)
    train(2, args + ["--epochs", "1", "--output-dir", str(resumed)], payload=payload)
    proc = train(2, args + ["--epochs", "2", "--output-dir", str(resumed)], payload=payload)
    assert _ranks_hooked(log, f"payloads.{payload}.train") == 6, "both ranks of all three runs ran under the hook"
    assert "resuming from" in proc.stdout + proc.stderr
    a, b = _npz_weights(straight), _npz_weights(resumed)
    diff = max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(a, b))
    assert diff < 1e-5, f"resumed run differs from a straight one by {diff}"
    assert [e["epoch"] for e in metrics(resumed)["epochs"]] == [1, 2]


def test_pytorch_payload_saves_and_resumes_where_rename_raises(no_rename):
    """Passes through checkpoint.write_atomically, now the rename-free checkpoint.write, and MetricsFile."""
    runs, log = no_rename
    straight, resumed = runs / "straight", runs / "resumed"
    args = TINY + ["--batch-size", "8", "--warmup-epochs", "1"]
    train(2, args + ["--epochs", "2", "--output-dir", str(straight)])
    train(2, args + ["--epochs", "1", "--output-dir", str(resumed)])
    proc = train(2, args + ["--epochs", "2", "--output-dir", str(resumed)])
    assert _ranks_hooked(log, "payloads.pytorch.train") == 6
    assert "resuming from" in proc.stdout + proc.stderr
    a, b = final_weights(straight), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [e["epoch"] for e in metrics(resumed)["epochs"]] == [1, 2]
