"""Input pipeline and real-vs-synthetic training throughput, on generated ImageNet-like JPEGs.

    .venv/bin/python -m benchmarks.input_pipeline                       # 2,000 images, ResNet-18 at 112 px
    .venv/bin/python -m benchmarks.input_pipeline --tiny                # a quick check that it runs
    .venv/bin/python -m benchmarks.input_pipeline --images 20000 --workers 8 --train-model resnet50 --train-image-size 224
    .venv/bin/python -m benchmarks.input_pipeline --decoders-only --images 300   # the JPEG decoder table alone

No real ImageNet is at hand here, so the images are generated: JPEG (quality 90) of ImageNet's typical
sizes (about 470 x 390 px, 80-130 KB each), smooth colour fields with noise so that they compress like
photographs, in class folders. Then:

1. input pipeline alone, images/sec over one epoch of one process with the same decode and augmentation
   (RandomResizedCrop to --image-size, flip, normalise) and the same --workers:
   - class folders, torchvision ImageFolder-style dataset + DataLoader (the payload's --data imagefolder);
   - WebDataset shards (--data shards), the same images byte for byte;
   - shards pre-resized at preparation (--resize, shorter side 256: what the ImageNet job uses);
   each as epoch 1 (files read through the OS page cache as the previous step left it, or from disk with
   --drop-page-cache, which needs root and slows every other process on the machine for a while) and
   epoch 2; for shards also epoch 2 with --cache-decoded (decoded images served from memory). Rates count
   from the first batch on; the time to the first batch (worker start-up) is printed beside them.
2. JPEG decoders: images per CPU-second (one process, one thread: images/sec per core) of every CPU decoder that loads here
   (payloads/pytorch/decoders.py: Pillow, torchvision.io.decode_jpeg, simplejpeg, PyTurboJPEG), decoding
   alone and decoding plus the training crop (RandomResizedCrop to --image-size, flip: the work of one
   shard worker per image), on the full-size JPEGs and on copies pre-resized as prepare --resize 256 and
   --resize 160 write them. The fastest one is the payloads' `--decoder auto`. simplejpeg and PyTurboJPEG are
   not payload requirements: put them on PYTHONPATH to measure them (docs/benchmarks.md#jpeg-decoders shows how).
3. training, images/sec of the payload in one process (no Horovod launcher), the same model, batch and
   settings on synthetic data, on class folders, and on shards with --cache-decoded.
On a 2-core machine the data loader and the model share the cores; on a GPU node the loader has the CPUs
to itself, so the training ratios here are a lower bound for what a GPU sees.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def generate(root: pathlib.Path, images: int, classes: int, seed: int = 0) -> pathlib.Path:
    """ImageNet-like JPEGs in root/train/<class>/; reused when already there with the same count."""
    from PIL import Image

    stamp = root / f".generated-{images}-{classes}-{seed}"
    if stamp.exists():
        return root / "train"
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for i in range(images):
        c = i % classes
        w = int(np.clip(rng.normal(470, 80), 200, 800))
        h = int(np.clip(w * rng.uniform(0.66, 0.9), 150, 700))
        base = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        field = np.asarray(Image.fromarray(base).resize((w, h), Image.BICUBIC), dtype=np.int16)
        pixels = np.clip(field + rng.normal(0, 16, (h, w, 3)), 0, 255).astype(np.uint8)
        folder = root / "train" / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"img_{i:07d}.JPEG", quality=90)
    stamp.touch()
    return root / "train"


def _photos_part(root: str, images: int, classes: int, seed: int) -> str:
    return str(generate(pathlib.Path(root), images, classes, seed))


def photos(work: pathlib.Path, images: int, classes: int, workers: int) -> pathlib.Path:
    """Photo-like JPEGs (input_pipeline.generate) in class folders, made by `workers` processes: 12,800 take
    minutes in one. Each part is generated apart, then its files are moved into one tree."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    parts = max(1, min(workers, images // 100 or 1))
    counts = [images // parts + (i < images % parts) for i in range(parts)]
    tree = work / "tree" / "train"
    roots = [str(work / f"part{i}") for i in range(parts)]
    if parts == 1:
        made = [_photos_part(roots[0], images, classes, 0)]
    else:  # spawn: the parent may hold CUDA, which a forked child must not touch
        with ProcessPoolExecutor(parts, mp_context=get_context("spawn")) as pool:
            made = list(pool.map(_photos_part, roots, counts, [classes] * parts, range(parts)))
    for i, part in enumerate(made):
        for folder in sorted(pathlib.Path(part).iterdir()):
            (tree / folder.name).mkdir(parents=True, exist_ok=True)
            for f in folder.iterdir():
                f.rename(tree / folder.name / f"p{i}-{f.name}")
        shutil.rmtree(work / f"part{i}")
    return tree


def shards(work: pathlib.Path, images: int, size: int) -> pathlib.Path:
    """JPEG shards pre-resized to `size` px (datatools.prepare --resize, as the shards job's; prepare uses every
    core) from generated photo-like images."""
    from datatools import prepare

    tree = photos(work, images, classes=100, workers=os.cpu_count() or 1)
    out = work / f"shards-{size}"
    prepare.main(
        [
            "--image-dir",
            str(tree),
            "--output-dir",
            str(out),
            "--shards",
            "16",
            "--resize",
            str(size),
            "--formats",
            "webdataset",
            "--no-progress",
        ]
    )
    return out / "webdataset"


def drop_page_cache() -> bool:
    """Linux: write back and drop the page cache, so that epoch 1 reads from disk (root only)."""
    try:
        os.sync()
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _rate(batches) -> tuple[int, float, float]:
    """(images after the first batch, seconds they took, seconds to the first batch)."""
    start = time.perf_counter()
    it = iter(batches)
    next(it)
    first = time.perf_counter()
    n = sum(len(images) for images, _labels, _skipped in it)
    return n, time.perf_counter() - first, first - start


def folder_loader(tree_dir: pathlib.Path, image_size: int, batch: int, workers: int):
    import torch
    from torch.utils.data import DataLoader

    from payloads.common import imagefolder
    from payloads.pytorch import data

    ds = data.ImageFiles(imagefolder.scan(tree_dir), image_size, train=True, skip_corrupt=False)
    sampler = data.ShardedBatchSampler(len(ds), 0, 1, batch, seed=0, tag_epoch=True)
    kwargs = dict(multiprocessing_context="forkserver", persistent_workers=True, prefetch_factor=4) if workers else {}
    return DataLoader(
        ds, batch_sampler=sampler, num_workers=workers, collate_fn=data.collate, generator=torch.Generator(), **kwargs
    ), sampler


def shard_loader(
    shard_dir: pathlib.Path, image_size: int, batch: int, workers: int, cache: bool, decoder: str = "auto"
):
    from payloads.pytorch import shards

    train, _, _ = shards.open_set(shard_dir)
    return shards.ShardLoader(
        train,
        shards.Reading(0, 1, batch, workers=workers, cache=cache, decoder=decoder),
        shards.Transform(image_size, train=True),
    )


def shard_epochs(
    shard_dir: pathlib.Path, image_size: int, batch: int, workers: int, decoder: str, epochs: int
) -> list[tuple[float, float]]:
    """The shard reader alone (decode, crop, uint8 batches), per epoch: (images/sec after the epoch's first batch,
    seconds to that first batch)."""
    loader = shard_loader(shard_dir, image_size, batch, workers, cache=False, decoder=decoder)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        images, seconds, first = _rate(loader)
        out.append((images / seconds, first))
    return out


def decoder_table(args, tree_dir: pathlib.Path) -> list[tuple[str, str, float, float]]:
    """(decoder, image set, decode images/sec, decode+crop images/sec) on one core, best of --repeats."""
    import torch

    from datatools import prepare
    from payloads.pytorch import data, decoders

    torch.set_num_threads(1)
    paths = sorted(str(p) for p in tree_dir.rglob("*.JPEG"))[: args.decode_images]
    sets = {"full size": [pathlib.Path(p).read_bytes() for p in paths]}
    for side in (256, 160):
        sets[f"pre-resized {side}"] = [prepare.encode(p, side)[0] for p in paths]
    for name, blobs in sets.items():
        shapes = np.array([decoders.pillow(b).shape[:2] for b in blobs[:50]])
        print(
            f"  {name:18} {len(blobs)} JPEGs, mean {np.mean([len(b) for b in blobs]) / 1e3:.0f} KB, "
            f"about {shapes[:, 1].mean():.0f} x {shapes[:, 0].mean():.0f} px"
        )
    names = decoders.available()
    missing = [n for n in decoders.PREFERENCE if n not in names]
    transform = data.Transform(args.image_size, train=True)
    rows = []
    print(
        f"\n  {'decoder':12} {'images':18} {'decode img/s/core':>18} {'+ crop ' + str(args.image_size) + ' img/s/core':>24}"
    )
    for name in names:
        decode = decoders.make(name)
        for label, blobs in sets.items():
            best_d = best_c = 0.0
            for _ in range(args.repeats):
                # CPU seconds of this process, not wall time: per core, and not skewed by whatever else runs.
                t = time.process_time()
                for b in blobs:
                    decode(b)
                best_d = max(best_d, len(blobs) / (time.process_time() - t))
                t = time.process_time()
                for i, b in enumerate(blobs):
                    transform(decode(b), np.random.default_rng(i))
                best_c = max(best_c, len(blobs) / (time.process_time() - t))
            rows.append((name, label, best_d, best_c))
            print(f"  {name:12} {label:18} {best_d:18.1f} {best_c:24.1f}", flush=True)
    if missing:
        print(f"  not installed here: {', '.join(missing)}")
    print(f"  --decoder auto picks: {decoders.resolve('auto')}")
    return rows


def pipeline(args, tree_dir: pathlib.Path, shard_dirs: dict[str, pathlib.Path]) -> list[tuple[str, str, float]]:
    rows = []

    def measure(name: str, epoch_label: str, it) -> None:
        n, s, first = _rate(it)
        rows.append((name, epoch_label, n / s))
        print(
            f"  {name:45} {epoch_label:28} {n / s:8.1f} images/sec ({n} images in {s:.1f} s; first batch after "
            f"{first:.1f} s)",
            flush=True,
        )

    dropped = args.drop_page_cache and drop_page_cache()
    if args.drop_page_cache and not dropped:
        print("  (could not drop the page cache: not root)")
    cold = "epoch 1 (page cache dropped)" if dropped else "epoch 1 (page cache as left)"
    dl, sampler = folder_loader(tree_dir, args.image_size, args.batch, args.workers)
    measure("class folders, DataLoader", cold, dl)
    sampler.set_epoch(1)
    measure("class folders, DataLoader", "epoch 2", dl)
    del dl
    for label, folder in shard_dirs.items():
        if dropped:
            drop_page_cache()
        loader = shard_loader(folder, args.image_size, args.batch, args.workers, cache=False)
        measure(f"shards{label}", cold, loader)
        loader.set_epoch(1)
        measure(f"shards{label}", "epoch 2", loader)
        cached = shard_loader(folder, args.image_size, args.batch, args.workers, cache=True)
        measure(f"shards{label}, --cache-decoded", "epoch 1 (fills the cache)", cached)
        cached.set_epoch(1)
        measure(f"shards{label}, --cache-decoded", "epoch 2 (from memory)", cached)
    return rows


def train_rate(args, extra: list[str], out: pathlib.Path) -> float:
    """Images/sec of the last epoch of one payload process (epoch 1 includes start-up and cache filling)."""
    cmd = [
        sys.executable,
        "-m",
        "payloads.pytorch.train",
        "--model",
        args.train_model,
        "--image-size",
        str(args.train_image_size),
        "--batch-size",
        str(args.batch),
        "--epochs",
        str(args.train_epochs),
        "--workers",
        str(args.workers),
        "--no-progress",
        "--warmup-epochs",
        "0",
        "--output-dir",
        str(out),
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((out / "metrics.json").read_text())["epochs"][-1]["images_per_sec"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--image-size", type=int, default=224, help="crop size of the input pipeline measurement")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="DataLoader processes / shard decode threads")
    p.add_argument("--train-model", default="resnet18")
    p.add_argument("--train-image-size", type=int, default=112)
    p.add_argument("--train-epochs", type=int, default=2)
    p.add_argument("--work-dir", type=pathlib.Path, default=None, help="keep the generated images here between runs")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument(
        "--drop-page-cache", action="store_true", help="epoch 1 from disk (root; disturbs the whole machine)"
    )
    p.add_argument("--tiny", action="store_true", help="seconds-long check: 64 small images, tiny model")
    p.add_argument("--decoders-only", action="store_true", help="only the JPEG decoder table")
    p.add_argument("--decode-images", type=int, default=300, help="JPEGs per set in the decoder table")
    p.add_argument("--repeats", type=int, default=3, help="decoder table: best of this many passes")
    p.add_argument("--json", type=pathlib.Path, help="also write the decoder table here (benchmarks.plots draws it)")
    args = p.parse_args(argv)
    if args.tiny:
        args.images, args.classes, args.shards, args.image_size, args.batch = 64, 4, 4, 32, 8
        args.train_model, args.train_image_size, args.train_epochs = "tiny_cnn", 16, 2
        args.decode_images, args.repeats = 16, 1

    from datatools import prepare

    work = args.work_dir or pathlib.Path(tempfile.mkdtemp(prefix="input-pipeline-"))
    t = time.perf_counter()
    tree_dir = generate(work / "images", args.images, args.classes)
    sizes = [f.stat().st_size for f in tree_dir.rglob("*.JPEG")]
    print(
        f"{len(sizes)} generated JPEGs (ImageNet-like, not ImageNet) in {tree_dir}: mean {np.mean(sizes) / 1e3:.0f} KB "
        f"({time.perf_counter() - t:.0f} s)"
    )
    print("\nJPEG decoders, 1 process x 1 thread (images/sec per core):")
    rows = decoder_table(args, tree_dir)
    if args.json:
        import platform

        from .report import cpu_model

        args.json.write_text(
            json.dumps(
                {
                    "date": time.strftime("%Y-%m-%d"),
                    "cores": os.cpu_count(),
                    "cpu": cpu_model(),
                    "command": "python -m benchmarks.input_pipeline "
                    + " ".join(argv if argv is not None else sys.argv[1:]),
                    "python": platform.python_version(),
                    "image_size": args.image_size,
                    "rows": [
                        {"decoder": d, "images": s, "decode_per_core": r1, "decode_crop_per_core": r2}
                        for d, s, r1, r2 in rows
                    ],
                },
                indent=2,
            )
        )
    if args.decoders_only:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    shard_dirs = {}
    for label, resize in (("", None), (", pre-resized to 256", 256)):
        out = work / f"shards-{resize or 'full'}"
        t = time.perf_counter()
        prepare.run(
            tree_dir,
            out,
            shards=args.shards,
            formats=["webdataset"],
            resize=resize,
            workers=args.workers,
            progress=False,
        )
        mb = sum(f.stat().st_size for f in (out / "webdataset").glob("*.tar")) / 1e6
        print(f"prepared {out / 'webdataset'} ({mb:.0f} MB, {time.perf_counter() - t:.0f} s)")
        shard_dirs[label] = out / "webdataset"

    print(f"\ninput pipeline alone: 1 process, batch {args.batch}, {args.workers} workers, crop {args.image_size} px")
    pipeline(args, tree_dir, shard_dirs)

    if not args.skip_training:
        print(
            f"\ntraining: {args.train_model} at {args.train_image_size} px, batch {args.batch}, 1 process, "
            f"{args.workers} workers, last of {args.train_epochs} epochs"
        )
        runs = work / "runs"
        shutil.rmtree(runs, ignore_errors=True)
        synth = train_rate(
            args,
            ["--data", "synthetic", "--synthetic-samples", str(args.images), "--num-classes", str(args.classes)],
            runs / "synthetic",
        )
        print(f"  synthetic data                                 {synth:8.1f} images/sec", flush=True)
        for name, extra in (
            ("class folders", ["--data", "imagefolder", "--data-dir", str(tree_dir)]),
            ("shards", ["--data", "shards", "--data-dir", str(shard_dirs[''])]),
            ("shards, --cache-decoded", ["--data", "shards", "--data-dir", str(shard_dirs['']), "--cache-decoded"]),
            (
                "shards pre-resized to 256, --cache-decoded",
                ["--data", "shards", "--data-dir", str(shard_dirs[', pre-resized to 256']), "--cache-decoded"],
            ),
        ):
            r = train_rate(args, extra, runs / name.replace(" ", "_").replace(",", ""))
            print(f"  {name:46} {r:8.1f} images/sec = {r / synth * 100:5.1f}% of synthetic", flush=True)
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
