"""Shared by the worker modules of benchmarks/backends.py: the fixed batch each rank trains on, the step timing,
and the line each process prints about its final parameters (so a run shows it trained and its ranks agree)."""

from __future__ import annotations

import json
import sys
import timeit

import torch

MARK = "BACKEND_RESULT "


def add_loop_args(ap) -> None:
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--num-classes", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup-batches", type=int, default=10)
    ap.add_argument("--batches-per-iter", type=int, default=10)
    ap.add_argument("--iters", type=int, default=5)


def batch(args, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed random batch, different on every rank: ranks that never averaged would not end up equal."""
    g = torch.Generator().manual_seed(1000 + rank)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g)
    return data, torch.randint(0, args.num_classes, (args.batch_size,), generator=g)


def timed_rate(step, args) -> float:
    """Images/sec of one process: warm-up batches untimed, then the mean of the timed iterations (the pattern
    of Horovod's pytorch_synthetic_benchmark.py and benchmarks/_horovod_loop.py)."""
    timeit.timeit(step, number=args.warmup_batches)
    rates = [
        args.batch_size * args.batches_per_iter / timeit.timeit(step, number=args.batches_per_iter)
        for _ in range(args.iters)
    ]
    return sum(rates) / len(rates)


def snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def fingerprint(model, initial: list[torch.Tensor]) -> dict:
    """The payloads' digest of the parameters (equal digests: bitwise-equal replicas) and how far they moved (L2)."""
    from payloads.pytorch.models import parameters_digest

    moved = sum(float((p.detach().double() - p0.double()).pow(2).sum()) for p, p0 in zip(model.parameters(), initial))
    return {"digest": parameters_digest(model), "moved": moved**0.5}


def emit(record: dict) -> None:
    # One write per line: under mpirun a separate newline gets its own "[1,0]<stdout>:" tag.
    sys.stdout.write(MARK + json.dumps(record) + "\n")
    sys.stdout.flush()
