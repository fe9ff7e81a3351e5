"""--loader dali: the shard set through NVIDIA DALI (NVIDIA DeepLearningExamples' loader for ResNet-50).

DALI reads the same WebDataset shards (its webdataset reader, one shard of the samples per rank), decodes in C++
threads inside the training process (no GIL, no worker processes; `--workers` is its thread count) and, on a GPU,
decodes JPEGs with the `mixed` backend (Huffman on the CPU, the rest on the GPU; the hardware decoder of A100/H100
where DALI uses it); the crop, flip and normalisation (ImageNet's mean and std) run in the pipeline too, on the
device, and the batches arrive as float Nx3xHxW there (channels_last when asked). Without a GPU the same pipeline
runs on the CPU (the tests run it so).

What differs from the worker processes (shards.py), on purpose or as DALI does it:
- The crops are DALI's (its random resized crop and resize), not Pillow's: the same distribution, other pixels.
- Equal steps on every rank: DALI gives each rank a contiguous part of the samples (sizes differing by at most
  one) and every rank runs ceil(largest part / batch) steps, the last batches filled with repeated samples.
- Each epoch builds its pipeline seeded by (seed, epoch, rank), so an epoch is the same whatever happened before it; a
  mid-epoch resume runs the epoch's first `skip` steps through the pipeline and drops them (their decoding is
  spent again, the remaining steps are the straight run's). The next epoch's pipeline is built when it starts:
  no prefetch across epochs.
- No --cache-decoded, --gpu-decode or --skip-corrupt-images (an undecodable image stops the run, naming DALI's
  error); refused before training.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import pathlib
import shutil
import tempfile

import numpy as np
import torch

from ..common.errors import ConfigError
from . import data

log = logging.getLogger(__name__)

LABEL_BYTES = 12  # a .cls member's ASCII digits, padded: up to 12 digits of class index
INSTALL = "pip install nvidia-dali-cuda130 (the GPU image has it)"


def check(cfg) -> None:
    """What --loader dali cannot do, refused before anything is read."""
    if cfg.data != "shards":
        raise ConfigError("--loader dali reads WebDataset shards: use --data shards, or drop --loader dali")
    for flag, on in (
        ("--cache-decoded", cfg.cache_decoded),
        ("--gpu-decode", cfg.gpu_decode),
        ("--skip-corrupt-images", cfg.skip_corrupt_images),
    ):
        if on:
            raise ConfigError(f"{flag} is an option of --loader workers; DALI has its own path: drop {flag}")
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        raise ConfigError(f"--loader dali needs NVIDIA DALI, which is not installed: {INSTALL}") from None


def labels_of(padded: torch.Tensor) -> torch.Tensor:
    """int64 labels from the .cls members' ASCII digits (one row per sample, padded with zero bytes), in a few
    whole-batch operations where the tensor lies (on the GPU: no copy, no sync)."""
    x = padded.to(torch.int64)
    digit = (x >= 48) & (x <= 57)
    after = digit.flip(1).cumsum(1).flip(1) - digit.to(torch.int64)  # digits to the right of each position
    return (torch.where(digit, x - 48, 0) * torch.pow(10, after)).sum(1)


def index_files(files: list[str]) -> list[str]:
    """DALI's index of each tar (its wds2idx, shipped with DALI), written once per loader in a folder of its own: the
    reader otherwise indexes every tar each time a pipeline is built, each epoch and pass."""
    from wds2idx import IndexCreator

    folder = tempfile.mkdtemp(prefix="dali-index-")
    atexit.register(shutil.rmtree, folder, True)
    out = []
    for i, tar in enumerate(files):
        out.append(os.path.join(folder, f"{i}.idx"))
        with IndexCreator(tar, out[-1], verbose=False) as creator:
            creator.create_index()
    return out


def _pipeline(files, indexes, r: data.Reading, device_id, seed: int, side: int):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(
        batch_size=r.batch, num_threads=max(1, r.workers), device_id=device_id, seed=seed, prefetch_queue_depth=2
    )
    def pipe():
        jpegs, cls = fn.readers.webdataset(
            paths=files,
            index_paths=indexes,
            ext=["jpg;png;jpeg", "cls"],
            missing_component_behavior="error",
            random_shuffle=r.shuffle,
            initial_fill=max(r.shuffle_buffer, 1),
            shard_id=r.rank,
            num_shards=r.size,
            pad_last_batch=True,
            name="Reader",
        )
        images = fn.decoders.image(jpegs, device="mixed" if device_id is not None else "cpu", output_type=types.RGB)
        if r.shuffle:  # training: random crops and flips; validation: the centre crop
            images = fn.random_resized_crop(
                images, size=[side, side], random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3], antialias=True
            )
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.resize(images, resize_shorter=int(side * 256 / 224), antialias=True)
            mirror = 0
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="HWC",
            crop=[side, side],
            mean=[m * 255 for m in data.MEAN],
            std=[s * 255 for s in data.STD],
            mirror=mirror,
        )
        labels = fn.pad(cls, fill_value=0, shape=[LABEL_BYTES])
        return images, labels.gpu() if device_id is not None else labels  # on a GPU the labels arrive there

    return pipe()


class Batches(data.EpochSteps):
    """This rank's steps of one split through DALI: (float Nx3xHxW on the device, int64 labels there, 0)."""

    def __init__(self, split, reading: data.Reading, side: int, device, channels_last: bool):
        self.files, self.reading, self.side = [str(f) for f in split.files], reading, side
        self.device, self.channels_last, self.indexes = device, channels_last, None
        largest = math.ceil(len(split) / reading.size)  # DALI's parts differ by at most one sample
        if largest < 1:
            raise ConfigError(
                f"{len(split)} samples cannot be split over {reading.size} processes: prepare more samples"
            )
        self.limit(math.ceil(largest / reading.batch), reading.max_steps)

    def __iter__(self):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        r = self.reading
        self.indexes = self.indexes or index_files(self.files)
        # The epoch's own, whatever ran before it, and the rank's own: ranks draw different crops and buffers.
        seed = ((r.seed * 1_000_003 + self.epoch) * 1_009 + r.rank) % 2**31
        order = range(len(self.files))  # training: the files in a new order each epoch, the same on every rank
        if r.shuffle:
            order = np.random.default_rng([r.seed, self.epoch]).permutation(len(self.files)).tolist()
        files, indexes = [self.files[i] for i in order], [self.indexes[i] for i in order]
        device_id = self.device.index if self.device.type == "cuda" else None
        pipe = _pipeline(files, indexes, r, device_id, seed, self.side)
        try:
            pipe.build()
        except RuntimeError as e:  # its reader's index of the tars, a decoder or the device it was given
            raise ConfigError(
                f"DALI's pipeline did not start (over {len(self.files)} shards in {pathlib.Path(self.files[0]).parent}): "
                f"{e}"
            ) from None
        batches = DALIGenericIterator(
            [pipe], ["images", "labels"], reader_name="Reader", last_batch_policy=LastBatchPolicy.FILL
        )
        try:
            for step, out in enumerate(batches):
                if step >= self.steps:
                    break
                if step < self.skip:
                    continue
                images = out[0]["images"].permute(0, 3, 1, 2)  # NHWC in memory: a channels_last NCHW view
                if not self.channels_last:
                    images = images.contiguous()
                yield images, labels_of(out[0]["labels"]), 0
        finally:
            del batches, pipe
