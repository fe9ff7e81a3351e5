"""The PyTorch shard reader: images -> shards -> tensors, rank split, shuffling, in-memory cache."""

import os
import pathlib
import socket

import numpy as np
import pytest
import torch
from conftest import write_tree
from PIL import Image

from datatools import prepare
from payloads.common import manifest
from payloads.common.errors import ConfigError
from payloads.pytorch import decodedcache, decoders, shards, shardset


# Transforms called in the loader's own reader thread (workers=0): they need not be importable by a worker.
def pixels(img, rng):
    return img  # the decoded HxWx3 uint8 array, as decoded


def label_only(img, rng):
    return np.zeros((1, 1, 3), np.uint8)


def _labels(loader) -> list[list[int]]:
    return [b[1].tolist() for b in loader]


def test_round_trip_gives_the_pixels_labels_and_counts_of_the_images(tree, tmp_path):
    prepare.run(tree, tmp_path / "out", shards=3, formats=["webdataset"], progress=False)
    train, val, classes = shards.open_set(tmp_path / "out" / "webdataset")
    m = manifest.load_complete(tmp_path / "out" / "webdataset", "webdataset")
    assert classes == m.classes and len(train) == m.splits["train"].samples == 18 and len(val) == 6
    inputs = prepare.scan(tree)
    want = sorted((label, np.asarray(Image.open(p).convert("RGB")).tobytes()) for p, label in inputs.splits["train"])
    loader = shards.ShardLoader(train, shards.Reading(0, 1, 1, shuffle=False, workers=0, decoder="pillow"), pixels)
    got = sorted((int(y), x[0].numpy().tobytes()) for x, y, skipped in loader)
    assert len(loader) == 18 and got == want


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_ranks_read_disjoint_parts_that_cover_the_set_with_equal_steps(one_per_class, size):
    train, _, _ = shards.open_set(one_per_class)
    for epoch in (0, 1):
        parts, steps = [], set()
        for rank in range(size):
            loader = shards.ShardLoader(
                train, shards.Reading(rank, size, 4, seed=7, shuffle_buffer=3, workers=0), label_only
            )
            loader.set_epoch(epoch)
            batches = _labels(loader)
            steps.add(len(batches))
            assert all(1 <= len(b) <= 4 for b in batches)
            parts.append([x for b in batches for x in b])
        every = [x for p in parts for x in p]
        assert sorted(every) == list(range(30)), f"{size} ranks, epoch {epoch}: {parts}"  # disjoint and complete
        assert len(steps) == 1, steps  # every rank runs the same number of steps
    # 6 shards: 1, 2 and 3 ranks read whole files of their own; 4 and 5 fall back to every size-th record.
    assert shards.plan(train.counts, 0, size, 4).stride == (6 % size != 0)


def test_shuffle_changes_order_per_epoch_and_repeats_for_the_same_seed(one_per_class):
    train, _, _ = shards.open_set(one_per_class)

    def order(epoch, seed=3):
        loader = shards.ShardLoader(train, shards.Reading(0, 1, 5, seed=seed, shuffle_buffer=8, workers=0), label_only)
        loader.set_epoch(epoch)
        return [x for b in _labels(loader) for x in b]

    assert order(0) == order(0)
    assert order(0) != order(1) and sorted(order(0)) == sorted(order(1))
    unshuffled = shards.ShardLoader(train, shards.Reading(0, 1, 5, seed=3, shuffle=False, workers=0), label_only)
    assert [x for b in _labels(unshuffled) for x in b] != order(0)


def test_augmentation_is_fixed_by_seed_epoch_and_sample_not_by_worker(one_per_class):
    train, _, _ = shards.open_set(one_per_class)

    def run(epoch, workers):
        loader = shards.ShardLoader(
            train, shards.Reading(0, 1, 6, seed=1, workers=workers), shards.Transform(16, train=True)
        )
        loader.set_epoch(epoch)
        return [(x.clone(), y.clone()) for x, y, _ in loader]  # a batch is its slot's view until the next one

    a, b, c, inline = run(0, 1), run(0, 3), run(1, 2), run(0, 0)  # worker processes, or none
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, inline))
    assert a[0][0].shape == (6, 16, 16, 3) and a[0][0].dtype == torch.uint8
    assert not all(torch.equal(x1, x2) for (x1, _), (x2, _) in zip(a, c))


def test_cache_keeps_decoded_images_so_later_epochs_read_no_files(tmp_path):
    root = write_tree(tmp_path / "img", classes=[f"c{i}" for i in range(8)], per_class=1)
    prepare.run(root, tmp_path / "out", shards=2, formats=["webdataset"], progress=False)
    folder = tmp_path / "out" / "webdataset"
    train, _, _ = shards.open_set(folder)
    cached = shards.ShardLoader(train, shards.Reading(0, 1, 4, shuffle_buffer=2, cache=True, workers=0), label_only)
    plain = shards.ShardLoader(train, shards.Reading(0, 1, 4, shuffle_buffer=2, workers=0), label_only)
    pix = shards.ShardLoader(train, shards.Reading(0, 1, 1, cache=True, workers=0), pixels)
    # The same through worker processes, which map the cache file (eval crops: no randomness).
    crops = shards.ShardLoader(
        train, shards.Reading(0, 1, 2, cache=True, shuffle=False, workers=2), shards.Transform(8, train=False)
    )
    crops0 = sorted((int(y), x.numpy().tobytes()) for xs, ys, _ in crops for x, y in zip(xs, ys))
    epoch0 = sorted((int(y), x[0].numpy().tobytes()) for x, y, _ in pix)
    assert len(_labels(cached)) == 2 and len(cached.cache) == 8 and len(pix.cache) == 8
    assert len(_labels(plain)) == 2 and plain.cache is None
    for f in train.files:
        f.rename(f.with_suffix(".moved"))  # the shards are gone: only memory can serve epoch 2
    cached.set_epoch(1)
    pix.set_epoch(1)
    assert sorted(x for b in _labels(cached) for x in b) == list(range(8))
    # The cache holds the decoded images themselves: epoch 2's pixels equal those read from the files.
    assert sorted((int(y), x[0].numpy().tobytes()) for x, y, _ in pix) == epoch0
    crops.set_epoch(1)
    assert len(crops.cache) == 8
    assert sorted((int(y), x.numpy().tobytes()) for xs, ys, _ in crops for x, y in zip(xs, ys)) == crops0
    with pytest.raises(ConfigError, match="cannot open shard .*check the data input"):
        _labels(plain)


def _eight_images(tmp_path):
    root = write_tree(tmp_path / "img", classes=[f"c{i}" for i in range(8)], per_class=1)
    prepare.run(root, tmp_path / "out", shards=2, formats=["webdataset"], progress=False)
    train, _, _ = shards.open_set(tmp_path / "out" / "webdataset")
    return train


def test_the_cache_is_a_file_in_cache_dir_removed_with_its_loader(tmp_path):
    train = _eight_images(tmp_path)
    folder = tmp_path / "cache"
    folder.mkdir()
    loader = shards.ShardLoader(train, shards.Reading(0, 1, 1, cache=True, cache_dir=folder, workers=0), pixels)
    first = sorted((int(y), x.numpy().tobytes()) for xs, ys, _ in loader for x, y in zip(xs, ys))
    (kept,) = folder.iterdir()
    assert kept.name.startswith(f"decoded-{socket.gethostname()}-{os.getpid()}-rank0-")
    # Its size is exact before epoch 1 (the images' headers): a page of status bytes, then the decoded images.
    assert loader.cache.nbytes == sum(len(b) for _, b in first)
    assert kept.stat().st_size == loader.cache_bytes() == 4096 + loader.cache.nbytes
    loader.set_epoch(1)
    assert sorted((int(y), x.numpy().tobytes()) for xs, ys, _ in loader for x, y in zip(xs, ys)) == first
    del loader
    import gc

    gc.collect()
    assert list(folder.iterdir()) == []


@pytest.mark.launches
def test_a_cache_left_by_a_killed_run_is_removed_and_a_live_ones_kept(tmp_path):
    """A live run holds a lock on its file; a killed run's lock went with its process. The process id in the name
    does not decide: a new container numbers its processes from 1 again, so a killed run's id is often a live
    process's (here: this one's)."""
    import fcntl

    host = socket.gethostname()
    stale = tmp_path / f"decoded-{host}-{os.getpid()}-rank0-x.u8"  # a killed run's, with a live process's id
    live = tmp_path / f"decoded-{host}-{os.getpid()}-rank1-y.u8"
    other = tmp_path / f"decoded-otherhost-{os.getpid()}-rank0-z.u8"  # another node's, on a shared folder
    for f in (stale, live, other):
        f.write_bytes(b"x")
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        decodedcache.remove_stale(tmp_path)
        assert not stale.exists() and live.exists() and other.exists()
    # A cache of this process is locked from its making to its removal.
    train = _eight_images(tmp_path / "set")
    loader = shards.ShardLoader(train, shards.Reading(0, 1, 1, cache=True, cache_dir=tmp_path, workers=0), pixels)
    next(iter(loader))
    decodedcache.remove_stale(tmp_path)
    assert pathlib.Path(loader.cache.path).exists()


def test_a_cache_that_cannot_fit_is_refused_before_epoch_1_with_the_figure_and_the_fix(tmp_path, monkeypatch):
    """The node's processes' caches (each exact, from the images' headers) are checked against the folder's free
    space before anything is decoded."""
    train = _eight_images(tmp_path)
    loader = shards.ShardLoader(train, shards.Reading(0, 1, 4, cache=True, cache_dir=tmp_path, workers=0), pixels)
    need = loader.cache_bytes()
    assert need == 4096 + sum(h * w * 3 for h, w in loader.index.dims.tolist()) and need > 4096
    real = os.statvfs

    class Small:
        f_frsize, f_bavail = 1, need * 8 - 1  # room for 7 processes' caches, not 8

    monkeypatch.setattr(decodedcache.os, "statvfs", lambda path: Small() if str(path) == str(tmp_path) else real(path))
    assert shards.check_cache_room([loader], 7) == need
    with pytest.raises(ConfigError) as e:
        shards.check_cache_room([loader, None], 8)
    text = str(e.value)
    assert "--cache-decoded" in text and "x 8 process(es)" in text and str(tmp_path) in text
    assert "--cache-dir" in text and "drop --cache-decoded" in text
    elsewhere = shards.ShardLoader(
        train, shards.Reading(0, 1, 4, cache=True, cache_dir=tmp_path / "missing", workers=0), pixels
    )
    with pytest.raises(ConfigError, match="--cache-dir .*no such folder"):
        shards.check_cache_room([elsewhere], 1)
    off = shards.ShardLoader(train, shards.Reading(0, 1, 4, workers=0), pixels)
    assert shards.check_cache_room([off], 8) == 0  # no --cache-decoded: nothing to check


def test_a_full_folder_at_epoch_1_drops_the_cache_and_training_goes_on(tmp_path, monkeypatch, caplog):
    """Another job can fill the disk after the check: the cache file's room is reserved when it is made
    (posix_fallocate), so a full folder is an OSError then, never a SIGBUS in a worker's mapping, and the loader goes
    on decoding every epoch."""
    import errno

    train = _eight_images(tmp_path)
    loader = shards.ShardLoader(train, shards.Reading(0, 1, 1, cache=True, cache_dir=tmp_path, workers=0), pixels)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(decodedcache.os, "posix_fallocate", full)
    first = sorted((int(y), x.numpy().tobytes()) for xs, ys, _ in loader for x, y in zip(xs, ys))
    assert len(first) == 8 and loader.cache is None and not loader.cache_wanted
    assert not list(tmp_path.glob("decoded-*")), "the file is removed"
    assert "--cache-decoded is off for rank 0: the folder is full" in caplog.text
    loader.set_epoch(1)
    assert sorted((int(y), x.numpy().tobytes()) for xs, ys, _ in loader for x, y in zip(xs, ys)) == first


def test_truncated_shard_and_unfinished_set_fail_with_the_fix(tree, tmp_path):
    prepare.run(tree, tmp_path / "out", shards=2, formats=["webdataset"], progress=False)
    folder = tmp_path / "out" / "webdataset"
    train, _, _ = shards.open_set(folder)
    data = train.files[1].read_bytes()
    train.files[1].write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="missing or not .* bytes"):
        shards.open_set(folder)
    loader = shards.ShardLoader(train, shards.Reading(0, 1, 4, workers=0), label_only)
    with pytest.raises(ConfigError, match=r"(damaged|fewer samples).*(again)"):
        _labels(loader)
    m = manifest.read(folder)
    m.complete = False
    manifest.write(folder, m)
    with pytest.raises(ConfigError, match="incomplete.*run the same prepare/download command again"):
        shards.open_set(folder)
    with pytest.raises(ConfigError, match="it has a webdataset sub-folder"):
        shards.open_set(tmp_path / "out")


def test_too_few_samples_for_the_ranks_is_refused_before_training():
    with pytest.raises(ConfigError, match="fewer than the .* steps"):
        shards.plan([3], 0, 4, 8)


def test_the_index_gives_read_shards_samples_in_its_order_with_the_same_bytes(tmp_path):
    """The loader streams references from index_shard where it streamed read_shard's bytes: the same keys, labels
    and bytes in the same order, so the shuffle, the batches and the per-sample crops are those of before."""
    root = write_tree(tmp_path / "img", classes=["a", "b", "c"], per_class=3)  # JPEGs, a grayscale one, a PNG
    prepare.run(root, tmp_path / "out", shards=2, formats=["webdataset"], progress=False)
    train, _, _ = shards.open_set(tmp_path / "out" / "webdataset")
    for f in train.files:
        streamed = [(s.key, s.label, s.data) for s in shards.read_shard(f)]
        index = shards.index_shard(str(f), dims=True)
        assert [(k, label) for k, label, *_ in index] == [(k, label) for k, label, _ in streamed]
        assert _read(f, index) == [data for _, _, data in streamed]
        # The header's (height, width) is the decoded image's, JPEG and PNG alike: the cache's layout.
        assert [(h, w) for *_, h, w in index] == [decoders.pillow(d).shape[:2] for _, _, d in streamed]


def test_the_training_process_reads_no_image_bytes(tmp_path, monkeypatch):
    """Issue 29 item 4: the decode workers index the shards and read the images; the training process only orders
    references. Reading refused in this process (the workers import their own, unpatched module): the loader with
    workers still delivers every sample, and the same loader decoding inline (workers=0) hits the refusal, so the
    refusal would catch a read here."""
    train = _eight_images(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("image bytes read in the training process")

    monkeypatch.setattr(shardset, "read_at", refuse)
    monkeypatch.setattr(shards, "read_shard", refuse)
    in_workers = shards.ShardLoader(train, shards.Reading(0, 1, 4, workers=2), shards.Transform(8, train=True))
    assert sorted(y for batch in _labels(in_workers) for y in batch) == list(range(8))
    inline = shards.ShardLoader(train, shards.Reading(0, 1, 4, workers=0), label_only)
    with pytest.raises(AssertionError, match="in the training process"):
        _labels(inline)


def _tar(path, members: list[tuple[str, bytes]]):
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_an_empty_image_member_gives_way_to_the_next_suffix_as_in_the_stream(tmp_path):
    png = _png_bytes()
    shard = _tar(tmp_path / "s.tar", [("a.jpg", b""), ("a.png", png), ("a.cls", b"2"), ("b.png", png), ("b.cls", b"1")])
    streamed = [(s.key, s.label, s.data) for s in shards.read_shard(shard)]
    index = shards.index_shard(str(shard))
    assert [(k, label) for k, label, _, _ in index] == [(k, label) for k, label, _ in streamed] == [("a", 2), ("b", 1)]
    assert _read(shard, index) == [png, png]


def test_short_reads_are_read_on_and_a_changed_shard_is_named(tmp_path, monkeypatch):
    """pread may return less than asked (a FUSE mount, a signal): the reader reads on. A shard rewritten after it
    was indexed would be read at stale offsets: the file's size and time, kept in the index, catch it."""
    train = _eight_images(tmp_path)
    loader = shards.ShardLoader(train, shards.Reading(0, 1, 4, workers=0, shuffle=False), label_only)
    whole = sorted(int(y) for _, ys, _ in loader for y in ys)
    real = os.pread
    monkeypatch.setattr(shardset.os, "pread", lambda fd, n, offset: real(fd, min(n, 7), offset))
    assert sorted(int(y) for _, ys, _ in loader for y in ys) == whole == list(range(8))
    assert _read(train.files[0], shards.index_shard(str(train.files[0]))) == [
        s.data for s in shards.read_shard(train.files[0])
    ]
    monkeypatch.undo()
    st = os.stat(train.files[0])
    os.utime(train.files[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ConfigError, match="changed under a running job"):
        _labels(loader)


def _read(path, index) -> list[bytes]:
    with open(path, "rb") as f:
        return [shardset.read_at(f, offset, size, path) for _, _, offset, size, *_ in index]


def _png_bytes() -> bytes:
    import io

    out = io.BytesIO()
    Image.new("RGB", (5, 4), (1, 2, 3)).save(out, "PNG")
    return out.getvalue()
