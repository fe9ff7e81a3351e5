"""Checkpoints and metrics without rename: a crash at any point leaves the previous complete checkpoint or the new
complete one as the newest resumable file, never a truncated one; rename and folder fsync may fail."""

import errno
import json
import os
import pathlib
import subprocess
import sys

import pytest
from helpers import ROOT

from payloads.common import checkpoint, durable
from payloads.common.metrics import MetricsFile, read, spare_for


def _write(path: pathlib.Path, data) -> None:
    data = data.encode() if isinstance(data, str) else data
    checkpoint.write(path, lambda p: p.write_bytes(data))


def test_latest_and_prune(tmp_path):
    for e in (1, 2, 3, 10):
        _write(checkpoint.path_for(tmp_path, e, ".pt"), f"epoch {e}")
    (tmp_path / "checkpoint-epoch-0099.ckpt").write_text("other framework")
    (tmp_path / ".checkpoint-epoch-0011.pt.tmp-1").write_text("half written")
    (tmp_path / "checkpoint-epoch-0012.pt").write_text("no marker: cut short")
    epoch, path = checkpoint.latest(tmp_path, ".pt")
    assert (epoch, path.read_text()) == (10, "epoch 10")
    checkpoint.prune(tmp_path, ".pt", keep=2)
    assert [e for e, _ in checkpoint.list_checkpoints(tmp_path, ".pt")] == [3, 10]
    assert not checkpoint.marker_for(checkpoint.path_for(tmp_path, 2, ".pt")).exists(), "markers pruned too"
    assert (tmp_path / "checkpoint-epoch-0012.pt").exists(), "an unfinished file newer than the newest is left"


def test_a_failed_save_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path):
    _write(checkpoint.path_for(tmp_path, 1, ".pt"), "good")

    def crash(p: pathlib.Path) -> None:
        p.write_text("partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        checkpoint.write(checkpoint.path_for(tmp_path, 2, ".pt"), crash)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".checkpoint-epoch-0001.pt.complete",
        "checkpoint-epoch-0001.pt",
    ]
    assert checkpoint.latest(tmp_path, ".pt")[1].read_text() == "good"


# A real crash: the writing process dies (os._exit: no finally, no cleanup) at each point of checkpoint.write.
_CRASHER = r"""
import os, pathlib, sys
from payloads.common import checkpoint, durable
point, path, data = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]).read_bytes()
real_copy, real_write_bytes = durable.copy, durable.write_bytes

def die():
    os._exit(9)

def save(p):
    if point == "in_save":
        p.write_bytes(data[: len(data) // 2]); die()
    p.write_bytes(data)

def copy(src, dst, chunk=8 << 20):
    if point == "marker_removed":
        die()
    if point == "mid_copy":
        with open(dst, "wb") as f:
            f.write(src.read_bytes()[: len(data) // 2])
        die()
    return real_copy(src, dst, chunk)

def write_bytes(p, b):
    if point == "before_marker":
        die()
    if point == "mid_marker":
        with open(p, "wb") as f:
            f.write(b[: len(b) // 2])
        die()
    real_write_bytes(p, b)
    if point == "after_marker":
        die()

durable.copy, durable.write_bytes = copy, write_bytes
checkpoint.write(path, save)
"""

POINTS = ["in_save", "marker_removed", "mid_copy", "before_marker", "mid_marker", "after_marker"]


@pytest.mark.launches
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("resave", [False, True], ids=["new-epoch", "same-epoch-again"])
def test_a_crash_at_any_point_leaves_a_complete_checkpoint_newest(tmp_path, point, resave):
    one, old_two, new_two = (bytes([i]) * (3 << 20) + bytes(range(i)) for i in (1, 2, 3))
    _write(checkpoint.path_for(tmp_path / "ck", 1, ".pt"), one)
    if resave:  # epoch 2 was saved before, and the resumed run saves epoch 2 again
        _write(checkpoint.path_for(tmp_path / "ck", 2, ".pt"), old_two)
    (tmp_path / "data").write_bytes(new_two)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _CRASHER,
            point,
            str(checkpoint.path_for(tmp_path / "ck", 2, ".pt")),
            str(tmp_path / "data"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 9, proc.stderr  # it died where it was told to
    epoch, path = checkpoint.latest(tmp_path / "ck", ".pt")
    got = path.read_bytes()
    if point == "after_marker":
        assert (epoch, got) == (2, new_two)
    elif resave and point == "in_save":  # the old epoch-2 file was not touched yet
        assert (epoch, got) == (2, old_two)
    else:
        assert (epoch, got) == (1, one), f"crash at {point}: chose epoch {epoch} of {len(got)} bytes"


def test_a_file_that_differs_from_its_marker_is_not_resumed(tmp_path, caplog):
    _write(checkpoint.path_for(tmp_path, 1, ".pt"), "one")
    _write(checkpoint.path_for(tmp_path, 2, ".pt"), "two")
    checkpoint.path_for(tmp_path, 2, ".pt").write_text("tw0")  # same size, other bytes
    assert checkpoint.latest(tmp_path, ".pt")[0] == 1
    assert "does not match the SHA-256" in caplog.text
    checkpoint.path_for(tmp_path, 1, ".pt").write_text("on")  # truncated: not even listed
    assert checkpoint.list_checkpoints(tmp_path, ".pt") == [(2, checkpoint.path_for(tmp_path, 2, ".pt"))]
    assert checkpoint.latest(tmp_path, ".pt") is None


def test_files_without_a_marker_are_named_when_nothing_resumes(tmp_path, caplog):
    (tmp_path / "checkpoint-epoch-0003.pt").write_text("written before markers existed")
    assert checkpoint.latest(tmp_path, ".pt") is None
    assert "checkpoint-epoch-0003.pt have no completion marker" in caplog.text


@pytest.fixture
def no_rename(monkeypatch):
    """A file system where rename raises, as a mount without rename would (EXDEV, as for a cross-device move)."""

    def refuse(*args, **kwargs):
        raise OSError(errno.EXDEV, "rename not supported here")

    for name in ("rename", "replace", "renames"):
        monkeypatch.setattr(os, name, refuse)


def test_checkpoints_and_metrics_need_no_rename(tmp_path, no_rename):
    with pytest.raises(OSError):  # the fixture bites
        os.replace(tmp_path / "a", tmp_path / "b")
    for e in (1, 2):
        _write(checkpoint.path_for(tmp_path, e, ".pt"), f"epoch {e}")
    checkpoint.prune(tmp_path, ".pt", keep=1)
    assert [(e, p.read_text()) for e, p in checkpoint.list_checkpoints(tmp_path, ".pt")] == [(2, "epoch 2")]
    m = MetricsFile(tmp_path / "metrics.json", {"config": {"mlflow": False}})
    m.add_epoch({"epoch": 1, "train_loss": 1.0})
    m.add_epoch({"epoch": 2, "train_loss": 0.5})
    assert [e["epoch"] for e in json.loads((tmp_path / "metrics.json").read_text())["epochs"]] == [1, 2]


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP, errno.EACCES])
def test_a_folder_fsync_the_file_system_lacks_is_skipped(tmp_path, monkeypatch, code):
    """FUSE file systems may not implement fsyncdir (the BlobFuse2 wiki, "Blobfuse2 Limitations"); Linux answers
    EINVAL for a file system without fsync (fsync(2))."""
    real = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(code, "not supported")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _write(checkpoint.path_for(tmp_path, 1, ".pt"), "one")
    assert checkpoint.latest(tmp_path, ".pt")[0] == 1


def test_a_real_write_error_is_not_hidden(tmp_path, monkeypatch):
    def fsync(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="I/O error"):
        _write(checkpoint.path_for(tmp_path, 1, ".pt"), "one")
    assert checkpoint.list_checkpoints(tmp_path, ".pt") == []


def test_metrics_survive_a_crash_while_either_copy_is_written(tmp_path):
    path = tmp_path / "metrics.json"
    m = MetricsFile(path, {"config": {"mlflow": False}})
    m.add_epoch({"epoch": 1})
    m.add_epoch({"epoch": 2})
    whole = path.read_bytes()
    # Cut short while metrics.json itself was rewritten: the spare copy holds the new text.
    path.write_bytes(whole[: len(whole) // 2])
    assert [e["epoch"] for e in read(path)["epochs"]] == [1, 2]
    assert [e["epoch"] for e in MetricsFile(path, {"config": {"mlflow": False}}).data["epochs"]] == [1, 2]
    # Cut short while the spare was written: metrics.json still holds the previous text.
    path.write_bytes(whole)
    spare_for(path).write_bytes(b'{"epochs": [')
    assert [e["epoch"] for e in read(path)["epochs"]] == [1, 2]


def test_durable_copy_reports_size_and_digest(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 100)
    assert durable.copy(tmp_path / "a", tmp_path / "b", chunk=7) == (100, durable.sha256(tmp_path / "a"))
    assert (tmp_path / "b").read_bytes() == b"x" * 100


def test_a_payload_process_ends_through_finish_as_python_would_end_it(tmp_path):
    """entry.finish skips the module teardown only: a non-daemon thread's work completes, a thread pool's idle
    workers are let go (inductor's compile pool hung a --compile run at exit when they were joined first), the
    atexit functions run, the exit code is the one given."""
    script = tmp_path / "ends.py"
    script.write_text(
        "import atexit, concurrent.futures, pathlib, sys, threading, time\n"
        "from payloads.common import entry\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "pool = concurrent.futures.ThreadPoolExecutor(2)\n"
        "pool.submit(lambda: 1).result()\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), (out / 'thread').write_text('done'))).start()\n"
        "atexit.register(lambda: (out / 'atexit').write_text('ran'))\n"
        "print('buffered line', end='')\n"
        "entry.finish(3)\n"
    )
    from helpers import ROOT, env

    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered line"
    assert (tmp_path / "thread").read_text() == "done" and (tmp_path / "atexit").read_text() == "ran"
