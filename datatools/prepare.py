"""Turn an ImageNet-style image tree into shards for both payloads, with a manifest; resumable.

    python -m datatools.prepare --image-dir IMAGES --output-dir SHARDS [--shards 1024]
        [--val-labels imagenet_2012_validation_synset_labels.txt] [--resize 160] [--formats webdataset,tfrecord]

IMAGES is root/train/<class>/<image> (and root/val: class folders, or flat files relabelled from a
ground-truth file as TensorFlow's ImageNet scripts do), or root/<class>/<image> for training only.
Writes SHARDS/webdataset/{train,validation}-NNNNN-of-NNNNN.tar (WebDataset: <key>.jpg + <key>.cls, read by
the PyTorch payload's --data shards) and SHARDS/tfrecord/{train,validation}-NNNNN-of-NNNNN (the TFRecord
layout of payloads/tensorflow/tfrecords.py, read by --data tfrecord), each folder with its manifest.json.

Samples are dealt to shards after one seeded shuffle, so every shard mixes classes (the readers' shuffle
buffer then only has to mix within a few shards). Each shard is written to a temporary name and renamed
when whole; the manifest records it after that, so a rerun of the same command skips it. Everything that
can be checked without decoding (missing tree, empty class, labels file) is checked before any shard is
written; a corrupt image is reported by path, recorded in the manifest and skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import pathlib
import re
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from payloads.common import imagefolder, manifest
from payloads.common.errors import ConfigError
from payloads.common.manifest import FORMATS, TFRECORD, TRAIN, VALIDATION, WEBDATASET, Manifest, Shard, Split

log = logging.getLogger("datatools.prepare")
JPEG_QUALITY = 90


@dataclass(frozen=True)
class Inputs:
    classes: list[str]
    splits: dict[str, list[tuple[str, int]]]  # split -> sorted (path, label)


# ---------------------------------------------------------------------------------------------- inputs


def _val_labels(val_dir: pathlib.Path, labels_file: pathlib.Path, classes: list[str]) -> list[tuple[str, int]]:
    """Flat validation images labelled from a ground-truth file: one synset per line in the sorted order of
    the file names (imagenet_2012_validation_synset_labels.txt), or `name,synset ...` lines
    (LOC_val_solution.csv: the first word after the name is the synset)."""
    if not labels_file.is_file():
        raise ConfigError(f"--val-labels {labels_file} does not exist: pass the validation ground-truth file")
    files = sorted(
        p for p in val_dir.iterdir() if p.is_file() and p.name.lower().endswith(imagefolder.IMAGE_EXTENSIONS)
    )
    if not files:
        raise ConfigError(
            f"validation folder {val_dir} has no images (looked for {', '.join(imagefolder.IMAGE_EXTENSIONS)})"
        )
    lines = [ln.strip() for ln in labels_file.read_text().splitlines() if ln.strip()]
    index = {c: i for i, c in enumerate(classes)}
    if lines and all(len(re.split(r"[\s,]+", ln)) == 1 for ln in lines):
        if len(lines) != len(files):
            raise ConfigError(
                f"{labels_file} has {len(lines)} labels for {len(files)} images in {val_dir}: "
                "a one-column labels file needs one line per image, in sorted file-name order"
            )
        pairs = list(zip(files, lines))
    else:
        by_stem = {}
        for ln in lines:
            parts = re.split(r"[\s,]+", ln)
            if len(parts) >= 2:
                by_stem[pathlib.Path(parts[0]).stem] = parts[1]
        missing = [f.name for f in files if f.stem not in by_stem]
        if missing:
            raise ConfigError(
                f"{labels_file} has no label for {len(missing)} validation image(s), e.g. {missing[0]}: "
                "use the ground-truth file of this validation set"
            )
        pairs = [(f, by_stem[f.stem]) for f in files]
    unknown = sorted({c for _, c in pairs if c not in index})
    if unknown:
        raise ConfigError(
            f"{labels_file} names classes with no training folder, e.g. {unknown[0]}: the labels "
            "file and the training tree must be of the same data set"
        )
    return [(str(f), index[c]) for f, c in pairs]


def scan(image_dir: pathlib.Path, val_labels: pathlib.Path | None = None) -> Inputs:
    """Every check that needs no decode, before anything is written."""
    try:
        train_dir, val_dir = imagefolder.split_dirs(image_dir)
        tree = imagefolder.scan(train_dir, "image directory")
        splits = {TRAIN: tree.samples}
        if val_dir is not None:
            has_class_dirs = any(p.is_dir() for p in val_dir.iterdir())
            if val_labels is not None:
                splits[VALIDATION] = _val_labels(val_dir, val_labels, tree.classes)
            elif has_class_dirs:
                val = imagefolder.scan(val_dir, "validation directory")
                if val.classes != tree.classes:
                    extra = sorted(set(val.classes) - set(tree.classes)) or sorted(set(tree.classes) - set(val.classes))
                    raise ConfigError(
                        f"{val_dir}'s class folders differ from {train_dir}'s (e.g. {extra[:1]}): "
                        "train and val need the same classes"
                    )
                splits[VALIDATION] = val.samples
            else:
                raise ConfigError(
                    f"{val_dir} holds flat images with no class folders: pass --val-labels with its "
                    "ground-truth file (e.g. imagenet_2012_validation_synset_labels.txt)"
                )
    except PermissionError as e:
        raise ConfigError(f"cannot read {e.filename}: {e.strerror}; fix its permissions") from None
    return Inputs(tree.classes, splits)


def deal(samples: Sequence[tuple[str, int]], shards: int, seed: int) -> list[list[tuple[int, str, int]]]:
    """(global index, path, label) per shard: one seeded shuffle, then near-equal contiguous parts."""
    order = np.random.default_rng(seed).permutation(len(samples))
    parts = np.array_split(order, shards)
    return [[(int(i), samples[i][0], samples[i][1]) for i in part] for part in parts]


def shard_name(fmt: str, split: str, index: int, count: int) -> str:
    base = f"{split}-{index:05d}-of-{count:05d}"
    return base + ".tar" if fmt == WEBDATASET else base


# ---------------------------------------------------------------------------------------------- encode


def encode(path: str, resize: int | None) -> tuple[bytes, str]:
    """(bytes, extension) of one image, decoded in full so that corrupt files fail here, not in training.
    Kept byte for byte when it is an RGB or grayscale JPEG/PNG that needs no resize (both readers decode
    those to RGB); otherwise re-encoded: CMYK JPEGs and other formats as RGB (TensorFlow's ImageNet
    scripts convert them too, since tf.image cannot decode them), PNGs losslessly, resized ones as JPEG."""
    raw = pathlib.Path(path).read_bytes()
    with Image.open(io.BytesIO(raw)) as img:
        img.load()
        fmt, mode, (w, h) = img.format, img.mode, img.size
        small = resize is None or min(w, h) <= resize
        if small and mode in ("RGB", "L") and fmt in ("JPEG", "PNG"):
            return raw, "jpg" if fmt == "JPEG" else "png"
        rgb = img.convert("RGB")
    out = io.BytesIO()
    if small:
        if fmt == "JPEG":
            rgb.save(out, "JPEG", quality=95)
            return out.getvalue(), "jpg"
        rgb.save(out, "PNG")
        return out.getvalue(), "png"
    scale = resize / min(w, h)
    rgb = rgb.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.BICUBIC)
    rgb.save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue(), "jpg"


@dataclass(frozen=True)
class Job:
    split: str
    index: int
    count: int
    samples: list[tuple[int, str, int]]
    resize: int | None
    folders: dict[str, str]  # format -> output folder


def _finish(tmp: pathlib.Path, final: pathlib.Path, samples: int) -> Shard:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    digest, size = manifest.md5_file(tmp), tmp.stat().st_size
    os.replace(tmp, final)  # whole files only: an interrupted write leaves a .tmp, never a shard name
    return Shard(final.name, samples, size, digest)


def write_shard(job: Job) -> tuple[dict[str, Shard], list[dict]]:
    """Write one shard in every requested format; returns ({format: Shard}, skipped inputs)."""
    tmps = {
        fmt: pathlib.Path(folder) / f".{shard_name(fmt, job.split, job.index, job.count)}.tmp"
        for fmt, folder in job.folders.items()
    }
    tar = tfw = None
    if WEBDATASET in tmps:
        from webdataset import TarWriter

        tar = TarWriter(str(tmps[WEBDATASET]), encoder=False, mtime=0)  # mtime 0: same bytes on a rerun
    if TFRECORD in tmps:
        import tensorflow as tf

        from payloads.tensorflow.tfrecords import example

        tfw = tf.io.TFRecordWriter(str(tmps[TFRECORD]))
    skipped, written = [], 0
    try:
        for index, path, label in job.samples:
            try:
                data, ext = encode(path, job.resize)
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
                log.warning("skipping corrupt image %s: %s", path, e)
                skipped.append({"path": path, "error": f"{type(e).__name__}: {e}"})
                continue
            if tar is not None:
                tar.write({"__key__": f"{index:09d}", ext: data, "cls": str(label).encode()})
            if tfw is not None:
                tfw.write(example(data, label))
            written += 1
    finally:
        if tar is not None:
            tar.close()
        if tfw is not None:
            tfw.close()
    shards = {fmt: _finish(tmp, tmp.with_name(tmp.name[1:-4]), written) for fmt, tmp in tmps.items()}
    return shards, skipped


# ---------------------------------------------------------------------------------------------- run


def fingerprint(inputs: Inputs, shards: dict[str, int], seed: int, resize: int | None) -> str:
    h = hashlib.sha256(json.dumps([inputs.classes, shards, seed, resize], sort_keys=True).encode())
    for split in sorted(inputs.splits):
        for path, label in inputs.splits[split]:
            h.update(f"{split}\0{path}\0{label}\n".encode())
    return h.hexdigest()


def _start_manifest(folder: pathlib.Path, fmt: str, inputs: Inputs, plan: dict) -> Manifest:
    old = manifest.read(folder)
    if old is not None and old.plan.get("fingerprint") != plan["fingerprint"]:
        raise ConfigError(
            f"{folder} already holds shards from a different preparation (other images, shard count, "
            "seed or --resize): choose a new --output-dir, or delete that folder to start over"
        )
    splits = {}
    for name, samples in inputs.splits.items():
        split = Split(len(samples))
        if old is not None and name in old.splits:
            # Keep what the manifest recorded as finished and is still on disk at its size.
            for s in old.splits[name].shards:
                p = folder / s.name
                if p.is_file() and p.stat().st_size == s.bytes:
                    split.shards.append(s)
            kept = {s.name for s in split.shards}
            split.skipped = [k for k in old.splits[name].skipped if k.get("shard") in kept]
        splits[name] = split
    return Manifest(fmt, inputs.classes, plan, splits, complete=False)


def run(
    image_dir: pathlib.Path,
    output_dir: pathlib.Path,
    shards: int = 64,
    formats: Sequence[str] = FORMATS,
    resize: int | None = None,
    val_labels: pathlib.Path | None = None,
    seed: int = 0,
    workers: int = 1,
    progress: bool = True,
) -> dict[str, Manifest]:
    if shards < 1:
        raise ConfigError(f"--shards must be at least 1, got {shards}")
    if resize is not None and resize < 8:
        raise ConfigError(f"--resize is the shorter side in pixels and must be at least 8, got {resize}")
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ConfigError(f"unknown --formats {','.join(bad) or '(none)'}: choose from {','.join(FORMATS)}")
    inputs = scan(pathlib.Path(image_dir), val_labels)
    counts = {name: max(1, min(shards, len(s))) for name, s in inputs.splits.items()}
    plan = {
        "shards": counts,
        "seed": seed,
        "resize": resize,
        "source": str(image_dir),
        "fingerprint": fingerprint(inputs, counts, seed, resize),
    }
    folders = {fmt: pathlib.Path(output_dir) / fmt for fmt in formats}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    manifests = {fmt: _start_manifest(folder, fmt, inputs, plan) for fmt, folder in folders.items()}

    jobs = []
    for split, samples in inputs.splits.items():
        for i, part in enumerate(deal(samples, counts[split], seed)):
            done = all(
                shard_name(fmt, split, i, counts[split]) in {s.name for s in manifests[fmt].splits[split].shards}
                for fmt in formats
            )
            if not done:
                jobs.append(Job(split, i, counts[split], part, resize, {f: str(p) for f, p in folders.items()}))
    total = sum(len(s) for s in inputs.splits.values())
    todo = sum(len(j.samples) for j in jobs)
    if todo < total:
        log.info("resuming: %d of %d images are in finished shards already", total - todo, total)

    from tqdm import tqdm

    bar = tqdm(total=todo, unit="img", desc="prepare", disable=not progress)

    def record(job: Job, result) -> None:
        shards_done, skipped = result
        for path in skipped:
            bar.write(f"skipped corrupt image {path['path']} ({path['error']})")
        for fmt, shard in shards_done.items():
            split = manifests[fmt].splits[job.split]
            split.shards = sorted([s for s in split.shards if s.name != shard.name] + [shard], key=lambda s: s.name)
            split.skipped += [dict(k, shard=shard.name) for k in skipped]
            manifest.write(folders[fmt], manifests[fmt])
        bar.update(len(job.samples))

    try:
        if workers <= 1 or len(jobs) <= 1:
            for job in jobs:
                record(job, write_shard(job))
        else:
            with ProcessPoolExecutor(workers) as pool:
                futures = {pool.submit(write_shard, job): job for job in jobs}
                for f in as_completed(futures):
                    record(futures[f], f.result())
    finally:
        bar.close()
    for fmt, m in manifests.items():
        for name, split in m.splits.items():
            if split.samples == 0:
                raise ConfigError(f"every {name} image was corrupt (see the messages above): nothing to train on")
        m.complete = True
        if fmt == TFRECORD:  # tfrecords.py's companion file: the class names in label order
            for name in m.splits:
                (folders[fmt] / f"{name}-classes.txt").write_text("".join(f"{c}\n" for c in m.classes))
        manifest.write(folders[fmt], m)
    return manifests


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    p = argparse.ArgumentParser(prog="python -m datatools.prepare", description=__doc__.splitlines()[0])
    p.add_argument("--image-dir", type=pathlib.Path, required=True)
    p.add_argument("--output-dir", type=pathlib.Path, required=True)
    p.add_argument(
        "--shards",
        type=int,
        default=64,
        help="files per split; a multiple of the training process count lets each rank read its own files",
    )
    p.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="comma-separated: webdataset (PyTorch), tfrecord (TensorFlow/Keras)",
    )
    p.add_argument(
        "--resize", type=int, default=None, metavar="N", help="shrink so the shorter side is N px (never enlarges)"
    )
    p.add_argument(
        "--val-labels",
        type=pathlib.Path,
        default=None,
        help="ground-truth file for a flat val/ folder (imagenet_2012_validation_synset_labels.txt or LOC_val_solution.csv)",
    )
    p.add_argument("--seed", type=int, default=0, help="the shuffle that deals images to shards")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes encoding shards in parallel")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    a = p.parse_args(argv)
    try:
        result = run(
            a.image_dir,
            a.output_dir,
            a.shards,
            [f.strip() for f in a.formats.split(",") if f.strip()],
            a.resize,
            a.val_labels,
            a.seed,
            a.workers,
            a.progress,
        )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for fmt, m in result.items():
        for name, split in m.splits.items():
            skipped = (
                f", {len(split.skipped)} corrupt image(s) skipped (listed in the manifest)" if split.skipped else ""
            )
            print(f"{fmt}: {split.samples} {name} images in {len(split.shards)} shards{skipped}")
        print(f"  {pathlib.Path(a.output_dir) / fmt / manifest.NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
