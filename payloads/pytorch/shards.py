"""Read WebDataset tar shards (python -m datatools.prepare) from a local folder or an Azure ML mount.

Split by rank, fixed for the whole run so a rank can keep its part in memory (the land-cover project's
"load once, read from memory"):
- shard count a multiple of the process count: rank r reads files r, r+size, ... and no other bytes;
- otherwise every rank reads every file and keeps every size-th record (balanced, but each rank reads
  all the bytes: prepare a multiple of the process count of shards).
Either way the parts are disjoint and cover the set. Every rank runs the same number of steps (enough for
the largest part), its part split into that many near-equal batches, as common/sharding.py does for
class folders; so the last allreduce never waits for a rank that has finished.

Order: files in a new order every epoch (file split), then a shuffle buffer; with --cache-decoded, the
first epoch keeps every decoded image of the rank in a file in --cache-dir that the workers map read-only,
and later epochs shuffle that fully and decode nothing. The file's size is estimated before epoch 1 and
checked against the folder's free space for all the node's processes (a write into a mapping past a full
tmpfs is a SIGBUS; a plain write past a full disk is an error, met here by dropping the cache). A pool of worker
processes (forkserver, one intra-op thread each, shared by every loader of the process) indexes the rank's tar
files once (index_shard: each sample's key, label and where its image lies) and, per batch, reads the images
(read_bytes), decodes and augments them and returns one uint8 NxHxWx3 tensor through shared memory. A reader
thread of the training process only orders references into batches: it reads, parses and pickles no image
bytes (0.06 ms of its CPU per image instead of 0.25-0.32 here), so the training process's Python thread is
left to launch GPU work. Augmentation draws from a generator seeded
by (seed, epoch, sample), so a resumed run and a straight one see the same crops, whatever the worker count.
With --gpu-decode the workers only read JPEG headers and pick the crops; nvJPEG decodes on the device
(`GpuDecoded`), or torchvision's CPU decoder where no GPU is present.
"""

from __future__ import annotations

import atexit
import collections
import errno
import logging
import math
import multiprocessing
import os
import pathlib
import queue
import re
import socket
import tempfile
import threading
import weakref
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..common import manifest, sharding
from ..common.errors import ConfigError
from ..common.manifest import TRAIN, VALIDATION, WEBDATASET
from . import decoders
from .data import Transform, collate, normalize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    key: str
    label: int
    data: bytes | tuple | Ref  # encoded bytes, (offset, shape) in the decoded cache, or where the bytes lie in a shard


@dataclass(frozen=True)
class Ref:
    """Where a sample's encoded image lies in its shard: the decode worker reads it (the training process never
    touches the bytes)."""

    path: str
    offset: int
    size: int
    stamp: tuple[int, int] = (0, 0)  # the file's (size, mtime_ns) when indexed; (0, 0): not checked


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
        return ShardSplit(
            pathlib.Path(folder),
            tuple(pathlib.Path(folder) / x.name for x in s.shards),
            tuple(x.samples for x in s.shards),
        )

    train = split(TRAIN)
    if train is None:
        raise ConfigError(
            f"the shard set in {folder} has no {TRAIN} shards: prepare it from a tree with training images"
        )
    return train, split(VALIDATION), m.classes


@dataclass(frozen=True)
class RankPlan:
    files: tuple[int, ...]  # indices of the files this rank opens
    stride: bool  # keep every size-th record of the stream (file count not a multiple of size)
    samples: int  # records this rank reads per epoch
    batch_sizes: tuple[int, ...]  # one entry per step; the same count on every rank


def plan(counts: Sequence[int], rank: int, size: int, batch: int) -> RankPlan:
    """This rank's files (sharding.file_share) and its batch sizes: as many steps as the largest share needs, the
    same count on every rank."""
    files, stride, per_rank = sharding.file_share(counts, rank, size)
    steps = math.ceil(max(per_rank) / batch)
    if min(per_rank) < steps:
        raise ConfigError(
            f"{sum(counts)} samples in {len(counts)} shard(s) leave one of {size} processes {min(per_rank)} samples, fewer than "
            f"the {steps} steps the largest part needs at batch {batch}: use a larger batch or fewer processes, "
            "or prepare a multiple of the process count of shards"
        )
    mine = per_rank[rank]
    if steps * batch == mine:
        sizes = (batch,) * steps
    else:
        sizes = tuple(len(a) for a in np.array_split(np.arange(mine), steps))
    return RankPlan(files, stride, mine, sizes)


IMAGE_SUFFIXES = ("jpg", "png", "jpeg")  # read_shard's preference order


def _open_shard(path) -> object:
    try:
        return open(path, "rb")
    except OSError as e:
        raise ConfigError(
            f"cannot open shard {path} ({e.strerror}): the set changed under a running job (a dropped "
            "mount, or files moved); check the data input and run again"
        ) from None


def _damaged(path, why: str) -> ConfigError:
    return ConfigError(
        f"shard {path} is damaged ({why}): download or prepare it again (datatools.transfer download verifies checksums)"
    )


def index_shard(path: str) -> list[tuple[str, int, int, int]]:
    """(key, label, offset, size) of every sample's image in one tar shard, in the shard's order: the headers and
    the small .cls members are read, the image bytes skipped over (a seek each). The same samples as read_shard
    (WebDataset's grouping of consecutive members by key), so a loader streaming `Ref`s yields the same order.
    Runs in a decode worker (ShardLoader indexes its files there), or inline."""
    import tarfile

    from webdataset.tariterators import base_plus_ext

    out: list[tuple[str, int, int, int]] = []
    with _open_shard(path) as f:
        end = os.fstat(f.fileno()).st_size
        key, members = None, {}

        def flush() -> None:
            if key is None:
                return
            # An empty image member is skipped for the next suffix, as read_shard's `or` chain does.
            image = next((members[x] for x in IMAGE_SUFFIXES if x in members and members[x][1] > 0), None)
            if image is None or "cls" not in members:
                raise ConfigError(
                    f"{path}: sample {key} lacks an image or a .cls label: prepare the shards with python -m "
                    "datatools.prepare"
                )
            f.seek(members["cls"][0])
            out.append((key, int(f.read(members["cls"][1])), *image))

        try:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                for m in tar:
                    if not m.isreg() or re.match(r"__[^/]*__($|/)", m.name):
                        continue
                    prefix, suffix = base_plus_ext(m.name)
                    if prefix is None:
                        continue
                    if m.offset_data + m.size > end:
                        raise _damaged(path, f"{m.name} ends past the end of the file: truncated")
                    if prefix != key:
                        flush()
                        key, members = prefix, {}
                    suffix = suffix.lower()
                    if suffix in members:
                        raise _damaged(path, f"{m.name}: duplicate file name")
                    members[suffix] = (m.offset_data, m.size)
                flush()
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - tarfile's errors, a label that is no number
            raise _damaged(path, f"{type(e).__name__}: {e}") from None
    return out


def read_bytes(refs: Sequence[Ref]) -> list[bytes]:
    """The encoded images of a batch's samples, each file opened once per batch (a moved or dropped file fails
    here with the fix, as streaming did)."""
    out: list[bytes] = []
    files: dict[str, object] = {}
    try:
        for r in refs:
            f = files.get(r.path)
            if f is None:
                f = files[r.path] = _open_shard(r.path)
                st = os.fstat(f.fileno())
                if r.stamp != (0, 0) and (st.st_size, st.st_mtime_ns) != r.stamp:
                    raise ConfigError(
                        f"shard {r.path} changed under a running job (size or time differs from when it was "
                        "indexed): keep a job's data input unchanged while it runs, and run again"
                    )
            parts, got = [], 0
            while got < r.size:  # pread may return less than asked (a FUSE mount, a signal): read on
                part = os.pread(f.fileno(), r.size - got, r.offset + got)
                if not part:
                    raise _damaged(r.path, f"{r.size} bytes at {r.offset}, {got} read: truncated")
                parts.append(part)
                got += len(part)
            out.append(parts[0] if len(parts) == 1 else b"".join(parts))
    finally:
        for f in files.values():
            f.close()
    return out


def read_shard(path: pathlib.Path) -> Iterator[Sample]:
    """Samples of one tar shard, streamed (works on a blobfuse mount: sequential reads only)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    with _open_shard(path) as f:
        try:
            for s in group_by_keys(tar_file_expander([{"url": str(path), "stream": f}])):
                data = s.get("jpg") or s.get("png") or s.get("jpeg")
                if data is None or "cls" not in s:
                    raise ConfigError(
                        f"{path}: sample {s['__key__']} lacks an image or a .cls label: prepare the "
                        "shards with python -m datatools.prepare"
                    )
                yield Sample(s["__key__"], int(s["cls"]), data)
        except Exception as e:
            if isinstance(e, ConfigError):
                raise
            raise _damaged(path, f"{type(e).__name__}: {e}") from None


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


# ------------------------------------------------------------------------------------------ decode workers


@dataclass(frozen=True)
class Task:
    """One batch for a worker: the samples and how to turn them into pixels."""

    samples: list[Sample]
    transform: object  # called as transform(HxWx3 uint8, rng) -> HxWx3 uint8
    seed: int
    epoch: int
    decoder: str
    cache: str | None  # path of the decoded-cache file the samples point into
    keep: bool  # return the decoded images too (the first epoch fills the cache)
    encoded: bool  # --gpu-decode: JPEGs stay encoded, only their crops are chosen here


@dataclass
class Result:
    items: list  # one uint8 NxHxWx3 tensor, or per sample (JPEG bytes, crop) or HxWx3 pixels
    labels: list[int]
    skipped: list[tuple[str, str]]  # (key, reason) of undecodable samples
    kept: list[tuple[Sample, np.ndarray]] | None


_decode_fns: dict[str, object] = {}
_maps: dict[str, np.memmap] = {}  # decoded-cache files mapped in this process, by path


def _init_worker() -> None:
    # One intra-op thread per worker: the worker count is the parallelism (DataLoader workers do the same).
    torch.set_num_threads(1)


def _sample_rng(seed: int, epoch: int, key: str) -> np.random.Generator:
    # The key, not Python's hash(), which differs between processes: the same sample gets the same crop anywhere.
    return np.random.default_rng([seed, epoch, int(key) if key.isdigit() else zlib.crc32(key.encode())])


def _cached(path: str, ref: tuple) -> np.ndarray:
    mapped = _maps.get(path)
    if mapped is None:
        # Read-only: nothing is ever written through the mapping, so a full file system cannot fault it.
        mapped = _maps[path] = np.memmap(path, np.uint8, mode="r")
    offset, shape = ref
    return mapped[offset : offset + math.prod(shape)].reshape(shape)


def _jpeg_size(data: bytes) -> tuple[int, int]:
    """(height, width) from a JPEG's header, without decoding it."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if img.format != "JPEG" or img.mode not in ("RGB", "L"):
            raise decoders.DecodeError(f"{img.format} {img.mode}")
        return img.height, img.width


def decode_batch(task: Task) -> Result:
    """Runs in a worker process (or inline with --workers 0): decode and augment one batch."""
    decode = _decode_fns.get(task.decoder)
    if decode is None:
        decode = _decode_fns[task.decoder] = decoders.make(task.decoder)
    items, labels, skipped = [], [], []
    kept = [] if task.keep else None
    refs = [i for i, s in enumerate(task.samples) if isinstance(s.data, Ref)]
    fetched = dict(zip(refs, read_bytes([task.samples[i].data for i in refs]))) if refs else {}
    for i, s in enumerate(task.samples):
        data = fetched.get(i, s.data)
        rng = _sample_rng(task.seed, task.epoch, s.key)
        if task.encoded:
            try:
                h, w = _jpeg_size(data)
            except Exception:  # noqa: BLE001 - not a plain JPEG (PNG, CMYK, damaged): decoded here instead
                pass
            else:
                # The bytes, pickled by value: a tensor per sample would cost a shared-memory handle each.
                items.append((data, task.transform.params(h, w, rng)))
                labels.append(s.label)
                continue
        try:
            image = _cached(task.cache, data) if task.cache else decode(data)
        except decoders.DecodeError as e:
            skipped.append((s.key, str(e)))
            continue
        if kept is not None:
            kept.append((Sample(s.key, s.label, b""), image))
        items.append(np.asarray(task.transform(image, rng)))
        labels.append(s.label)
    if not task.encoded and items:
        items = [torch.from_numpy(np.stack(items))]  # one tensor: one shared-memory handle back, not N
    return Result(items, labels, skipped, kept)


_pools: dict[int, multiprocessing.pool.Pool] = {}


def pool(workers: int):
    """The process's decode pool of `workers` processes, started once and shared by its loaders."""
    p = _pools.get(workers)
    if p is None:
        # forkserver: forking after Horovod's background thread and Gloo sockets exist is unsafe.
        p = _pools[workers] = multiprocessing.get_context("forkserver").Pool(workers, initializer=_init_worker)
    return p


@atexit.register
def _close_pools() -> None:
    """At exit the workers are killed and the pool's own finalizer dropped: Pool.terminate() first takes the task
    queue's read lock, which an idle worker holds while it waits for a task, and hung there at the exit of a process
    that had also run a DataLoader's forkserver workers (tests/test_inputs.py's uint8 test, alone). Nothing a
    worker holds needs a clean exit: results travel through shared memory that the parent maps."""
    for p in _pools.values():
        p._worker_handler._state = multiprocessing.pool.TERMINATE  # no replacement for the workers killed below
        p._change_notifier.put(None)
        for worker in p._pool:
            worker.kill()
        for worker in p._pool:
            worker.join(timeout=5)
        p._terminate.cancel()  # the Finalize that would run terminate() at interpreter exit
    _pools.clear()


class _Now:
    """A finished result (--workers 0 decodes in the reader thread)."""

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


CACHE_PREFIX = "decoded-"
CACHE_MARGIN = 1.1  # the estimate is a mean over a sample of headers: room for a part with larger images
HEADER_SAMPLE = 64  # JPEG headers read per split to estimate the decoded size


class DecodedCache:
    """A rank's decoded images in one file in the cache folder, written with plain writes while epoch 1 decodes
    them and mapped read-only by every worker once complete. Named for host, process and rank, removed when the
    loader goes; a run that was killed leaves its file behind, removed by the next run on that host."""

    def __init__(self, folder: pathlib.Path, rank: int):
        remove_stale(folder)
        name = f"{CACHE_PREFIX}{socket.gethostname()}-{os.getpid()}-rank{rank}-"
        fd, self.path = tempfile.mkstemp(prefix=name, suffix=".u8", dir=folder)
        self.file = os.fdopen(fd, "wb")
        self.samples: list[Sample] = []
        self.nbytes = 0
        weakref.finalize(self, _remove, self.path)

    def add(self, kept: list[tuple[Sample, np.ndarray]]) -> None:
        """Appends a batch's decoded images; OSError (ENOSPC) when the folder is full."""
        for s, a in kept:
            a = np.ascontiguousarray(a, dtype=np.uint8)
            self.file.write(memoryview(a).cast("B"))
            self.samples.append(Sample(s.key, s.label, (self.nbytes, a.shape)))
            self.nbytes += a.nbytes

    def close(self) -> None:
        self.file.close()
        self.samples.sort(key=lambda s: s.key)  # key order: later epochs do not depend on the filling one

    def discard(self) -> None:
        self.file.close()
        _remove(self.path)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_stale(folder: pathlib.Path) -> None:
    """Cache files of this host whose process no longer runs (a killed or preempted run)."""
    host = socket.gethostname()
    for f in pathlib.Path(folder).glob(f"{CACHE_PREFIX}{host}-*-rank*.u8"):
        pid = f.name[len(CACHE_PREFIX) + len(host) + 1 :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove(str(f))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def estimate_cache_bytes(loader: ShardLoader) -> int:
    """The decoded bytes of this rank's part: its sample count x the mean H x W x 3 of up to HEADER_SAMPLE JPEG
    headers from its first file (read without decoding), with CACHE_MARGIN."""
    sizes = []
    for s in read_shard(loader.split.files[loader.plan.files[0]]):
        try:
            h, w = _jpeg_size(s.data)
        except Exception:  # noqa: BLE001 - not a plain JPEG: decoded here to learn its size
            try:
                h, w = decoders.make(loader.decoder)(s.data).shape[:2]
            except decoders.DecodeError:
                continue
        sizes.append(h * w * 3)
        if len(sizes) == HEADER_SAMPLE:
            break
    mean = sum(sizes) / len(sizes) if sizes else 0
    return int(mean * loader.plan.samples * CACHE_MARGIN)


def check_cache_room(loaders: Sequence[ShardLoader], local_size: int) -> int:
    """Before epoch 1: the decoded cache of every split of this rank, times the processes on this node (one
    folder per node), must fit the free space of the loaders' --cache-dir. Returns this rank's estimate in bytes."""
    wanted = [x for x in loaders if x is not None and x.cache_wanted]
    if not wanted:
        return 0
    folder = wanted[0].cache_dir  # every loader of the run gets the same --cache-dir (loader())
    if not folder.is_dir():
        raise ConfigError(f"--cache-dir {folder}: no such folder (create it, or pick a folder on a local disk)")
    per_rank = sum(estimate_cache_bytes(x) for x in wanted)
    node = per_rank * local_size
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    if node > free:
        raise ConfigError(
            f"--cache-decoded: the decoded images need about {per_rank / 2**30:.1f} GiB per process x {local_size} "
            f"process(es) on this node = {node / 2**30:.1f} GiB in {folder}, which has {free / 2**30:.1f} GiB "
            "free: pass --cache-dir on a local disk with that room (on Azure ML, the node's local NVMe disk), "
            "train more nodes (each keeps only its part), or drop --cache-decoded (every epoch then decodes)"
        )
    return per_rank


# ------------------------------------------------------------------------------------------------ loader


class ShardLoader:
    """This rank's batches of one split: (uint8 NxHxWx3 images, int64 labels, skipped) per step, `len()`
    steps per epoch. `workers` decode processes (0: decode in the reader thread of this process)."""

    def __init__(
        self,
        split: ShardSplit,
        rank: int,
        size: int,
        batch: int,
        seed: int,
        transform,
        shuffle: bool = True,
        shuffle_buffer: int = 5000,
        cache: bool = False,
        cache_dir: pathlib.Path | None = None,
        workers: int = 2,
        max_steps: int = 0,
        skip_corrupt: bool = False,
        prefetch: int = 4,
        pin_memory: bool = False,
        decoder: str = "auto",
        encoded: bool = False,
    ):
        self.split, self.rank, self.size, self.seed = split, rank, size, seed
        self.plan = plan(split.counts, rank, size, batch)
        self.transform, self.shuffle, self.buffer = transform, shuffle, shuffle_buffer
        self.workers, self.skip_corrupt, self.pin, self.encoded = workers, skip_corrupt, pin_memory, encoded
        self.inflight = max(prefetch, workers + 1)
        self.decoder = decoders.resolve(decoder)
        self.sizes = self.plan.batch_sizes[:max_steps] if max_steps else self.plan.batch_sizes
        # A truncated epoch never reads the whole part, so there is nothing complete to keep.
        self.cache_wanted = cache and len(self.sizes) == len(self.plan.batch_sizes)
        if cache and not self.cache_wanted:
            log.warning("--cache-decoded is off: --max-steps-per-epoch stops epochs before the data is read whole")
        if cache and encoded:
            raise ConfigError("--cache-decoded keeps CPU-decoded images, --gpu-decode decodes on the GPU: choose one")
        self.cache_dir = pathlib.Path(cache_dir) if cache_dir is not None else pathlib.Path(tempfile.gettempdir())
        self.cache: DecodedCache | None = None
        self._filling: DecodedCache | None = None
        self._index: dict[int, list[Sample]] = {}
        self.epoch = self.skip = 0

    def __len__(self) -> int:
        return len(self.sizes)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """`skip`: the epoch's first steps were trained before a mid-epoch checkpoint: their samples are drawn from
        the same stream and dropped undecoded, so the rest of the epoch gets the same samples and crops."""
        self.epoch, self.skip = epoch, skip

    # -- the sample stream of this rank for the current epoch
    def _indexed(self, files: list[int]) -> Iterator[list[Sample]]:
        """This rank's samples of each of `files`, in their order. Each file is indexed once per run (index_shard), by
        the decode workers in parallel and in order, so the first batch waits for the first file only. Kept: this
        rank's samples only (a stride split keeps every size-th of the stream), as references."""
        missing = [f for f in files if f not in self._index]
        paths = [str(self.split.files[f]) for f in missing]
        if self.workers > 0:
            fresh = pool(self.workers).imap(index_shard, paths)
        else:
            fresh = map(index_shard, paths)
        fresh = zip(paths, fresh)  # in files' order, as `missing` is
        starts = np.concatenate([[0], np.cumsum(self.split.counts)])
        for f in files:
            if f not in self._index:
                path, entries = next(fresh)
                if len(entries) != self.split.counts[f]:
                    raise _damaged(path, f"{len(entries)} samples, its manifest says {self.split.counts[f]}")
                st = os.stat(path)
                stamp = (st.st_size, st.st_mtime_ns)
                first = int(starts[f])
                self._index[f] = [
                    Sample(key, label, Ref(path, offset, size, stamp))
                    for i, (key, label, offset, size) in enumerate(entries)
                    if not self.plan.stride or (first + i) % self.size == self.rank
                ]
            yield self._index[f]

    def _records(self) -> Iterator[Sample]:
        """The epoch's sample stream, as references: the decode workers read the bytes (read_bytes), so the
        training process neither reads nor pickles images, and a stride split reads only its own samples."""
        files = list(self.plan.files)
        if self.shuffle and not self.plan.stride:  # a stride split needs one file order on every rank
            files = [
                files[i] for i in np.random.default_rng([self.seed, self.epoch, self.rank]).permutation(len(files))
            ]
        for samples in self._indexed(files):
            yield from samples

    def _samples(self) -> Iterator[Sample]:
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, 1])
        if self.cache is not None:
            order = rng.permutation(len(self.cache)) if self.shuffle else range(len(self.cache))
            return (self.cache[i] for i in order)
        return shuffled(self._records(), self.buffer, rng) if self.shuffle else self._records()

    def _produce(self, out: queue.Queue, stop: threading.Event) -> None:
        try:
            # A part of an epoch (resumed mid-epoch) does not decode every image: the cache waits for a whole one.
            if self.cache_wanted and self.cache is None and not self.skip:
                self._start_cache()
            cache_name = self.cache.path if self.cache is not None else None
            stream = self._samples()
            for n in self.sizes[: self.skip]:
                for _ in range(n):
                    next(stream)
            workers = pool(self.workers) if self.workers > 0 else None
            pending: collections.deque = collections.deque()
            for n in self.sizes[self.skip :]:
                task = Task(
                    [next(stream) for _ in range(n)],
                    self.transform,
                    self.seed,
                    self.epoch,
                    self.decoder,
                    cache_name,
                    self._filling is not None,
                    self.encoded,
                )
                pending.append(workers.apply_async(decode_batch, (task,)) if workers else _Now(decode_batch(task)))
                while len(pending) > (self.inflight if workers else 0):
                    if not self._emit(pending.popleft().get(), out, stop):
                        return
            while pending:
                if not self._emit(pending.popleft().get(), out, stop):
                    return
            if self._filling is not None:
                rest = list(stream)
                if rest:  # never the case: the plan sized the batches from the manifest's counts
                    raise ConfigError(f"{len(rest)} more samples than the manifest of {self.split.folder} lists")
                self._finish_cache()
            out.put(None)
        except StopIteration:
            out.put(
                ConfigError(
                    f"the shards in {self.split.folder} hold fewer samples than their manifest says: "
                    "download or prepare the set again"
                )
            )
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, which raises it
            out.put(e)

    def _start_cache(self) -> None:
        """Epoch 1 (or the first whole epoch after a truncated one) writes the cache as it decodes."""
        if self._filling is not None:  # a partial cache of an epoch that stopped early
            self._filling.discard()
            self._filling = None
        try:
            self._filling = DecodedCache(self.cache_dir, self.rank)
        except OSError as e:
            self._drop_cache(e)

    def _keep(self, kept: list) -> None:
        try:
            self._filling.add(kept)
        except OSError as e:
            self._drop_cache(e)

    def _finish_cache(self) -> None:
        try:
            self._filling.close()
        except OSError as e:
            self._drop_cache(e)
            return
        self.cache, self._filling = self._filling, None
        log.info(
            "kept %d decoded images of rank %d in %s (%.1f MB)",
            len(self.cache),
            self.rank,
            self.cache.path,
            self.cache.nbytes / 1e6,
        )

    def _drop_cache(self, e: OSError) -> None:
        """A full folder (another job's files, an estimate too low): the run goes on decoding every epoch."""
        if self._filling is not None:
            self._filling.discard()
        self._filling, self.cache_wanted = None, False
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        log.warning(
            "--cache-decoded is off for rank %d: %s in %s (%s); every epoch decodes its images. Fix: --cache-dir "
            "on a local disk with room for the decoded images (the size check before epoch 1 is an estimate)",
            self.rank,
            "the folder is full" if full else "the cache file failed",
            self.cache_dir,
            e,
        )

    def _emit(self, result: Result, out: queue.Queue, stop) -> bool:
        for key, reason in result.skipped:
            if not self.skip_corrupt:
                raise ConfigError(
                    f"cannot decode sample {key} of the shards in {self.split.folder} ({reason}): "
                    "prepare the set again, or pass --skip-corrupt-images to skip and count such samples"
                )
            log.warning("skipping undecodable sample %s in %s: %s", key, self.split.folder, reason)
        if self._filling is not None and result.kept:
            self._keep(result.kept)
        n = len(result.labels) + len(result.skipped)
        if not result.labels:
            collate([None] * n)  # raises: every image of the batch was undecodable
        labels = torch.tensor(result.labels, dtype=torch.int64)
        if self.encoded:
            batch = (result.items, labels, len(result.skipped))
        else:
            images = result.items[0]
            batch = (
                images.pin_memory() if self.pin else images,
                labels.pin_memory() if self.pin else labels,
                len(result.skipped),
            )
        while not stop.is_set():
            try:
                out.put(batch, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        out: queue.Queue = queue.Queue(maxsize=2)
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

    def on_device(self, device: torch.device, channels_last: bool) -> GpuDecoded:
        return GpuDecoded(self, device, channels_last)


class GpuDecoded:
    """--gpu-decode: the loader's JPEGs decoded by nvJPEG (torchvision.io.decode_jpeg on the device), cropped,
    resized and flipped there, then normalised; samples the workers decoded (PNG, CMYK) join as pixels.
    Without a GPU the same code runs torchvision's CPU decoder: the fallback the tests check."""

    def __init__(self, loader: ShardLoader, device: torch.device, channels_last: bool):
        self.loader, self.device, self.channels_last = loader, device, channels_last
        self.size = loader.transform.size

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.loader.set_epoch(epoch, skip)

    def pixels(self, items: list) -> torch.Tensor:
        """uint8 NxHxWx3 on the device from a batch's items."""
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import functional as F

        jpegs = [i for i, item in enumerate(items) if isinstance(item, tuple)]
        encoded = [torch.frombuffer(bytearray(items[i][0]), dtype=torch.uint8) for i in jpegs]
        decoded = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=self.device) if jpegs else []
        out = [None] * len(items)
        for i, image in zip(jpegs, decoded):
            top, left, h, w, flip = items[i][1]
            x = F.resized_crop(image, top, left, h, w, [self.size, self.size], antialias=True)
            out[i] = (x.flip(-1) if flip else x).permute(1, 2, 0)
        for i, item in enumerate(items):
            if out[i] is None:
                out[i] = torch.from_numpy(np.ascontiguousarray(item)).to(self.device)
        return torch.stack(out)

    def __iter__(self):
        for items, labels, skipped in self.loader:
            yield normalize(self.pixels(items), self.channels_last), labels.to(self.device), skipped


def datasets(data_dir: pathlib.Path):
    """(train, validation or None, number of classes) for the training payload."""
    train, val, classes = open_set(data_dir)
    return train, val, len(classes)


def loader(
    split: ShardSplit,
    cfg,
    rank: int,
    size: int,
    batch: int,
    shuffle: bool,
    device,
    decoder: str = "auto",
    encoded: bool = False,
) -> ShardLoader:
    return ShardLoader(
        split,
        rank,
        size,
        batch,
        cfg.seed,
        Transform(cfg.image_size, train=shuffle),
        shuffle=shuffle,
        shuffle_buffer=cfg.shuffle_buffer,
        cache=cfg.cache_decoded,
        cache_dir=cfg.cache_dir,
        workers=cfg.workers,
        max_steps=cfg.max_steps_per_epoch if shuffle else 0,
        skip_corrupt=cfg.skip_corrupt_images,
        pin_memory=device.type == "cuda" and not encoded,
        decoder=decoder,
        encoded=encoded,
    )


def gpu_loader(
    split: ShardSplit, cfg, rank: int, size: int, batch: int, shuffle: bool, device, decoder: str = "auto"
) -> ShardLoader:
    if device.type != "cuda":
        log.warning("--gpu-decode without a GPU: torchvision's CPU JPEG decoder runs in the training process")
    return loader(split, cfg, rank, size, batch, shuffle, device, decoder, encoded=True)
