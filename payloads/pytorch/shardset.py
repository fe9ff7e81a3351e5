"""A WebDataset shard set (python -m datatools.prepare) as this rank sees it: the manifest's splits, which files
and records are the rank's (`plan`, after common/sharding.file_share), where each sample's image lies in its tar
file (`index_shard`, read once per run), and each epoch's order of the rank's samples (`epoch_order`): a new file
order every epoch, then a shuffle buffer; or, once the decoded cache is complete, a full shuffle of the cache.
Everything here is a pure function of (seed, epoch, rank, step) and the files, so the decode workers derive each
step's samples themselves and a resumed run repeats a straight one."""

from __future__ import annotations

import io
import math
import os
import pathlib
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..common import manifest, sharding
from ..common.errors import ConfigError
from ..common.manifest import TRAIN, VALIDATION, WEBDATASET


@dataclass(frozen=True)
class Sample:
    key: str
    label: int
    data: bytes  # the encoded image


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


def open_shard(path) -> object:
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


def index_shard(path: str, dims: bool = False) -> list[tuple]:
    """(key, label, offset, size) of every sample's image in one tar shard, in the shard's order, plus its decoded
    (height, width) from the image's header when `dims` (the decoded cache's layout; (0, 0) where unreadable): the
    tar headers and the small .cls members are read, the image bytes skipped over (a seek each). The same samples
    as read_shard (WebDataset's grouping of consecutive members by key). Runs in a decode worker, or inline."""
    import tarfile

    from webdataset.tariterators import base_plus_ext

    out: list[tuple[str, int, int, int]] = []
    with open_shard(path) as f:
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
            entry = (key, int(f.read(members["cls"][1])), *image)
            out.append((*entry, *image_dims(f, *image)) if dims else entry)

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


def image_dims(f, offset: int, size: int) -> tuple[int, int]:
    """(height, width) of the image at `offset` in the open file `f`, from its header (the first 64 KiB, all of it
    where that is not enough); (0, 0) where Pillow cannot read one."""
    from PIL import Image

    for want in (min(size, 1 << 16), size):
        try:
            with Image.open(io.BytesIO(os.pread(f.fileno(), want, offset))) as img:
                return img.height, img.width
        except Exception:  # noqa: BLE001 - a header past the first bytes, or no image: the caller decides
            continue
    return 0, 0


def read_at(f, offset: int, size: int, path) -> bytes:
    """`size` bytes at `offset` (pread may return less than asked on a FUSE mount or after a signal: read on)."""
    parts, got = [], 0
    while got < size:
        part = os.pread(f.fileno(), size - got, offset + got)
        if not part:
            raise _damaged(path, f"{size} bytes at {offset}, {got} read: truncated")
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_shard(path: pathlib.Path) -> Iterator[Sample]:
    """Samples of one tar shard, streamed (works on a blobfuse mount: sequential reads only)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    with open_shard(path) as f:
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


# ------------------------------------------------------------------------------------- the rank's index


def sample_seed(key: str) -> int:
    """A sample's part of its augmentation seed: the key, not Python's hash(), which differs between processes."""
    return int(key) if key.isdigit() else zlib.crc32(key.encode())


@dataclass(frozen=True)
class Index:
    """This rank's samples in the plan's file order (a stride split keeps every size-th record of the stream):
    where each image lies, its label and seed, and with a decoded cache each image's decoded (height, width).
    Built once per run from index_shard's entries; sent once to every decode worker."""

    paths: tuple[str, ...]  # per file of the plan
    stamps: tuple[tuple[int, int], ...]  # each file's (size, mtime_ns) when indexed
    bounds: np.ndarray  # int64: file i's samples are positions bounds[i]:bounds[i+1]
    file: np.ndarray  # int32 per sample
    offset: np.ndarray  # int64 per sample
    size: np.ndarray  # int64 per sample
    label: np.ndarray  # int64 per sample
    keys: tuple[str, ...]
    seeds: tuple[int, ...]
    dims: np.ndarray | None  # int64 (n, 2), or None

    def __len__(self) -> int:
        return len(self.keys)


def build_index(split: ShardSplit, rank_plan: RankPlan, rank: int, size: int, entries: Sequence[list]) -> Index:
    """The Index from index_shard's entries of each of the plan's files (in the plan's order)."""
    starts = np.concatenate([[0], np.cumsum(split.counts)])
    paths, stamps, bounds, rows = [], [], [0], []
    for i, (f, found) in enumerate(zip(rank_plan.files, entries)):
        path = str(split.files[f])
        if len(found) != split.counts[f]:
            raise _damaged(path, f"{len(found)} samples, its manifest says {split.counts[f]}")
        st = os.stat(path)
        paths.append(path)
        stamps.append((st.st_size, st.st_mtime_ns))
        first = int(starts[f])
        mine = [e for j, e in enumerate(found) if not rank_plan.stride or (first + j) % size == rank]
        rows += [(i, *e) for e in mine]
        bounds.append(len(rows))
    with_dims = bool(rows) and len(rows[0]) == 7
    col = list(zip(*rows)) if rows else [()] * 7
    return Index(
        tuple(paths),
        tuple(stamps),
        np.array(bounds, np.int64),
        np.array(col[0], np.int32),
        np.array(col[3], np.int64),
        np.array(col[4], np.int64),
        np.array(col[2], np.int64),
        tuple(col[1]),
        tuple(sample_seed(k) for k in col[1]),
        np.stack([np.array(col[5], np.int64), np.array(col[6], np.int64)], 1) if with_dims else None,
    )


def epoch_order(index: Index, rank_plan: RankPlan, seed: int, epoch: int, rank: int, shuffle: bool, buffer: int):
    """The positions of this rank's samples in the epoch's order: the plan's files in a new order every epoch (one
    order on every rank for a stride split), streamed through a shuffle buffer."""
    files = range(len(index.paths))
    if shuffle and not rank_plan.stride:
        files = np.random.default_rng([seed, epoch, rank]).permutation(len(files)).tolist()
    stream = (p for f in files for p in range(int(index.bounds[f]), int(index.bounds[f + 1])))
    if shuffle:
        stream = shuffled(stream, buffer, np.random.default_rng([seed, epoch, rank, 1]))
    return np.fromiter(stream, np.int64, len(index))


def key_order(index: Index) -> np.ndarray:
    """The rank's samples' positions in key order (the decoded cache's layout)."""
    return np.array(sorted(range(len(index)), key=index.keys.__getitem__), np.int64)


def cached_order(by_key: np.ndarray, seed: int, epoch: int, rank: int, shuffle: bool) -> np.ndarray:
    """The epoch's order with --cache-decoded in every epoch after the first (also a resumed or rolled-back one whose
    cache is new or incomplete, which then fills it): a full shuffle of the samples in key order."""
    if not shuffle:
        return by_key
    return by_key[np.random.default_rng([seed, epoch, rank, 1]).permutation(len(by_key))]
