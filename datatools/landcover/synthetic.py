"""Synthetic land-cover tiles: four-band GeoTIFF imagery and co-registered labels with a learnable pattern.

    python -m datatools.landcover.synthetic --output-dir data/raw --tiles 4 --size 512

Each tile is a map of blocky regions (one class each) drawn at 1/16 resolution; a pixel's four bands are its
class's spectral signature plus noise, so a U-Net can learn the classes from colour and texture. A strip along
one edge is no data (label 0, image 0), as NAIP tiles have at their borders. Written in the CRS of the NAIP
tiles over the Chesapeake watershed (UTM 18N, 1 m pixels) so that the preparation step sees real GeoTIFFs.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

import numpy as np

from payloads.segmentation.labels import NODATA
from payloads.segmentation.models import BANDS

CRS = "EPSG:26918"  # NAD83 / UTM zone 18N


def tile(height: int, width: int, num_classes: int, seed: int, cell: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """(image uint8 [4, H, W], labels uint8 [H, W]) for tile `seed`; class signatures depend on nothing but
    the class, so what is learnt on one tile holds on every other."""
    signatures = np.random.default_rng(1234).uniform(40, 215, size=(num_classes + 1, BANDS))
    rng = np.random.default_rng(seed)
    coarse = rng.integers(1, num_classes + 1, size=(-(-height // cell), -(-width // cell)))
    labels = np.kron(coarse, np.ones((cell, cell), dtype=np.int64))[:height, :width].astype(np.uint8)
    image = signatures[labels].transpose(2, 0, 1) + rng.normal(0, 25, size=(BANDS, height, width))
    strip = max(1, width // 20)
    labels[:, :strip] = NODATA
    image[:, :, :strip] = 0
    return np.clip(image, 0, 255).astype(np.uint8), labels


def write_pair(
    image_path: pathlib.Path,
    labels_path: pathlib.Path,
    image: np.ndarray,
    labels: np.ndarray,
    origin: tuple[float, float] = (400_000.0, 4_300_000.0),
) -> None:
    import rasterio
    from rasterio.transform import from_origin

    transform = from_origin(origin[0], origin[1], 1.0, 1.0)
    common = dict(driver="GTiff", height=labels.shape[0], width=labels.shape[1], crs=CRS, transform=transform)
    # MINISBLACK: the fourth band is near-infrared, not an alpha channel (GDAL's default for 4 x uint8)
    with rasterio.open(
        image_path, "w", count=BANDS, dtype="uint8", nodata=0, photometric="MINISBLACK", **common
    ) as dst:
        dst.write(image)
    with rasterio.open(labels_path, "w", count=1, dtype="uint8", **common) as dst:
        dst.write(labels[None])


def write_tiles(
    output_dir: pathlib.Path, tiles: int, height: int, width: int, num_classes: int, seed: int = 0
) -> list[tuple[pathlib.Path, pathlib.Path]]:
    output_dir.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(tiles):
        image, labels = tile(height, width, num_classes, seed * 10_007 + i)
        pair = output_dir / f"tile{i:03d}_naip.tif", output_dir / f"tile{i:03d}_lc.tif"
        write_pair(*pair, image, labels, origin=(400_000.0 + i * width, 4_300_000.0))
        pairs.append(pair)
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m datatools.landcover.synthetic", description=__doc__.splitlines()[0])
    ap.add_argument("--output-dir", type=pathlib.Path, required=True)
    ap.add_argument("--tiles", type=int, default=4)
    ap.add_argument("--size", type=int, default=512, help="tile side in pixels")
    ap.add_argument("--num-classes", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.tiles < 1 or args.size < 16 or not 2 <= args.num_classes <= 254:
        ap.error("need --tiles >= 1, --size >= 16 and 2 <= --num-classes <= 254")
    pairs = write_tiles(args.output_dir, args.tiles, args.size, args.size, args.num_classes, args.seed)
    print(f"wrote {len(pairs)} tile pairs to {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
