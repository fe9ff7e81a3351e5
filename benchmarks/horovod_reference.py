"""The local job's steady-state throughput against Horovod's own synthetic benchmark loop, at 1 and 2 processes.

    .venv/bin/python -m benchmarks.horovod_reference [--max-np 2] [--repeats 3] [--json FILE]

Same model, batch, image size, threads and launcher settings (the launcher's local target: Open MPI when
present, else Gloo) as scripts/train-local; the payload's figure is its steady-state "Total images/sec"
(start-up steps excluded), the loop's the mean of its timed iterations after warm-up (benchmarks/_horovod_loop.py).
The target is a ratio of at least 1.0: the payload's data, metrics and checkpoints cost nothing measurable.
Horovod's loop runs plain SGD (as its benchmark does); the loop is also run with the payload's optimizer (momentum
and weight decay), the fair reference for what the payload adds around the step.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
# scripts/train-local's payload arguments
LOCAL = {"model": "resnet18", "image_size": 64, "num_classes": 100, "batch_size": 16, "threads": 1}


def horovodrun_command(np: int) -> tuple[list[str], dict]:
    from launcher.local import controller, horovodrun_options

    flags, fast_env = horovodrun_options(controller("auto"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), **fast_env)
    return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", *flags], env


def payload(np: int, epochs: int) -> float:
    cmd, env = horovodrun_command(np)
    with tempfile.TemporaryDirectory() as out:
        args = [
            "--model",
            LOCAL["model"],
            "--image-size",
            str(LOCAL["image_size"]),
            "--num-classes",
            str(LOCAL["num_classes"]),
            "--batch-size",
            str(LOCAL["batch_size"]),
            "--threads",
            str(LOCAL["threads"]),
            "--synthetic-samples",
            "1024",
            "--epochs",
            str(epochs),
            "--warmup-epochs",
            "1",
            "--workers",
            "0",
            "--no-progress",
            "--no-mlflow",
            "--output-dir",
            out,
        ]
        proc = subprocess.run(
            cmd + [sys.executable, "-m", "payloads.pytorch.train", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if proc.returncode:
            raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
        return json.loads((pathlib.Path(out) / "metrics.json").read_text())["summary"]["total_images_per_sec"]


def horovod_loop(np: int, iters: int, optimizer: str = "plain") -> float:
    cmd, env = horovodrun_command(np)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in LOCAL.items()] + [f"--iters={iters}", f"--optimizer={optimizer}"]
    proc = subprocess.run(
        cmd + [sys.executable, "-m", "benchmarks._horovod_loop", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode:
        raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-3000:])
    found = re.findall(r"loop images/sec: ([0-9.]+)", proc.stdout)
    if not found:
        raise RuntimeError(f"no rate in the loop's output:\n{proc.stdout[-2000:]}")
    return float(found[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-np", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each; medians are compared")
    ap.add_argument("--epochs", type=int, default=3, help="payload epochs (1024 images each)")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations of 10 batches in Horovod's loop")
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)
    result = {}
    load = os.getloadavg()[0]  # the figures mean little on a busy machine: recorded beside them
    for np in range(1, args.max_np + 1):
        ours, theirs, same = [], [], []
        for _ in range(args.repeats):  # alternate, so drift on a shared machine hits all alike
            ours.append(payload(np, args.epochs))
            theirs.append(horovod_loop(np, args.iters))
            same.append(horovod_loop(np, args.iters, "payload"))
        a, b, c = statistics.median(ours), statistics.median(theirs), statistics.median(same)
        result[np] = {
            "payload": a,
            "horovod_loop": b,
            "ratio": a / b,
            "payload_runs": ours,
            "loop_runs": theirs,
            "horovod_loop_payload_optimizer": c,
            "ratio_same_optimizer": a / c,
            "loop_payload_optimizer_runs": same,
        }
        runs = lambda xs: ", ".join(f"{x:.1f}" for x in xs)
        print(
            f"{np} process(es): payload {a:.1f} images/sec (runs {runs(ours)}); Horovod's loop {b:.1f} (runs "
            f"{runs(theirs)}): ratio {a / b:.2f}; the loop with the payload's optimizer {c:.1f} (runs {runs(same)}): "
            f"ratio {a / c:.2f}",
            flush=True,
        )
    print("config: " + ", ".join(f"{k} {v}" for k, v in LOCAL.items()) + f"; load average before: {load}")
    if args.json:
        args.json.write_text(
            json.dumps({"config": LOCAL, "load_average_before": load, "results": result}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
