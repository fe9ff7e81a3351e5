"""The GPU benchmark: one command, one GPU, under 10 minutes; prints a table and writes JSON.

    python -m benchmarks.gpu [--json gpu.json] [--workers 12] [--quick] [--compiled] [--plan]

Needs Python 3.11 or 3.12 with torch and torchvision, and benchmarks/requirements-gpu-box.txt (no Horovod, no
.venv: docs/pytorch-gpu.md#on-a-gpu-machine-without-horovod).

1. Synthetic ceiling: ResNet-50 training steps on one fixed batch made on the GPU (Horovod's synthetic benchmark
   pattern), channels_last, at batch 64 and 256, fp16 and bf16, with the payload's own optimizer and step
   (runtime.optimizer: fused SGD, its weight-decay groups; runtime.optimizer_step: fp16's loss scaler unscales,
   steps unless inf/NaN, updates, exactly as in training). Steady state: the first steps (cuDNN autotuning,
   compilation) are not timed. --compiled adds each case torch.compile'd (inductor compiles every batch and dtype
   anew: minutes each, beyond the 10 minutes).
2. The payload: `payloads.pytorch.train` on synthetic data, one process, its defaults for the GPU, batch 256;
   its steady-state "Total images/sec" (start-up excluded, see --startup-steps); then the same with the other
   mixed-precision dtype (bf16: the default follows these two rows, tests/test_precision.py), and where Horovod is
   installed once more with HOROVOD_ENABLE_ASYNC_COMPLETION=1.
3. The input pipeline alone: images/sec of the shard reader per decoder, from JPEG shards pre-resized to 256 px
   (shorter side) as the shards job's are (datatools.prepare --resize 256), with `--workers` decode processes
   (12 = the vCPUs per GPU of ND H100 v5), after each epoch's first batch, and the seconds to that first batch.
4. Real data: the payload on those shards with `--workers`, its ratio to (2), each epoch's images/sec and its
   step-only rate (images over the epoch's time outside input waits); then with --cache-decoded, as the shards
   job runs (epoch 1 fills the cache, later epochs read it), with --gpu-decode (nvJPEG), and with --loader dali
   where DALI is installed (requirements-gpu-box.txt carries it).
The payload runs in one process: under `horovodrun -np 1 --gloo` where Horovod is installed, else as a plain
`python -m payloads.pytorch.train`, which trains alone (backends.Single); the checkout goes first on its
PYTHONPATH (extended, never replaced).
`--quick` (any device) runs small sizes for a smoke check, one case compiled; `--device cpu` runs on the CPU (CI
does, with --quick). `--plan` prints the rows and the payload commands as JSON and runs nothing.
Reference: NVIDIA's published ResNet-50 (PyTorch, AMP, A100 80 GB, batch 256): 2,470 img/s per GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
SHARD_SIDE = 256  # the shards job's --resize (jobs/pytorch-resnet50-imagenet-shards.yaml, docs/data.md)


def other_dtype(device: str) -> str:
    """The mixed-precision dtype the payload does not default to on `device` (payloads/pytorch/precision.py: fp16 on
    a GPU, bf16 with --amp on a CPU): the second payload row runs it."""
    return "bf16" if device == "cuda" else "fp16"


@dataclass(frozen=True)
class Sizes:
    model: str
    image_size: int
    batches: tuple[int, ...]
    warmup: int  # steps not timed (ceiling) / the payload's --startup-steps
    steps: int  # steps timed
    images: int  # generated photos in the shards
    shard_side: int  # their shorter side after datatools.prepare --resize
    real_epochs: int  # of the payload on the shards


FULL = Sizes("resnet50", 224, (64, 256), 15, 40, 12800, SHARD_SIDE, 3)
# --quick is a smoke check of every code path, not a figure: the smallest model the payload has (compiling
# resnet18 with inductor alone took minutes of a 2-core CI machine).
QUICK = Sizes("tiny_cnn", 32, (8,), 2, 3, 128, 40, 1)


def ceiling_cases(quick: bool, compiled: bool | None) -> list[tuple[int, str, bool]]:
    """(batch, dtype, compiled) of the ceiling rows. Compiled rows: with --compiled every case, with --quick and
    no choice one (bf16: the smoke check that the compiled path runs), else none (each compiles for minutes)."""
    sizes = QUICK if quick else FULL
    if compiled is None:
        compiled = False
        one_compiled = quick
    else:
        one_compiled = False
    cases = []
    for batch in sizes.batches:
        for dtype in ("fp16", "bf16"):
            cases.append((batch, dtype, False))
            if compiled or (one_compiled and dtype == "bf16"):
                cases.append((batch, dtype, True))
    return cases


def horovod_installed() -> bool:
    """Whether this Python (the payload's) has Horovod. A finder that hides it (the tests' sitecustomize) raises."""
    try:
        return importlib.util.find_spec("horovod") is not None
    except (ImportError, ValueError):
        return False


def payload_env(environ: dict | None = None, extra: dict | None = None) -> dict:
    """The payload's environment: this one, with the checkout put first on PYTHONPATH. Extended, never replaced:
    what the machine or the caller put there (a vendor image's packages, a folder of wheels unpacked with
    pip --target) stays importable in the payload."""
    env = dict(os.environ if environ is None else environ)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + old if old else "")
    env.update(extra or {})
    return env


def horovodrun() -> str | None:
    found = BIN / "horovodrun"
    return str(found) if found.exists() else shutil.which("horovodrun")


def payload_command(args: list[str], out: str, processes: int = 1, horovod: bool | None = None) -> list[str]:
    """The command of a payload row. With Horovod installed (None: ask this Python): horovodrun (Gloo, this host),
    as before. Without it: one plain process, `python -m payloads.pytorch.train`, which trains alone
    (backends.Single); a row of several processes cannot run there and stops the benchmark, naming why."""
    train = [
        sys.executable,
        "-m",
        "payloads.pytorch.train",
        "--no-progress",
        "--no-resume",
        "--no-mlflow",
        *args,
        "--output-dir",
        str(out),
    ]
    launcher = horovodrun() if (horovod_installed() if horovod is None else horovod) else None
    if launcher:
        return [launcher, "-np", str(processes), "-H", f"localhost:{processes}", "--gloo", *train]
    if processes == 1:
        return train
    raise SystemExit(
        f"error: a row of {processes} payload processes needs Horovod and horovodrun, which {sys.executable} "
        "does not have: install Horovod, or run the rows of one process"
    )


def payload_args(sizes: Sizes, device: str, data: list[str], epochs: int = 1) -> list[str]:
    """The payload's arguments for a row: the ceiling's model and size at the largest batch."""
    args = [
        "--model",
        sizes.model,
        "--image-size",
        str(sizes.image_size),
        "--batch-size",
        str(sizes.batches[-1]),
        "--epochs",
        str(epochs),
        "--warmup-epochs",
        "0",
        "--startup-steps",
        str(sizes.warmup),
    ]
    if device == "cpu":
        args += ["--amp", "--threads", str(os.cpu_count() or 1)]
    return args + data


def real_cases(quick: bool, work: str) -> list[tuple[str, list[str]]]:
    """The real-data rows: decoding every epoch; as the shards job runs (--cache-decoded: epoch 1 decodes and keeps,
    later epochs crop the kept images from a file in `work`); JPEGs decoded on the GPU (--gpu-decode)."""
    cases = [("", [])]
    if not quick:
        cases += [(", --cache-decoded", ["--cache-decoded", "--cache-dir", work]), (", --gpu-decode", ["--gpu-decode"])]
        if importlib.util.find_spec("nvidia") and importlib.util.find_spec("nvidia.dali"):
            cases.append((", --loader dali", ["--loader", "dali"]))  # decoding on the GPU (mixed), in C++ threads
    return cases


TINY_SIDE = 24  # shards of 24 px images: decoding nearly free, the crop upscales; what is left is the rest
TRAINER_CPUS = "TRAINING_TRAINER_CPUS"  # payloads/pytorch/ring.py: the training process's own cores


def step_only(run: dict) -> list[float]:
    """Each epoch's images/sec over its time outside input waits: what the steps alone would deliver."""
    return [
        round(rate * seconds / max(seconds - waits, 1e-9), 1)
        for rate, seconds, waits in zip(run["epoch_images_per_sec"], run["epoch_seconds"], run["epoch_input_seconds"])
    ]


def plan(sizes: Sizes, device: str, workers: int, compiled: bool | None, quick: bool) -> dict:
    """What the benchmark will run: the ceiling cases and the payload rows' commands (with placeholders for the
    folders it makes), and the payload's PYTHONPATH."""
    big = sizes.batches[-1]
    samples = str(big * (sizes.warmup + sizes.steps))
    synthetic = payload_args(sizes, device, ["--data", "synthetic", "--synthetic-samples", samples])
    other = synthetic + ["--amp-dtype", other_dtype(device)]
    shard_args = ["--data", "shards", "--data-dir", "SHARDS", "--workers", str(workers)]
    real = payload_args(sizes, device, shard_args, sizes.real_epochs)
    return {
        "sizes": asdict(sizes),
        "ceiling": [{"batch": b, "dtype": d, "compiled": c} for b, d, c in ceiling_cases(quick, compiled)],
        "horovod_installed": horovod_installed(),
        "payload": {
            "synthetic": payload_command(synthetic, "OUT"),
            **({} if quick else {f"synthetic {other_dtype(device)}": payload_command(other, "OUT")}),
            **{f"real{label}": payload_command(real + extra, "OUT") for label, extra in real_cases(quick, "WORK")},
        },
        "shards": f"datatools.prepare --resize {sizes.shard_side}, {sizes.images} generated photos",
        "pythonpath": payload_env()["PYTHONPATH"],
    }


def ceiling(
    device: str,
    model_name: str,
    batch: int,
    image_size: int,
    dtype: str,
    compiled: bool,
    warmup: int,
    steps: int,
    host_flag: bool = False,
) -> float:
    """Images/sec of the payload's training step on a fixed batch on the device (no input pipeline, no Horovod):
    its model, optimizer (runtime.optimizer) and step (runtime.optimizer_step, fp16's loss scaler included, its
    found-inf flag read in the fused kernel as runtime.scaler_in_kernel sets it; `host_flag`: read on the host,
    one sync per step, as before)."""
    import torch
    import torch.nn.functional as F

    from payloads.common.config import TrainConfig
    from payloads.pytorch import backends, models, runtime
    from payloads.pytorch.precision import Precision

    torch.manual_seed(0)
    dev = torch.device(device)
    cfg = TrainConfig(model=model_name, image_size=image_size)  # the payload's defaults: momentum, weight decay, scale
    model = models.build(model_name, 1000, image_size).to(dev).to(memory_format=torch.channels_last)
    opt = runtime.optimizer(cfg, model, 0.1, dev)
    prec = Precision(dtype, dev.type)
    scaler = prec.grad_scaler(cfg.loss_scale_init)
    runtime.scaler_in_kernel(opt, scaler)
    if host_flag:
        opt._step_supports_amp_scaling = False  # GradScaler reads found-inf with .item() and skips step() itself
    alone = backends.Single()  # one process: the gradients are the average already
    step_model = torch.compile(model) if compiled else model
    x = torch.randn(batch, 3, image_size, image_size, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with prec.autocast():
            loss = F.cross_entropy(step_model(x), y)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        runtime.optimizer_step(opt, scaler, alone)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return batch * steps / (time.perf_counter() - start)


def payload(args: list[str], env_extra: dict | None = None) -> dict:
    """One process of the PyTorch payload (payload_command); returns its metrics.json summary, world, each
    epoch's images/sec and seconds, and the seconds of each epoch its step waited for the next batch (the
    watchdog's `input` phase: the epoch's first batch and every later wait for the loader)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = payload_command(args, out)
        env = payload_env(extra=env_extra)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise RuntimeError(
                f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        metrics = json.loads((pathlib.Path(out) / "metrics.json").read_text())
        epochs = metrics["epochs"]
        return {
            **metrics["summary"],
            "world": metrics["run"]["world"],
            "epoch_images_per_sec": [round(e["images_per_sec"], 1) for e in epochs],
            "epoch_seconds": [round(e["epoch_seconds"], 3) for e in epochs],
            "epoch_input_seconds": [round(e["phase_seconds"][0]["input"], 3) for e in epochs],
        }


def _photos_part(root: str, images: int, classes: int, seed: int) -> str:
    from benchmarks.input_pipeline import generate

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


def pipeline(
    shard_dir: pathlib.Path, image_size: int, batch: int, workers: int, decoder: str, epochs: int
) -> tuple[float, float]:
    """The shard reader alone (decode, augment, batch as uint8) over `epochs` epochs, the first left out: the best
    images/sec after an epoch's first batch, and the longest wait for an epoch's first batch (the refill a
    training epoch pays at its start)."""
    from benchmarks.input_pipeline import shard_epochs

    later = shard_epochs(shard_dir, image_size, batch, workers, decoder, epochs)[1:]
    return max(rate for rate, _ in later), max(first for _, first in later)


def table(rows: list[dict]) -> str:
    width = max(len(r["what"]) for r in rows)
    lines = [f"{'what':<{width}}  images/sec", f"{'-' * width}  ----------"]
    lines += [
        f"{r['what']:<{width}}  {r['images_per_sec']:>10.1f}" + (f"  ({r['note']})" if r.get("note") else "")
        for r in rows
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default when a GPU is visible) or cpu")
    ap.add_argument("--workers", type=int, default=12, help="decode processes (ND H100 v5: 12 vCPUs per GPU)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke check of the whole benchmark")
    ap.add_argument(
        "--compiled",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add every ceiling case torch.compile'd (minutes each: beyond the 10 minutes); default: none, "
        "with --quick one",
    )
    ap.add_argument("--plan", action="store_true", help="print the rows and payload commands as JSON; run nothing")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes = QUICK if args.quick else FULL
    if args.plan:
        print(json.dumps({"device": device, **plan(sizes, device, args.workers, args.compiled, args.quick)}, indent=2))
        return 0
    if device == "cuda" and not torch.cuda.is_available():
        print(
            "error: --device cuda but torch sees no GPU (run the health check for the driver and CUDA versions)",
            file=sys.stderr,
        )
        return 2
    model, size, warmup, steps = sizes.model, sizes.image_size, sizes.warmup, sizes.steps
    rows: list[dict] = []
    facts = {
        "device": device,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "horovod": horovod_installed(),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "workers": args.workers,
        "quick": args.quick,
        "shard_side": sizes.shard_side,
    }
    started = time.perf_counter()

    def save() -> None:
        if args.json:  # after every row: a run stopped at a time limit keeps what it measured
            facts["seconds"] = round(time.perf_counter() - started, 1)
            args.json.write_text(json.dumps({"machine": facts, "rows": rows}, indent=2) + "\n")

    def add(row: dict, since: float) -> None:
        row["seconds"] = round(time.perf_counter() - since, 1)  # what the row cost, set-up included
        rows.append(row)
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        save()

    for batch, dtype, compiled in ceiling_cases(args.quick, args.compiled):
        since = time.perf_counter()
        rate = ceiling(device, model, batch, size, dtype, compiled, warmup, steps)
        add(
            {
                "what": f"ceiling {model} batch {batch} {dtype}{' compiled' if compiled else ''}",
                "images_per_sec": rate,
                "kind": "ceiling",
                "batch": batch,
                "dtype": dtype,
                "loss_scaler": dtype == "fp16",
                "compiled": compiled,
            },
            since,
        )

    if not args.quick:  # fp16 with the flag read on the host: what the scaler in the kernel saves per step
        since = time.perf_counter()
        batch = sizes.batches[-1]
        rate = ceiling(device, model, batch, size, "fp16", False, warmup, steps, host_flag=True)
        add(
            {
                "what": f"ceiling {model} batch {batch} fp16, found-inf read on the host",
                "images_per_sec": rate,
                "kind": "ceiling",
                "batch": batch,
                "dtype": "fp16",
                "loss_scaler": True,
                "compiled": False,
                "host_flag": True,
            },
            since,
        )

    big = sizes.batches[-1]

    def synthetic_row(extra: list[str], env_extra: dict | None = None, label: str = "", **fields) -> dict:
        """One payload row on synthetic data: the payload's arguments for the sizes, plus `extra`."""
        since = time.perf_counter()
        samples = str(big * (warmup + steps))
        run = payload(
            payload_args(sizes, device, ["--data", "synthetic", "--synthetic-samples", samples]) + extra, env_extra
        )
        add(
            {
                "what": f"payload synthetic batch {big} {run['world']['precision']}{label}",
                "images_per_sec": run["total_images_per_sec"],
                "kind": "payload",
                "startup_seconds": run.get("startup_seconds"),
                "precision": run["world"]["precision"],
                "backend": run["world"]["backend"],
                **fields,
            },
            since,
        )
        return run

    synthetic = synthetic_row([])
    facts["payload_backend"] = synthetic["world"]["backend"]
    if not args.quick:  # the same code with one flag more: the smoke check runs it once
        synthetic_row(["--amp-dtype", other_dtype(device)])
    if not args.quick and horovod_installed():
        # Horovod's completion of GPU work by a callback instead of a blocking event synchronize (issue 29 item 7);
        # with one process it shows the cost of the path, the gain needs several GPUs.
        flag = {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1"}
        synthetic_row([], flag, ", HOROVOD_ENABLE_ASYNC_COMPLETION=1", async_completion=True)

    with tempfile.TemporaryDirectory() as work:
        since = time.perf_counter()
        shard_dir = shards(pathlib.Path(work), sizes.images, sizes.shard_side)
        facts["shards_seconds"] = round(time.perf_counter() - since, 1)
        from payloads.pytorch.decoders import available

        for decoder in available():
            since = time.perf_counter()
            rate, first = pipeline(shard_dir, size, big, args.workers, decoder, epochs=3)
            add(
                {
                    "what": f"input pipeline {decoder}, {args.workers} workers, {sizes.shard_side} px shards",
                    "images_per_sec": rate,
                    "kind": "pipeline",
                    "decoder": decoder,
                    "first_batch_seconds": round(first, 3),
                    "note": f"first batch of an epoch after {first:.2f} s",
                },
                since,
            )
        shard_args = ["--data", "shards", "--data-dir", str(shard_dir), "--workers", str(args.workers)]
        for label, extra in real_cases(args.quick, work):
            since = time.perf_counter()
            real = payload(payload_args(sizes, device, shard_args + extra, sizes.real_epochs))
            ratio = real["total_images_per_sec"] / synthetic["total_images_per_sec"]
            epochs = ", ".join(f"{r:.0f}" for r in real["epoch_images_per_sec"])
            waits = ", ".join(f"{w:.2f}" for w in real["epoch_input_seconds"])
            add(
                {
                    "what": f"payload real data ({sizes.shard_side} px shards, {args.workers} workers{label})",
                    "images_per_sec": real["total_images_per_sec"],
                    "kind": "real",
                    "cache_decoded": "--cache-decoded" in extra,
                    "gpu_decode": "--gpu-decode" in extra,
                    "note": f"{ratio:.0%} of synthetic; epochs {epochs}; waits for input {waits} s",
                    "ratio_to_synthetic": ratio,
                    "epoch_images_per_sec": real["epoch_images_per_sec"],
                    # Where an epoch's time went beyond the steps: input waits against the epoch's seconds.
                    "epoch_seconds": real["epoch_seconds"],
                    "epoch_input_seconds": real["epoch_input_seconds"],
                    "step_only_images_per_sec": step_only(real),
                },
                since,
            )

        if not args.quick:
            # Where a real-data step's time goes beyond decoding: the same loader on images that cost nearly nothing
            # to decode (the training process's own part), then the trainer on cores of its own, the workers on the
            # rest (TRAINING_TRAINER_CPUS: 2, its thread and the collectives').
            since = time.perf_counter()
            tiny_dir = shards(pathlib.Path(work), sizes.images, TINY_SIDE)
            facts["tiny_shards_seconds"] = round(time.perf_counter() - since, 1)
            tiny_args = ["--data", "shards", "--data-dir", str(tiny_dir), "--workers", str(args.workers)]
            for label, data_args, env_extra in (
                (f"{TINY_SIDE} px shards: decoding nearly free", tiny_args, None),
                ("trainer on 2 cores of its own, workers on the rest", shard_args, {TRAINER_CPUS: "2"}),
            ):
                since = time.perf_counter()
                real = payload(payload_args(sizes, device, data_args, sizes.real_epochs), env_extra)
                add(
                    {
                        "what": f"payload real data, {label}",
                        "images_per_sec": real["total_images_per_sec"],
                        "kind": "real",
                        "note": f"{real['total_images_per_sec'] / synthetic['total_images_per_sec']:.0%} of synthetic",
                        "ratio_to_synthetic": real["total_images_per_sec"] / synthetic["total_images_per_sec"],
                        "epoch_images_per_sec": real["epoch_images_per_sec"],
                        "epoch_seconds": real["epoch_seconds"],
                        "epoch_input_seconds": real["epoch_input_seconds"],
                        "step_only_images_per_sec": step_only(real),
                        **({"env": env_extra} if env_extra else {}),
                    },
                    since,
                )

    save()
    facts["seconds"] = time.perf_counter() - started
    print()
    print(
        f"{facts['gpu'] or 'CPU'}, Python {facts['python']}, torch {facts['torch']}, CUDA {facts['cuda']}, "
        f"payload backend {facts['payload_backend']}, {facts['seconds']:.0f} s"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
