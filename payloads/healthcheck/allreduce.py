"""Horovod's allreduce, checked and timed: every element must equal size(size+1)/2; bus bandwidth as NCCL-tests defines
it (bytes x 2(n-1)/n / time); then among each node's own processes and across nodes over InfiniBand, nodes paired
in rounds so that each pair's traffic crosses one card of each.
"""

from __future__ import annotations

import statistics
import time

from .expected import IN_NODE, OVER_IB


def busbw(nbytes: int, processes: int, seconds: float) -> float:
    """NCCL-tests' bus bandwidth of an all-reduce, GB/s: bytes x 2(n-1)/n / time."""
    return nbytes * 2 * (processes - 1) / processes / seconds / 1e9 if processes > 1 and seconds > 0 else 0.0


def time_allreduce(hvd, torch, device, nbytes: int, iterations: int, name: str, members, process_set=None):
    """(seconds of each timed all-reduce, whether the sums were right) on this rank. Each rank contributes its
    rank + 1, so every element must come back as the sum of that over `members`."""
    kw = {} if process_set is None else {"process_set": process_set}
    t = torch.full((nbytes // 4,), float(hvd.rank() + 1), device=device)
    out = hvd.allreduce(t, op=hvd.Sum, name=f"{name}.warmup", **kw)  # first call negotiates and allocates
    times = []
    for _ in range(iterations):
        out = None  # the last result freed first: at 16 GiB, input and one result are 32 GiB of the GPU
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = hvd.allreduce(t, op=hvd.Sum, name=name, **kw)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    expected = float(sum(r + 1 for r in members))
    return times, bool(torch.all(out == expected).item())


def measure(hvd, torch, device, sizes: list[int], iterations: int) -> list[dict]:
    """The all-reduce across every process of the job, per size; judged by `judge` against the floor."""
    n = hvd.size()
    results = []
    for nbytes in sizes:
        times, correct = time_allreduce(hvd, torch, device, nbytes, iterations, f"size{nbytes}", range(n))
        median = statistics.median(times)
        results.append(
            {
                "mbytes": nbytes / 1e6,
                "best_seconds": min(times),
                "median_seconds": median,
                "bus_gbytes_per_sec": busbw(nbytes, n, median),
                "correct": correct,
            }
        )
    return results


def judge(results: list[dict], processes: int, floor: float | None) -> tuple[dict, list[str]]:
    """(bandwidth verdict, failures). The largest size is judged (the closest to the link's peak), on the
    median of its timed runs."""
    failures = [f"wrong sum at {r['mbytes']:g} MB on some rank" for r in results if not r["correct"]]
    largest = max(results, key=lambda r: r["mbytes"])
    verdict = {
        "min_busbw_gbytes_per_sec": floor,
        "judged_mbytes": largest["mbytes"],
        "busbw_gbytes_per_sec": largest["bus_gbytes_per_sec"],
        "judged": False,
        "ok": None,
    }
    if floor is None or processes < 2:
        return verdict, failures
    verdict.update(judged=True, ok=largest["bus_gbytes_per_sec"] >= floor)
    if not verdict["ok"]:
        failures.append(
            f"bus bandwidth {largest['bus_gbytes_per_sec']:.2f} GB/s at {largest['mbytes']:g} MB is below the "
            f"floor of {floor:g} GB/s: the fabric is slower than this VM size delivers healthy. Likely: NCCL "
            "is not using InfiniBand (run with NCCL_DEBUG=INFO and look for 'NET/IB'), a degraded link or GPU "
            "on one node (the node verdicts above name it; docs/health-check.md#a-bad-node), or too small a "
            "--sizes-mb to reach the link's speed"
        )
    return verdict, failures


def node_groups(hosts: list[str]) -> list[tuple[str, list[int]]]:
    """[(host, its ranks)] in the order of each host's first rank."""
    groups: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    return list(groups.items())


def pair_rounds(nodes: int) -> list[list[tuple[int, int]]]:
    """The ring of nodes 0-1, 1-2, ..., (n-1)-0 as rounds of pairs no node is in twice, so that a round runs
    all its pairs at once. Every node is in two pairs (one with 2 nodes): a node whose every pair is slow is
    the slow one; a healthy node's other pair clears it."""
    edges = [(0, 1)] if nodes == 2 else [(i, (i + 1) % nodes) for i in range(nodes)] if nodes > 2 else []
    rounds: list[list[tuple[int, int]]] = []
    for a, b in edges:
        for r in rounds:
            if all(a not in e and b not in e for e in r):
                r.append((a, b))
                break
        else:
            rounds.append([(a, b)])
    return rounds


def _process_set(hvd, ranks: list[int]):
    """(process set, whether it was added here). Every rank must call this for every set, in the same order."""
    if sorted(ranks) == list(range(hvd.size())):
        return hvd.global_process_set, False  # Horovod refuses a duplicate of the global set
    return hvd.add_process_set(ranks), True


def _measure_sets(hvd, torch, device, sets: list[dict], sizes: list[int], iterations: int) -> list[dict]:
    """Register every set, measure the one(s) this rank is in (all sets at once), remove them again."""
    handles = [_process_set(hvd, s["ranks"]) for s in sets]
    records = []
    try:
        for s, (ps, _) in zip(sets, handles):
            if hvd.rank() not in s["ranks"]:
                continue
            for nbytes in sizes:
                name = f"{s['check']}.{'-'.join(map(str, s['ranks']))}.{nbytes}"
                times, correct = time_allreduce(hvd, torch, device, nbytes, iterations, name, s["ranks"], ps)
                records.append({**s, "bytes": nbytes, "seconds": times, "correct": correct})
    finally:
        for ps, added in handles:
            if added:
                hvd.remove_process_set(ps)
    return records


def allreduce_checks(hvd, torch, device, hosts: list[str], sizes: list[int], iterations: int) -> list[dict]:
    """This rank's timed all-reduces: in its node (every node with 2+ processes at once), then over
    InfiniBand in rounds of node pairs, where process i of one node is paired with process i of the other."""
    nodes = node_groups(hosts)
    in_node = [{"check": IN_NODE, "ranks": ranks, "node": host} for host, ranks in nodes if len(ranks) > 1]
    records = _measure_sets(hvd, torch, device, in_node, sizes, iterations)
    for pairs in pair_rounds(len(nodes)):
        sets = []
        for a, b in pairs:
            (ha, ra), (hb, rb) = nodes[a], nodes[b]
            sets += [
                {"check": OVER_IB, "ranks": [ra[i], rb[i]], "nodes": [ha, hb], "local_index": i}
                for i in range(min(len(ra), len(rb)))
            ]
        records += _measure_sets(hvd, torch, device, sets, sizes, iterations)
    return records
