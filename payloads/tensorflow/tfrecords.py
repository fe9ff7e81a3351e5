"""TFRecord shards of images: write them from class folders, count and check them, plan who reads what.

    python -m payloads.tensorflow.tfrecords --image-dir IMAGES --output-dir SHARDS [--shards 64]
    python -m payloads.tensorflow.tfrecords --check SHARDS

Format: the one TensorFlow's ImageNet scripts write (`image/encoded`: JPEG/PNG bytes, `image/class/label`:
int64), in files named `train-00000-of-00064` (and `validation-*` from IMAGES/val). Our writer numbers
classes from 0 in sorted folder order, as the PyTorch payload does; shards from TF's ImageNet scripts
number them from 1, so train those with --num-classes 1001.

Sharding by rank: when the file count is a multiple of the process count, each rank reads whole files
(files[rank::size]: no rank reads another's bytes); otherwise every rank reads every file and keeps every
size-th record (balanced, but each rank reads all the bytes: write a multiple of the process count).
Either way the shards are disjoint and cover the data. Every rank runs the same number of steps (the
smallest shard's full batches), or the last allreduce would wait for a rank that has finished.
"""
from __future__ import annotations

import argparse
import pathlib
import struct
import sys
from dataclasses import dataclass
from typing import Sequence

from ..common.errors import ConfigError

TRAIN, VALIDATION = "train", "validation"


def shard_files(data_dir: pathlib.Path, split: str) -> list[pathlib.Path]:
    return sorted(p for p in data_dir.glob(f"{split}-*")
                  if p.is_file() and not p.name.startswith(".") and p.suffix not in (".txt", ".json"))


def find(data_dir: pathlib.Path) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
    """(train shards, validation shards); a clear error when there is nothing to train on."""
    if not data_dir.is_dir():
        raise ConfigError(f"--data-dir {data_dir} is not a folder: point it at a folder of TFRecord shards")
    train = shard_files(data_dir, TRAIN)
    if not train:
        raise ConfigError(f"no TFRecord shards named {TRAIN}-* in {data_dir}: write them from class folders with "
                          f"python -m payloads.tensorflow.tfrecords --image-dir IMAGES --output-dir {data_dir}")
    return train, shard_files(data_dir, VALIDATION)


def count_records(path: pathlib.Path) -> int:
    """Records in one TFRecord file, reading only each record's 12-byte header (seeks past the data)."""
    n = 0
    size = path.stat().st_size
    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if not header:
                return n
            if len(header) < 12:
                raise ConfigError(f"{path} is truncated after {n} records: re-copy or rewrite that shard")
            (length,) = struct.unpack("<Q", header[:8])
            end = f.tell() + length + 4
            if end > size:
                raise ConfigError(f"{path} is truncated in record {n + 1} (or is not a TFRecord file): "
                                  "re-copy or rewrite that shard")
            f.seek(end)
            n += 1


@dataclass(frozen=True)
class Plan:
    files: tuple[pathlib.Path, ...]   # what this rank opens
    record_shard: bool                # keep every size-th record (file count not a multiple of ranks)
    samples: int                      # records this rank trains on per epoch
    steps: int                        # full batches every rank runs per epoch


def plan(files: Sequence[pathlib.Path], counts: Sequence[int], rank: int, size: int, batch: int) -> Plan:
    """Which files this rank reads and how many steps all ranks run (see the module docstring)."""
    if len(files) % size == 0:
        per_rank = [sum(counts[r::size]) for r in range(size)]
        mine, record_shard = tuple(files[rank::size]), False
    else:
        total = sum(counts)
        per_rank = [len(range(r, total, size)) for r in range(size)]
        mine, record_shard = tuple(files), True
    steps = min(per_rank) // batch
    if steps == 0:
        raise ConfigError(
            f"{sum(counts)} records in {len(files)} shard(s) give a rank only {min(per_rank)} samples, fewer than "
            f"one batch of {batch}: use a smaller batch, fewer processes, or more data")
    return Plan(mine, record_shard, per_rank[rank], steps)


def _features(image: bytes, label: int):
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def write(image_dir: pathlib.Path, output_dir: pathlib.Path, shards: int, split: str = TRAIN) -> int:
    """Write the class-folder tree `image_dir` as `shards` files; returns the record count."""
    import tensorflow as tf

    from ..common import imagefolder

    tree = imagefolder.scan(image_dir)
    shards = max(1, min(shards, len(tree.samples)))
    output_dir.mkdir(parents=True, exist_ok=True)
    writers = [tf.io.TFRecordWriter(str(output_dir / f".{split}-{i:05d}-of-{shards:05d}.tmp")) for i in range(shards)]
    for i, (path, label) in enumerate(tree.samples):
        writers[i % shards].write(_features(pathlib.Path(path).read_bytes(), label))
    for i, w in enumerate(writers):
        w.close()
        tmp = output_dir / f".{split}-{i:05d}-of-{shards:05d}.tmp"
        tmp.rename(output_dir / f"{split}-{i:05d}-of-{shards:05d}")   # whole files only, never half-written
    (output_dir / f"{split}-classes.txt").write_text("".join(f"{c}\n" for c in tree.classes))
    return len(tree.samples)


def check(data_dir: pathlib.Path) -> list[str]:
    """Every record that does not parse or decode, as 'file#index: error'."""
    import tensorflow as tf

    bad = []
    for path in shard_files(data_dir, TRAIN) + shard_files(data_dir, VALIDATION):
        for i, raw in enumerate(tf.data.TFRecordDataset(str(path))):
            try:
                ex = tf.io.parse_single_example(raw, feature_spec())
                tf.io.decode_image(ex["image/encoded"], channels=3, expand_animations=False)
            except (tf.errors.InvalidArgumentError, ValueError) as e:
                bad.append(f"{path}#{i}: {str(e).splitlines()[0]}")
    return bad


def feature_spec() -> dict:
    import tensorflow as tf

    return {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m payloads.tensorflow.tfrecords", description=__doc__.splitlines()[0])
    p.add_argument("--image-dir", type=pathlib.Path, help="root/<class>/<image>, or root/train and root/val so")
    p.add_argument("--output-dir", type=pathlib.Path)
    p.add_argument("--shards", type=int, default=64, help="files per split (at least the process count)")
    p.add_argument("--check", type=pathlib.Path, metavar="SHARDS", help="decode every record and list bad ones")
    a = p.parse_args(argv)
    try:
        if a.check:
            bad = check(a.check)
            print("\n".join(bad) if bad else f"every record in {a.check} decodes")
            return 1 if bad else 0
        if not (a.image_dir and a.output_dir):
            p.error("give --image-dir and --output-dir (or --check SHARDS)")
        if a.shards < 1:
            p.error(f"--shards must be at least 1, got {a.shards}")
        from ..common import imagefolder

        train_dir, val_dir = imagefolder.split_dirs(a.image_dir)
        print(f"{write(train_dir, a.output_dir, a.shards, TRAIN)} training records in {a.output_dir}")
        if val_dir is not None:
            print(f"{write(val_dir, a.output_dir, a.shards, VALIDATION)} validation records in {a.output_dir}")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
