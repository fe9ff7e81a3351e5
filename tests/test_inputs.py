"""The input pipeline the training loop consumes (payloads/pytorch/inputs.py): uint8 out of every loader,
normalised on the device, channels_last, synthetic data made on the device, shard decoding in worker
processes, the decoders and the --gpu-decode CPU fallback."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from datatools import prepare
from payloads.common import config, sharding
from payloads.common.errors import ConfigError
from payloads.pytorch import data, decoders, inputs, shards

CPU = torch.device("cpu")


def _photos(root: pathlib.Path, classes: int = 3, per_class: int = 6, seed: int = 0) -> pathlib.Path:
    """JPEGs that compress like photographs (smooth fields plus noise), of varied sizes, in class folders."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(40, 90, 2))
            base = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
            field = np.asarray(Image.fromarray(base).resize((w, h), Image.BICUBIC), dtype=np.int16)
            pixels = np.clip(field + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    _photos(root / "img")
    prepare.run(root / "img", root / "out", shards=2, formats=["webdataset"], progress=False)
    return root / "out" / "webdataset"


def _cfg(**kw) -> config.TrainConfig:
    base = dict(
        data="synthetic",
        image_size=16,
        num_classes=4,
        synthetic_samples=40,
        seed=5,
        workers=0,
        channels_last=False,
        batch_size=8,
    )
    base.update(kw)
    return config.TrainConfig(**base)


class _HostBatches:
    """A host loader stand-in: fixed uint8 NxHxWx3 batches."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def set_epoch(self, epoch):
        pass

    def __iter__(self):
        return iter(self.batches)


def test_device_normalisation_is_bitwise_the_host_normalisation_and_honours_channels_last():
    """The CPU path of Prefetched (the CUDA one minus streams) equals torchvision's ToTensor + Normalize on
    the host bit for bit: the same float32 operations (x / 255, - mean, / std) in the same order, each
    rounded once by IEEE 754, whatever the memory layout."""
    from torchvision import transforms

    rng = np.random.default_rng(0)
    batches = [
        (torch.from_numpy(rng.integers(0, 256, (4, 12, 10, 3), dtype=np.uint8)), torch.arange(4), 0) for _ in range(3)
    ]
    host = transforms.Compose([transforms.ToTensor(), transforms.Normalize(data.MEAN, data.STD)])
    for channels_last in (False, True):
        got = list(inputs.Prefetched(_HostBatches(batches), CPU, channels_last))
        assert len(got) == 3
        for (images, labels, skipped), (raw, raw_labels, _) in zip(got, batches):
            want = torch.stack([host(Image.fromarray(x.numpy())) for x in raw])
            assert images.dtype == torch.float32 and images.shape == (4, 3, 12, 10)
            assert torch.equal(images, want)
            assert torch.equal(labels, raw_labels) and labels.dtype == torch.int64 and skipped == 0
            if channels_last:
                assert images.is_contiguous(memory_format=torch.channels_last) and images.stride()[1] == 1
            else:
                assert images.is_contiguous()
    with pytest.raises(TypeError, match="uint8"):
        next(iter(inputs.Prefetched(_HostBatches([(torch.zeros(1, 2, 2, 3), torch.zeros(1), 0)]), CPU, False)))


@pytest.mark.parametrize("channels_last", [False, True])
def test_synthetic_batches_on_two_ranks_are_the_one_rank_batch_split(channels_last):
    """1 process at batch B and 2 at B/2 train on the same samples each step (common/sharding.py)."""
    cfg = _cfg(channels_last=channels_last)
    one = inputs.build(cfg, 0, 1, 8, CPU)
    two = [inputs.build(cfg, r, 2, 4, CPU) for r in range(2)]
    assert one.val is None and one.num_classes == 4
    assert len(one.train) == len(two[0].train) == len(two[1].train) == 5
    epochs = []
    for epoch in (0, 1):
        for b in (one.train, *(t.train for t in two)):
            b.set_epoch(epoch)
        seen = []
        for (x, y, k), (x0, y0, _), (x1, y1, _) in zip(one.train, two[0].train, two[1].train):
            # Rank r takes every 2nd sample of the epoch's permutation: the 1-rank batch interleaves them.
            assert torch.equal(x[0::2], x0) and torch.equal(x[1::2], x1)
            assert torch.equal(y[0::2], y0) and torch.equal(y[1::2], y1)
            assert x.dtype == torch.float32 and y.dtype == torch.int64 and k == 0
            assert x.is_contiguous(memory_format=torch.channels_last) == channels_last
            seen.append(x)
        epochs.append(torch.cat(seen))
    assert not torch.equal(epochs[0], epochs[1])  # reshuffled per epoch
    # The same set, in another order: the per-sample images do not change between epochs.
    assert torch.equal(epochs[0].sum((1, 2, 3)).sort().values, epochs[1].sum((1, 2, 3)).sort().values)


def test_synthetic_samples_are_per_index_learnable_and_bounded():
    ds = data.SyntheticImages(40, 4, 16, seed=5)
    # What the pipeline hands the model for index i is ds[i]: the references in test_distributed rely on it.
    b = inputs.build(_cfg(), 0, 1, 8, CPU).train
    order = np.concatenate(sharding.batches(40, 0, 1, 8, 5, epoch=0))
    x, y, _ = next(iter(b))
    for row, i in enumerate(order[:8]):
        image, label = ds[int(i)]
        assert torch.equal(x[row], image) and int(y[row]) == label
    # Deterministic per (seed, index), and another seed gives other images.
    assert torch.equal(data.SyntheticImages(40, 4, 16, seed=5).images, ds.images)
    assert not torch.equal(data.SyntheticImages(40, 4, 16, seed=6).images, ds.images)
    # Learnable: an image is nearer its own class's mean image than any other class's.
    imgs, labels = ds.images.float().flatten(1), ds.labels
    means = torch.stack([imgs[labels == c].mean(0) for c in range(4)])
    assert torch.equal(torch.cdist(imgs, means).argmin(1), labels)
    # The device pool is capped: 10 images' worth of bytes hold 10 distinct images, sample i is image i mod 10.
    small = data.SyntheticImages(1000, 4, 16, seed=5, pool_bytes=10 * 16 * 16 * 3)
    assert small.pool == 10 and small.images.shape == (10, 16, 16, 3) and small.images.dtype == torch.uint8
    for i in (3, 13, 993):
        assert torch.equal(small[i][0], small[3][0]) and small[i][1] == small[3][1]
    assert torch.equal(small.images, ds.images[:10])  # image j does not depend on the pool size


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_synthetic_pool_is_the_same_on_the_gpu_and_the_cpu():
    """Integer hashing only: a resumed run on other hardware sees the same data."""
    gpu = data.SyntheticImages(64, 10, 32, seed=3, device="cuda")
    cpu = data.SyntheticImages(64, 10, 32, seed=3)
    assert (
        gpu.images.is_cuda and torch.equal(gpu.images.cpu(), cpu.images) and torch.equal(gpu.labels.cpu(), cpu.labels)
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_uint8_leaves_the_class_folder_and_shard_loaders(tmp_path, shard_set, workers):
    """What crosses to the device is uint8 NxHxWx3: a quarter of float32's bytes."""
    _photos(tmp_path / "img", per_class=4)
    cfg = _cfg(data="imagefolder", data_dir=tmp_path / "img", workers=workers)
    tree = inputs.imagefolder.scan(tmp_path / "img")
    folder = inputs.FolderLoader(data.ImageFiles(tree, 16, True, False, cfg.seed), cfg, 0, 1, 4, True, CPU)
    train, _, _ = shards.open_set(shard_set)
    shard = shards.ShardLoader(train, data.Reading.of(_cfg(workers=workers), 0, 1, 4, True), data.Transform(16, True))
    for loader in (folder, shard):
        batches = list(loader)
        assert len(batches) == len(loader) >= 3
        for images, labels, skipped in batches:
            assert images.dtype == torch.uint8 and images.shape[1:] == (16, 16, 3) and 1 <= len(images) <= 4
            assert labels.dtype == torch.int64 and skipped == 0
    # And through build(): float32 on the device, normalised.
    built = inputs.build(cfg, 0, 1, 4, CPU)
    x, y, _ = next(iter(built.train))
    assert x.dtype == torch.float32 and x.shape == (4, 3, 16, 16) and built.num_classes == 3


def test_class_folder_crops_depend_on_seed_epoch_and_sample_not_on_workers(tmp_path):
    _photos(tmp_path / "img", per_class=4)
    tree = inputs.imagefolder.scan(tmp_path / "img")

    def epoch(e, workers):
        cfg = _cfg(data="imagefolder", data_dir=tmp_path / "img", workers=workers)
        loader = inputs.FolderLoader(data.ImageFiles(tree, 16, True, False, cfg.seed), cfg, 0, 1, 4, True, CPU)
        loader.set_epoch(e)
        return [x for x, _, _ in loader]

    a, b, c = epoch(1, 0), epoch(1, 2), epoch(2, 0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


class PidProbe:
    """A transform that writes where it ran: the process id and torch's intra-op thread count."""

    size = 2

    def __call__(self, image, rng):
        pid, threads = os.getpid(), torch.get_num_threads()
        return np.array([[[pid >> 16, (pid >> 8) & 255, pid & 255], [threads, 0, 0]]] * 2, np.uint8)


@pytest.mark.launches
def test_shard_decoding_runs_in_worker_processes_with_one_intra_op_thread_each(shard_set):
    """The training process's Python thread only launches GPU work: decoding and augmentation run in other
    processes, each with torch.set_num_threads(1) (as DataLoader workers do)."""
    torch.set_num_threads(2)
    train, _, _ = shards.open_set(shard_set)
    loader = shards.ShardLoader(train, shards.Reading(0, 1, 2, workers=2, shuffle_buffer=4), PidProbe())
    pids, threads = set(), set()
    for images, _, _ in loader:
        px = images.numpy().astype(np.int64)
        pids |= set((px[:, 0, 0, 0] << 16 | px[:, 0, 0, 1] << 8 | px[:, 0, 0, 2]).tolist())
        threads |= set(px[:, 0, 1, 0].tolist())
    workers = set(shards.ring.workers(2).pids)
    assert os.getpid() not in pids and pids <= workers and pids, (pids, workers, os.getpid())
    assert threads == {1}
    # With --workers 0 the same work runs in this process (the CPU-only test configuration).
    inline = shards.ShardLoader(train, shards.Reading(0, 1, 2, workers=0), PidProbe())
    px = next(iter(inline))[0].numpy().astype(np.int64)
    assert int(px[0, 0, 0, 0] << 16 | px[0, 0, 0, 1] << 8 | px[0, 0, 0, 2]) == os.getpid()


def test_gpu_decode_cpu_fallback_runs_and_matches_the_cpu_decoder(shard_set):
    """--gpu-decode without a GPU: torchvision's CPU JPEG decoder and torch's resize, against the CPU path
    (Pillow's decoder and resize) with the same crops. Both decoders are libjpeg-turbo with its default
    integer IDCT (the same pixels); the two antialiased bilinear resizers round differently: at most 1 grey
    level apart, on a few per cent of the pixels (measured 0.010-0.025 levels on average)."""
    train, _, _ = shards.open_set(shard_set)
    for shuffle in (True, False):  # RandomResizedCrop + flip, and the evaluation crop
        cfg = _cfg(data="shards", image_size=24, workers=2, gpu_decode=True)
        crops = data.Transform(24, train=shuffle)
        gpu = shards.ShardLoader(train, data.Reading.of(cfg, 0, 1, 6, shuffle, encoded=True), crops).on_device(
            CPU, False
        )
        plain = shards.ShardLoader(train, data.Reading.of(cfg, 0, 1, 6, shuffle, decoder="pillow"), crops)
        cpu = inputs.Prefetched(plain, CPU, False)
        levels = torch.tensor(data.STD).view(1, 3, 1, 1) * 255
        diffs = []
        for (xg, yg, kg), (xc, yc, kc) in zip(gpu, cpu):
            assert torch.equal(yg, yc) and kg == kc == 0 and xg.shape == xc.shape == (6, 3, 24, 24)
            diffs.append(((xg - xc) * levels).abs())
        d = torch.cat(diffs)
        print(f"gpu-decode CPU fallback vs CPU path (shuffle={shuffle}): mean {d.mean():.3f}, max {d.max():.2f} levels")
        assert len(diffs) == len(gpu) == 3
        assert d.mean() < 0.1 and d.max() < 1.01  # 1 level, plus float rounding of the normalisation


def test_gpu_decode_runs_its_per_image_work_in_a_thread_of_its_own(shard_set, monkeypatch):
    """--gpu-decode's per-image work (on a GPU: nvJPEG's call, which waits for its own stream, then a few kernels per
    image) runs one batch ahead in a thread of its own, never on the training thread; a loop that leaves the epoch
    early ends that thread, and an error there (a damaged sample, a dead worker) is raised in the training thread."""
    import threading

    from torchvision.transforms.v2 import functional as F

    ran, real = set(), F.resized_crop
    monkeypatch.setattr(F, "resized_crop", lambda *a, **k: ran.add(threading.get_ident()) or real(*a, **k))
    train = inputs.build(_cfg(data="shards", data_dir=shard_set, gpu_decode=True), 0, 1, 4, CPU).train
    batches = iter(train)
    next(batches)
    batches.close()
    assert ran and threading.get_ident() not in ran
    assert not [t for t in threading.enumerate() if t.name == "gpu-decode"]
    monkeypatch.setattr(F, "resized_crop", lambda *a, **k: (_ for _ in ()).throw(ConfigError("a damaged sample")))
    with pytest.raises(ConfigError, match="a damaged sample"):
        next(iter(train))


def test_gpu_decode_flag_through_build_and_its_errors(shard_set, tmp_path):
    cfg = _cfg(data="shards", data_dir=shard_set, gpu_decode=True, image_size=16)
    built = inputs.build(cfg, 0, 1, 6, CPU)
    x, y, _ = next(iter(built.train))
    assert x.dtype == torch.float32 and x.shape == (6, 3, 16, 16) and built.num_classes == 3 and len(y) == 6
    with pytest.raises(ConfigError, match="--gpu-decode applies to --data shards"):
        inputs.build(_cfg(data="imagefolder", data_dir=tmp_path, gpu_decode=True), 0, 1, 4, CPU)
    with pytest.raises(ConfigError, match="choose one"):
        inputs.build(_cfg(data="shards", data_dir=shard_set, gpu_decode=True, cache_decoded=True), 0, 1, 4, CPU)


def test_decoders_agree_with_pillow_and_fall_back_to_it(shard_set):
    """Every decoder that loads here gives Pillow's pixels for a JPEG (all are libjpeg-turbo with its default
    integer IDCT: bit for bit, or within 1 level where a build differs), and hands non-JPEG data to Pillow."""
    first = next(shards.read_shard(shards.open_set(shard_set)[0].files[0]))
    want = decoders.pillow(first.data)
    names = decoders.available()
    assert names and "pillow" in names and decoders.resolve("auto") == names[0]
    for name in names:
        got = decoders.make(name)(first.data)
        assert got.shape == want.shape and got.dtype == np.uint8
        assert np.abs(got.astype(int) - want).max() <= 1, name
    png = _png(want)
    assert np.array_equal(decoders.make(names[0])(png), want)
    with pytest.raises(decoders.DecodeError):
        decoders.make(names[0])(b"\xff\xd8 not a jpeg")
    with pytest.raises(ConfigError, match="unknown decoder 'jpegxl': choose one of auto"):
        inputs.build(_cfg(data="shards", data_dir=shard_set, decoder="jpegxl"), 0, 1, 4, CPU)


def _png(pixels: np.ndarray) -> bytes:
    import io

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@pytest.mark.launches
def test_a_process_that_ran_both_loaders_exits():
    """The uint8 test above with 2 workers, alone in a process of its own (no xdist worker, which skips atexit): it
    ran a DataLoader's forkserver workers and the shard loader's decode workers (0 workers start neither), which
    ignore SIGTERM: the exit hook kills them (ring._end_workers)."""
    test = f"{__file__}::test_uint8_leaves_the_class_folder_and_shard_loaders[2]"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", test],
        cwd=pathlib.Path(__file__).resolve().parents[1],
        env=os.environ,  # its launches count as this session's (conftest.py)
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr[-2000:]
