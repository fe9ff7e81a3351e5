"""Interim: today's loaders behind the inputs API the training loop uses (replaced by the device input path)."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.data import DataLoader

from ..common import imagefolder
from ..common.errors import ConfigError
from . import data, shards


class Batches:
    def __init__(self, loader, device, channels_last, seed, rank):
        self.loader, self.device, self.channels_last, self.seed, self.rank = loader, device, channels_last, seed, rank

    def __len__(self):
        return len(self.loader)

    def set_epoch(self, epoch):
        s = (self.seed * 1_000_003 + epoch) * 4099 + self.rank
        torch.manual_seed(s)
        if isinstance(self.loader, shards.ShardLoader):
            self.loader.set_epoch(epoch)
            return
        self.loader.generator.manual_seed(s)
        self.loader.batch_sampler.set_epoch(epoch)

    def __iter__(self):
        for images, labels, skipped in self.loader:
            images = images.to(self.device, non_blocking=True)
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            yield images, labels.to(self.device, non_blocking=True), skipped


class Inputs(NamedTuple):
    train: Batches
    val: Batches | None
    num_classes: int


def build(cfg, rank, size, batch, device, broadcast_object=None) -> Inputs:
    if cfg.data == "synthetic":
        train_set, val_set, n = data.SyntheticImages(cfg.synthetic_samples, cfg.num_classes, cfg.image_size, cfg.seed), None, cfg.num_classes
    elif cfg.data == "shards":
        train_set, val_set, n = shards.datasets(cfg.data_dir)
    else:
        train_dir, val_dir = imagefolder.split_dirs(cfg.data_dir)
        tree = imagefolder.scan(train_dir)
        val_set = None
        if val_dir is not None:
            val_tree = imagefolder.scan(val_dir, "validation directory")
            val_set = data.ImageFiles(val_tree, cfg.image_size, train=False, skip_corrupt=cfg.skip_corrupt_images)
        train_set, n = data.ImageFiles(tree, cfg.image_size, train=True, skip_corrupt=cfg.skip_corrupt_images), len(tree.classes)

    def loader(dataset, b, shuffle):
        if isinstance(dataset, shards.ShardSplit):
            return shards.loader(dataset, cfg, rank, size, b, shuffle, device)
        try:
            sampler = data.ShardedBatchSampler(len(dataset), rank, size, b, cfg.seed, shuffle=shuffle,
                                               max_steps=cfg.max_steps_per_epoch if shuffle else 0)
        except ValueError as e:
            raise ConfigError(f"{e} (data set of {len(dataset)} samples)") from None
        kwargs = {}
        if cfg.workers > 0:
            kwargs = dict(multiprocessing_context="forkserver", persistent_workers=True, prefetch_factor=4)
        return DataLoader(dataset, batch_sampler=sampler, num_workers=cfg.workers, collate_fn=data.collate,
                          pin_memory=device.type == "cuda", generator=torch.Generator(), **kwargs)

    wrap = lambda dl: Batches(dl, device, cfg.channels_last, cfg.seed, rank)  # noqa: E731
    return Inputs(wrap(loader(train_set, batch, True)),
                  wrap(loader(val_set, batch // max(1, cfg.backward_passes_per_step), False)) if val_set is not None else None, n)
