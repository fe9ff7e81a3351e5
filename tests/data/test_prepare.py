"""Prepare: image tree -> WebDataset and TFRecord shards + manifest; resumable; bad input fails early."""

import io
import pathlib

import numpy as np
import pytest
from conftest import write_tree
from PIL import Image

from datatools import prepare
from payloads.common import manifest
from payloads.common.errors import ConfigError


def _tar_samples(folder: pathlib.Path, names):
    from webdataset.tariterators import group_by_keys, tar_file_expander

    out = {}
    for name in names:
        with open(folder / name, "rb") as f:
            for s in group_by_keys(tar_file_expander([{"url": name, "stream": f}])):
                out[s["__key__"]] = (s.get("jpg") or s.get("png"), int(s["cls"]), name)
    return out


def _rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def test_webdataset_round_trip_keeps_pixels_labels_and_counts(tree, tmp_path):
    out = tmp_path / "shards"
    m = prepare.run(tree, out, shards=4, formats=["webdataset"], progress=False)["webdataset"]
    folder = out / "webdataset"
    assert m.complete and manifest.load_complete(folder, "webdataset").complete
    assert m.classes == ["n01", "n02", "n03"]
    inputs = prepare.scan(tree)
    for split, n_inputs in ((manifest.TRAIN, 18), (manifest.VALIDATION, 6)):
        s = m.splits[split]
        assert s.inputs == s.samples == n_inputs and len(s.shards) == 4 and not s.skipped
        got = _tar_samples(folder, [sh.name for sh in s.shards])
        assert len(got) == n_inputs
        # Per-shard counts and checksums in the manifest are those of the files.
        for sh in s.shards:
            assert sum(1 for v in got.values() if v[2] == sh.name) == sh.samples
            assert manifest.md5_file(folder / sh.name) == sh.md5 and (folder / sh.name).stat().st_size == sh.bytes
        # Every input image is in the shards once, with its label and the same pixels.
        for key, (data, label, _) in got.items():
            path, want_label = inputs.splits[split][int(key)]
            assert label == want_label
            assert np.array_equal(_rgb(data), _rgb(pathlib.Path(path).read_bytes())), path
    # Shards mix classes (dealt after a shuffle), so a shuffle buffer need not span the whole set.
    first = _tar_samples(folder, [m.splits[manifest.TRAIN].shards[0].name])
    assert len({label for _, label, _ in first.values()}) > 1


def test_tfrecord_round_trip_is_read_by_the_tensorflow_reader(tree, tmp_path):
    import tensorflow as tf

    from payloads.tensorflow import tfrecords

    out = tmp_path / "shards"
    m = prepare.run(tree, out, shards=2, formats=["tfrecord"], progress=False)["tfrecord"]
    train, val = tfrecords.find(out / "tfrecord")  # the TF payload's own discovery: names and count match
    assert [p.name for p in train] == [s.name for s in m.splits["train"].shards]
    assert [tfrecords.count_records(p) for p in train] == [s.samples for s in m.splits["train"].shards]
    assert sum(tfrecords.count_records(p) for p in val) == 6
    inputs = prepare.scan(tree)
    wanted = sorted((lbl, _rgb(pathlib.Path(p).read_bytes()).tobytes()) for p, lbl in inputs.splits["train"])
    got = []
    for raw in tf.data.TFRecordDataset([str(p) for p in train]):
        ex = tf.io.parse_single_example(raw, tfrecords.feature_spec())
        got.append((int(ex["image/class/label"]), _rgb(ex["image/encoded"].numpy()).tobytes()))
    assert sorted(got) == wanted


def test_resize_shrinks_the_shorter_side_only_when_larger(tmp_path):
    root = tmp_path / "img"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        Image.new("RGB", (80, 40), "red").save(root / c / "big.jpg")
        Image.new("RGB", (10, 12), "blue").save(root / c / "small.jpg")
    prepare.run(root, tmp_path / "out", shards=1, formats=["webdataset"], resize=20, progress=False)
    sizes = sorted(
        Image.open(io.BytesIO(d)).size
        for d, _, _ in _tar_samples(tmp_path / "out" / "webdataset", ["train-00000-of-00001.tar"]).values()
    )
    assert sizes == [(10, 12), (10, 12), (40, 20), (40, 20)]


def test_interrupted_preparation_resumes_without_redoing_finished_shards(tree, tmp_path, monkeypatch):
    out, straight = tmp_path / "out", tmp_path / "straight"
    real, calls = prepare.write_shard, []

    def dies_on_third(job):
        calls.append((job.split, job.index))
        if len(calls) == 3:
            raise KeyboardInterrupt  # what Ctrl-C or a killed VM does mid-run
        return real(job)

    monkeypatch.setattr(prepare, "write_shard", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        prepare.run(tree, out, shards=3, progress=False)
    for fmt in manifest.FORMATS:
        with pytest.raises(ConfigError, match="incomplete"):  # nothing half-done looks finished
            manifest.load_complete(out / fmt, fmt)
    done = {p.name: p.stat().st_mtime_ns for p in (out / "webdataset").glob("train-*")}
    assert len(done) == 2

    calls.clear()
    monkeypatch.setattr(prepare, "write_shard", lambda job: (calls.append((job.split, job.index)), real(job))[1])
    prepare.run(tree, out, shards=3, progress=False)
    assert calls == [("train", 2), ("validation", 0), ("validation", 1), ("validation", 2)]
    assert {p.name: p.stat().st_mtime_ns for p in (out / "webdataset").glob("train-*") if p.name in done} == done
    assert not list(out.rglob("*.tmp"))
    # Same result as a run that was never interrupted (tar mtimes are fixed, so even the bytes match).
    monkeypatch.setattr(prepare, "write_shard", real)
    prepare.run(tree, straight, shards=3, progress=False)
    for fmt in manifest.FORMATS:
        a, b = manifest.load_complete(out / fmt, fmt), manifest.load_complete(straight / fmt, fmt)
        assert [s.md5 for s in a.files()] == [s.md5 for s in b.files()]


def test_corrupt_images_are_reported_by_path_and_skipped(tree, tmp_path, caplog):
    garbage = tree / "train" / "n02" / "garbage.jpg"
    garbage.write_bytes(b"not an image at all")
    truncated = tree / "train" / "n01" / "truncated.jpg"
    good = (tree / "train" / "n01" / "n01_000.JPEG").read_bytes()
    truncated.write_bytes(good[: len(good) // 2])
    m = prepare.run(tree, tmp_path / "out", shards=2, formats=["webdataset"], progress=False)["webdataset"]
    train = m.splits["train"]
    assert train.inputs == 20 and train.samples == 18
    assert sorted(k["path"] for k in train.skipped) == sorted([str(garbage), str(truncated)])
    assert all(k["shard"].startswith("train-") for k in train.skipped)
    assert str(garbage) in caplog.text and str(truncated) in caplog.text


def test_empty_class_or_missing_tree_fails_before_anything_is_written(tmp_path):
    root = write_tree(tmp_path / "img")
    (root / "train" / "n04").mkdir()
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"n04 has no images.*add images or remove the folder"):
        prepare.run(root, out, shards=2, progress=False)
    assert not out.exists()
    with pytest.raises(ConfigError, match="does not exist"):
        prepare.run(tmp_path / "nowhere", out, shards=2, progress=False)
    assert not out.exists()


def test_flat_validation_folder_is_relabelled_from_the_ground_truth_file(tmp_path):
    root = write_tree(tmp_path / "img", val_per_class=2, flat_val=True)
    m = prepare.run(
        root, tmp_path / "out", shards=1, formats=["webdataset"], val_labels=root / "val_labels.txt", progress=False
    )["webdataset"]
    got = _tar_samples(tmp_path / "out" / "webdataset", ["validation-00000-of-00001.tar"])
    val_files = sorted(p for p in (root / "val").iterdir())
    labels = (root / "val_labels.txt").read_text().split()
    inputs = prepare.scan(root, root / "val_labels.txt")
    assert [p for p, _ in inputs.splits["validation"]] == [str(p) for p in val_files]
    for key, (data, label, _) in got.items():
        assert m.classes[label] == labels[int(key)]
        assert np.array_equal(_rgb(data), _rgb(val_files[int(key)].read_bytes()))
    # Flat images without labels, and labels for unknown classes, fail before writing.
    with pytest.raises(ConfigError, match="--val-labels"):
        prepare.run(root, tmp_path / "out2", shards=1, progress=False)
    (root / "bad.txt").write_text("nXX\n" * len(val_files))
    with pytest.raises(ConfigError, match="no training folder, e.g. nXX"):
        prepare.run(root, tmp_path / "out2", shards=1, val_labels=root / "bad.txt", progress=False)
    assert not (tmp_path / "out2").exists()


def test_a_different_preparation_into_the_same_folder_is_refused(tree, tmp_path):
    prepare.run(tree, tmp_path / "out", shards=2, formats=["webdataset"], progress=False)
    with pytest.raises(ConfigError, match="different preparation.*new --output-dir"):
        prepare.run(tree, tmp_path / "out", shards=3, formats=["webdataset"], progress=False)


def test_command_line_prints_counts_and_reports_errors(tree, tmp_path, capsys):
    assert (
        prepare.main(
            [
                "--image-dir",
                str(tree),
                "--output-dir",
                str(tmp_path / "o"),
                "--shards",
                "2",
                "--formats",
                "webdataset",
                "--workers",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "webdataset: 18 train images in 2 shards" in capsys.readouterr().out
    assert prepare.main(["--image-dir", str(tmp_path / "none"), "--output-dir", str(tmp_path / "o2")]) == 2
    assert "does not exist" in capsys.readouterr().err
