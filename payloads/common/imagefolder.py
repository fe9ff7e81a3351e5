"""Scan and check an ImageNet-style class-folder tree (root/<class>/<image>) before training.

Every problem is reported with the path and the fix, on every rank, before any process trains.
Corrupt image files cannot be found by a scan (that needs a decode of every file); the loaders fail
on the first one they meet, naming the file, unless skipping is asked for (see docs/pytorch.md#bad-input).
"""

from __future__ import annotations

import os
import pathlib
import pickle
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
        raise ConfigError(
            f"{what} {root} does not exist: pass --data-dir pointing at a folder with one sub-folder per class"
        )
    if not root.is_dir():
        raise ConfigError(
            f"{what} {root} is not a folder: pass --data-dir pointing at a folder with one sub-folder per class"
        )
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


def scan_shared(root: pathlib.Path, what: str, rank: int, broadcast_object: Callable[[Any], Any]) -> ImageTree:
    """scan() on rank 0 only, its result (or its error) broadcast to every rank.

    A tree of 1.28 million files behind a FUSE mount is listed once per job instead of once per process.
    `broadcast_object(obj)` sends rank 0's `obj` to all ranks and returns it (every rank calls it once, e.g.
    `lambda obj: hvd.broadcast_object(obj, root_rank=0, name="scan_train")`). Rank 0's ConfigError is raised
    as the same ConfigError on every rank, and any other failure of rank 0 fails the others too, so no rank
    waits on a collective that rank 0 never joins. The listing travels as one compressed block of file names
    per class, not as pickled full paths.
    """
    root = pathlib.Path(root)
    message, tree = None, None
    if rank == 0:
        try:
            tree = scan(root, what)
            message = ("tree", _pack(tree))
        except ConfigError as e:
            message = ("config_error", str(e))
        except Exception as e:
            broadcast_object(("failed", f"{type(e).__name__}: {e}"))
            raise
    kind, body = broadcast_object(message)
    if kind == "config_error":
        raise ConfigError(body)
    if kind == "failed":
        raise RuntimeError(f"rank 0 could not list {what} {root} ({body}); see rank 0's error")
    return tree if tree is not None else _unpack(root, body)


_SEPARATOR = "\0"  # the one character a POSIX file name cannot hold


def _pack(tree: ImageTree) -> bytes:
    per_class: list[list[str]] = [[] for _ in tree.classes]
    for path, index in tree.samples:
        per_class[index].append(path.rsplit(os.sep, 1)[-1])  # scan() wrote it as str(folder / name)
    return zlib.compress(pickle.dumps((tree.classes, [_SEPARATOR.join(names) for names in per_class])), 1)


def _unpack(root: pathlib.Path, blob: bytes) -> ImageTree:
    """The tree scan() would have returned for `root` on this rank (same paths, same order)."""
    classes, names = pickle.loads(zlib.decompress(blob))
    samples = []
    for index, (name, files) in enumerate(zip(classes, names)):
        folder = str(root / name) + os.sep  # str(root / name / file), without a Path per file
        samples.extend((folder + file, index) for file in files.split(_SEPARATOR))
    return ImageTree(root, classes, samples)


def split_dirs(data_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path | None]:
    """ImageNet layout (data_dir/train, data_dir/val) when present, else data_dir is the training set."""
    data_dir = pathlib.Path(data_dir)
    train, val = data_dir / "train", data_dir / "val"
    if train.is_dir():
        return train, (val if val.is_dir() else None)
    return data_dir, None
