"""Allreduce health check: correctness and bandwidth of Horovod's allreduce across all processes.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.healthcheck --sizes-mb 1,8

Each rank fills a tensor with its rank + 1 and sums it; every element must equal size(size+1)/2, so a
broken link or a misconfigured transport fails loudly instead of training slowly or wrongly. Bus
bandwidth uses NCCL-tests' definition for allreduce: bytes x 2(n-1)/n / time. The largest size's bus
bandwidth is judged against the floor of the cluster's VM size (the launcher sets it from the catalog,
HEALTHCHECK_MIN_BUSBW_GBYTES_PER_SEC) or --min-busbw. Every node's driver, CUDA, NCCL versions and
InfiniBand devices are printed and written to the report.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import sys
import time

from .common import devices
from .common.errors import ConfigError
from .common.metrics import say

MIN_BUSBW = "HEALTHCHECK_MIN_BUSBW_GBYTES_PER_SEC"


def _floor(text: str | None, source: str) -> float | None:
    if text in (None, ""):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{source} {text!r}: a bus bandwidth floor in GB/s, a positive number like 20")
    return value


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="8,32,128,256", help="comma-separated tensor sizes in MB")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--min-busbw", default=None, metavar="GB_PER_SEC",
                    help=f"fail below this bus bandwidth at the largest size (default: ${MIN_BUSBW}, set by "
                         "the launcher from the VM-size catalog; none: reported, not judged)")
    ap.add_argument("--output", type=pathlib.Path, default=None, help="rank 0 writes the JSON report here")
    args = ap.parse_args(argv)
    try:
        args.sizes = [float(s) for s in args.sizes_mb.split(",")]
    except ValueError:
        raise ConfigError(f"--sizes-mb takes numbers like 8,32,128, got {args.sizes_mb!r}") from None
    if not args.sizes or min(args.sizes) <= 0:
        raise ConfigError(f"--sizes-mb takes positive sizes like 8,32,128, got {args.sizes_mb!r}")
    if args.iterations < 1:
        raise ConfigError(f"--iterations {args.iterations}: at least 1")
    if args.min_busbw is not None:
        args.floor = _floor(args.min_busbw, "--min-busbw")
    else:
        args.floor = _floor(os.environ.get(MIN_BUSBW), MIN_BUSBW)
    return args


def node_facts(torch) -> dict:
    """What this process sees of its node: versions ('none' where absent) and InfiniBand devices."""
    gpu = torch.cuda.is_available()
    nccl = "none"
    if gpu:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    ib = pathlib.Path("/sys/class/infiniband")
    return {"host": socket.gethostname(), "driver": devices.driver_version() or "none",
            "cuda": (torch.version.cuda or "none") if gpu else "none", "nccl": nccl,
            "gpus_visible": torch.cuda.device_count() if gpu else 0,
            "infiniband_devices": sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []}


def measure(hvd, torch, device, sizes: list[float], iterations: int) -> list[dict]:
    n = hvd.size()
    expected = n * (n + 1) / 2
    results = []
    for mb in sizes:
        numel = int(mb * 1e6 / 4)
        t = torch.full((numel,), float(hvd.rank() + 1), device=device)
        out = hvd.allreduce(t, op=hvd.Sum, name=f"warmup{mb}")   # first call negotiates and allocates
        times = []
        for _ in range(iterations):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = hvd.allreduce(t, op=hvd.Sum, name=f"size{mb}")
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        best = min(times)
        bus = numel * 4 * 2 * (n - 1) / n / best / 1e9 if n > 1 else 0.0
        results.append({"mbytes": mb, "best_seconds": best, "median_seconds": sorted(times)[len(times) // 2],
                        "bus_gbytes_per_sec": bus, "correct": bool(torch.all(out == expected).item())})
    return results


def judge(results: list[dict], processes: int, floor: float | None) -> tuple[dict, list[str]]:
    """(bandwidth verdict, failures). The largest size is judged: it is the closest to the link's peak."""
    failures = [f"wrong sum at {r['mbytes']:g} MB on some rank" for r in results if not r["correct"]]
    largest = max(results, key=lambda r: r["mbytes"])
    verdict = {"min_busbw_gbytes_per_sec": floor, "judged_mbytes": largest["mbytes"],
               "busbw_gbytes_per_sec": largest["bus_gbytes_per_sec"], "judged": False, "ok": None}
    if floor is None or processes < 2:
        return verdict, failures
    verdict.update(judged=True, ok=largest["bus_gbytes_per_sec"] >= floor)
    if not verdict["ok"]:
        failures.append(
            f"bus bandwidth {largest['bus_gbytes_per_sec']:.2f} GB/s at {largest['mbytes']:g} MB is below the "
            f"floor of {floor:g} GB/s: the fabric is slower than this VM size delivers healthy. Likely: NCCL "
            "is not using InfiniBand (run with NCCL_DEBUG=INFO and look for 'NET/IB'), a degraded link or GPU "
            "on one node (see the per-node lines above; replace the node by scaling the cluster to 0), or "
            "too small a --sizes-mb to reach the link's speed")
    return verdict, failures


def main(argv=None) -> int:
    try:
        args = parse(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import horovod.torch as hvd
    import torch

    hvd.init()
    try:
        devices.require_gpus(torch.cuda.device_count(), hvd.local_size(), "PyTorch", torch.version.cuda)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    n = hvd.size()
    facts = hvd.allgather_object(node_facts(torch), name="node_facts")
    results = measure(hvd, torch, device, args.sizes, args.iterations)
    bandwidth, failures = judge(results, n, args.floor)
    all_ok = bool(hvd.allreduce(torch.tensor(0.0 if failures else 1.0), op=hvd.Min, name="verdict").item())
    if hvd.rank() == 0:
        nodes = {}
        for f in facts:    # one entry per host: what its first process saw
            nodes.setdefault(f["host"], f)
        for f in nodes.values():
            say(f"node {f['host']}: driver {f['driver']}, CUDA {f['cuda']}, NCCL {f['nccl']}, "
                f"{f['gpus_visible']} GPUs, InfiniBand devices: {', '.join(f['infiniband_devices']) or 'none'}")
        for r in results:
            say(f"allreduce {r['mbytes']:>7.1f} MB: {r['best_seconds'] * 1e3:8.2f} ms, "
                f"bus bandwidth {r['bus_gbytes_per_sec']:.2f} GB/s, {'ok' if r['correct'] else 'WRONG SUM'}")
        if bandwidth["judged"]:
            say(f"bus bandwidth {bandwidth['busbw_gbytes_per_sec']:.2f} GB/s at {bandwidth['judged_mbytes']:g} MB, "
                f"floor {bandwidth['min_busbw_gbytes_per_sec']:g} GB/s: {'ok' if bandwidth['ok'] else 'TOO LOW'}")
        else:
            say("bus bandwidth not judged: " + ("one process has no bus" if n < 2 else
                f"no floor for this VM size (set --min-busbw or {MIN_BUSBW})"))
        report = {"processes": n, "nodes": len(nodes), "device": device.type,
                  "vm_size": os.environ.get("TRAINING_VM_SIZE"), "node_facts": list(nodes.values()),
                  "results": results, "bandwidth": bandwidth, "failures": failures, "passed": all_ok}
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=2) + "\n")
        if all_ok:
            say("healthcheck passed")
        else:
            say("healthcheck FAILED: " + ("; ".join(failures) or "another rank failed (see its output)"))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
