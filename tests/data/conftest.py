"""Small ImageNet-like image trees, generated: real JPEG/PNG files of varied sizes, classes and modes."""
import pathlib

import numpy as np
import pytest
from PIL import Image


def write_tree(root: pathlib.Path, classes=("n01", "n02", "n03"), per_class=6, seed=0, val_per_class=0,
               flat_val=False) -> pathlib.Path:
    """root/train/<class>/*.JPEG (+ root/val): images of different sizes, one grayscale and one PNG."""
    rng = np.random.default_rng(seed)
    labels = []
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c in classes:
            if n == 0:
                continue
            folder = root / split / c
            if split == "val" and flat_val:
                folder = root / split
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                w, h = int(rng.integers(24, 64)), int(rng.integers(24, 64))
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                img = Image.fromarray(pixels)
                name = f"{c}_{i:03d}" if not flat_val or split == "train" else f"val_{len(labels):05d}"
                if i == 1:
                    img.convert("L").save(folder / f"{name}.JPEG")    # grayscale: re-encoded as RGB
                elif i == 2:
                    img.save(folder / f"{name}.png")
                else:
                    img.save(folder / f"{name}.JPEG", quality=95)
                if split == "val" and flat_val:
                    labels.append(c)
    if flat_val:
        (root / "val_labels.txt").write_text("".join(f"{c}\n" for c in labels))
    return root


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "images", val_per_class=2)
