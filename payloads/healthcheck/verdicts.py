"""Each node judged on its own against its VM size's figures (median of the timed runs at the largest size): one
verdict per node and check, the table rank 0 prints and the line a failure is told in.
"""

from __future__ import annotations

import statistics

from .allreduce import busbw, node_groups
from .expected import IB_WRITE, IN_NODE, NODE_CHECKS, OVER_IB, UNITS
from .infiniband import IB_WRITE_BW_MESSAGE
from .options import FAIL, NOT_JUDGED, PASS, SKIPPED, TITLES, size_text


def _combined(records: list[dict]) -> dict:
    """{(check, ranks, bytes): (per-run seconds of the slowest rank, all sums right)}: a collective ends when
    its last rank does."""
    out: dict = {}
    for r in records:
        key = (r["check"], tuple(r["ranks"]), r["bytes"])
        seconds, correct = out.get(key, ([0.0] * len(r["seconds"]), True))
        out[key] = ([max(a, b) for a, b in zip(seconds, r["seconds"])], correct and r["correct"])
    return out


def _verdict(check: str, figure: float | None, expected: dict | None, why_not: str | None = None) -> dict:
    v = {"check": check, "figure": figure, "unit": UNITS[check], "expected": None, "source": None}
    if expected is not None:
        v.update(expected=expected["value"], source=expected["source"])
    if why_not:
        v.update(status=NOT_JUDGED, reason=why_not)
    elif expected is None:
        v.update(status=NOT_JUDGED, reason="no expected figure for this VM size")
    elif figure is None:
        v.update(status=FAIL, reason="nothing measured")
    else:
        v.update(status=PASS if figure >= expected["value"] else FAIL, reason=None)
    return v


def _at_largest(check, curve, expected, extra: str = "") -> dict:
    """Judge the largest size measured; Azure's figure holds only at the message size it was measured at."""
    top = max(curve, key=lambda c: c["bytes"])
    why = None
    if expected and expected.get("message_bytes") and top["bytes"] < expected["message_bytes"]:
        why = (
            f"measured up to {size_text(top['bytes'])}; the expected figure is at "
            f"{size_text(expected['message_bytes'])} (leave --sizes-mb out)"
        )
    v = _verdict(check, top["busbw"], expected, why)
    if not all(c["correct"] for c in curve):
        v.update(status=FAIL, reason="wrong sums: a GPU, its link or NCCL corrupts data")
    v.update(at_bytes=top["bytes"], sizes=curve)
    if extra and v["status"] == FAIL:
        v["reason"] = "; ".join(x for x in (v.get("reason"), extra) if x)
    return v


def judge_nodes(facts: list[dict], records: list[dict], cards: list[dict], expected: dict) -> list[dict]:
    """One verdict per node from every rank's facts and measurements (the same code on CPUs and GPUs):
    {host, private_ip, physical_host, ranks, checks: {check: {status, figure, unit, expected, source, reason,
    ...}}, verdict}. A figure is the median of the timed runs, each timed at its slowest rank."""
    hosts = [f["host"] for f in facts]
    nodes = node_groups(hosts)
    runs = _combined(records)
    figures = {k: (busbw(k[2], len(k[1]), statistics.median(sec)), ok) for k, (sec, ok) in runs.items()}
    by_host = {c["host"]: c for c in cards}
    out = []
    for host, ranks in nodes:
        checks = {}
        # in the node
        exp = expected.get(IN_NODE)
        mine = sorted((k[2], f, ok) for k, (f, ok) in figures.items() if k[0] == IN_NODE and list(k[1]) == ranks)
        if len(ranks) < 2:
            checks[IN_NODE] = _verdict(IN_NODE, None, exp, "one process on this node: nothing to all-reduce with")
        elif not mine:
            checks[IN_NODE] = _verdict(IN_NODE, None, exp, None)
        else:
            curve = [{"bytes": b, "busbw": f, "correct": ok} for b, f, ok in mine]
            v = _at_largest(IN_NODE, curve, exp)
            if exp and exp.get("processes") and exp["processes"] != len(ranks) and v["status"] != FAIL:
                v.update(
                    status=NOT_JUDGED,
                    reason=f"the expected figure is for {exp['processes']} processes (one per GPU); this node "
                    f"ran {len(ranks)}",
                )
            checks[IN_NODE] = v
        # over InfiniBand: each card (process index) by its best pair, the node by its weakest card
        exp = expected.get(OVER_IB)
        mine = [r for r in records if r["check"] == OVER_IB and host in r["nodes"]]
        if len(nodes) < 2:
            checks[OVER_IB] = _verdict(OVER_IB, None, exp, "one node: no other node to pair with")
        elif not mine:
            checks[OVER_IB] = _verdict(OVER_IB, None, exp, "no process of this node had a partner")
        else:
            curve = []
            for nbytes in sorted({r["bytes"] for r in mine}):
                best: dict[int, tuple[float, str]] = {}  # process index -> (its best pair's figure, partner)
                correct = True
                for r in (r for r in mine if r["bytes"] == nbytes):
                    f, ok = figures[(OVER_IB, tuple(r["ranks"]), nbytes)]
                    correct = correct and ok
                    if r["local_index"] not in best or f > best[r["local_index"]][0]:
                        best[r["local_index"]] = (f, next(n for n in r["nodes"] if n != host))
                index, (f, partner) = min(best.items(), key=lambda kv: kv[1][0])
                curve.append(
                    {"bytes": nbytes, "busbw": f, "correct": correct, "process_index": index, "best_partner": partner}
                )
            top = curve[-1]
            weakest = {"process_index": top["process_index"], "best_partner": top["best_partner"]}
            shared = (
                "with 2 nodes the one pair's figure is both nodes': a third node tells which is slow"
                if len(nodes) == 2
                else ""
            )
            v = _at_largest(OVER_IB, curve, exp, shared)
            v["weakest"] = weakest
            checks[OVER_IB] = v
        # ib_write_bw per card
        exp = expected.get(IB_WRITE)
        c = by_host.get(host, {"skipped": "not measured"})
        if c.get("skipped"):
            checks[IB_WRITE] = {**_verdict(IB_WRITE, None, exp, c["skipped"]), "status": SKIPPED}
        else:
            per_card = {d: statistics.median(r["gbits"]) if r["gbits"] else None for d, r in c["cards"].items()}
            errors = {d: r["error"] for d, r in c["cards"].items() if r["error"] and not r["gbits"]}
            measured = [f for f in per_card.values() if f is not None]
            low = min(per_card, key=lambda d: -1.0 if per_card[d] is None else per_card[d])
            v = _verdict(IB_WRITE, min(measured) if measured else None, exp, None)
            if errors:
                v.update(status=FAIL, reason="; ".join(f"{d}: {e}" for d, e in errors.items()))
            elif exp is None:
                v.update(status=NOT_JUDGED, reason="no expected figure for this VM size")
            v.update(cards=per_card, weakest_card=low, memory=c["memory"], at_bytes=IB_WRITE_BW_MESSAGE)
            checks[IB_WRITE] = v
        statuses = [v["status"] for v in checks.values()]
        verdict = FAIL if FAIL in statuses else PASS if PASS in statuses else NOT_JUDGED
        f0 = facts[ranks[0]]
        out.append(
            {
                "host": host,
                "private_ip": f0.get("private_ip"),
                "physical_host": f0.get("physical_host"),
                "ranks": ranks,
                "checks": checks,
                "verdict": verdict,
            }
        )
    return out


def _cell(v: dict) -> str:
    if v["figure"] is None:
        return v["status"].lower()
    figure = f"{v['figure']:.3g} {v['unit']}"
    if v["status"] in (PASS, FAIL):
        return f"{figure} {'>=' if v['status'] == PASS else '<'} {v['expected']:g} {v['status']}"
    return f"{figure} (not judged)"


def node_table(nodes: list[dict]) -> list[str]:
    """The verdict table rank 0 prints: one row per node, then why each FAIL or unjudged figure is so."""
    header = ["host", "private IP", *(TITLES[c] for c in NODE_CHECKS), "verdict"]
    rows = [
        [n["host"], n["private_ip"] or "?", *(_cell(n["checks"][c]) for c in NODE_CHECKS), n["verdict"]] for n in nodes
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    for n in nodes:
        for c in NODE_CHECKS:
            v = n["checks"][c]
            if v["status"] == FAIL:
                lines.append(f"{n['host']}: {failure_line(v)}")
    notes = {}
    for n in nodes:
        for c in NODE_CHECKS:
            v = n["checks"][c]
            if v["status"] in (NOT_JUDGED, SKIPPED) and v.get("reason"):
                notes.setdefault((c, v["status"], v["reason"]), []).append(n["host"])
    for (c, status, reason), hosts in notes.items():
        lines.append(f"{TITLES[c]} {status.lower()} on {', '.join(hosts)}: {reason}")
    sources = {v["source"] for n in nodes for v in n["checks"].values() if v.get("source")}
    lines += [f"expected figures from {s}" for s in sorted(sources)]
    return lines


def failure_line(v: dict) -> str:
    """One check's FAIL, with its figure, the expected one and where that comes from."""
    what = TITLES[v["check"]]
    if v["figure"] is None:
        return f"{what} FAILED: {v['reason']}"
    where = f" at {size_text(v['at_bytes'])}" if v.get("at_bytes") else ""
    detail = ""
    if v["check"] == OVER_IB and v.get("weakest"):
        w = v["weakest"]
        detail = f" (process {w['process_index']}'s card, best with {w['best_partner']})"
    elif v["check"] == IB_WRITE and v.get("weakest_card"):
        detail = f" (card {v['weakest_card']})"
    line = f"{what} {v['figure']:.3g} {v['unit']}{where}{detail}"
    if v.get("expected") is not None:
        line += f", expected at least {v['expected']:g} {v['unit']} ({v['source']})"
    return line + (f"; {v['reason']}" if v.get("reason") else "")
