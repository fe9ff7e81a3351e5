"""The GPU benchmark: one command, one GPU, under 8 minutes on an H200; prints a table and writes JSON.

    python -m benchmarks.gpu [--json gpu.json] [--workers 12] [--quick] [--compiled] [--deadline 460] [--plan]

Its rows, what each measures and what it needs (Python 3.11 or 3.12 with torch and torchvision and
benchmarks/requirements-gpu-box.txt; no Horovod, no .venv) are in docs/pytorch-gpu.md#the-gpu-benchmark. In order,
diagnostic rows first: the check of /dev/shm and pinned memory, the ceilings (the payload's step on one batch made
on the GPU), the payload on synthetic data (sentinel on and off, both dtypes), the decoders, the payload on shards
(plain, cached, 24 px, trainer on its own cores), then the risky row (--gpu-decode). Every row is guarded: one
that fails is a row with its error, and rows not started by the deadline are rows saying so. `--quick --device cpu`
runs the same code at toy sizes (CI); `--plan` prints the rows and the payload commands as JSON and runs nothing.
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

from benchmarks import input_pipeline

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
    """The real-data rows, the risky one last: decoding every epoch; as the shards job runs (--cache-decoded: epoch
    1 decodes and keeps, later epochs crop the kept images from a file in `work`); JPEGs decoded on the GPU
    (--gpu-decode: nvJPEG's hardware backend, which a VM may not expose)."""
    cases = [("", [])]
    if not quick:
        cases += [(", --cache-decoded", ["--cache-decoded", "--cache-dir", work]), (", --gpu-decode", ["--gpu-decode"])]
    return cases


DEADLINE = 460  # seconds: rows not started by then are recorded as skipped; the command ends within 8 minutes


def check_pinning(device: str) -> dict:
    """Before any row: the ring's folder (payloads/pytorch/ring.py) is a tmpfs with room; on a GPU a slot registers
    as pinned memory, and a registration that fails (the same mapping again: cudaErrorHostMemoryAlreadyRegistered)
    leaves no error behind for the next kernel. Raises (the run stops) when the slot is not pinned or the kernel
    fails."""
    import torch

    from payloads.pytorch import ring

    folder = ring.shm_folder()
    st = os.statvfs(folder)
    facts = {"folder": folder, "tmpfs": ring.on_tmpfs(folder), "free_mib": st.f_bavail * st.f_frsize // 2**20}
    if device != "cuda":
        return facts
    slots = ring.make_slots(ring.Layout((("x", "uint8", (1 << 20,)),)), 1, "check", pin=True)  # refuses non-tmpfs
    slots.unlink()
    facts["pinned"] = slots.pinned and torch.from_numpy(slots.view(0)["x"]).is_pinned()
    slots.pin()  # fails: registered already
    facts["kernel_after_a_failed_registration"] = torch.ones(4, device="cuda").sum().item() == 4
    if not facts["pinned"]:
        raise RuntimeError(f"a slot of the ring did not register as pinned memory: {facts}")
    return facts


def guarded(measure, remaining: float) -> dict:
    """One row's result: what `measure` returns; its error, as a row, when it fails (the next row runs); skipped
    when the deadline has passed."""
    if remaining <= 0:
        return {"skipped": f"past the benchmark's {DEADLINE} s deadline"}
    try:
        return measure()
    except Exception as e:  # noqa: BLE001 - recorded as the row; the benchmark goes on
        return {"error": f"{type(e).__name__}: {e}"[-3000:]}


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
    full = (
        {}
        if quick
        else {
            "synthetic, sentinel off": payload_command(synthetic + ["--replica-check-every", "0"], "OUT"),
            f"synthetic {other_dtype(device)}": payload_command(other, "OUT"),
        }
    )
    return {
        "sizes": asdict(sizes),
        "ceiling": [{"batch": b, "dtype": d, "compiled": c} for b, d, c in ceiling_cases(quick, compiled)],
        "horovod_installed": horovod_installed(),
        "payload": {
            "synthetic": payload_command(synthetic, "OUT"),
            **full,
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


def payload(args: list[str], env_extra: dict | None = None, timeout: float = 1800) -> dict:
    """One process of the PyTorch payload (payload_command); returns its metrics.json summary, world, each
    epoch's images/sec and seconds, and the seconds of each epoch its step waited for the next batch (the
    watchdog's `input` phase: the epoch's first batch and every later wait for the loader)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = payload_command(args, out)
        env = payload_env(extra=env_extra)
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=min(max(timeout, 1), 1800)
        )
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


def pipeline(
    shard_dir: pathlib.Path, image_size: int, batch: int, workers: int, decoder: str, epochs: int
) -> tuple[float, float]:
    """The shard reader alone (decode, augment, batch as uint8) over `epochs` epochs, the first left out: the best
    images/sec after an epoch's first batch, and the longest wait for an epoch's first batch (the refill a
    training epoch pays at its start)."""
    later = input_pipeline.shard_epochs(shard_dir, image_size, batch, workers, decoder, epochs)[1:]
    return max(rate for rate, _ in later), max(first for _, first in later)


def table(rows: list[dict]) -> str:
    width = max(len(r["what"]) for r in rows)
    lines = [f"{'what':<{width}}  images/sec", f"{'-' * width}  ----------"]
    for r in rows:
        rate = r.get("images_per_sec")
        note = r.get("note") or r.get("skipped") or (r.get("error") or "").strip().splitlines()[-1:]
        note = note[0][:300] if isinstance(note, list) and note else note
        lines.append(
            f"{r['what']:<{width}}  " + (f"{rate:>10.1f}" if rate else f"{'-':>10}") + (f"  ({note})" * bool(note))
        )
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
        help="add every ceiling case torch.compile'd (minutes each: beyond the deadline); default: none, "
        "with --quick one",
    )
    ap.add_argument(
        "--deadline",
        type=float,
        default=None,
        help=f"seconds after which rows are skipped (default {DEADLINE}; 0: none; --quick: none)",
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
        "payload_backend": None,
    }
    started = time.perf_counter()
    deadline = args.deadline if args.deadline is not None else (0 if args.quick else DEADLINE)
    left = lambda: deadline - (time.perf_counter() - started) if deadline else 1e9

    def save() -> None:
        if args.json:  # after every row: a run stopped at a time limit keeps what it measured
            facts["seconds"] = round(time.perf_counter() - started, 1)
            args.json.write_text(json.dumps({"machine": facts, "rows": rows}, indent=2) + "\n")

    def row(what: str, kind: str, measure, **fields) -> dict | None:
        """Measures one row, guarded: its result, or None when it failed or was skipped (its row says which)."""
        since = time.perf_counter()
        result = guarded(measure, left())
        rows.append({"what": what, "kind": kind, **fields, **result, "seconds": round(time.perf_counter() - since, 1)})
        print(table(rows[-1:]).splitlines()[-1], flush=True)  # the seconds: what the row cost, set-up included
        save()
        return None if "error" in result or "skipped" in result else result

    # Diagnostic rows first: whether pinning works at all (a failure is its row: the ring's rows then say theirs),
    # then the GPU alone, then the payload; the risky row last.
    def check() -> dict:
        found = check_pinning(device)
        return {"check": found, "note": ", ".join(f"{k} {v}" for k, v in found.items())}

    row("check: /dev/shm and pinned memory", "check", check)
    cases = ceiling_cases(args.quick, args.compiled)
    # fp16 with the flag read on the host: what the scaler in the kernel saves per step
    plain = [(b, d, False) for b, d, c in cases if not c] + ([] if args.quick else [(sizes.batches[-1], "fp16", True)])
    for batch, dtype, host_flag in plain:
        label = ", found-inf read on the host" if host_flag else ""
        row(
            f"ceiling {model} batch {batch} {dtype}{label}",
            "ceiling",
            lambda b=batch, d=dtype, h=host_flag: {
                "images_per_sec": ceiling(device, model, b, size, d, False, warmup, steps, h)
            },
            batch=batch,
            dtype=dtype,
            loss_scaler=dtype == "fp16",
            compiled=False,
            **({"host_flag": True} if host_flag else {}),
        )

    big = sizes.batches[-1]

    def synthetic_run(extra: list[str], env_extra: dict | None = None) -> dict:
        samples = str(big * (warmup + steps))
        run = payload(
            payload_args(sizes, device, ["--data", "synthetic", "--synthetic-samples", samples]) + extra,
            env_extra,
            left(),
        )
        facts["payload_backend"] = facts["payload_backend"] or run["world"]["backend"]
        return {
            "images_per_sec": run["total_images_per_sec"],
            "startup_seconds": run.get("startup_seconds"),
            "precision": run["world"]["precision"],
            "backend": run["world"]["backend"],
        }

    synthetic = row(f"payload synthetic batch {big}", "payload", lambda: synthetic_run([]))
    base = synthetic["images_per_sec"] if synthetic else None
    of_synthetic = lambda rate: f"{rate / base:.0%} of synthetic" if base else "synthetic failed"
    if not args.quick:  # the replica sentinel's cost (--replica-check-every 0), then the other dtype
        off = row(
            f"payload synthetic batch {big}, sentinel off",
            "payload",
            lambda: synthetic_run(["--replica-check-every", "0"]),
            replica_check_every=0,
        )
        if off and base:
            rows[-1]["note"] = f"sentinel on/off {base / off['images_per_sec']:.3f}"
        row(
            f"payload synthetic batch {big} {other_dtype(device)}",
            "payload",
            lambda: synthetic_run(["--amp-dtype", other_dtype(device)]),
        )
    if not args.quick and horovod_installed():
        # Horovod's completion of GPU work by a callback instead of a blocking event synchronize (issue 29 item 7);
        # with one process it shows the cost of the path, the gain needs several GPUs.
        flag = {"HOROVOD_ENABLE_ASYNC_COMPLETION": "1"}
        row(
            f"payload synthetic batch {big}, HOROVOD_ENABLE_ASYNC_COMPLETION=1",
            "payload",
            lambda: synthetic_run([], flag),
            async_completion=True,
        )

    def real_run(data_args: list[str], env_extra: dict | None = None) -> dict:
        real = payload(payload_args(sizes, device, data_args, sizes.real_epochs), env_extra, left())
        epochs = ", ".join(f"{r:.0f}" for r in real["epoch_images_per_sec"])
        waits = ", ".join(f"{w:.2f}" for w in real["epoch_input_seconds"])
        return {
            "images_per_sec": real["total_images_per_sec"],
            "note": f"{of_synthetic(real['total_images_per_sec'])}; epochs {epochs}; waits for input {waits} s",
            "ratio_to_synthetic": real["total_images_per_sec"] / base if base else None,
            "epoch_images_per_sec": real["epoch_images_per_sec"],
            # Where an epoch's time went beyond the steps: input waits against the epoch's seconds.
            "epoch_seconds": real["epoch_seconds"],
            "epoch_input_seconds": real["epoch_input_seconds"],
            "step_only_images_per_sec": step_only(real),
        }

    with tempfile.TemporaryDirectory() as work:
        since = time.perf_counter()
        shard_dir = input_pipeline.shards(pathlib.Path(work), sizes.images, sizes.shard_side)
        facts["shards_seconds"] = round(time.perf_counter() - since, 1)
        from payloads.pytorch.decoders import available

        for decoder in available():

            def decode(d=decoder):
                rate, first = pipeline(shard_dir, size, big, args.workers, d, epochs=3)
                note = f"first batch of an epoch after {first:.2f} s"
                return {"images_per_sec": rate, "first_batch_seconds": round(first, 3), "note": note}

            row(
                f"input pipeline {decoder}, {args.workers} workers, {sizes.shard_side} px shards",
                "pipeline",
                decode,
                decoder=decoder,
            )
        shard_args = ["--data", "shards", "--data-dir", str(shard_dir), "--workers", str(args.workers)]
        real = [(label, extra) for label, extra in real_cases(args.quick, work)]
        risky = [case for case in real if case[1][:1] == ["--gpu-decode"]]
        for label, extra in [case for case in real if case not in risky]:
            what = f"payload real data ({sizes.shard_side} px shards, {args.workers} workers{label})"
            row(
                what,
                "real",
                lambda e=extra: real_run(shard_args + e),
                cache_decoded="--cache-decoded" in extra,
                gpu_decode=False,
            )

        if not args.quick:
            # Where a real-data step's time goes beyond decoding: the same loader on images that cost nearly nothing
            # to decode (the training process's own part), then the trainer on cores of its own, the workers on the
            # rest (TRAINING_TRAINER_CPUS: 2, its thread and the collectives').
            def tiny() -> dict:
                tiny_dir = input_pipeline.shards(pathlib.Path(work), sizes.images, TINY_SIDE)
                return real_run(["--data", "shards", "--data-dir", str(tiny_dir), "--workers", str(args.workers)])

            row(f"payload real data, {TINY_SIDE} px shards: decoding nearly free", "real", tiny)
            env = {TRAINER_CPUS: "2"}
            row(
                "payload real data, trainer on 2 cores of its own, workers on the rest",
                "real",
                lambda: real_run(shard_args, env),
                env=env,
            )
        # The risky row last: nvJPEG on the GPU (its hardware backend in a VM).
        for label, extra in risky:
            what = f"payload real data ({sizes.shard_side} px shards, {args.workers} workers{label})"
            row(
                what,
                "real",
                lambda e=extra: real_run(shard_args + e),
                cache_decoded=False,
                gpu_decode="--gpu-decode" in extra,
            )
    for batch, dtype, _ in [c for c in cases if c[2]]:  # compiled: minutes each, so after everything else
        row(
            f"ceiling {model} batch {batch} {dtype} compiled",
            "ceiling",
            lambda b=batch, d=dtype: {"images_per_sec": ceiling(device, model, b, size, d, True, warmup, steps)},
            batch=batch,
            dtype=dtype,
            loss_scaler=dtype == "fp16",
            compiled=True,
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
