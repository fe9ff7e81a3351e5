"""Training throughput from 1 to N local processes, and Horovod's overhead against a plain PyTorch loop.

    .venv/bin/python -m benchmarks.scaling [--config local|resnet50|frameworks|landcover]
                                           [--payload pytorch|tensorflow|keras|segmentation] [--max-np 2] [--json FILE]

Each process gets one thread and the same per-process batch (weak scaling, as in the seed benchmarks);
scaling efficiency = images/sec at N / (N x images/sec at 1). Runs are the real payload under horovodrun,
read from its metrics.json; the plain loop is the same model, data and optimizer without Horovod (PyTorch
only). `--config frameworks` is one model every payload has (ResNet-50, 64 px), to compare the payloads.
`--config landcover` is the land-cover segmentation payload's local run (U-Net, ResNet-18 encoder, 64 px
patches) on synthetic tiles prepared once in a temporary folder; its "images" are patches.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent

CONFIGS = {
    # the local job (scripts/train-local)
    "local": [
        "--model",
        "resnet18",
        "--image-size",
        "64",
        "--num-classes",
        "100",
        "--batch-size",
        "16",
        "--synthetic-samples",
        "1024",
        "--epochs",
        "2",
    ],
    # the reference: ResNet-50 at 224 px, batch 32 per process (a few steps: it is slow on a CPU)
    "resnet50": [
        "--model",
        "resnet50",
        "--image-size",
        "224",
        "--num-classes",
        "1000",
        "--batch-size",
        "32",
        "--synthetic-samples",
        "512",
        "--max-steps-per-epoch",
        "4",
        "--epochs",
        "2",
    ],
    # the same model in PyTorch, TensorFlow and Keras
    "frameworks": [
        "--model",
        "resnet50",
        "--image-size",
        "64",
        "--num-classes",
        "100",
        "--batch-size",
        "16",
        "--synthetic-samples",
        "512",
        "--max-steps-per-epoch",
        "8",
        "--epochs",
        "2",
    ],
    # scripts/train-landcover's run (payload segmentation): 16 blocks, so 1 and 2 processes read exact shares
    "landcover": [
        "--model",
        "unet_resnet18",
        "--image-size",
        "64",
        "--batch-size",
        "8",
        "--patches-per-epoch",
        "512",
        "--epochs",
        "2",
    ],
}
PAYLOADS = ("pytorch", "tensorflow", "keras", "segmentation")
COMMON = [
    "--data",
    "synthetic",
    "--workers",
    "0",
    "--threads",
    "1",
    "--no-progress",
    "--warmup-epochs",
    "0",
    "--no-resume",
]


def payload(np: int, args: list[str], name: str = "pytorch", controller: str = "gloo") -> float:
    with tempfile.TemporaryDirectory() as out:
        from launcher.local import horovodrun_options

        flags, fast_env = horovodrun_options(controller)  # what the launcher's local target runs
        # land cover declares neither --data (tiles only) nor --workers (it cuts patches in the training process)
        common = COMMON[4:] + ["--data-dir", str(_landcover_tiles())] if name == "segmentation" else COMMON
        cmd = [
            str(BIN / "horovodrun"),
            "-np",
            str(np),
            "-H",
            f"localhost:{np}",
            *flags,
            sys.executable,
            "-m",
            f"payloads.{name}.train",
            *common,
            *args,
            "--output-dir",
            out,
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", **fast_env)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode:
            raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])
        epochs = json.loads((pathlib.Path(out) / "metrics.json").read_text())["epochs"]
    last = epochs[-1]  # the first epoch carries start-up costs
    return last["images_per_sec"]


_TILES: list[pathlib.Path] = []


def _landcover_tiles() -> pathlib.Path:
    """Synthetic four-band tiles cut into 16 blocks of 256 px, made once per benchmark run (what
    scripts/train-landcover trains on)."""
    if not _TILES:
        from datatools.landcover import prepare, synthetic

        root = pathlib.Path(tempfile.mkdtemp(prefix="landcover-bench-"))
        pairs = synthetic.write_tiles(root / "raw", 5, 512, 512, 6)
        prepare.prepare(root / "prepared", pairs[:4], pairs[4:], block_size=256)
        _TILES.append(root / "prepared")
    return _TILES[0]


def plain_loop(args: list[str]) -> float:
    """The same training step without Horovod: model, SGD, the payload's own synthetic batches, one thread."""
    import torch
    import torch.nn.functional as F

    from payloads.common import options
    from payloads.pytorch import inputs, models

    cfg = dataclasses.replace(options.parse(COMMON + args, "plain", "", list(models.MODELS)), channels_last=False)
    torch.set_num_threads(1)
    batch = cfg.per_process_batch(1)
    data = inputs.build(cfg, 0, 1, batch, torch.device("cpu"))
    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, cfg.num_classes, cfg.image_size)
    opt = torch.optim.SGD(
        model.parameters(), lr=cfg.lr_for(batch), momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    rate = 0.0
    for epoch in range(cfg.epochs):
        data.train.set_epoch(epoch)
        model.train()
        seen, start = 0, time.perf_counter()
        for images, labels, _ in data.train:
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()
            seen += len(images)
        rate = seen / (time.perf_counter() - start)
    return rate


def independent(np: int, config: str) -> float:
    """The machine's own ceiling: `np` plain loops at once, no communication at all; their summed rate
    over np x one loop alone is the best scaling efficiency any allreduce could reach here (shared
    memory bandwidth, caches, and vCPUs that may share a physical core all count against it)."""
    cmd = [sys.executable, "-m", "benchmarks.scaling", "--config", config, "--plain-only"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) for _ in range(np)]
    return sum(float(p.communicate(timeout=3600)[0].split()[-1]) for p in procs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="local")
    ap.add_argument("--payload", choices=PAYLOADS, default="pytorch")
    ap.add_argument("--max-np", type=int, default=2)
    ap.add_argument(
        "--controllers",
        default="auto",
        help="comma-separated Horovod controllers to compare (gloo, mpi); auto = the local launcher's choice",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per controller and process count, alternating; the median is reported",
    )
    ap.add_argument("--json", type=pathlib.Path)
    ap.add_argument("--plain-only", action="store_true", help=argparse.SUPPRESS)  # one loop, for independent()
    args = ap.parse_args(argv)
    extra = CONFIGS[args.config]
    if (args.config == "landcover") != (args.payload == "segmentation"):
        ap.error("--config landcover goes with --payload segmentation, and only it")
    if args.plain_only:
        print(plain_loop(extra))
        return 0
    from launcher.local import controller

    controllers = [controller(c.strip()) for c in args.controllers.split(",")]
    plain = plain_loop(extra) if args.payload == "pytorch" else None
    ceiling = {np: independent(np, args.config) for np in range(2, args.max_np + 1)} if plain else {}
    runs: dict[str, dict[int, list[float]]] = {c: {np: [] for np in range(1, args.max_np + 1)} for c in controllers}
    for _ in range(args.repeats):  # alternate, so drift on a shared machine hits all alike
        for np in range(1, args.max_np + 1):
            for c in controllers:
                runs[c][np].append(payload(np, extra, args.payload, c))
    by_controller = {c: {np: statistics.median(r) for np, r in per.items()} for c, per in runs.items()}
    rates = by_controller[controllers[0]]
    print(f"config {args.config}, payload {args.payload}, controllers {', '.join(controllers)}: {' '.join(extra)}")
    if plain is not None:
        print(f"plain PyTorch loop, 1 process: {plain:.1f} images/sec")
        print(f"Horovod, 1 process: {rates[1]:.1f} images/sec ({(rates[1] / plain - 1) * 100:+.1f}% vs plain)")
        for np, rate in ceiling.items():
            print(
                f"{np} independent plain loops at once: {rate:.1f} images/sec in all, a ceiling of "
                f"{rate / (np * plain) * 100:.0f}% scaling efficiency on this machine"
            )
    else:
        print(f"Horovod, 1 process: {rates[1]:.1f} images/sec")
    for c, per in by_controller.items():
        for np, rate in per.items():
            if np > 1:
                print(
                    f"Horovod over {c}, {np} processes: {rate:.1f} images/sec (runs: "
                    f"{', '.join(f'{x:.1f}' for x in runs[c][np])}), scaling efficiency "
                    f"{rate / (np * per[1]) * 100:.0f}% against its own 1-process rate {per[1]:.1f}"
                )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "config": args.config,
                    "payload": args.payload,
                    "plain": plain,
                    "controller": controllers[0],
                    "horovod": rates,
                    "independent": ceiling,
                    "controllers": by_controller,
                    "runs": runs,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
