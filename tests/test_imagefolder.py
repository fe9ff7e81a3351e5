"""imagefolder.scan_shared: rank 0 lists the tree once and every rank gets its listing (or its error)."""

import json
import pathlib
import subprocess
import sys

import pytest
from helpers import ROOT, env

from payloads.common import imagefolder
from payloads.common.errors import ConfigError


def _tree(root: pathlib.Path, classes=("cat", "dog", "émeu"), per_class=3) -> pathlib.Path:
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            (root / c / f"img {i}\nline.JPEG").write_bytes(b"x")  # spaces, a newline: still one file each
        (root / c / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    return root


class _Wire:
    """Two ranks in one process: rank 0's broadcast_object records, rank 1's returns it (pickled, as Horovod's)."""

    def __init__(self):
        self.sent = None

    def rank0(self, obj):
        import pickle

        self.sent = pickle.dumps(obj)
        return obj

    def rank1(self, obj):
        assert obj is None
        import pickle

        return pickle.loads(self.sent)


def test_every_rank_gets_what_scan_returns(tmp_path):
    root = _tree(tmp_path / "train")
    wire = _Wire()
    zero = imagefolder.scan_shared(root, "data directory", 0, wire.rank0)
    one = imagefolder.scan_shared(root, "data directory", 1, wire.rank1)
    assert zero == one == imagefolder.scan(root)
    assert len(one.samples) == 9 and one.classes == ["cat", "dog", "émeu"]


def test_rank0s_config_error_is_raised_on_every_rank(tmp_path):
    (tmp_path / "train" / "empty").mkdir(parents=True)
    wire = _Wire()
    with pytest.raises(ConfigError) as zero:
        imagefolder.scan_shared(tmp_path / "train", "data directory", 0, wire.rank0)
    with pytest.raises(ConfigError) as one:
        imagefolder.scan_shared(tmp_path / "train", "data directory", 1, wire.rank1)
    assert str(zero.value) == str(one.value) and "has no images" in str(one.value)


def test_any_other_failure_of_rank0_fails_the_others_too(tmp_path, monkeypatch):
    def broken(root, what):
        raise PermissionError(13, "Permission denied", str(root))

    monkeypatch.setattr(imagefolder, "scan", broken)
    wire = _Wire()
    with pytest.raises(PermissionError):
        imagefolder.scan_shared(tmp_path, "data directory", 0, wire.rank0)
    with pytest.raises(RuntimeError, match="rank 0 could not list data directory .*PermissionError"):
        imagefolder.scan_shared(tmp_path, "data directory", 1, wire.rank1)


def _two_ranks(tree: pathlib.Path, out: pathlib.Path) -> tuple[subprocess.CompletedProcess, dict, dict]:
    out.mkdir()
    horovodrun = str(pathlib.Path(sys.executable).with_name("horovodrun"))
    cmd = [
        horovodrun,
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        sys.executable,
        str(ROOT / "tests" / "scan_shared_worker.py"),
        str(tree),
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=180)
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in (0, 1)]
    return proc, ranks[0], ranks[1]


@pytest.mark.launches
def test_two_horovod_processes_list_the_tree_once(tmp_path):
    tree = _tree(tmp_path / "train", classes=[f"n{i:08d}" for i in range(5)], per_class=4)
    proc, zero, one = _two_ranks(tree, tmp_path / "out")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert zero["listings"] >= 6, zero  # the count sees rank 0's scan (root + 5 class folders)...
    assert one["listings"] == 0, one  # ...and rank 1 never lists the tree
    assert one["samples"] == zero["samples"] == 20
    assert (one["digest"], one["classes"], one["first"]) == (zero["digest"], zero["classes"], zero["first"])
