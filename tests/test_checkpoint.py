import pathlib

import pytest

from payloads.common import checkpoint


def _write(path: pathlib.Path, text: str) -> None:
    checkpoint.write_atomically(path, lambda p: p.write_text(text))


def test_latest_and_prune(tmp_path):
    for e in (1, 2, 3, 10):
        _write(checkpoint.path_for(tmp_path, e, ".pt"), f"epoch {e}")
    (tmp_path / "checkpoint-epoch-0099.ckpt").write_text("other framework")
    (tmp_path / ".checkpoint-epoch-0011.pt.tmp-1").write_text("half written")
    epoch, path = checkpoint.latest(tmp_path, ".pt")
    assert (epoch, path.read_text()) == (10, "epoch 10")
    checkpoint.prune(tmp_path, ".pt", keep=2)
    assert [e for e, _ in checkpoint.list_checkpoints(tmp_path, ".pt")] == [3, 10]


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path):
    _write(checkpoint.path_for(tmp_path, 1, ".pt"), "good")

    def crash(p: pathlib.Path) -> None:
        p.write_text("partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        checkpoint.write_atomically(checkpoint.path_for(tmp_path, 2, ".pt"), crash)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-epoch-0001.pt"]
    assert checkpoint.latest(tmp_path, ".pt")[1].read_text() == "good"
