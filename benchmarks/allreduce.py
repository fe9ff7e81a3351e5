"""Allreduce time and bandwidth: our Horovod configurations vs torch.distributed (Gloo) vs a memory copy.

    .venv/bin/python -m benchmarks.allreduce [--np 2] [--sizes 4K,64K,1M,16M,102M,256M] [--repeats 5] [--json FILE]

Every variant runs in the same invocation, one after another, with one thread per process, so the figures
are comparable. "Horovod" times an in-place average (what DistributedOptimizer does). The ResNet-50 rows
use its 161 real gradient tensors: "per tensor" submits them one by one (Horovod: async, fused by its
background thread, as the optimizer's hooks do; torch.distributed: one call each), "grouped" as one
operation (Horovod: grouped_allreduce, what DistributedOptimizer's `groups` gives; torch.distributed: one
flat bucket, as DDP does). The memory copy is
the same bytes copied once in one process: a floor no allreduce beats.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], env: dict | None = None) -> dict:
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    with tempfile.TemporaryDirectory() as tmp:
        result = pathlib.Path(tmp) / "result.json"
        proc = subprocess.run(
            cmd + ["--result-file", str(result)], cwd=ROOT, env=e, capture_output=True, text=True, timeout=1800
        )
        if proc.returncode == 0 and result.is_file():
            return json.loads(result.read_text())
    raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def _has_mpi() -> bool:
    check = subprocess.run([str(BIN / "horovodrun"), "--check-build"], capture_output=True, text=True).stdout
    return "[X] MPI" in check.split("Available Tensor Operations")[0] and bool(
        subprocess.run(["sh", "-c", "command -v mpirun"], capture_output=True).stdout
    )


def variants(np: int) -> list[tuple[str, list[str], dict]]:
    worker = [sys.executable, "-m", "benchmarks._allreduce_workers"]
    hvd = [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}"]
    out = [
        ("horovod gloo (defaults)", hvd + ["--gloo"] + worker + ["--backend", "horovod"], {}),
        (
            "horovod gloo, fusion 128 MB, cycle 1 ms",
            hvd + ["--gloo"] + worker + ["--backend", "horovod"],
            {"HOROVOD_FUSION_THRESHOLD": str(128 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "1"},
        ),
        ("horovod gloo, fp16 compression", hvd + ["--gloo"] + worker + ["--backend", "horovod", "--fp16"], {}),
    ]
    if _has_mpi():
        from launcher.local import horovodrun_options

        flags, env = horovodrun_options("mpi")
        out.append(("horovod mpi (busy-polling)", hvd + ["--mpi"] + worker + ["--backend", "horovod"], {}))
        out.append(("horovod mpi (our default: yield when idle)", hvd + flags + worker + ["--backend", "horovod"], env))
    out.append(
        (
            "torch.distributed gloo",
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={np}",
                "-m",
                "benchmarks._allreduce_workers",
                "--backend",
                "torch",
            ],
            {"MASTER_PORT": str(_free_port())},
        )
    )
    return out


def memcpy(byte_sizes: list[int], repeats: int) -> list[float]:
    torch.set_num_threads(1)
    out = []
    for n in byte_sizes:
        src, dst = torch.ones(n // 4), torch.empty(n // 4)
        dst.copy_(src)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
        out.append(statistics.median(times))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--sizes", default="4K,64K,1M,16M,102M,256M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)
    runs = []
    for label, cmd, env in variants(args.np):
        print(f"running: {label}", file=sys.stderr, flush=True)
        result = _run(cmd + ["--sizes", args.sizes, "--repeats", str(args.repeats), "--label", label], env)
        runs.append(result)
    rows = [r["name"] for r in runs[0]["results"]]
    byte_sizes = [r["bytes"] for r in runs[0]["results"]]
    copy = memcpy(byte_sizes, args.repeats)
    print(
        f"\nallreduce, {args.np} processes on {platform.node()} ({os.cpu_count()} cores), median of {args.repeats}; ms"
    )
    header = ["size"] + [r["label"] for r in runs] + ["memory copy"]
    print(" | ".join(header))
    for i, name in enumerate(rows):
        cells = [name] + [f"{r['results'][i]['seconds'] * 1e3:.2f}" for r in runs] + [f"{copy[i] * 1e3:.2f}"]
        print(" | ".join(cells))
    ref = next(i for i, b in enumerate(byte_sizes) if b >= 100e6)
    torch_ms = runs[-1]["results"][ref]["seconds"]
    for r in runs[:-1]:
        s = r["results"][ref]["seconds"]
        print(f"{rows[ref]}: {r['label']}: {s / torch_ms:.2f}x torch.distributed, {s / copy[ref]:.1f}x the memory copy")
    if args.json:
        build = "Gloo and Open MPI" if _has_mpi() else "Gloo only: no MPI on the machine"
        args.json.write_text(
            json.dumps(
                {
                    "np": args.np,
                    "machine": platform.node(),
                    "cores": os.cpu_count(),
                    "horovod_build": build,
                    "runs": runs,
                    "memory_copy_seconds": copy,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
