"""PyTorch datasets, the image transform and the rank-sharded batch sampler.

Images leave every loader as uint8 HxWx3 (a quarter of float32's bytes); inputs.py copies them to the
device and normalises them there with `normalize`, the one definition of the model's input.
"""

from __future__ import annotations

import functools
import logging
import math
import pathlib
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Sampler

from ..common import sharding
from ..common.errors import ConfigError
from ..common.imagefolder import ImageTree
from . import decoders

log = logging.getLogger(__name__)

# ImageNet channel statistics, as torchvision's reference training uses.
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # torchvision RandomResizedCrop's defaults
# Synthetic data keeps at most this many bytes of distinct uint8 images on the device (see SyntheticImages).
SYNTHETIC_POOL_BYTES = 256 * 2**20
CHUNK_ELEMENTS = 2**20  # int64 temporaries of 8 MiB while the pool is made


def normalize(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """uint8 NxHxWx3 -> float32 Nx3xHxW normalised with ImageNet's mean/std, on the tensor's device.

    The operations and their order are torchvision's ToTensor + Normalize (x / 255, - mean, / std), so the
    result is bitwise what normalising on the host gives. The NHWC batch seen as NCHW is already
    channels_last in memory; the float ops keep that layout."""
    x = images.permute(0, 3, 1, 2)
    if not channels_last:
        x = x.contiguous()
    mean, std = _stats(images.device)
    return x.float().div_(255).sub_(mean).div_(std)


@functools.cache
def _stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # Made once per device: a step copies nothing from the host for them.
    return (
        torch.tensor(MEAN, dtype=torch.float32, device=device).view(1, 3, 1, 1),
        torch.tensor(STD, dtype=torch.float32, device=device).view(1, 3, 1, 1),
    )


# -------------------------------------------------------------------------------------------- synthetic

_MASK = 0xFFFFFFFF


def _mul32(x: torch.Tensor, a: int) -> torch.Tensor:
    """(x * a) mod 2**32 for x in [0, 2**32) held in int64, without overflowing int64 (two 16-bit halves)."""
    return (x * (a & 0xFFFF) + (((x * (a >> 16)) & 0xFFFF) << 16)) & _MASK


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """Chris Wellons' lowbias32 integer hash: integer ops only, so every device gives the same bits."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _bell(h: torch.Tensor) -> torch.Tensor:
    """Sum of the 4 bytes of a 32-bit hash, centred: about normal, mean 0, standard deviation 147.8."""
    return (h & 255) + ((h >> 8) & 255) + ((h >> 16) & 255) + (h >> 24) - 510


class EpochSteps:
    """A loader's steps per epoch (`len()`, equal on every rank, at most --max-steps-per-epoch) and the epoch it is
    set to (`set_epoch(epoch, skip)`: `skip`, the steps a mid-epoch checkpoint already trained)."""

    steps = 0
    epoch = skip = 0

    def limit(self, steps: int, max_steps: int) -> None:
        self.steps = min(steps, max_steps) if max_steps else steps

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip


@dataclass(frozen=True)
class Reading:
    """How one rank reads one split, the one argument of shards.ShardLoader's constructor: its part (`rank` of
    `size`, `batch` per step), the order (seed, shuffle or not) and the options."""

    rank: int
    size: int
    batch: int
    seed: int = 0
    shuffle: bool = True  # training; validation reads in order
    shuffle_buffer: int = 5000
    workers: int = 2
    max_steps: int = 0
    cache: bool = False
    cache_dir: pathlib.Path | None = None
    skip_corrupt: bool = False
    decoder: str = "auto"
    encoded: bool = False  # --gpu-decode: the JPEG bytes go through the slots
    pin_memory: bool = False  # on a GPU: the slots registered as page-locked memory

    @classmethod
    def of(cls, cfg, rank: int, size: int, batch: int, shuffle: bool, **options) -> Reading:
        return cls(
            rank,
            size,
            batch,
            cfg.seed,
            shuffle,
            cfg.shuffle_buffer,
            cfg.workers,
            cfg.max_steps_per_epoch if shuffle else 0,
            cfg.cache_decoded,
            cfg.cache_dir,
            cfg.skip_corrupt_images,
            **options,
        )


class SyntheticImages(Dataset):
    """A learnable stand-in for ImageNet: each class a smooth random 8x8 pattern, each image its class
    pattern plus per-pixel noise, as uint8 HxWx3. Every value comes from an integer hash of (seed, what,
    index), computed vectorised on `device`: the same bits on every device, rank and resume, no random
    generator state. The `pool` = min(samples, SYNTHETIC_POOL_BYTES / bytes per image) distinct images
    (1,783 at 224 px, 256 MiB) are made once; sample i is image i mod pool, label included.
    `self[i]` gives (normalised float 3xHxW, label), what the input pipeline hands the model for i."""

    def __init__(
        self,
        num_samples: int,
        num_classes: int,
        image_size: int,
        seed: int,
        noise: float = 1.0,
        device: torch.device | str = "cpu",
        pool_bytes: int = SYNTHETIC_POOL_BYTES,
    ):
        self.num_samples, self.image_size = num_samples, image_size
        self.pool = max(1, min(num_samples, pool_bytes // (3 * image_size * image_size)))
        device = torch.device(device)
        base = int(_hash32(torch.tensor([seed & _MASK]))[0])
        key = lambda stream, n: _hash32(
            torch.arange(n, device=device, dtype=torch.int64) ^ _hash32(torch.tensor([base ^ stream], device=device))
        )
        self.labels = (key(1, self.pool) % num_classes).to(torch.int64)
        patterns = _bell(key(2, num_classes * 8 * 8 * 3)).view(num_classes, 8, 8, 3)
        # Nearest upsampling of the 8x8 patterns, as F.interpolate(mode="nearest") picks its source pixels.
        cells = (torch.arange(image_size, device=device) * 8) // image_size
        q = round(noise * 32)
        self.images = torch.empty(self.pool, image_size, image_size, 3, dtype=torch.uint8, device=device)
        per_image = image_size * image_size * 3
        chunk = max(1, CHUNK_ELEMENTS // per_image)  # bounds the int64 temporaries
        for a in range(0, self.pool, chunk):
            n = min(chunk, self.pool - a)
            pattern = patterns[self.labels[a : a + n]][:, cells][:, :, cells]
            pixel = torch.arange(n * per_image, device=device, dtype=torch.int64) + a * per_image
            noise_ = _bell(_hash32((pixel + (base ^ 3)) & _MASK)).view(n, image_size, image_size, 3)
            # Pattern and noise of equal spread around mid-grey, 32 grey levels per standard deviation.
            self.images[a : a + n] = (128 + (32 * pattern + q * noise_) // 148).clamp_(0, 255).to(torch.uint8)

    def __len__(self) -> int:
        return self.num_samples

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images and labels of sample indices (a tensor on the pool's device): no host copy."""
        j = indices % self.pool
        return self.images[j], self.labels[j]

    def __getitem__(self, i: int):
        image, label = self.batch(torch.tensor([i], device=self.images.device))
        return normalize(image)[0], int(label[0])


# -------------------------------------------------------------------------------------------- transform


class Transform:
    """The torchvision reference augmentation (RandomResizedCrop + flip; Resize + CenterCrop for eval) on
    a decoded HxWx3 uint8 array, returning HxWx3 uint8. The random draws come from the generator passed
    in (seeded per sample by the caller), not torch's global one, so workers and resumes give the same crops."""

    def __init__(self, image_size: int, train: bool):
        self.size, self.train = image_size, train

    def crop_params(self, height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        # torchvision.transforms.RandomResizedCrop.get_params, with numpy draws.
        area = height * width
        log_ratio = np.log(RATIO)
        for _ in range(10):
            target = area * rng.uniform(*SCALE)
            aspect = math.exp(rng.uniform(*log_ratio))
            w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
        in_ratio = width / height
        if in_ratio < min(RATIO):
            w, h = width, int(round(width / min(RATIO)))
        elif in_ratio > max(RATIO):
            w, h = int(round(height * max(RATIO))), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def eval_params(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Resize's shorter side to size*256/224 then CenterCrop(size), as one crop of the original image:
        the central square of side min(height, width) * 224/256, resized to size."""
        side = max(1, min(height, width, int(round(min(height, width) * self.size / int(self.size * 256 / 224)))))
        return (height - side) // 2, (width - side) // 2, side, side

    def params(self, height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int, bool]:
        """(top, left, height, width, flip) of the region of the decoded image that becomes the output."""
        if self.train:
            i, j, h, w = self.crop_params(height, width, rng)
            return i, j, h, w, bool(rng.random() < 0.5)
        return (*self.eval_params(height, width), False)

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        i, j, h, w, flip = self.params(image.shape[0], image.shape[1], rng)
        # Crop, then Pillow's antialiased bilinear resize: torchvision's resized_crop on a PIL image. The crop is
        # made contiguous first: Pillow 13 imports a strided array far more slowly
        # (docs/benchmarks.md#strided-crops-and-pillow).
        crop = np.ascontiguousarray(image[i : i + h, j : j + w])
        out = Image.fromarray(crop).resize((self.size, self.size), Image.BILINEAR)
        if flip:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return np.asarray(out)


class ImageFiles(Dataset):
    """Images from a scanned class-folder tree, as uint8 HxWx3. Items are asked for as (index, epoch)
    (see EpochBatches): the crop depends on (seed, epoch, index) only, in any worker. An undecodable file
    fails naming the file, or with `skip_corrupt` is returned as None and counted by `collate`."""

    def __init__(
        self, tree: ImageTree, image_size: int, train: bool, skip_corrupt: bool, seed: int = 0, decoder: str = "auto"
    ):
        self.samples, self.skip_corrupt, self.seed = tree.samples, skip_corrupt, seed
        self.transform, self.decoder_name = Transform(image_size, train), decoders.resolve(decoder)
        self._decode = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item):
        i, epoch = item if isinstance(item, tuple) else (item, 0)
        if self._decode is None:  # made in the worker: decoders hold C handles that are not picklable
            self._decode = decoders.make(self.decoder_name)
        path, label = self.samples[i]
        try:
            with open(path, "rb") as f:
                image = self._decode(f.read())
        except (decoders.DecodeError, OSError) as e:
            if self.skip_corrupt:
                log.warning("skipping undecodable image %s: %s", path, e)
                return None
            raise ConfigError(
                f"cannot decode image {path} ({e}): remove or replace the file, "
                "or pass --skip-corrupt-images to skip and count such files"
            ) from None
        return self.transform(image, np.random.default_rng([self.seed, epoch, i])), label

    def __getstate__(self):
        return {**self.__dict__, "_decode": None}


def collate(batch):
    """Stack a batch, dropping skipped (None) samples; returns (images, labels int64, skipped count).
    uint8 arrays stack to one uint8 NxHxWx3 tensor; tensors (SyntheticImages items) stack as they are."""
    kept = [b for b in batch if b is not None]
    if not kept:
        raise ConfigError(f"every image of a batch of {len(batch)} was undecodable: the data set is damaged")
    first = kept[0][0]
    if isinstance(first, np.ndarray):
        images = torch.from_numpy(np.stack([b[0] for b in kept]))
    else:
        images = torch.stack([b[0] for b in kept])
    labels = torch.tensor([b[1] for b in kept], dtype=torch.int64)
    return images, labels, len(batch) - len(kept)


class ShardedBatchSampler(Sampler):
    """Yields this rank's batches of indices for the current epoch (see common/sharding.py); with
    `tag_epoch`, each index as (index, epoch), so that persistent workers know the epoch."""

    def __init__(
        self,
        num_samples: int,
        rank: int,
        size: int,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        max_steps: int = 0,
        tag_epoch: bool = False,
    ):
        self.args = (num_samples, rank, size, batch_size, seed)
        self.shuffle, self.max_steps, self.epoch, self.tag_epoch = shuffle, max_steps, 0, tag_epoch
        self.skip = 0
        sharding.batches(*self.args, epoch=0, shuffle=shuffle)  # fail now, not mid-epoch

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """`skip`: leave out the epoch's first steps (trained before a mid-epoch checkpoint); len() stays the
        epoch's."""
        self.epoch, self.skip = epoch, skip

    def batches(self) -> list[np.ndarray]:
        b = sharding.batches(*self.args, epoch=self.epoch, shuffle=self.shuffle)
        return (b[: self.max_steps] if self.max_steps else b)[self.skip :]

    def __iter__(self):
        if self.tag_epoch:
            return iter([[(int(i), self.epoch) for i in batch] for batch in self.batches()])
        return iter([batch.tolist() for batch in self.batches()])

    def __len__(self) -> int:
        steps = sharding.steps_per_epoch(self.args[0], self.args[2], self.args[3])
        return min(steps, self.max_steps) if self.max_steps else steps
