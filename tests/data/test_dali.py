"""--loader dali (payloads/pytorch/dali.py): NVIDIA DALI's CPU pipeline over the same shards, on this CPU. Every
sample once per epoch over the ranks, equal steps on every rank, an epoch fixed by (seed, epoch) so a mid-epoch
resume gets the straight run's remaining steps, ImageNet's normalisation, the refusals; and two Horovod processes
training through it."""

import math

import pytest
import torch
from helpers import TINY, metrics, train

from payloads.common.config import TrainConfig
from payloads.common.errors import ConfigError
from payloads.pytorch import dali, data, inputs, shards

pytest.importorskip("nvidia.dali", reason="DALI is in .venv (requirements.txt): this runs wherever set-up ran")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def shard_dir(one_per_class):
    return one_per_class


def _cfg(shard_dir, **kw):
    return TrainConfig(data="shards", data_dir=shard_dir, loader="dali", image_size=16, workers=2, **kw)


def _epoch(batches, epoch, skip=0):
    batches.set_epoch(epoch, skip)
    return [(x.clone(), y.clone()) for x, y, _ in batches]


def test_ranks_cover_the_set_in_equal_steps_and_an_epoch_is_fixed_by_seed_and_epoch(shard_dir):
    for size in (2, 4):  # 15 and 15 samples; 7, 8, 7, 8 (parts of unequal size)
        seen, steps = [], set()
        for rank in range(size):
            train = inputs.build(_cfg(shard_dir), rank, size, 4, CPU).train
            got = _epoch(train, 0)
            steps.add(len(got))
            assert len(got) == len(train)
            seen += [int(y) for _, ys in got for y in ys]
        assert steps == {len(train)} and len(train) == math.ceil(math.ceil(30 / size) / 4)
        assert set(seen) == set(range(30)) and len(seen) == size * len(train) * 4  # the rest repeats samples
    train = inputs.build(_cfg(shard_dir), 0, 1, 4, CPU).train
    first, again, other = _epoch(train, 3), _epoch(train, 3), _epoch(train, 4)
    same = lambda a, b: all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    assert same(first, again) and not same(first, other)
    resumed = _epoch(train, 3, skip=2)  # a mid-epoch resume: the straight run's remaining steps
    assert len(resumed) == len(first) - 2 and same(resumed, first[2:])


def test_batches_are_normalised_images_on_the_device_in_the_asked_layout(shard_dir):
    built = inputs.build(_cfg(shard_dir), 0, 1, 6, CPU, channels_last=True)
    x, y, skipped = next(iter(built.val or built.train))
    assert x.shape == (6, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64 and skipped == 0
    assert x.is_contiguous(memory_format=torch.channels_last) and built.num_classes == 30
    pixels = x * torch.tensor(data.STD).view(1, 3, 1, 1) + torch.tensor(data.MEAN).view(1, 3, 1, 1)
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5 and pixels.std() > 0.01  # ImageNet's mean and std
    x, _, _ = next(iter(inputs.build(_cfg(shard_dir), 0, 1, 6, CPU, channels_last=False).train))
    assert x.is_contiguous()
    assert dali.labels_of(
        torch.tensor([[49, 50, 0, 0], [55, 10, 0, 0], [48, 0, 0, 0]], dtype=torch.uint8)
    ).tolist() == [12, 7, 0]


def test_the_tars_are_indexed_once_and_read_in_a_new_order_each_epoch(shard_dir, monkeypatch):
    """Without index files DALI's reader indexes every tar each time a pipeline is built (each epoch and pass): the
    loader writes them once (DALI's wds2idx). Training reads the files in a new order each epoch, the same on every
    rank (so the ranks' parts still cover the set), each file with its own index; validation in order."""
    import wds2idx

    indexed, pipelines = [], []
    real_index, real_pipeline = wds2idx.IndexCreator.create_index, dali._pipeline
    monkeypatch.setattr(wds2idx.IndexCreator, "create_index", lambda self: indexed.append(self.uri) or real_index(self))
    monkeypatch.setattr(dali, "_pipeline", lambda f, i, *a: pipelines.append((f, i)) or real_pipeline(f, i, *a))
    files = sorted(str(f) for f in shards.open_set(shard_dir)[0].files)
    runs = [inputs.build(_cfg(shard_dir), rank, 2, 4, CPU).train for rank in (0, 1)]
    for epoch in (0, 1):
        for batches in runs:
            _epoch(batches, epoch)
    assert sorted(indexed) == sorted(files * 2)  # each rank's loader once, not once per epoch
    (e0r0, i0), (e0r1, _), (e1r0, i1), _ = pipelines
    assert sorted(e0r0) == sorted(e1r0) == files and e0r0 == e0r1 and e0r0 != e1r0
    assert len(set(i0)) == len(files) and {f: i for f, i in zip(e0r0, i0)} == {f: i for f, i in zip(e1r0, i1)}
    val = dali.Batches(shards.open_set(shard_dir)[0], data.Reading(0, 1, 4, shuffle=False), 16, CPU, False)
    _epoch(val, 3)
    assert pipelines[-1][0] == [str(f) for f in shards.open_set(shard_dir)[0].files]


def test_what_dali_does_not_do_is_refused_before_training(shard_dir, monkeypatch):
    for kw, flag in (
        ({"cache_decoded": True}, "--cache-decoded"),
        ({"gpu_decode": True}, "--gpu-decode"),
        ({"skip_corrupt_images": True}, "--skip-corrupt-images"),
    ):
        with pytest.raises(ConfigError, match=f"{flag} is an option of --loader workers"):
            inputs.build(_cfg(shard_dir, **kw), 0, 1, 4, CPU)
    with pytest.raises(ConfigError, match="--loader dali reads WebDataset shards"):
        inputs.build(TrainConfig(data="synthetic", loader="dali"), 0, 1, 4, CPU)
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(
        builtins,
        "__import__",
        lambda name, *a, **k: (
            (_ for _ in ()).throw(ImportError(name)) if name.startswith("nvidia.dali") else real(name, *a, **k)
        ),
    )
    with pytest.raises(ConfigError, match="pip install nvidia-dali-cuda130"):
        inputs.build(_cfg(shard_dir), 0, 1, 4, CPU)


@pytest.mark.launches
def test_two_horovod_processes_train_through_dali_and_end_identical(shard_dir, tmp_path):
    out = tmp_path / "run"
    args = [a for a in TINY if a not in ("--synthetic-samples", "128")]
    args += ["--data", "shards", "--data-dir", str(shard_dir), "--loader", "dali", "--num-classes", "30"]
    train(2, args + ["--epochs", "2", "--batch-size", "4", "--workers", "1", "--output-dir", str(out)])
    m = metrics(out)
    assert m["summary"]["ranks_identical"] is True and m["run"]["config"]["loader"] == "dali"
    assert m["run"]["resolved"]["decoder"] == "dali (cpu)"
    assert [e["images"] for e in m["epochs"]] == [32, 32]  # 4 steps of 4 on each of 2 ranks: 30 samples and 2 repeats
