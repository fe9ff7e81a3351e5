"""Cut large imagery + label rasters into training blocks, with a manifest and band statistics.

    python -m datatools.landcover.prepare --output-dir D --block-size 1024 --label-map chesapeake \
        --train naip_1.tif lc_1.tif --train naip_2.tif lc_2.tif --val naip_3.tif lc_3.tif

Each pair is a four-band image (R, G, B, NIR) and a one-band label raster on the same grid (CRS, transform and
size are checked). Blocks are non-overlapping windows of --block-size pixels (the last ones cut short at the
edges), written as GeoTIFFs that keep their georeferencing, so that each training process can load its share
into memory once, as the source project did. The manifest (D/manifest.json) lists the blocks, the classes and
the per-band mean and standard deviation over the training imagery's valid pixels, computed here once.
Every input is checked before anything is kept: the blocks are written to a temporary folder that becomes D
only when all pairs were read; on any error D is not created and nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
from collections.abc import Sequence

import numpy as np

from payloads.common.errors import ConfigError
from payloads.segmentation import labels as lab
from payloads.segmentation.models import BANDS
from payloads.segmentation.tiling import FORMAT, MANIFEST, windows


def _open(path: pathlib.Path, what: str):
    import rasterio
    from rasterio.errors import RasterioIOError

    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist: check the path")
    try:
        return rasterio.open(path)
    except RasterioIOError as e:
        raise ConfigError(
            f"cannot read {what} {path} ({e}): it is not a readable GeoTIFF; re-download or "
            f"re-export it (gdalinfo {path} shows what GDAL sees)"
        ) from None


def check_pair(image_path: pathlib.Path, labels_path: pathlib.Path) -> None:
    """Header checks of one pair: band counts and the same grid."""
    with _open(image_path, "image") as img, _open(labels_path, "labels") as lbl:
        if img.count != BANDS:
            raise ConfigError(
                f"image {image_path} has {img.count} band(s), the model takes {BANDS} (red, green, "
                "blue, near-infrared): give the four-band NAIP GeoTIFF, not an RGB rendition"
            )
        if lbl.count != 1:
            raise ConfigError(
                f"labels {labels_path} has {lbl.count} bands, expected 1 (one class value per pixel): "
                "give the land-cover layer alone (e.g. Chesapeake's *_lc.tif)"
            )
        problems = []
        if img.crs != lbl.crs:
            problems.append(f"CRS {img.crs} vs {lbl.crs}")
        if (img.width, img.height) != (lbl.width, lbl.height):
            problems.append(f"size {img.width}x{img.height} vs {lbl.width}x{lbl.height} pixels")
        if not img.transform.almost_equals(lbl.transform):
            problems.append(f"transform {tuple(img.transform)[:6]} vs {tuple(lbl.transform)[:6]}")
        if problems:
            raise ConfigError(
                f"image {image_path} and labels {labels_path} are not on the same grid ({'; '.join(problems)}): "
                "warp the labels onto the image's grid (gdalwarp -t_srs, -te and -tr of the image, "
                "nearest resampling) or pair each image with its own labels"
            )


def _read(src, path, what, method: str = "read", **kw) -> np.ndarray:
    from rasterio.errors import RasterioError

    try:
        return getattr(src, method)(**kw)
    except RasterioError as e:
        raise ConfigError(
            f"cannot read {what} {path} ({e}): the file is damaged; re-download or re-export it"
        ) from None


def _cut_pair(
    split: str,
    index: int,
    image_path,
    labels_path,
    block: int,
    out: pathlib.Path,
    num_classes: int,
    mapping,
    stats: np.ndarray | None,
    class_pixels: np.ndarray,
) -> list[dict]:
    import rasterio
    from rasterio.windows import Window

    entries = []
    folder = out / "blocks" / split
    folder.mkdir(parents=True, exist_ok=True)
    with _open(image_path, "image") as img, _open(labels_path, "labels") as lbl:
        for w in windows(img.height, img.width, block):
            win = Window(w.col, w.row, w.width, w.height)
            raw = _read(lbl, labels_path, "labels", indexes=1, window=win)
            labels, bad = lab.apply_map(raw, mapping, num_classes)
            if bad:
                shown = ", ".join(f"{v} ({c} px)" for v, c in sorted(bad.items())[:8])
                raise ConfigError(
                    f"labels {labels_path} hold values that are not classes 1..{num_classes} or no data (0) "
                    f"in the block at row {w.row}, column {w.col}: {shown}. Pass --label-map chesapeake for "
                    f"Chesapeake Land Cover rasters (15 = no data), or --num-classes for more classes"
                )
            image = _read(img, image_path, "image", window=win)
            if stats is not None:
                valid = _read(img, image_path, "image", "dataset_mask", window=win) > 0
                pixels = image[:, valid].astype(np.float64)
                stats += np.stack([np.full(BANDS, pixels.shape[1]), pixels.sum(1), (pixels**2).sum(1)])
            class_pixels += np.bincount(labels.ravel(), minlength=num_classes + 1)[: num_classes + 1]
            stem = f"{index:03d}-{image_path.stem}-r{w.row:06d}-c{w.col:06d}"
            profile = dict(
                driver="GTiff",
                height=w.height,
                width=w.width,
                crs=img.crs,
                transform=img.window_transform(win),
                compress="deflate",
                photometric="MINISBLACK",
            )
            with rasterio.open(folder / f"{stem}-image.tif", "w", count=BANDS, dtype=image.dtype, **profile) as dst:
                dst.write(image)
            with rasterio.open(folder / f"{stem}-labels.tif", "w", count=1, dtype="uint8", **profile) as dst:
                dst.write(labels[None])
            entries.append(
                {
                    "image": f"blocks/{split}/{stem}-image.tif",
                    "labels": f"blocks/{split}/{stem}-labels.tif",
                    "source": str(image_path),
                    "window": list(w),
                    "height": w.height,
                    "width": w.width,
                }
            )
    return entries


def _image_dtype(pairs) -> str:
    """uint8 when every image is 8-bit (NAIP), else float32: blocks keep one dtype the loader can batch."""
    dtypes = set()
    for _, (image, _labels) in pairs:
        with _open(pathlib.Path(image), "image") as src:
            dtypes.update(src.dtypes)
    return "uint8" if dtypes == {"uint8"} else "float32"


def prepare(
    output_dir: pathlib.Path,
    train: Sequence[tuple[pathlib.Path, pathlib.Path]],
    val: Sequence[tuple[pathlib.Path, pathlib.Path]] = (),
    block_size: int = 1024,
    num_classes: int = 6,
    label_map: str = "identity",
    class_names: Sequence[str] | None = None,
) -> dict:
    if not train:
        raise ConfigError("no --train pair: give at least one --train IMAGE LABELS")
    if block_size < 16:
        raise ConfigError(f"--block-size {block_size} is too small: use 256 or more (blocks hold many patches)")
    if label_map not in lab.LABEL_MAPS:
        raise ConfigError(f"--label-map {label_map!r}: choose {' or '.join(lab.LABEL_MAPS)}")
    if not 2 <= num_classes <= 254:
        raise ConfigError(f"--num-classes {num_classes}: between 2 and 254 land-cover classes (no data is not one)")
    if class_names is None:
        class_names = (
            lab.CHESAPEAKE_CLASSES if num_classes == 6 else tuple(f"class {c}" for c in range(1, num_classes + 1))
        )
    if len(class_names) != num_classes:
        raise ConfigError(f"{len(class_names)} class names for {num_classes} classes: give one name per class")
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise ConfigError(
            f"--output-dir {output_dir} already exists and is not empty: choose a new folder "
            "(prepare never overwrites blocks)"
        )
    pairs = [("train", p) for p in train] + [("val", p) for p in val]
    for _, (image, labels) in pairs:  # every header before any pixel is read or written
        check_pair(pathlib.Path(image), pathlib.Path(labels))

    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = output_dir.parent / f".{output_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    stats = np.zeros((3, BANDS))  # count, sum, sum of squares per band (train imagery)
    manifest = {
        "format": FORMAT,
        "bands": BANDS,
        "num_classes": num_classes,
        "class_names": list(class_names),
        "nodata_label": lab.NODATA,
        "label_map": label_map,
        "block_size": block_size,
        "train": [],
        "val": [],
        "image_dtype": _image_dtype(pairs),
    }
    counts = {"train": np.zeros(num_classes + 1, dtype=np.int64), "val": np.zeros(num_classes + 1, dtype=np.int64)}
    try:
        for i, (split, (image, labels)) in enumerate(pairs):
            manifest[split] += _cut_pair(
                split,
                i,
                pathlib.Path(image),
                pathlib.Path(labels),
                block_size,
                tmp,
                num_classes,
                lab.LABEL_MAPS[label_map],
                stats if split == "train" else None,
                counts[split],
            )
        if stats[0, 0] == 0:
            raise ConfigError("the training imagery has no valid pixel (all masked as no data): check --train")
        mean = stats[1] / stats[0]
        std = np.sqrt(np.maximum(stats[2] / stats[0] - mean**2, 0.0))
        manifest["band_mean"], manifest["band_std"] = mean.tolist(), np.maximum(std, 1e-6).tolist()
        manifest["class_pixels"] = {k: v.tolist() for k, v in counts.items()}  # index 0: no data
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if output_dir.exists():
            output_dir.rmdir()  # empty (checked above)
        os.replace(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m datatools.landcover.prepare",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument("--output-dir", type=pathlib.Path, required=True)
    ap.add_argument("--train", nargs=2, action="append", type=pathlib.Path, default=[], metavar=("IMAGE", "LABELS"))
    ap.add_argument("--val", nargs=2, action="append", type=pathlib.Path, default=[], metavar=("IMAGE", "LABELS"))
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--num-classes", type=int, default=6, help="land-cover classes, no data not counted")
    ap.add_argument(
        "--label-map",
        default="identity",
        choices=sorted(lab.LABEL_MAPS),
        help="identity: labels are already 0 (no data) and 1..C; chesapeake: 15 -> no data",
    )
    args = ap.parse_args(argv)
    try:
        m = prepare(args.output_dir, args.train, args.val, args.block_size, args.num_classes, args.label_map)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"{len(m['train'])} training and {len(m['val'])} validation blocks in {args.output_dir}; band mean "
        f"{[round(x, 1) for x in m['band_mean']]}, std {[round(x, 1) for x in m['band_std']]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
