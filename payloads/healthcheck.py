"""Allreduce health check: correctness and bandwidth of Horovod's allreduce across all processes.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.healthcheck --sizes-mb 1,8

Each rank fills a tensor with its rank + 1 and sums it; every element must equal size(size+1)/2, so a
broken link or a misconfigured transport fails loudly instead of training slowly or wrongly. Bus
bandwidth uses NCCL-tests' definition for allreduce: bytes x 2(n-1)/n / time.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from .common.metrics import say


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="8,32,128,256", help="comma-separated tensor sizes in MB")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--output", type=pathlib.Path, default=None, help="rank 0 writes the JSON report here")
    args = ap.parse_args(argv)
    try:
        sizes = [float(s) for s in args.sizes_mb.split(",")]
    except ValueError:
        print(f"error: --sizes-mb takes numbers like 8,32,128, got {args.sizes_mb!r}", file=sys.stderr)
        return 2

    import horovod.torch as hvd
    import torch

    hvd.init()
    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    n = hvd.size()
    expected = n * (n + 1) / 2
    results, ok = [], True
    for mb in sizes:
        numel = int(mb * 1e6 / 4)
        t = torch.full((numel,), float(hvd.rank() + 1), device=device)
        out = hvd.allreduce(t, op=hvd.Sum, name=f"warmup{mb}")   # first call negotiates and allocates
        times = []
        for _ in range(args.iterations):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = hvd.allreduce(t, op=hvd.Sum, name=f"size{mb}")
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        good = bool(torch.all(out == expected).item())
        ok &= good
        best = min(times)
        bus = numel * 4 * 2 * (n - 1) / n / best / 1e9 if n > 1 else 0.0
        results.append({"mbytes": mb, "best_seconds": best, "median_seconds": sorted(times)[len(times) // 2],
                        "bus_gbytes_per_sec": bus, "correct": good})
    all_ok = bool(hvd.allreduce(torch.tensor(1.0 if ok else 0.0), op=hvd.Min, name="verdict").item())
    if hvd.rank() == 0:
        report = {"processes": n, "nodes": n // hvd.local_size(), "device": device.type, "results": results,
                  "passed": all_ok}
        for r in results:
            say(f"allreduce {r['mbytes']:>7.1f} MB: {r['best_seconds'] * 1e3:8.2f} ms, "
                f"bus bandwidth {r['bus_gbytes_per_sec']:.2f} GB/s, {'ok' if r['correct'] else 'WRONG SUM'}")
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=2) + "\n")
        say("healthcheck " + ("passed" if all_ok else "FAILED: some rank saw a wrong sum"))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
