"""The training loop's one source of batches: `build(cfg, ...)` -> Inputs(train, val, num_classes).

Every Batches object has `len()` steps per epoch (equal on every rank), `set_epoch(epoch, skip=0)` (all
shuffling and augmentation depend on (seed, epoch, rank/sample) only, so a resumed run repeats a
straight one; `skip`: the steps of the epoch already trained before a mid-epoch checkpoint, which the next
iteration leaves out, without reading or decoding them) and yields (images, labels, skipped): images float32 Nx3xHxW on the device, normalised
there with ImageNet's mean/std (channels_last when asked), labels int64 on the device, skipped the
undecodable images dropped from the step (--skip-corrupt-images).

- synthetic: a pool of uint8 images made once on the device (data.SyntheticImages), indexed per step
  there: no host work and no host-to-device copy per step, the GPU's ceiling (as Horovod's benchmark).
- imagefolder: a DataLoader with worker processes (forkserver) yielding uint8 batches;
- shards: shards.ShardLoader, decoding in worker processes (one intra-op thread each) into shared slots.
Real data goes through `Prefetched`: pinned uint8 host batches copied on a side CUDA stream while the
previous step runs, normalised there, handed over with record_stream (NVIDIA DeepLearningExamples'
PrefetchedWrapper); on a CPU the same steps run without streams.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..common import imagefolder, sharding
from ..common.errors import ConfigError
from . import data, decoders, shards

log = logging.getLogger(__name__)
Batch = tuple[torch.Tensor, torch.Tensor, int]


class Batches(Protocol):
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int, skip: int = 0) -> None: ...
    def __iter__(self) -> Iterator[Batch]: ...


@dataclass
class Inputs:
    train: Batches
    val: Batches | None
    num_classes: int


class Prefetched:
    """Moves a host loader's uint8 batches to the device and normalises them there. On CUDA: the copy and
    the normalisation of batch k+1 are queued on a side stream before batch k is handed to the training
    loop, and the compute stream waits for the side stream only when it takes batch k+1."""

    def __init__(self, host, device: torch.device, channels_last: bool):
        self.host, self.device, self.channels_last = host, device, channels_last

    def __len__(self) -> int:
        return len(self.host)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.host.set_epoch(epoch, skip)

    def _copy(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both to the device without blocking: from pinned memory (the ring's slots, DataLoader's pinned batches)
        an asynchronous copy; the host never waits for the device here."""
        if images.dtype != torch.uint8:
            raise TypeError(f"the host loader yielded {images.dtype} images: uint8 is what crosses to the device")
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[Batch]:
        if self.device.type != "cuda":
            for images, labels, skipped in self.host:
                images, labels = self._copy(images, labels)
                yield data.normalize(images, self.channels_last), labels, skipped
            return
        stream = torch.cuda.Stream(self.device)
        ready = None
        fence = getattr(self.host, "fence", None)  # a loader that reuses its host buffers (shards.ShardLoader)
        for images, labels, skipped in self.host:
            with torch.cuda.stream(stream):
                images, labels = self._copy(images, labels)
                if fence is not None:  # the slot is free once the copies are done, before the normalisation
                    copied = torch.cuda.Event()
                    copied.record(stream)
                    fence(copied)
                nxt = (data.normalize(images, self.channels_last), labels)
            if ready is not None:
                yield ready
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(stream)
            for t in nxt:  # made on the side stream, used on the compute stream: keep the allocator off them
                t.record_stream(compute)
            ready = (*nxt, skipped)
        if ready is not None:
            yield ready


class SyntheticBatches(data.EpochSteps):
    """This rank's steps over SyntheticImages held on the device: each epoch's sample indices (sharded
    as common/sharding.py does) go to the device once; a step is a gather and the normalisation."""

    def __init__(
        self,
        images: data.SyntheticImages,
        rank: int,
        size: int,
        batch: int,
        seed: int,
        max_steps: int,
        channels_last: bool,
    ):
        try:
            sharding.batches(len(images), rank, size, batch, seed, epoch=0)  # fail now, not mid-epoch
        except ValueError as e:
            raise ConfigError(f"{e} (data set of {len(images)} samples)") from None
        self.images, self.args, self.channels_last = images, (len(images), rank, size, batch, seed), channels_last
        self.limit(sharding.steps_per_epoch(len(images), size, batch), max_steps)

    def __iter__(self) -> Iterator[Batch]:
        parts = sharding.batches(*self.args, epoch=self.epoch)[self.skip : self.steps]
        ends = np.cumsum([len(p) for p in parts]).tolist()
        flat = torch.from_numpy(np.concatenate(parts)).to(self.images.images.device, non_blocking=True)
        start = 0
        for end in ends:
            images, labels = self.images.batch(flat[start:end])
            start = end
            yield data.normalize(images, self.channels_last), labels, 0


class FolderLoader:
    """DataLoader over class folders yielding uint8 batches; the epoch travels with each index."""

    def __init__(
        self, dataset: data.ImageFiles, cfg, rank: int, size: int, batch: int, shuffle: bool, device: torch.device
    ):
        try:
            self.sampler = data.ShardedBatchSampler(
                len(dataset),
                rank,
                size,
                batch,
                cfg.seed,
                shuffle=shuffle,
                max_steps=cfg.max_steps_per_epoch if shuffle else 0,
                tag_epoch=True,
            )
        except ValueError as e:
            raise ConfigError(f"{e} (data set of {len(dataset)} samples)") from None
        kwargs = {}
        if cfg.workers > 0:
            # forkserver: fork after Horovod's background thread and Gloo sockets exist is unsafe.
            kwargs = dict(multiprocessing_context="forkserver", persistent_workers=True, prefetch_factor=4)
            # A SIGTERM to the whole job (the local launcher signals every process) must not end the workers
            # before their rank has reached the agreed stop step and written its checkpoint; they end with it.
            kwargs["worker_init_fn"] = _ignore_sigterm
            _end_workers_at_exit()
        self.loader = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            num_workers=cfg.workers,
            collate_fn=data.collate,
            pin_memory=device.type == "cuda",
            **kwargs,
        )

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.sampler.set_epoch(epoch, skip)

    def __iter__(self):
        return iter(self.loader)


def _ignore_sigterm(_worker: int) -> None:
    """A DataLoader worker's start: SIGTERM ignored, and ended with its forkserver (watchdog.die_with_parent)."""
    import signal

    from ..common import watchdog

    watchdog.die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


_ENDING_WORKERS: list[bool] = []


def _end_workers_at_exit() -> None:
    """Workers that ignore SIGTERM outlive multiprocessing's own exit handler, which terminates daemonic children
    (SIGTERM) and then joins them without a timeout: a rank leaving on an error would hang there for good. Registered
    after multiprocessing's handler, this runs first (atexit is last in, first out) and kills them."""
    if _ENDING_WORKERS:
        return
    import atexit
    import multiprocessing

    atexit.register(lambda: [p.kill() for p in multiprocessing.active_children()])
    _ENDING_WORKERS.append(True)


def decoder_of(cfg) -> str:
    """The CPU decoder for cfg (`decoder`, default auto = fastest installed), as a clear error if unusable."""
    try:
        return decoders.resolve(cfg.decoder)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _scan(directory, what: str, rank: int, broadcast_object):
    if broadcast_object is not None:
        return imagefolder.scan_shared(directory, what, rank, broadcast_object)
    return imagefolder.scan(directory, what)


def build(
    cfg,
    rank: int,
    size: int,
    batch: int,
    device: torch.device,
    broadcast_object=None,
    local_size: int = 1,
    channels_last: bool | None = None,
    decoder: str | None = None,
) -> Inputs:
    """The train (and validation, when the data has it) batches of this rank; every input problem is
    raised here as a ConfigError, before training. `batch` is the per-process batch of one step; `local_size`
    the processes on this node, which share its --cache-dir; `channels_last` and `decoder` as start-up resolved
    them (runtime.Settings; when not given, the configuration's, with a device's default off)."""
    channels_last = bool(cfg.channels_last if channels_last is None else channels_last)
    gpu_decode = cfg.gpu_decode
    if gpu_decode and cfg.data != "shards":
        raise ConfigError(
            f"--gpu-decode applies to --data shards (JPEGs decoded by nvJPEG on the GPU); with "
            f"--data {cfg.data} drop --gpu-decode"
        )
    if cfg.data == "synthetic":
        images = data.SyntheticImages(cfg.synthetic_samples, cfg.num_classes, cfg.image_size, cfg.seed, device=device)
        return Inputs(
            SyntheticBatches(images, rank, size, batch, cfg.seed, cfg.max_steps_per_epoch, channels_last),
            None,
            cfg.num_classes,
        )
    decoder = decoder or decoder_of(cfg)
    if cfg.data == "shards":
        train_split, val_split, num_classes = shards.datasets(cfg.data_dir)
        if gpu_decode and device.type != "cuda":
            log.warning("--gpu-decode without a GPU: torchvision's CPU JPEG decoder runs in the training process")

        def make(split, shuffle):
            pin = device.type == "cuda"
            how = data.Reading.of(cfg, rank, size, batch, shuffle, decoder=decoder, encoded=gpu_decode, pin_memory=pin)
            return shards.ShardLoader(split, how, data.Transform(cfg.image_size, train=shuffle))

        def wrap(host):
            return host.on_device(device, channels_last) if gpu_decode else Prefetched(host, device, channels_last)

        train = make(train_split, True)
        val = make(val_split, False) if val_split is not None else None
        shards.check_cache_room([train, val], local_size)  # indexes the files: before anything is trained
        if val is not None:
            val.prefetch()  # its first pass decodes during epoch 1, later ones after each pass
        return Inputs(wrap(train), wrap(val) if val is not None else None, num_classes)
    if cfg.data != "imagefolder":
        raise ConfigError(
            f"--data {cfg.data} is not read by the PyTorch payload: choose synthetic, imagefolder or shards"
        )
    train_dir, val_dir = imagefolder.split_dirs(cfg.data_dir)
    tree = _scan(train_dir, "data directory", rank, broadcast_object)
    val = None
    if val_dir is not None:
        val_tree = _scan(val_dir, "validation directory", rank, broadcast_object)
        if val_tree.classes != tree.classes:
            raise ConfigError(
                f"{val_dir} has classes {val_tree.classes[:5]}... that differ from {train_dir}'s: "
                "train and val need the same class folders"
            )
        ds = data.ImageFiles(val_tree, cfg.image_size, False, cfg.skip_corrupt_images, cfg.seed, decoder)
        val = Prefetched(FolderLoader(ds, cfg, rank, size, batch, False, device), device, channels_last)
    ds = data.ImageFiles(tree, cfg.image_size, True, cfg.skip_corrupt_images, cfg.seed, decoder)
    train = Prefetched(FolderLoader(ds, cfg, rank, size, batch, True, device), device, channels_last)
    return Inputs(train, val, len(tree.classes))
