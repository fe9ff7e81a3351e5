"""Prepared blocks in memory, random patches per epoch sharded by rank, and the validation windows.

Training patches. With n blocks, a global batch of B patches and `steps` steps, epoch e has steps x B patches;
patch j comes from the block at position p_e(j mod n) of a fixed order of the blocks, at a random offset with a
random flip/rotation, all drawn from (seed, epoch): the patches of a global batch do not depend on the number
of processes, so a 2-process run trains on what a 1-process run with the same global batch does. Rank r of S
takes patches j = r, r + S, ... of each batch. p_e permutes positions only within their residue class modulo B
(a multiple of S), so when S divides n, rank r reads only the blocks at positions r, r + S, ...: its share,
loaded once and then read from memory (`--cache memory`), as the source project did. Every rank runs the same
number of steps of the same batch size.

Validation: every pixel of every validation block once, in non-overlapping patch windows (edges padded with
no data); rank r evaluates blocks r, r + S, ...
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
from dataclasses import dataclass

import numpy as np
import torch

from ..common.errors import ConfigError
from . import labels as lab
from .models import BANDS
from .tiling import FORMAT, MANIFEST, windows

log = logging.getLogger(__name__)


@dataclass
class Manifest:
    root: pathlib.Path
    num_classes: int
    class_names: list[str]
    band_mean: np.ndarray
    band_std: np.ndarray
    train: list[dict]
    val: list[dict]
    image_dtype: str = "uint8"

    @classmethod
    def load(cls, root: pathlib.Path) -> Manifest:
        path = root / MANIFEST
        hint = "cut the rasters into blocks first: python -m datatools.landcover.prepare --output-dir DIR ..."
        if not root.is_dir():
            raise ConfigError(f"--data-dir {root} is not a folder: {hint}")
        if not path.is_file():
            raise ConfigError(f"{root} has no {MANIFEST}: {hint}")
        try:
            m = json.loads(path.read_text())
            if m.get("format") != FORMAT or m.get("bands") != BANDS:
                raise ValueError(
                    f"format {m.get('format')} with {m.get('bands')} bands, expected format {FORMAT}, {BANDS} bands"
                )
            self = cls(
                root,
                int(m["num_classes"]),
                list(m["class_names"]),
                np.asarray(m["band_mean"], np.float32),
                np.asarray(m["band_std"], np.float32),
                list(m["train"]),
                list(m["val"]),
                str(np.dtype(m.get("image_dtype", "uint8"))),
            )
            for e in self.train + self.val:
                e["height"], e["width"], e["image"], e["labels"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{path} is not a manifest this payload reads ({type(e).__name__}: {e}): "
                "prepare the data again with python -m datatools.landcover.prepare"
            ) from None
        if not self.train:
            raise ConfigError(f"{path} lists no training block: prepare with at least one --train pair")
        return self


def read_block(
    root: pathlib.Path, entry: dict, num_classes: int, m_dtype: str = "uint8"
) -> tuple[np.ndarray, np.ndarray]:
    """(image [4, h, w] in its stored dtype, labels uint8 [h, w]); any damage is an error naming the file."""
    import rasterio
    from rasterio.errors import RasterioError

    fix = "the prepared data is damaged: restore the file or prepare the data again (python -m datatools.landcover.prepare)"
    arrays = []
    for key, bands in (("image", BANDS), ("labels", 1)):
        path = root / entry[key]
        try:
            with rasterio.open(path) as src:
                a = src.read()
        except (RasterioError, OSError) as e:
            raise ConfigError(f"cannot read block {path} ({e}): {fix}") from None
        if a.shape != (bands, entry["height"], entry["width"]):
            raise ConfigError(
                f"block {path} is {a.shape} (bands, height, width), the manifest says "
                f"{(bands, entry['height'], entry['width'])}: {fix}"
            )
        arrays.append(a)
    image, labels = arrays[0].astype(np.dtype(m_dtype), copy=False), arrays[1][0]
    bad = lab.apply_map(labels, None, num_classes)[1]
    if bad:
        raise ConfigError(
            f"block {root / entry['labels']} holds label values {sorted(bad)} beyond the manifest's "
            f"{num_classes} classes: {fix}"
        )
    return image, labels.astype(np.uint8)


class BlockStore:
    """Blocks by index; with `cache` each is read once and kept (the share of a process fits in memory)."""

    def __init__(self, manifest: Manifest, entries: list[dict], cache: bool):
        self.m, self.entries, self.cache = manifest, entries, cache
        self._kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.reads = 0

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if i in self._kept:
            return self._kept[i]
        self.reads += 1
        block = read_block(self.m.root, self.entries[i], self.m.num_classes, self.m.image_dtype)
        if self.cache:
            self._kept[i] = block
        return block

    def load(self, indices) -> None:
        """Read (and with the cache, keep) these blocks now: every damaged file is found before training."""
        for i in indices:
            self.get(i)

    def memory_bytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self._kept.values())


def _permute_within_classes(n: int, modulus: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation q of 0..n-1 with q[k] = k (mod modulus) for every k."""
    q = np.arange(n)
    for r in range(min(modulus, n)):
        members = q[r::modulus].copy()
        q[r::modulus] = rng.permutation(members)
    return q


class PatchSampler:
    """This rank's training patches: a list of steps, each a list of (block, row, col, dihedral)."""

    def __init__(
        self,
        blocks: list[dict],
        patch: int,
        rank: int,
        size: int,
        global_batch: int,
        seed: int,
        patches_per_epoch: int = 0,
        max_steps: int = 0,
    ):
        if global_batch % size:
            raise ConfigError(f"a global batch of {global_batch} does not divide over {size} processes")
        self.sizes = [(e["height"], e["width"]) for e in blocks]
        self.n, self.patch, self.rank, self.size, self.batch, self.seed = (
            len(blocks),
            patch,
            rank,
            size,
            global_batch,
            seed,
        )
        # default: as many patches as the training area holds
        target = patches_per_epoch or sum(h * w for h, w in self.sizes) // (patch * patch)
        self.steps = max(1, math.ceil(target / global_batch))
        if max_steps:
            self.steps = min(self.steps, max_steps)
        self.order = np.random.default_rng([seed, 7]).permutation(self.n)  # fixed: position -> block

    def owned(self) -> list[int]:
        """Blocks this rank reads when the process count divides the block count (its share)."""
        return sorted(int(b) for b in self.order[self.rank :: self.size])

    @property
    def shares_exactly(self) -> bool:
        return self.n % self.size == 0

    def epoch(self, epoch: int) -> list[list[tuple[int, int, int, int]]]:
        rng = np.random.default_rng([self.seed, epoch])
        positions = _permute_within_classes(self.n, self.batch, rng)
        total = self.steps * self.batch
        draws = rng.random((total, 3))
        steps = []
        for s in range(self.steps):
            mine = []
            for j in range(s * self.batch + self.rank, (s + 1) * self.batch, self.size):
                block = int(self.order[positions[j % self.n]])
                h, w = self.sizes[block]
                row = int(draws[j, 0] * (max(h - self.patch, 0) + 1))
                col = int(draws[j, 1] * (max(w - self.patch, 0) + 1))
                mine.append((block, row, col, int(draws[j, 2] * 8)))
            steps.append(mine)
        return steps


def _cut(image: np.ndarray, labels: np.ndarray, row: int, col: int, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """A patch x patch window in the stored dtypes; beyond the block's edge: image 0 (as NAIP's no-data
    borders) and no data."""
    img = np.zeros((image.shape[0], patch, patch), dtype=image.dtype)
    lbl = np.full((patch, patch), lab.NODATA, dtype=np.uint8)
    h, w = min(patch, labels.shape[0] - row), min(patch, labels.shape[1] - col)
    img[:, :h, :w] = image[:, row : row + h, col : col + w]
    lbl[:h, :w] = labels[row : row + h, col : col + w]
    return img, lbl


def batch(store: BlockStore, patches, patch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [b, 4, p, p] as stored: uint8 for NAIP, labels uint8 [b, p, p]). Kept in the stored 8 bits
    until `inputs` converts them where the model runs: a quarter of the bytes to cut, copy and transfer."""
    images = np.empty((len(patches), BANDS, patch, patch), dtype=store.m.image_dtype)
    labels = np.empty((len(patches), patch, patch), dtype=np.uint8)
    for i, (block, row, col, dihedral) in enumerate(patches):
        img, lbl = _cut(*store.get(block), row, col, patch)
        # aerial imagery has no "up": the 8 flips/rotations of the square are equally likely views
        img, lbl = np.rot90(img, dihedral % 4, axes=(1, 2)), np.rot90(lbl, dihedral % 4)
        if dihedral >= 4:
            img, lbl = img[:, :, ::-1], lbl[:, ::-1]
        images[i], labels[i] = img, lbl
    return torch.from_numpy(images), torch.from_numpy(labels)


def inputs(
    images: torch.Tensor, labels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized float32 images, int64 targets with no data as IGNORE), computed on the tensors' device;
    `mean` and `std` are per band, shaped [4, 1, 1]."""
    x = (images.float() - mean) / std
    t = labels.long() - 1
    t[labels == lab.NODATA] = lab.IGNORE
    return x, t


def val_windows(store: BlockStore, patch: int, rank: int, size: int) -> list[tuple[int, int, int, int]]:
    """This rank's validation windows (block, row, col, 0): blocks rank, rank + size, ..., tiled by `patch`."""
    out = []
    for b in range(rank, len(store), size):
        e = store.entries[b]
        out += [(b, w.row, w.col, 0) for w in windows(e["height"], e["width"], patch)]
    return out
