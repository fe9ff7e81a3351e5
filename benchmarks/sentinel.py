"""The replica sentinel's per-step cost (issue 55, item 3): the local job (scripts/train-local's arguments, 2
processes under the launcher's local target) with the sentinel on (its default, a check every 100 steps and the
gradients checked before every exchange) and off (--replica-check-every 0), alternating in one invocation so that
both see the same machine; prints each run's steady "Total images/sec" and the median ratio on/off.

    .venv/bin/python -m benchmarks.sentinel [--rounds 3] [--root OTHER_CHECKOUT] [-- extra payload arguments]

`--root`: run another checkout's payload and launcher (a `git worktree` of an older commit) with this .venv.
A figure, not a test (tests/README.md: figures are not tests).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCAL_JOB = [  # scripts/train-local's arguments, without the progress bar
    *("--model", "resnet18", "--image-size", "64", "--num-classes", "100", "--synthetic-samples", "1024"),
    *("--batch-size", "16", "--epochs", "3", "--warmup-epochs", "1", "--workers", "0", "--threads", "1"),
    "--no-progress",
]


def images_per_sec(root: pathlib.Path, out: pathlib.Path, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "launcher", "jobs/pytorch-resnet50-synthetic.yaml", "--target", "local"]
    cmd += ["--np", "2", "--output-dir", str(out), "--", *LOCAL_JOB, "--no-resume", *extra]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    found = re.findall(r"Total images/sec: ([\d.]+)", proc.stdout + proc.stderr)
    if proc.returncode or not found:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return float(found[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", type=pathlib.Path, default=ROOT)
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    figures: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="sentinel-bench-") as tmp:
        for i in range(args.rounds):
            order = ("on", "off") if i % 2 == 0 else ("off", "on")  # alternating: drift falls on both
            for kind in order:
                flags = extra + (["--replica-check-every", "0"] if kind == "off" else [])
                figure = images_per_sec(args.root, pathlib.Path(tmp) / f"{kind}-{i}", flags)
                figures[kind].append(figure)
                print(f"round {i + 1} sentinel {kind}: {figure:.1f} images/sec", flush=True)
    ratios = [on / off for on, off in zip(figures["on"], figures["off"])]
    print(f"{args.root}: sentinel on {figures['on']}, off {figures['off']} images/sec")
    print(f"median on/off: {statistics.median(ratios):.3f} (per round {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
