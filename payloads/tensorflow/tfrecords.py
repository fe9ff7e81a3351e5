"""TFRecord shards of images: their record format, and finding, counting, checking and planning who reads what.

    python -m payloads.tensorflow.tfrecords --check SHARDS

The shards are written by the data line (python -m datatools.prepare --formats tfrecord: SHARDS/tfrecord/),
which reports and skips an image that does not decode, with this module's example(). Format: the one
TensorFlow's ImageNet scripts write (`image/encoded`: JPEG/PNG bytes, `image/class/label`: int64), in files
named `train-00000-of-00064` (and `validation-*`). prepare numbers classes from 0 in sorted folder order, as
the PyTorch payload does; shards from TF's ImageNet scripts number them from 1, so train those with
--num-classes 1001.

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
from collections.abc import Sequence
from dataclasses import dataclass

from ..common import sharding
from ..common.errors import ConfigError

TRAIN, VALIDATION = "train", "validation"


def shard_files(data_dir: pathlib.Path, split: str) -> list[pathlib.Path]:
    return sorted(
        p
        for p in data_dir.glob(f"{split}-*")
        if p.is_file() and not p.name.startswith(".") and p.suffix not in (".txt", ".json")
    )


def find(data_dir: pathlib.Path) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
    """(train shards, validation shards); a clear error when there is nothing to train on."""
    if not data_dir.is_dir():
        raise ConfigError(f"--data-dir {data_dir} is not a folder: point it at a folder of TFRecord shards")
    train = shard_files(data_dir, TRAIN)
    if not train:
        raise ConfigError(
            f"no TFRecord shards named {TRAIN}-* in {data_dir}: write them from class folders with "
            f"python -m datatools.prepare --image-dir IMAGES --output-dir OUT --formats tfrecord, "
            "then pass --data-dir OUT/tfrecord"
        )
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
                raise ConfigError(
                    f"{path} is truncated in record {n + 1} (or is not a TFRecord file): re-copy or rewrite that shard"
                )
            f.seek(end)
            n += 1


@dataclass(frozen=True)
class Plan:
    files: tuple[pathlib.Path, ...]  # what this rank opens
    record_shard: bool  # keep every size-th record (file count not a multiple of ranks)
    samples: int  # records this rank trains on per epoch
    steps: int  # full batches every rank runs per epoch


def plan(files: Sequence[pathlib.Path], counts: Sequence[int], rank: int, size: int, batch: int) -> Plan:
    """Which files this rank reads (sharding.file_share, as the PyTorch shard reader) and how many full batches
    all ranks run (see the module docstring)."""
    mine, record_shard, per_rank = sharding.file_share(counts, rank, size)
    steps = min(per_rank) // batch
    if steps == 0:
        raise ConfigError(
            f"{sum(counts)} records in {len(files)} shard(s) give a rank only {min(per_rank)} samples, fewer than "
            f"one batch of {batch}: use a smaller batch, fewer processes, or more data"
        )
    return Plan(tuple(files[i] for i in mine), record_shard, per_rank[rank], steps)


def example(image: bytes, label: int) -> bytes:
    """One serialized record: the encoded image and its class number."""
    import tensorflow as tf

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
        )
    ).SerializeToString()


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

    return {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m payloads.tensorflow.tfrecords", description=__doc__.splitlines()[0])
    p.add_argument(
        "--check",
        type=pathlib.Path,
        metavar="SHARDS",
        required=True,
        help="decode every record of the train-* and validation-* shards in SHARDS and list bad ones",
    )
    a = p.parse_args(argv)
    if not a.check.is_dir():
        print(f"error: {a.check} is not a folder: pass the folder of TFRecord shards", file=sys.stderr)
        return 2
    bad = check(a.check)
    print("\n".join(bad) if bad else f"every record in {a.check} decodes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
