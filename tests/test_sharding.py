import numpy as np
import pytest

from payloads.common import sharding


@pytest.mark.parametrize("n,size,batch", [(128, 2, 16), (101, 2, 8), (1000, 3, 7), (17, 4, 2), (5, 5, 1), (64, 1, 64)])
def test_shards_are_disjoint_and_cover_the_dataset(n, size, batch):
    for epoch in (0, 3):
        per_rank = [np.concatenate(sharding.batches(n, r, size, batch, seed=1, epoch=epoch)) for r in range(size)]
        everything = np.concatenate(per_rank)
        assert len(everything) == n, "a sample is missing or repeated"
        assert sorted(everything.tolist()) == list(range(n))


# Steps by hand: the largest shard (n / size, rounded up) in batches of `batch`, the last one short.
@pytest.mark.parametrize(
    "n,size,batch,steps",
    [
        (101, 2, 8, 7),  # shards of 51 and 50: 6 x 8 + 3
        (1000, 3, 7, 48),  # 334, 333, 333: 47 x 7 + 5
        (11, 2, 5, 2),  # 6 and 5: 5 + 1
        (129, 4, 32, 2),  # 33, 32, 32, 32: 32 + 1
    ],
)
def test_every_rank_runs_the_same_number_of_non_empty_steps(n, size, batch, steps):
    counts = {len(sharding.batches(n, r, size, batch, seed=0, epoch=0)) for r in range(size)}
    assert counts == {steps}
    assert sharding.steps_per_epoch(n, size, batch) == steps
    for r in range(size):
        assert all(0 < len(b) <= batch for b in sharding.batches(n, r, size, batch, seed=0, epoch=0))


def test_sharding_is_by_global_rank_and_reshuffled_each_epoch():
    a0 = sharding.shard(100, 0, 4, seed=7, epoch=0)
    assert not np.array_equal(a0, sharding.shard(100, 1, 4, seed=7, epoch=0))
    assert np.array_equal(a0, sharding.shard(100, 0, 4, seed=7, epoch=0)), "same seed+epoch must give the same shard"
    assert not np.array_equal(a0, sharding.shard(100, 0, 4, seed=7, epoch=1))


def test_global_batches_do_not_depend_on_the_process_count():
    # Step k of a 2-process run covers exactly step k of a 1-process run with twice the batch:
    # what makes the averaged 2-process run comparable to a single process.
    one = sharding.batches(64, 0, 1, 32, seed=3, epoch=0)
    two = [sharding.batches(64, r, 2, 16, seed=3, epoch=0) for r in range(2)]
    for k, b in enumerate(one):
        assert sorted(b.tolist()) == sorted(np.concatenate([two[0][k], two[1][k]]).tolist())


def test_too_few_samples_is_an_error():
    with pytest.raises(ValueError, match="cannot be shared by 4 processes"):
        sharding.batches(3, 0, 4, 1, seed=0, epoch=0)
    with pytest.raises(ValueError, match="batch size of 2 or more"):
        sharding.batches(5, 1, 2, 1, seed=0, epoch=0)


@pytest.mark.parametrize("counts,size", [((5, 5, 5, 5), 2), ((5, 5, 4), 2), ((6,), 3), ((3, 3, 3, 3, 3, 3), 3)])
def test_the_shard_and_tfrecord_readers_share_one_rank_plan(counts, size):
    """The PyTorch shard reader and the TFRecord reader give each rank the same files, the same record stride and
    the same record count (sharding.file_share); they differ only in how they cut steps (every record, or full
    batches)."""
    import pathlib

    from payloads.pytorch import shards
    from payloads.tensorflow import tfrecords

    files = [pathlib.Path(f"f{i}") for i in range(len(counts))]
    seen = []
    for rank in range(size):
        torch_plan = shards.plan(counts, rank, size, batch=1)
        tf_plan = tfrecords.plan(files, counts, rank, size, batch=1)
        assert [files[i] for i in torch_plan.files] == list(tf_plan.files)
        assert (torch_plan.stride, torch_plan.samples) == (tf_plan.record_shard, tf_plan.samples)
        seen.append(torch_plan.samples)
    assert sum(seen) == sum(counts)  # every record read by exactly one rank
