"""The replica sentinel's per-step cost (issue 55, item 3): the local job (scripts/train-local's arguments, 2
processes under the launcher's local target) with the sentinel on (its default, a check every 100 steps and the
gradients checked before every exchange) and off (--replica-check-every 0), alternating in one invocation so that
both see the same machine; prints each run's steady "Total images/sec" and the median ratios to the sentinel off.

    .venv/bin/python -m benchmarks.sentinel [--rounds 3] [--baseline OTHER_CHECKOUT] [-- extra payload arguments]
    .venv/bin/python -m benchmarks.sentinel --step [--rounds 5]

`--baseline`: in each round also another checkout's payload and launcher (a `git worktree` of an older commit, run
with this .venv), with the same arguments. `--step`: the gradient check alone, in this process, on the local job's
model and batch (one thread): seconds per training step without a check, with a hook per parameter (the check
before issue 55), and with the fused check per group of about 25 MB (payloads/pytorch/sentinel.py now).
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


def step_seconds(rounds: int, steps: int = 10) -> None:
    import time

    import torch
    import torchvision

    from payloads.pytorch import backends

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torchvision.models.resnet18(num_classes=100)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.randn(16, 3, 64, 64), torch.randint(0, 100, (16,))
    finite, groups = torch.ones((), dtype=torch.bool), backends.buckets(model)

    def hook(grad):
        finite.logical_and_(torch.isfinite(grad).all())

    def fused():
        for group in groups:
            finite.logical_and_(torch.stack(torch._foreach_norm([p.grad for p in group])).sum().isfinite())

    seconds: dict[str, list[float]] = {"no check": [], "a hook per parameter": [], "fused, per group": []}
    for _ in range(rounds):
        for kind in seconds:
            hooks = [p.register_hook(hook) for p in model.parameters()] if kind == "a hook per parameter" else []
            started = time.perf_counter()
            for _ in range(steps):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(images), labels).backward()
                if kind == "fused, per group":
                    fused()
                optimizer.step()
            seconds[kind].append((time.perf_counter() - started) / steps)
            for h in hooks:
                h.remove()
    for kind, values in seconds.items():
        print(f"{kind}: {statistics.median(values) * 1e3:.1f} ms per step (median of {rounds} rounds of {steps})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=pathlib.Path)
    parser.add_argument("--step", action="store_true")
    args, extra = parser.parse_known_args(argv)
    if args.step:
        return step_seconds(args.rounds)
    extra = [a for a in extra if a != "--"]
    runs = {"sentinel on": (ROOT, extra), "sentinel off": (ROOT, [*extra, "--replica-check-every", "0"])}
    if args.baseline:
        runs[f"baseline {args.baseline}"] = (args.baseline, extra)
    figures: dict[str, list[float]] = {kind: [] for kind in runs}
    with tempfile.TemporaryDirectory(prefix="sentinel-bench-") as tmp:
        for i in range(args.rounds):
            order = list(runs) if i % 2 == 0 else list(reversed(runs))  # alternating: drift falls on all
            for n, kind in enumerate(order):
                root, flags = runs[kind]
                figures[kind].append(images_per_sec(root, pathlib.Path(tmp) / f"{i}-{n}", flags))
                print(f"round {i + 1} {kind}: {figures[kind][-1]:.1f} images/sec", flush=True)
    for kind, values in figures.items():
        ratios = [v / off for v, off in zip(values, figures["sentinel off"])]
        print(f"{kind}: {values} images/sec; median ratio to the sentinel off {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
