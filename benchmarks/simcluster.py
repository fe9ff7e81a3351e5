"""What the simulated nodes cost, and their network (docs/rehearse.md): the local job on 1 node x 2 processes against
2 simulated nodes x 1, side by side; then the health check's allreduce within one node against between two.

    .venv/bin/python -m benchmarks.simcluster [--rounds 2] [--json benchmarks/results/simcluster.json]

Root (the simulated nodes' namespaces). The same world size, arguments and machine each time, in alternation, so
the figures compare within one run: the difference is the nodes (their own network stack, a veth pair and a bridge
between the ranks instead of shared memory, mpirun's daemon on the other node).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# scripts/train-local's arguments
LOCAL_JOB = ["--model", "resnet18", "--image-size", "64", "--num-classes", "100", "--synthetic-samples", "1024",
             "--batch-size", "16", "--epochs", "3", "--warmup-epochs", "1", "--workers", "0", "--threads", "1",
             "--no-progress"]  # fmt: skip
HEALTHCHECK = ["--sizes-mb", "1,16,64", "--iterations", "5", "--train-steps", "2"]
WHERE = {"1 node x 2": ["--np", "2"], "2 nodes x 1": ["--nodes", "2"]}


def _launch(job: str, where: list[str], out: pathlib.Path, args: list[str]) -> float:
    cmd = [sys.executable, "-m", "launcher", job, "--target", "local", *where, "--output-dir", str(out), "--", *args]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - started


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)
    job: dict[str, dict[str, list[float]]] = {w: {"images_per_sec": [], "wall_seconds": []} for w in WHERE}
    allreduce: dict[str, dict[float, list[float]]] = {w: {} for w in WHERE}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for where, flags in WHERE.items():
                out = pathlib.Path(tmp, f"job-{r}-{flags[-1]}{flags[0]}")
                print(f"round {r + 1}: the local job on {where}", file=sys.stderr, flush=True)
                wall = _launch("jobs/pytorch-resnet50-synthetic.yaml", flags, out, LOCAL_JOB)
                summary = json.loads((out / "run" / "metrics.json").read_text())["summary"]
                job[where]["images_per_sec"].append(summary["total_images_per_sec"])
                job[where]["wall_seconds"].append(wall)
                out = pathlib.Path(tmp, f"check-{r}-{flags[-1]}{flags[0]}")
                print(f"round {r + 1}: the health check's allreduce on {where}", file=sys.stderr, flush=True)
                _launch("jobs/healthcheck-allreduce.yaml", flags, out, HEALTHCHECK)
                report = json.loads((out / "report" / "allreduce.json").read_text())
                for row in report["results"]:
                    allreduce[where].setdefault(row["mbytes"], []).append(row["median_seconds"])
    print(f"\nthe local job (scripts/train-local's arguments), {platform.node()}, median of {args.rounds} rounds")
    print("where | images/sec | wall seconds")
    for where, figures in job.items():
        ips, wall = statistics.median(figures["images_per_sec"]), statistics.median(figures["wall_seconds"])
        print(f"{where} | {ips:.1f} | {wall:.1f}")
    print("\nallreduce of one tensor, 2 processes (the health check's, Open MPI over TCP between nodes); ms")
    print("MB | " + " | ".join(WHERE))
    for mb in allreduce["1 node x 2"]:
        print(f"{mb:g} | " + " | ".join(f"{statistics.median(allreduce[w][mb]) * 1e3:.2f}" for w in WHERE))
    if args.json:
        rows = {w: {f"{mb:g}": statistics.median(s) for mb, s in sizes.items()} for w, sizes in allreduce.items()}
        result = {"machine": platform.node(), "rounds": args.rounds, "local_job": job, "allreduce_seconds": rows,
                  "date": time.strftime("%Y-%m-%d")}  # fmt: skip
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
