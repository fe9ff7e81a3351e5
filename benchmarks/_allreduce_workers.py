"""Worker side of benchmarks/allreduce.py: one process of a Horovod or torch.distributed run.

Prints one JSON line on rank 0: {"label": ..., "results": [{"name", "bytes", "seconds"}...]}; seconds is
the median of the repeats after a warm-up call.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import torch


def sizes(text: str) -> list[int]:
    units = {"K": 1e3, "M": 1e6, "G": 1e9}
    out = []
    for item in text.split(","):
        item = item.strip().upper().removesuffix("B")
        out.append(int(float(item[:-1]) * units[item[-1]]) if item[-1] in units else int(item))
    return out


def resnet50_gradients() -> list[torch.Tensor]:
    import torchvision

    return [torch.zeros_like(p) for p in torchvision.models.resnet50(weights=None).parameters()]


def timed(fn, repeats: int) -> float:
    fn()  # warm-up: negotiation, buffer allocation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def horovod(args) -> dict:
    import horovod.torch as hvd

    hvd.init()
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    results = []

    def average(t: torch.Tensor, name: str) -> None:
        if args.fp16:  # compression is out of place by construction
            c, ctx = compression.compress(t)
            compression.decompress(hvd.allreduce(c, op=hvd.Average, name=name), ctx)
        else:  # in place: what DistributedOptimizer does with each gradient
            hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Average, name=name))

    for n in sizes(args.sizes):
        t = torch.ones(n // 4)
        results.append(
            {
                "name": f"{n / 1e6:g} MB",
                "bytes": n,
                "seconds": timed(lambda t=t, n=n: average(t, f"t{n}"), args.repeats),
            }
        )
    grads = resnet50_gradients()

    def step():  # ResNet-50's 161 gradient tensors submitted one by one, as the optimizer's hooks do; fused
        handles = [hvd.allreduce_async_(g, op=hvd.Average, name=f"g{i}") for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    results.append(
        {
            "name": "ResNet-50 gradients, per tensor",
            "bytes": sum(g.numel() * 4 for g in grads),
            "seconds": timed(step, args.repeats),
        }
    )

    def grouped():  # the same tensors as one group: one negotiation (DistributedOptimizer's `groups`)
        hvd.synchronize(hvd.grouped_allreduce_async_(grads, op=hvd.Average, name="grouped"))

    results.append(
        {
            "name": "ResNet-50 gradients, grouped",
            "bytes": sum(g.numel() * 4 for g in grads),
            "seconds": timed(grouped, args.repeats),
        }
    )
    return {"rank": hvd.rank(), "size": hvd.size(), "results": results}


def torch_dist(args) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env:// from the launcher
    results = []
    for n in sizes(args.sizes):
        t = torch.ones(n // 4)
        results.append(
            {"name": f"{n / 1e6:g} MB", "bytes": n, "seconds": timed(lambda t=t: dist.all_reduce(t), args.repeats)}
        )
    grads = resnet50_gradients()
    flat = torch.cat([g.flatten() for g in grads])

    def per_tensor():  # one call per gradient, no bucketing
        for g in grads:
            dist.all_reduce(g)

    def bucket():  # DDP-style: all gradients in one flat bucket
        dist.all_reduce(flat)

    results.append(
        {
            "name": "ResNet-50 gradients, per tensor",
            "bytes": flat.numel() * 4,
            "seconds": timed(per_tensor, args.repeats),
        }
    )
    results.append(
        {"name": "ResNet-50 gradients, grouped", "bytes": flat.numel() * 4, "seconds": timed(bucket, args.repeats)}
    )
    out = {"rank": dist.get_rank(), "size": dist.get_world_size(), "results": results}
    dist.destroy_process_group()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("horovod", "torch"), required=True)
    ap.add_argument("--sizes", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--label", required=True)
    ap.add_argument(
        "--result-file",
        type=pathlib.Path,
        required=True,
        help="rank 0 writes its JSON here (mpirun re-tags and splits long output lines)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = horovod(args) if args.backend == "horovod" else torch_dist(args)
    if out["rank"] == 0:
        out["label"] = args.label
        args.result_file.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
