"""PyTorch datasets and the rank-sharded batch sampler."""
from __future__ import annotations

import logging

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset, Sampler

from ..common import sharding
from ..common.errors import ConfigError
from ..common.imagefolder import ImageTree

log = logging.getLogger(__name__)

# ImageNet channel statistics, as torchvision's reference training uses.
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class SyntheticImages(Dataset):
    """A learnable stand-in for ImageNet: each class has a smooth random pattern, each sample is its
    class pattern plus noise. Deterministic per (seed, index), so every rank, every resume and a
    1-process run see the same sample i. Generated on the fly: no memory grows with the sample count."""

    def __init__(self, num_samples: int, num_classes: int, image_size: int, seed: int, noise: float = 1.0):
        self.num_samples, self.image_size, self.seed, self.noise = num_samples, image_size, seed, noise
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(num_classes, (num_samples,), generator=g)
        self.patterns = torch.randn(num_classes, 3, 8, 8, generator=g)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int):
        label = int(self.labels[i])
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        pattern = torch.nn.functional.interpolate(self.patterns[label][None], size=self.image_size, mode="nearest")[0]
        image = pattern + self.noise * torch.randn(3, self.image_size, self.image_size, generator=g)
        return image, label


class ImageFiles(Dataset):
    """Images from a scanned class-folder tree. An undecodable file fails naming the file, or with
    `skip_corrupt` is returned as None and counted by `collate`."""

    def __init__(self, tree: ImageTree, image_size: int, train: bool, skip_corrupt: bool):
        from torchvision import transforms

        self.samples, self.skip_corrupt = tree.samples, skip_corrupt
        norm = transforms.Normalize(MEAN, STD)
        if train:
            self.transform = transforms.Compose([
                transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(),
                transforms.ToTensor(), norm])
        else:
            self.transform = transforms.Compose([
                transforms.Resize(int(image_size * 256 / 224)), transforms.CenterCrop(image_size),
                transforms.ToTensor(), norm])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        try:
            with Image.open(path) as img:
                image = img.convert("RGB")
        except (UnidentifiedImageError, OSError, SyntaxError) as e:
            if self.skip_corrupt:
                log.warning("skipping undecodable image %s: %s", path, e)
                return None
            raise ConfigError(
                f"cannot decode image {path} ({type(e).__name__}: {e}): remove or replace the file, "
                "or pass --skip-corrupt-images to skip and count such files"
            ) from None
        return self.transform(image), label


def collate(batch):
    """Stack a batch, dropping skipped (None) samples; returns (images, labels, skipped count)."""
    kept = [b for b in batch if b is not None]
    if not kept:
        raise ConfigError(f"every image of a batch of {len(batch)} was undecodable: the data set is damaged")
    images = torch.stack([b[0] for b in kept])
    labels = torch.tensor([b[1] for b in kept])
    return images, labels, len(batch) - len(kept)


class ShardedBatchSampler(Sampler):
    """Yields this rank's batches of indices for the current epoch (see common/sharding.py)."""

    def __init__(self, num_samples: int, rank: int, size: int, batch_size: int, seed: int,
                 shuffle: bool = True, max_steps: int = 0):
        self.args = (num_samples, rank, size, batch_size, seed)
        self.shuffle, self.max_steps, self.epoch = shuffle, max_steps, 0
        sharding.batches(*self.args, epoch=0, shuffle=shuffle)  # fail now, not mid-epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[np.ndarray]:
        b = sharding.batches(*self.args, epoch=self.epoch, shuffle=self.shuffle)
        return b[: self.max_steps] if self.max_steps else b

    def __iter__(self):
        return iter([batch.tolist() for batch in self._batches()])

    def __len__(self) -> int:
        steps = sharding.steps_per_epoch(self.args[0], self.args[2], self.args[3])
        return min(steps, self.max_steps) if self.max_steps else steps
