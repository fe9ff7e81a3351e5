"""Read WebDataset tar shards (python -m payloads.data.prepare) from a local folder or an Azure ML mount.

Split by rank, fixed for the whole run so a rank can keep its part in memory (the land-cover project's
"load once, read from memory"):
- shard count a multiple of the process count: rank r reads files r, r+size, ... and no other bytes;
- otherwise every rank reads every file and keeps every size-th record (balanced, but each rank reads
  all the bytes: prepare a multiple of the process count of shards).
Either way the parts are disjoint and cover the set. Every rank runs the same number of steps (enough for
the largest part), its part split into that many near-equal batches, as common/sharding.py does for
class folders; so the last allreduce never waits for a rank that has finished.

Order: files in a new order every epoch (file split), then a shuffle buffer; with --cache-decoded, the
first epoch keeps every decoded image of the rank in memory and later epochs shuffle that fully and
decode nothing. Decoding and augmentation run in a thread pool (Pillow and torch release the GIL) fed by
a reader thread, a few batches ahead of training. Augmentation draws from a generator seeded by (seed,
epoch, sample), so a resumed run and a straight one see the same crops.
"""
from __future__ import annotations

import io
import logging
import math
import pathlib
import queue
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ..common.errors import ConfigError
from ..data import manifest
from ..data.manifest import TRAIN, VALIDATION, WEBDATASET
from .data import MEAN, STD, collate

log = logging.getLogger(__name__)
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)   # torchvision RandomResizedCrop's defaults


@dataclass(frozen=True)
class Sample:
    key: str
    label: int
    data: bytes | np.ndarray      # encoded bytes from a shard, or decoded HxWx3 uint8 from the cache


@dataclass(frozen=True)
class ShardSplit:
    """One split of a shard set: the files and their record counts, from the manifest."""
    folder: pathlib.Path
    files: tuple[pathlib.Path, ...]
    counts: tuple[int, ...]

    def __len__(self) -> int:
        return sum(self.counts)


def open_set(folder: pathlib.Path) -> tuple[ShardSplit, ShardSplit | None, list[str]]:
    """(train, validation or None, classes) of a complete WebDataset shard set; clear errors otherwise."""
    m = manifest.load_complete(pathlib.Path(folder), WEBDATASET)

    def split(name):
        s = m.splits.get(name)
        if s is None or not s.shards:
            return None
        return ShardSplit(pathlib.Path(folder), tuple(pathlib.Path(folder) / x.name for x in s.shards),
                          tuple(x.samples for x in s.shards))

    train = split(TRAIN)
    if train is None:
        raise ConfigError(f"the shard set in {folder} has no {TRAIN} shards: prepare it from a tree with training images")
    return train, split(VALIDATION), m.classes


@dataclass(frozen=True)
class RankPlan:
    files: tuple[int, ...]    # indices of the files this rank opens
    stride: bool              # keep every size-th record of the stream (file count not a multiple of size)
    samples: int              # records this rank reads per epoch
    batch_sizes: tuple[int, ...]   # one entry per step; the same count on every rank


def plan(counts: Sequence[int], rank: int, size: int, batch: int) -> RankPlan:
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    n = len(counts)
    if n % size == 0:
        per_rank = [sum(counts[r::size]) for r in range(size)]
        files, stride = tuple(range(rank, n, size)), False
    else:
        total = sum(counts)
        per_rank = [len(range(r, total, size)) for r in range(size)]
        files, stride = tuple(range(n)), True
    steps = math.ceil(max(per_rank) / batch)
    if min(per_rank) < steps:
        raise ConfigError(
            f"{sum(counts)} samples in {n} shard(s) leave one of {size} processes {min(per_rank)} samples, fewer than "
            f"the {steps} steps the largest part needs at batch {batch}: use a larger batch or fewer processes, "
            "or prepare a multiple of the process count of shards")
    mine = per_rank[rank]
    if steps * batch == mine:
        sizes = (batch,) * steps
    else:
        sizes = tuple(len(a) for a in np.array_split(np.arange(mine), steps))
    return RankPlan(files, stride, mine, sizes)


def read_shard(path: pathlib.Path) -> Iterator[Sample]:
    """Samples of one tar shard, streamed (works on a blobfuse mount: sequential reads only)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    try:
        f = open(path, "rb")
    except OSError as e:
        raise ConfigError(f"cannot open shard {path} ({e.strerror}): the set changed under a running job (a dropped "
                          "mount, or files moved); check the data input and run again") from None
    with f:
        try:
            for s in group_by_keys(tar_file_expander([{"url": str(path), "stream": f}])):
                data = s.get("jpg") or s.get("png") or s.get("jpeg")
                if data is None or "cls" not in s:
                    raise ConfigError(f"{path}: sample {s['__key__']} lacks an image or a .cls label: prepare the "
                                      "shards with python -m payloads.data.prepare")
                yield Sample(s["__key__"], int(s["cls"]), data)
        except Exception as e:  # noqa: BLE001 - tarfile and webdataset raise many kinds for a damaged file
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"shard {path} is damaged ({type(e).__name__}: {e}): download or prepare it again "
                              "(payloads.data.transfer download verifies checksums)") from None


def shuffled(stream: Iterator[Sample], buffer: int, rng: np.random.Generator) -> Iterator[Sample]:
    """A shuffle buffer: once full, each new sample replaces a random one that is yielded."""
    if buffer <= 1:
        yield from stream
        return
    buf: list[Sample] = []
    for s in stream:
        if len(buf) < buffer:
            buf.append(s)
            continue
        i = int(rng.integers(len(buf)))
        buf[i], s = s, buf[i]
        yield s
    for i in rng.permutation(len(buf)):
        yield buf[i]


class Transform:
    """The torchvision reference augmentation (RandomResizedCrop + flip; Resize + CenterCrop for eval),
    with the random draws taken from a per-sample generator instead of torch's global one, so threads
    and resumes give the same crops."""

    def __init__(self, image_size: int, train: bool):
        self.size, self.train = image_size, train
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def crop_params(self, height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        # torchvision.transforms.RandomResizedCrop.get_params, with numpy draws.
        area = height * width
        log_ratio = np.log(RATIO)
        for _ in range(10):
            target = area * rng.uniform(*SCALE)
            aspect = math.exp(rng.uniform(*log_ratio))
            w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
        in_ratio = width / height
        if in_ratio < min(RATIO):
            w, h = width, int(round(width / min(RATIO)))
        elif in_ratio > max(RATIO):
            w, h = int(round(height * max(RATIO))), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> torch.Tensor:
        from torchvision.transforms import functional as F

        if self.train:
            i, j, h, w = self.crop_params(img.height, img.width, rng)
            img = F.resized_crop(img, i, j, h, w, [self.size, self.size], antialias=True)
            if rng.random() < 0.5:
                img = F.hflip(img)
        else:
            img = F.center_crop(F.resize(img, int(self.size * 256 / 224), antialias=True), self.size)
        x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255)
        return (x - self.mean) / self.std


class ShardLoader:
    """This rank's batches of one split: (images, labels, skipped) per step, `len()` steps per epoch."""

    def __init__(self, split: ShardSplit, rank: int, size: int, batch: int, seed: int, transform,
                 shuffle: bool = True, shuffle_buffer: int = 5000, cache: bool = False, workers: int = 2,
                 max_steps: int = 0, skip_corrupt: bool = False, prefetch: int = 4, pin_memory: bool = False):
        self.split, self.rank, self.size, self.seed = split, rank, size, seed
        self.plan = plan(split.counts, rank, size, batch)
        self.transform, self.shuffle, self.buffer = transform, shuffle, shuffle_buffer
        self.workers, self.skip_corrupt, self.prefetch, self.pin = max(1, workers), skip_corrupt, prefetch, pin_memory
        self.sizes = self.plan.batch_sizes[:max_steps] if max_steps else self.plan.batch_sizes
        # A truncated epoch never reads the whole part, so there is nothing complete to keep.
        self.cache_wanted = cache and len(self.sizes) == len(self.plan.batch_sizes)
        if cache and not self.cache_wanted:
            log.warning("--cache-decoded is off: --max-steps-per-epoch stops epochs before the data is read whole")
        self.cache: list[Sample] | None = None
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.sizes)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    # -- the sample stream of this rank for the current epoch
    def _records(self) -> Iterator[Sample]:
        files = list(self.plan.files)
        if self.shuffle and not self.plan.stride:   # a stride split needs one file order on every rank
            files = [files[i] for i in np.random.default_rng([self.seed, self.epoch, self.rank]).permutation(len(files))]
        position = 0
        for f in files:
            for s in read_shard(self.split.files[f]):
                if not self.plan.stride or position % self.size == self.rank:
                    yield s
                position += 1

    def _samples(self) -> Iterator[Sample]:
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, 1])
        if self.cache is not None:
            order = rng.permutation(len(self.cache)) if self.shuffle else range(len(self.cache))
            return (self.cache[i] for i in order)
        return shuffled(self._records(), self.buffer, rng) if self.shuffle else self._records()

    def _decode(self, s: Sample) -> tuple[Image.Image | None, str | None]:
        if isinstance(s.data, np.ndarray):
            return Image.fromarray(s.data), None
        try:
            with Image.open(io.BytesIO(s.data)) as img:
                return img.convert("RGB"), None
        except (UnidentifiedImageError, OSError, SyntaxError) as e:
            return None, f"{type(e).__name__}: {e}"

    def _one(self, s: Sample):
        img, err = self._decode(s)
        if img is None:
            if not self.skip_corrupt:
                raise ConfigError(f"cannot decode sample {s.key} of the shards in {self.split.folder} ({err}): prepare "
                                  "the set again, or pass --skip-corrupt-images to skip and count such samples")
            log.warning("skipping undecodable sample %s in %s: %s", s.key, self.split.folder, err)
            return None, None
        # The key, not Python's hash(), which differs between processes: the same sample gets the same crop anywhere.
        rng = np.random.default_rng([self.seed, self.epoch, int(s.key) if s.key.isdigit() else zlib.crc32(s.key.encode())])
        kept = Sample(s.key, s.label, np.asarray(img)) if self.cache_wanted and self.cache is None else None
        return (self.transform(img, rng), s.label), kept

    def _produce(self, out: queue.Queue, stop: threading.Event) -> None:
        try:
            filling = [] if self.cache_wanted and self.cache is None else None
            stream = self._samples()
            with ThreadPoolExecutor(self.workers, thread_name_prefix="shard-decode") as pool:
                pending = []
                for n in self.sizes:
                    batch = [next(stream) for _ in range(n)]
                    pending.append(pool.map(self._one, batch))
                    if len(pending) > 1:   # keep one batch decoding while the previous one is assembled
                        self._emit(pending.pop(0), out, filling, stop)
                    if stop.is_set():
                        return
                for p in pending:
                    self._emit(p, out, filling, stop)
            if filling is not None:
                rest = list(stream)
                if rest:   # never the case: the plan sized the batches from the manifest's counts
                    raise ConfigError(f"{len(rest)} more samples than the manifest of {self.split.folder} lists")
                # In key order: later epochs' permutations then do not depend on which epoch filled it.
                self.cache = sorted(filling, key=lambda s: s.key)
                log.info("kept %d decoded images of rank %d in memory", len(filling), self.rank)
            out.put(None)
        except StopIteration:
            out.put(ConfigError(f"the shards in {self.split.folder} hold fewer samples than their manifest says: "
                                "download or prepare the set again"))
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, which raises it
            out.put(e)

    def _emit(self, results, out: queue.Queue, filling, stop) -> None:
        results = list(results)
        if filling is not None:
            filling.extend(k for _, k in results if k is not None)
        batch = collate([r for r, _ in results])
        if self.pin:
            batch = (batch[0].pin_memory(), batch[1].pin_memory(), batch[2])
        while not stop.is_set():
            try:
                out.put(batch, timeout=0.5)
                return
            except queue.Full:
                continue

    def __iter__(self):
        out: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        t = threading.Thread(target=self._produce, args=(out, stop), daemon=True, name="shard-reader")
        t.start()
        try:
            while True:
                item = out.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            t.join(timeout=5)


def datasets(data_dir: pathlib.Path):
    """(train, validation or None, number of classes) for the training payload."""
    train, val, classes = open_set(data_dir)
    return train, val, len(classes)


def loader(split: ShardSplit, cfg, rank: int, size: int, batch: int, shuffle: bool, device) -> ShardLoader:
    return ShardLoader(split, rank, size, batch, cfg.seed, Transform(cfg.image_size, train=shuffle), shuffle=shuffle,
                       shuffle_buffer=cfg.shuffle_buffer, cache=cfg.cache_decoded, workers=cfg.workers,
                       max_steps=cfg.max_steps_per_epoch if shuffle else 0, skip_corrupt=cfg.skip_corrupt_images,
                       pin_memory=device.type == "cuda")
