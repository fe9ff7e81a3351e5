"""Horovod allreduce, torch DDP over Gloo and a synchronous parameter server, side by side on this machine.

    .venv/bin/python -m benchmarks.backends [--max-np 4] [--repeats 3] [--json benchmarks/results/backends.json]
    .venv/bin/python -m benchmarks.backends --quick            # smoke test: toy sizes, one repeat

One model and step for all three (LOCAL, scripts/train-local's arguments: torchvision resnet18, 100 classes,
64 px, batch 16 per process, 1 thread; one fixed random batch per rank, SGD at lr 0.01 x workers, warm-up
batches untimed, images/sec the mean of the timed iterations x workers):
  horovod  hvd.DistributedOptimizer (benchmarks/_horovod_loop.py) under horovodrun with the launcher's local
           settings (Open MPI when present, else Gloo)
  ddp      DistributedDataParallel over Gloo (benchmarks/_ddp_loop.py) under torchrun
  ps       one parameter-server process plus N workers over torch.distributed.rpc (benchmarks/_ps_rpc.py):
           synchronous, the PS averages the N gradients of a step and applies SGD; N + 1 processes
plus a 1-process Horovod loop (no communication) as the reference for efficiency = rate / (N x 1-process rate).
The reference and the backends alternate within each repeat, so drift on a shared machine hits all alike;
medians are reported.
Every process prints its parameters' sha256 and distance moved: ranks_agree and moved are in the JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys

from benchmarks._backend_common import MARK
from launcher.local import controller, horovodrun_options

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCAL = {"model": "resnet18", "image_size": 64, "num_classes": 100, "batch_size": 16, "threads": 1}

BACKENDS = ("horovod", "ddp", "ps")
FULL = {"warmup_batches": 10, "batches_per_iter": 10, "iters": 5}
QUICK = {"image_size": 32, "batch_size": 4, "warmup_batches": 1, "batches_per_iter": 2, "iters": 2}


def horovodrun_command(np: int) -> tuple[list[str], dict]:
    flags, fast_env = horovodrun_options(controller("auto"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), **fast_env)
    return [
        str(pathlib.Path(sys.executable).parent / "horovodrun"),
        "-np",
        str(np),
        "-H",
        f"localhost:{np}",
        *flags,
    ], env


def _args(config: dict) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in config.items()]


def command(backend: str, np: int, config: dict) -> tuple[list[str], dict]:
    if backend in ("horovod", "single"):
        cmd, env = horovodrun_command(np)
        return cmd + [sys.executable, "-m", "benchmarks._horovod_loop", *_args(config), "--fingerprint"], env
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(config["threads"]))
    module, procs = {"ddp": ("benchmarks._ddp_loop", np), "ps": ("benchmarks._ps_rpc", np + 1)}[backend]
    # torchrun's module under this interpreter (the console script runs the same main()): its ranks are started with
    # sys.executable, so they run in the interpreter the benchmark was started with, as the Horovod rows do.
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    return [*torchrun, "--standalone", f"--nproc-per-node={procs}", "-m", module, *_args(config)], env


def parse(backend: str, stdout: str) -> dict:
    records = [json.loads(m) for m in re.findall(re.escape(MARK) + r"(\{.*\})", stdout)]
    ranks = [r for r in records if "digest" in r]
    rates = [r["images_per_sec"] for r in records if "images_per_sec" in r]
    if backend in ("horovod", "single"):
        rates = [float(x) for x in re.findall(r"loop images/sec: ([0-9.]+)", stdout)]
    if not rates or not ranks:
        raise RuntimeError(f"{backend}: no rate or no parameter digests in the output:\n{stdout[-3000:]}")
    return {
        "images_per_sec": rates[-1],
        "ranks": ranks,
        "ranks_agree": len({r["digest"] for r in ranks}) == 1,
        "moved": min(r["moved"] for r in ranks) > 0,
    }


def run(backend: str, np: int, config: dict, timeout: float) -> dict:
    cmd, env = command(backend, np, config)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = parse(backend, proc.stdout)
    out["processes"] = np + 1 if backend == "ps" else np
    return out


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def measure(counts: list[int], repeats: int, config: dict, timeout: float) -> dict:
    """Each repeat runs the 1-process reference and every backend at every count once, in that order."""
    single, runs = [], {(np, b): [] for np in counts for b in BACKENDS}
    for _ in range(repeats):
        single.append(run("single", 1, config, timeout))
        for np in counts:
            for b in BACKENDS:
                runs[np, b].append(run(b, np, config, timeout))
    rate1 = statistics.median(r["images_per_sec"] for r in single)
    results = {"1": {"single": {"median": rate1, "runs": single, "processes": 1}}}
    for np in counts:
        results[str(np)] = {}
        for b in BACKENDS:
            median = statistics.median(r["images_per_sec"] for r in runs[np, b])
            results[str(np)][b] = {
                "median": median,
                "efficiency": median / (np * rate1),
                "runs": runs[np, b],
                "processes": runs[np, b][0]["processes"],
                "workers": np,
            }
    return results


def table(results: dict) -> str:
    rate1 = results["1"]["single"]["median"]
    lines = [
        f"1 process, no communication (Horovod loop, size 1): {rate1:.1f} images/sec",
        "workers  backend  processes  images/sec (median)  runs                      efficiency  ranks agree  moved",
    ]
    for np, row in results.items():
        if np == "1":
            continue
        for b, r in row.items():
            runs = ", ".join(f"{x['images_per_sec']:.1f}" for x in r["runs"])
            lines.append(
                f"{np:>7}  {b:7}  {r['processes']:>9}  {r['median']:19.1f}  {runs:24}  "
                f"{r['efficiency'] * 100:9.0f}%  {str(all(x['ranks_agree'] for x in r['runs'])):11}  "
                f"{all(x['moved'] for x in r['runs'])}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--max-np", type=int, default=2, help="workers: 2, 4, ... up to this (default 2)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each backend; medians reported")
    ap.add_argument("--quick", action="store_true", help="smoke test: 32 px, batch 4, 2 timed iterations, 1 repeat")
    ap.add_argument("--json", type=pathlib.Path, help="e.g. benchmarks/results/backends.json")
    args = ap.parse_args(argv)
    if args.max_np < 2:
        ap.error(f"--max-np {args.max_np}: a comparison needs at least 2 workers (use --max-np 2 or more)")
    counts = [2**k for k in range(1, args.max_np.bit_length()) if 2**k <= args.max_np]
    config = dict(LOCAL, **(QUICK if args.quick else FULL))
    repeats = 1 if args.quick else args.repeats
    load_before = uptime()
    print(f"load before: {load_before}", flush=True)
    results = measure(counts, repeats, config, 300 if args.quick else 1800)
    load_after = uptime()
    print(table(results))
    print(f"load after:  {load_after}")
    print("config: " + ", ".join(f"{k} {v}" for k, v in config.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "command": "python -m benchmarks.backends " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "machine": {"cores": os.cpu_count(), "load_before": load_before, "load_after": load_after},
                    "horovod_controller": controller("auto"),
                    "quick": args.quick,
                    "repeats": repeats,
                    "config": config,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
