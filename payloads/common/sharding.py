"""Which samples each rank trains on, and in which batches.

Every epoch all ranks draw the same permutation of the whole dataset (seed + epoch) and rank r takes
every size-th sample starting at r: the shards are disjoint and together cover the dataset, so each
sample is seen exactly once per epoch. Sharding is by global rank, not local rank (local rank repeats
on every node, which would train every node on the same data).

All ranks must run the same number of steps, or the last allreduce waits for a rank that has already
finished the epoch. Shards differ in length by at most one, so every rank splits its shard into the
same number of near-equal batches, none larger than the batch size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    if not shuffle:
        return np.arange(num_samples)
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def shard(num_samples: int, rank: int, size: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Indices of the samples rank `rank` of `size` trains on in `epoch`."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    return epoch_permutation(num_samples, seed, epoch, shuffle)[rank::size]


def steps_per_epoch(num_samples: int, size: int, batch_size: int) -> int:
    """Steps every rank runs: enough for the largest shard at `batch_size` per step."""
    return math.ceil(math.ceil(num_samples / size) / batch_size)


def batches(
    num_samples: int, rank: int, size: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True
) -> list[np.ndarray]:
    """This rank's batches for `epoch`: the same count on every rank, each non-empty."""
    if num_samples < size:
        raise ValueError(f"{num_samples} samples cannot be shared by {size} processes: each needs at least one")
    mine = shard(num_samples, rank, size, seed, epoch, shuffle)
    steps = steps_per_epoch(num_samples, size, batch_size)
    if steps * batch_size == len(mine):
        return [mine[i * batch_size : (i + 1) * batch_size] for i in range(steps)]
    split = list(np.array_split(mine, steps))
    if len(split[-1]) == 0:
        raise ValueError(
            f"with a batch size of {batch_size}, {num_samples} samples over {size} processes leave rank {rank} "
            "a step short: use a batch size of 2 or more, or a sample count divisible by the process count"
        )
    return split


def file_share(counts: Sequence[int], rank: int, size: int) -> tuple[tuple[int, ...], bool, list[int]]:
    """How the ranks share a set of record files (WebDataset shards, TFRecord files) of `counts` records each:
    (the indices of the files rank `rank` opens, whether it keeps every size-th record of their stream, the
    records each rank reads). A file count that is a multiple of the ranks gives each rank whole files
    (files[rank::size]: no rank reads another's bytes); otherwise every rank reads every file and keeps every
    size-th record."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside 0..{size - 1}")
    n = len(counts)
    if n % size == 0:
        return tuple(range(rank, n, size)), False, [sum(counts[r::size]) for r in range(size)]
    total = sum(counts)
    return tuple(range(n)), True, [len(range(r, total, size)) for r in range(size)]
