"""The health check from start to report: options, node facts, the allreduce checks, the per-node checks, the training
steps, then rank 0's lines and report (docs/health-check.md).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

from ..common import devices
from ..common.errors import ConfigError
from ..common.metrics import say
from . import mpistop, nccl
from .allreduce import allreduce_checks, judge, measure, node_groups
from .expected import MIN_BUSBW
from .facts import disks_line, node_facts
from .infiniband import ib_card_check
from .options import FAIL, parse
from .training import judge_training, train_steps, training_line
from .verdicts import failure_line, judge_nodes, node_table


def main(argv=None) -> int:
    try:
        args = parse(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import horovod.torch as hvd
    import torch

    from ..pytorch import precision

    devices.pin_nccl_to_infiniband()  # the cards the training job's NCCL gets (common/entry.py), before NCCL starts
    nccl_logs = pathlib.Path(tempfile.gettempdir()) / "healthcheck-nccl"
    logged = nccl.log_to(nccl_logs)  # InfiniBand sizes: what NCCL chose, judged per node below
    hvd.init(process_sets="dynamic")  # the node checks add process sets (each node, pairs of nodes) as they go
    try:
        devices.require_gpus(torch.cuda.device_count(), hvd.local_size(), "PyTorch", torch.version.cuda)
        device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
        # The PyTorch payload's defaults on this device (pytorch/train.py): mixed precision and channels_last on GPUs.
        prec = precision.choose(device, args.amp, args.amp_dtype)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    channels_last = device.type == "cuda" if args.channels_last is None else args.channels_last
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # as the payload: the node's cores shared by its processes, not each process taking them all
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    n = hvd.size()
    facts = hvd.allgather_object(node_facts(torch), name="node_facts")
    results = measure(hvd, torch, device, args.sizes_bytes, args.iterations)
    bandwidth, failures = judge(results, n, args.floor)

    # Every node on its own: the all-reduces, then ib_write_bw on each node's first process; every rank judges
    # the same gathered figures, so every rank knows the verdict.
    hosts = [f["host"] for f in facts]
    records = allreduce_checks(hvd, torch, device, hosts, args.sizes_bytes, args.iterations)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the all-reduces' 8-16 GiB blocks, before ib_write_bw and the training steps
    card = None
    if hvd.rank() in [ranks[0] for _, ranks in node_groups(hosts)]:
        card = {**ib_card_check(args.ib_repeats, device.type == "cuda"), "host": hosts[hvd.rank()]}
    records = [r for mine in hvd.allgather_object(records, name="node_checks") for r in mine]
    chosen = hvd.allgather_object(nccl.seen(nccl_logs) if logged else None, name="nccl_logs")
    groups = node_groups(hosts)
    network = (
        [
            nccl.judge(h, [chosen[r] for r in ranks], facts[ranks[0]]["infiniband_cards"], len(groups) > 1)
            for h, ranks in groups
        ]
        if logged
        else []
    )
    cards = [c for c in hvd.allgather_object(card, name="ib_cards") if c]
    node_verdicts = judge_nodes(facts, records, cards, args.expected)
    failures += [
        f"node {v['host']} ({v['private_ip'] or 'IP unknown'}): {failure_line(c)}"
        for v in node_verdicts
        for c in v["checks"].values()
        if c["status"] == FAIL
    ]

    failures += [f"{line.split(':', 1)[0]}: {problem}" for line, problem in network if problem]

    status = train_steps(hvd, torch, device, args, channels_last)
    # A rank that failed part-way joins: the others' pending gradient allreduces then complete instead of
    # waiting for it forever (Horovod's join; a broadcast with a joined rank fails, and is reported, instead).
    hvd.join(device.index if device.type == "cuda" else -1)
    statuses = hvd.allgather_object(status, name="train_status")
    training, train_failures = judge_training(statuses, args.train_steps)
    training = {
        "model": args.model,
        "image_size": args.image_size,
        "batch_per_process": args.batch_size,
        "steps": args.train_steps,
        "precision": prec.name,
        "memory_format": "channels_last" if channels_last else "contiguous",
        **training,
    }
    failures += train_failures

    all_ok = bool(hvd.allreduce(torch.tensor(0.0 if failures else 1.0), op=hvd.Min, name="verdict").item())
    if hvd.rank() == 0:
        nodes = {}
        for f in facts:  # one entry per host: what its first process saw
            nodes.setdefault(f["host"], f)
        for f in nodes.values():
            say(
                f"node {f['host']}: driver {f['driver']}, CUDA {f['cuda']}, NCCL {f['nccl']}, "
                f"{f['gpus_visible']} GPUs, InfiniBand devices: {', '.join(f['infiniband_devices']) or 'none'}"
                + (f"; NCCL_IB_HCA {f['nccl_ib_hca']}" if f.get("nccl_ib_hca") else "")
                + (f"; MISMATCH: {f['driver_mismatch']}" if f.get("driver_mismatch") else "")
            )
            say(f"node {f['host']} disks: {disks_line(f['disks'])}")
            say(mpistop.line(f["host"], f["mpi_stop"]))
        for line, problem in network:
            say(line + (f": {problem}" if problem else ""))
        say(
            "CPU binding for training (the payload's own, runtime.resolve): "
            + "; ".join(f"rank {s['rank']} on {hosts[s['rank']]}: {s.get('cpus') or '?'}" for s in statuses)
        )
        for r in results:
            say(
                f"allreduce {r['mbytes']:>7.1f} MB: {r['median_seconds'] * 1e3:8.2f} ms (median), "
                f"bus bandwidth {r['bus_gbytes_per_sec']:.2f} GB/s, {'ok' if r['correct'] else 'WRONG SUM'}"
            )
        if bandwidth["judged"]:
            say(
                f"bus bandwidth {bandwidth['busbw_gbytes_per_sec']:.2f} GB/s at {bandwidth['judged_mbytes']:g} MB, "
                f"floor {bandwidth['min_busbw_gbytes_per_sec']:g} GB/s: {'ok' if bandwidth['ok'] else 'TOO LOW'}"
            )
        else:
            say(
                "bus bandwidth not judged: "
                + ("one process has no bus" if n < 2 else f"no floor for this VM size (set --min-busbw or {MIN_BUSBW})")
            )
        say(
            f"node verdicts (median of {args.iterations} runs at the largest size; all-reduce figures are bus "
            "bandwidth):",
            *node_table(node_verdicts),
        )
        say(training_line(training, n))
        report = {
            "processes": n,
            "nodes": len(nodes),
            "device": device.type,
            "vm_size": os.environ.get("TRAINING_VM_SIZE"),
            "node_facts": list(nodes.values()),
            "results": results,
            "bandwidth": bandwidth,
            "expected": args.expected,
            "node_verdicts": node_verdicts,
            "training": training,
            "nccl_network": [{"line": line, "problem": problem} for line, problem in network],
            "cpu_binding": [{"rank": st["rank"], "host": hosts[st["rank"]], "cpus": st["cpus"]} for st in statuses],
            "failures": failures,
            "passed": all_ok,
        }
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=2) + "\n")
        if all_ok:
            say("healthcheck passed")
        else:
            say("healthcheck FAILED: " + ("; ".join(failures) or "another rank failed (see its output)"))
    return 0 if all_ok else 1
