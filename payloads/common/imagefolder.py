"""Scan and check an ImageNet-style class-folder tree (root/<class>/<image>) before training.

Every problem is reported with the path and the fix, on every rank, before any process trains.
Corrupt image files cannot be found by a scan (that needs a decode of every file); the loaders fail
on the first one they meet, naming the file, unless skipping is asked for (see the README).
"""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

from .errors import ConfigError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class ImageTree:
    root: pathlib.Path
    classes: list[str]
    samples: list[tuple[str, int]]  # (path, class index), sorted: identical on every rank


def scan(root: pathlib.Path, what: str = "data directory") -> ImageTree:
    root = pathlib.Path(root)
    if not root.exists():
        raise ConfigError(f"{what} {root} does not exist: pass --data-dir pointing at a folder with one sub-folder per class")
    if not root.is_dir():
        raise ConfigError(f"{what} {root} is not a folder: pass --data-dir pointing at a folder with one sub-folder per class")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ConfigError(
            f"{what} {root} has no class folders: put each class's images in a sub-folder named for the class "
            "(root/<class>/<image>.jpg)"
        )
    samples: list[tuple[str, int]] = []
    for index, name in enumerate(classes):
        folder = root / name
        files = sorted(
            str(folder / f.name)
            for f in os.scandir(folder)
            if f.is_file() and f.name.lower().endswith(IMAGE_EXTENSIONS)
        )
        if not files:
            raise ConfigError(
                f"class folder {folder} has no images (looked for {', '.join(IMAGE_EXTENSIONS)}): "
                "add images or remove the folder"
            )
        samples.extend((path, index) for path in files)
    return ImageTree(root, classes, samples)


def split_dirs(data_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path | None]:
    """ImageNet layout (data_dir/train, data_dir/val) when present, else data_dir is the training set."""
    data_dir = pathlib.Path(data_dir)
    train, val = data_dir / "train", data_dir / "val"
    if train.is_dir():
        return train, (val if val.is_dir() else None)
    return data_dir, None
