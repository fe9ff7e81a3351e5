"""The cost ledger of one job: where its time and its money went, from the job's own history.

    python -m launcher cost JOB_NAME --stack-outputs outputs.dev.json [--json cost.json]
        [--status-log LOG_ANALYTICS_WORKSPACE_ID] [--metrics metrics.json] [--gpu-images-per-sec R]
        [--price-per-node-hour USD]

The launcher also prints it at the end of a job it followed. What it reads, each a documented REST shape, with
the person's sign-in:

- the job (ARM "Jobs - Get"): its cluster (computeId), node count (resources.instanceCount), output folder
  (outputs.run.uri), status, tags;
- its cluster (ARM "Compute - Get"): vmSize, vmPriority and scaleSettings (minNodeCount,
  nodeIdleTimeBeforeScaleDown), and the region it is in;
- run history (runs/{name}/details, what `az ml job stream` polls): createdTimeUtc, startTimeUtc, endTimeUtc,
  computeDuration ("the cumulative time spent in an active status for a terminal run"),
  effectiveStartTimeUtc ("compute duration of an active run is now() - EffectiveStartTimeUtc"),
  lastStartTimeUtc, currentAttemptId, and compute.vmSize/priority/instanceCount, what the run ran on;
- the status log, where the workspace sends its AmlRunStatusChangedEvent diagnostic log to Log Analytics
  (--status-log WORKSPACE_ID, the Log Analytics workspace's id; without it, the stack output status_log_workspace_id:
  the platform stack declares that diagnostic setting and grants its users Log Analytics Reader there): every status
  change with its time, which tells queue, preparation and each requeue after a preemption apart. Without it run
  history gives totals only: the wait before the first start, the time nodes were held, how many times the run
  started;
- the payload's metrics.json (epochs, images, startup_seconds, the --epochs it aims at) and the times of the
  checkpoints' completion markers, every version the logs container keeps, in the job's output folder.

Money is the time the job held nodes (Running, Finalizing, CancelRequested) x nodes x the dated price of its VM
size and priority in launcher/vm_prices.csv (launcher/prices.py). The split:

    queue         NotStarted, Starting, Provisioning, Queued (and a requeue's wait): no node is held for the job
    preparation   Preparing (the environment; the image is prebuilt, so mostly its lookup)
    start-up      per start, the payload's startup_seconds: its process start to its first timed step
    training      the rest of the held time
    lost          per requeue (a preemption on a low-priority cluster): the held time after the last checkpoint
                  completed in that stretch, or the whole stretch after its start-up when no checkpoint time is
                  known (the ledger says which)

`local_split(metrics.json, wall seconds)` splits a local run's time the same way (launcher/local.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from . import prices
from .errors import JobError
from .stack import StackOutputs

HELD = ("Running", "Finalizing", "CancelRequested")  # the job's nodes are allocated: charged
PREPARING = ("Preparing",)
TERMINAL = ("Completed", "Failed", "Canceled", "NotResponding")
# Everything else (NotStarted, Starting, Provisioning, Queued, Paused, Unknown) is waiting: no node held.

LOGS_ENDPOINT = "https://api.loganalytics.io"
LOGS_SCOPE = LOGS_ENDPOINT + "/.default"
# The stack output naming the Log Analytics workspace (its customerId) that receives the status log (program.py).
STATUS_LOG_OUTPUT = "status_log_workspace_id"
GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
JOB_NAME = re.compile(r"^[a-zA-Z0-9][\w-]{0,255}$")  # jobspec.JOB_NAME: safe inside a KQL string
MARKER = re.compile(r"(?:^|/)\.checkpoint-epoch-(\d+)[^/]*\.complete$")  # payloads/common/checkpoint.py
DURATION = re.compile(r"^(?:(\d+)\.)?(\d+):(\d\d):(\d\d(?:\.\d+)?)$")  # .NET TimeSpan: [d.]hh:mm:ss[.fffffff]


# ---- the ledger: pure arithmetic on what was read ------------------------------------------------------------


@dataclass
class Facts:
    """Everything the ledger is computed from; gather() reads it from Azure, tests build it by hand."""

    name: str
    status: str
    created: dt.datetime
    now: dt.datetime
    nodes: int
    vm_size: str
    low_priority: bool
    quote: prices.Quote
    run: dict[str, Any]  # run history's details, as Azure answers them
    compute: str = ""
    min_nodes: int | None = None  # the cluster's scaleSettings; None: not known (cluster gone)
    idle_seconds: float | None = None
    transitions: list[tuple[dt.datetime, str]] | None = None  # the status log; None: not asked or not read
    metrics: dict[str, Any] | None = None
    checkpoints: list[tuple[dt.datetime, int | None]] | None = None  # marker times; None: unknown
    own_folder: bool = True  # the output folder is this job's own (not one it resumed from)
    gpu_images_per_sec: float | None = None  # the planner's input (item 7)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Stretch:
    """A stretch of time the job held its nodes, from one start to a requeue or the end."""

    seconds: float
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    requeued: bool = False
    starts: int = 1  # run history without the status log folds all earlier starts into one stretch
    startup: float = 0.0
    lost: float | None = 0.0  # None: not known
    last_checkpoint: dt.datetime | None = None


def utcnow() -> dt.datetime:
    """The time a running job's ledger is taken at (tests fix it)."""
    return dt.datetime.now(dt.UTC)


def parse_time(text: str | None) -> dt.datetime | None:
    """ISO 8601 as Azure writes it ('2024-12-05T20:45:09.986Z', '...53.3886899+00:00': 7 digits), as UTC."""
    if not text:
        return None
    text = str(text).strip().replace("Z", "+00:00")
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(.*)$", text)
    if m and m.group(2) and len(m.group(2)) > 7:
        text = m.group(1) + m.group(2)[:7] + m.group(3)
    when = dt.datetime.fromisoformat(text)
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def parse_duration(text: str | None) -> float | None:
    """Seconds in a .NET TimeSpan string as run history writes computeDuration ('00:10:53.6438246', '1.02:00:00')."""
    m = DURATION.match(str(text).strip()) if text else None
    if not m:
        return None
    days, hours, minutes, seconds = m.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def _segments(facts: Facts, end: dt.datetime) -> list[tuple[str, dt.datetime, dt.datetime]]:
    """(status, from, to) from the status log, closed by run history's end (the log arrives minutes late)."""
    events = sorted(facts.transitions or [])
    if not events or events[0][0] > facts.created:
        events.insert(0, (facts.created, "NotStarted"))
    collapsed: list[tuple[dt.datetime, str]] = []
    for when, status in events:
        if not collapsed or collapsed[-1][1] != status:
            collapsed.append((when, status))
    out = []
    for i, (when, status) in enumerate(collapsed):
        if status in TERMINAL:
            break
        until = collapsed[i + 1][0] if i + 1 < len(collapsed) else end
        out.append((status, when, max(when, min(until, end))))
    return out


def _stretches_from_log(facts: Facts, end: dt.datetime) -> tuple[float, float, list[Stretch]]:
    queue = preparation = 0.0
    stretches: list[Stretch] = []
    current: Stretch | None = None
    for status, start, until in _segments(facts, end):
        seconds = (until - start).total_seconds()
        if status in HELD:
            if current is None:
                current = Stretch(0.0, start, until)
                stretches.append(current)
            current.seconds += seconds
            current.end = until
            continue
        if current is not None:
            current.requeued = True  # held, then waiting again: a requeue
            current = None
        if status in PREPARING:
            preparation += seconds
        else:
            queue += seconds
    return queue, preparation, stretches


def _held_from_history(facts: Facts, end: dt.datetime, notes: list[str]) -> tuple[float, float, list[Stretch]]:
    """(wait before the first start, waits between starts, stretches) from run history's totals."""
    run = facts.run
    start = parse_time(run.get("startTimeUtc"))
    if start is None:
        return (end - facts.created).total_seconds(), 0.0, []
    elapsed = (end - start).total_seconds()
    held = parse_duration(run.get("computeDuration")) if facts.status in TERMINAL else None
    effective = parse_time(run.get("effectiveStartTimeUtc"))
    if held is None and effective is not None and facts.status not in TERMINAL:
        held = (facts.now - effective).total_seconds()
    if held is None:
        held = elapsed
        notes.append("run history gave no computeDuration: the nodes are counted as held from the first start on")
    held = max(0.0, min(held, elapsed))
    attempts = run.get("currentAttemptId")
    last = parse_time(run.get("lastStartTimeUtc"))
    restarts = int(attempts) - 1 if isinstance(attempts, int) and attempts > 0 else 0
    if not restarts and last is not None and (last - start).total_seconds() > 1:
        restarts = 1  # at least one; how many, only currentAttemptId or the status log says
    if not restarts:
        return (start - facts.created).total_seconds(), elapsed - held, [Stretch(held, start, end)]
    final = min(held, (end - last).total_seconds()) if last is not None and last > start else 0.0
    earlier = Stretch(held - final, start, last, requeued=True, starts=restarts, lost=None)
    stretches = [earlier] + ([Stretch(final, last, end)] if final > 0 else [])
    return (start - facts.created).total_seconds(), elapsed - held, stretches


def _this_jobs_epochs(facts: Facts, end: dt.datetime, notes: list[str]) -> list[dict]:
    epochs = [e for e in (facts.metrics or {}).get("epochs", []) if isinstance(e, dict)]
    if facts.own_folder or not epochs:
        return epochs
    # A resumed job writes into the folder of the job it resumed from, whose epochs metrics.json keeps.
    ours = {n for when, n in (facts.checkpoints or []) if n is not None and facts.created <= when <= end}
    if ours:
        return [e for e in epochs if e.get("epoch") in ours]
    notes.append(
        "this job resumed in another job's folder and no checkpoint time there says which epochs were its own: "
        "per-epoch figures count every epoch metrics.json records"
    )
    return epochs


def ledger(facts: Facts) -> dict[str, Any]:
    """The ledger as a JSON-ready dict: seconds and dollars per phase, per epoch, per million images, and for a
    running job the projected cost to finish; render() prints it."""
    terminal = facts.status in TERMINAL
    end = (parse_time(facts.run.get("endTimeUtc")) if terminal else None) or facts.now
    notes = list(facts.notes)
    per_second = facts.quote.per_node_hour * facts.nodes / 3600
    metrics = facts.metrics or {}
    summary = metrics.get("summary") or {}
    startup = summary.get("startup_seconds")
    if not isinstance(startup, (int, float)):
        startup = None

    if facts.transitions:
        queue, preparation, stretches = _stretches_from_log(facts, end)
        history = "status log (AmlRunStatusChangedEvent in Log Analytics) and run history"
        first_start = stretches[0].start if stretches else None
        held_log = sum(s.seconds for s in stretches)
        reported = parse_duration(facts.run.get("computeDuration")) if terminal else None
        if reported is not None and abs(reported - held_log) > max(60.0, 0.05 * reported):
            notes.append(
                f"the status log holds nodes for {clock(held_log)}, run history's computeDuration says "
                f"{clock(reported)}: charged from the status log"
            )
    else:
        before, between, stretches = _held_from_history(facts, end, notes)
        queue, preparation = before + between, None
        history = "run history only (no status log): queue and preparation are one figure"
        first_start = parse_time(facts.run.get("startTimeUtc"))

    requeues = sum(s.starts if s.lost is None else 1 for s in stretches if s.requeued)
    times = None if facts.checkpoints is None else sorted(when for when, _ in facts.checkpoints)
    lost_method = None
    for s in stretches:
        s.startup = min(s.seconds, (startup or 0.0) * s.starts)
        if not s.requeued or s.lost is None:
            s.lost = s.lost if s.lost is None else 0.0
            continue
        begin = s.start + dt.timedelta(seconds=s.startup)
        inside = [t for t in times or [] if s.start <= t <= s.end]
        s.last_checkpoint = max(inside) if inside else None
        durable = max(begin, s.last_checkpoint) if s.last_checkpoint else begin
        s.lost = max(0.0, (s.end - durable).total_seconds())
        lost_method = (
            "the whole held stretch after its start-up: no checkpoint times (the output folder's markers were not read)"
            if times is None
            else "held time after the last checkpoint completed before each requeue (a stretch without one "
            "loses all of it after its start-up)"
        )
    if any(s.lost is None for s in stretches):
        earlier = sum(s.seconds for s in stretches if s.lost is None)
        lost_method = (
            f"not known without the status log: at most {clock(earlier)}, all the held time before the last "
            "start (pass --status-log)"
        )

    held = sum(s.seconds for s in stretches)
    startups = sum(s.startup for s in stretches)
    lost = sum(s.lost or 0.0 for s in stretches)
    training = held - startups - lost
    starts = sum(s.starts for s in stretches)

    scales_to_zero = facts.min_nodes == 0
    waiting_note = (
        f"not charged: {facts.compute or 'the cluster'} scales to zero, no node is held while the job waits"
        if scales_to_zero
        else f"not charged to the job: the cluster keeps {facts.min_nodes} node(s) on whether or not jobs wait"
        if facts.min_nodes
        else "not charged: no node is held for the job while it waits"
    )
    if preparation is not None:
        prep = _phase(preparation, 0.0, "not charged: no node is held for the job while Azure ML prepares it")
    else:
        prep = _phase(None, None, "in the queue figure: run history has no per-status times (pass --status-log)")
        waiting_note += "; includes preparation and any wait between starts"
    phases = {
        "queue": _phase(queue, 0.0, waiting_note),
        "preparation": prep,
        "startup": _phase(
            startups,
            startups * per_second,
            f"{starts} start(s) x the payload's startup_seconds ({startup:.1f} s)"
            if startup is not None
            else "not known (the payload writes startup_seconds when it ends): counted as training",
        ),
        "training": _phase(
            training, training * per_second, "the rest of the held time: steps, evaluation, checkpoints"
        ),
        "lost_to_preemption": _phase(
            None if any(s.lost is None for s in stretches) else lost,
            None if any(s.lost is None for s in stretches) else lost * per_second,
            f"{requeues} requeue(s): {lost_method}" if requeues else "no requeue",
        ),
    }
    total = {"held_seconds": held, "node_hours": held * facts.nodes / 3600, "usd": held * per_second}

    idle = None
    if terminal and scales_to_zero and facts.idle_seconds and held > 0:
        idle = {
            "seconds": facts.idle_seconds,
            "usd_at_most": facts.idle_seconds * per_second,
            "note": f"the nodes wait {facts.idle_seconds:.0f} s (nodeIdleTimeBeforeScaleDown) before the cluster "
            "scales down, charged unless another job takes them",
        }

    epochs = _this_jobs_epochs(facts, end, notes)
    done = len({e.get("epoch") for e in epochs})
    images = sum(int(e.get("images") or 0) for e in epochs)
    epoch_seconds = [float(e["epoch_seconds"]) for e in epochs if isinstance(e.get("epoch_seconds"), (int, float))]
    target = ((metrics.get("run") or {}).get("config") or {}).get("epochs")
    recorded = max((int(e.get("epoch") or 0) for e in (metrics.get("epochs") or []) if isinstance(e, dict)), default=0)
    per = {
        "epochs_done": done,
        "epochs_target": target,
        "images": images,
        "usd_per_epoch": total["usd"] / done if done else None,
        "training_usd_per_epoch": training * per_second / done if done else None,
        "usd_per_million_images": total["usd"] / images * 1e6 if images else None,
    }

    projection = None
    if not terminal:
        if isinstance(target, int) and epoch_seconds and recorded < target:
            remaining = target - recorded
            mean = sum(epoch_seconds) / len(epoch_seconds)
            # The epoch under way has run since the last checkpoint of the stretch still holding nodes.
            running = stretches[-1] if stretches and stretches[-1].end == end and facts.status in HELD else None
            since = None
            if running is not None and times is not None:
                marks = [t for t in times if running.start <= t <= end]
                since = (end - (max(marks) if marks else running.start)).total_seconds()
                since -= 0.0 if marks else running.startup
            done_of_current = min(mean, max(0.0, since or 0.0))
            left = remaining * mean - done_of_current
            more = left * per_second
            projection = {
                "epochs_left": remaining,
                "seconds_per_epoch": mean,
                "seconds_into_current_epoch": done_of_current,
                "seconds_left": left,
                "usd_more": more,
                "usd_total": total["usd"] + more,
                "note": f"{remaining} epoch(s) of {target} left at the {len(epoch_seconds)} recorded epochs' mean "
                f"{clock(mean)}, less {clock(done_of_current)} into the current one; without further preemptions, "
                "evaluation or checkpoint time",
            }
        else:
            projection = {
                "note": "nothing to project from: no finished epoch recorded yet"
                if not epoch_seconds
                else f"all {target} epochs recorded"
                if isinstance(target, int)
                else "metrics.json gives no --epochs target",
            }

    since_checkpoint = None
    if facts.status in ("Failed", "Canceled", "NotResponding") and stretches and stretches[-1].end is not None:
        last = stretches[-1]
        inside = [t for t in times or [] if last.start and last.start <= t <= last.end]
        if times is not None:
            since = (last.end - max(inside)).total_seconds() if inside else last.seconds
            since_checkpoint = {
                "seconds": since,
                "usd": since * per_second,
                "note": "held time since the last checkpoint: a --resume-from job redoes it",
            }

    quote = facts.quote
    price = {
        "usd_per_node_hour": quote.per_node_hour,
        "kind": quote.kind,
        "vm_size": quote.vm_size,
        "region": quote.region,
        "job_region": quote.wanted_region,
        "date": quote.date,
        "source": quote.source,
        "line": quote.line(facts.nodes),
    }
    if quote.no_low_priority_price:
        notes.append(
            f"the cluster is low priority but the table has no low-priority price for {quote.vm_size}: priced at "
            "the dedicated rate, an upper bound"
        )
    return {
        "job": facts.name,
        "status": facts.status,
        "compute": facts.compute,
        "nodes": facts.nodes,
        "vm_size": facts.vm_size,
        "priority": "low priority" if facts.low_priority else "dedicated",
        "created": facts.created.isoformat(),
        "first_start": first_start.isoformat() if first_start else None,
        "end": end.isoformat() if terminal else None,
        "as_of": facts.now.isoformat(),
        "history": history,
        "sources": facts.sources,
        "price": price,
        "phases": phases,
        "total": total,
        "idle_before_scale_down": idle,
        "since_last_checkpoint": since_checkpoint,
        "starts": starts,
        "requeues": requeues,
        "stretches": [
            {
                "start": s.start.isoformat() if s.start else None,
                "end": s.end.isoformat() if s.end else None,
                "seconds": s.seconds,
                "starts": s.starts,
                "requeued": s.requeued,
                "startup_seconds": s.startup,
                "lost_seconds": s.lost,
                "last_checkpoint": s.last_checkpoint.isoformat() if s.last_checkpoint else None,
            }
            for s in stretches
        ],
        "per": per,
        "projection": projection,
        "planner": planner_estimate(facts, epochs, training, per_second) if facts.metrics else None,
        "notes": notes,
    }


def _phase(seconds: float | None, usd: float | None, note: str) -> dict[str, Any]:
    return {"seconds": seconds, "usd": usd, "note": note}


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# ---- item 7: the planner's estimate for the same job ---------------------------------------------------------


def planner_estimate(facts: Facts, epochs: list[dict], training_seconds: float, per_second: float) -> dict[str, Any]:
    """benchmarks/planner.py's predicted images/sec for this job's GPUs, batch and gradient size beside what the job
    measured, and the training time and cost of the job's images at either speed."""
    metrics = facts.metrics or {}
    world = (metrics.get("run") or {}).get("world") or {}
    config = (metrics.get("run") or {}).get("config") or {}
    images = sum(int(e.get("images") or 0) for e in epochs)
    seconds = sum(float(e.get("epoch_seconds") or 0.0) for e in epochs)
    summary = metrics.get("summary") or {}
    measured = summary.get("total_images_per_sec") or (images / seconds if seconds else None)
    if not facts.gpu_images_per_sec:
        return {
            "note": "the planner needs one GPU's measured images/sec (`python -m benchmarks.gpu`, or a one-GPU run "
            "of the same job): pass --gpu-images-per-sec to `python -m launcher cost`",
            "measured_images_per_sec": measured,
        }
    from benchmarks import planner
    from trainingplatform import vm_sizes

    size = vm_sizes.lookup(facts.vm_size)
    processes, per_node = world.get("processes"), world.get("local_processes")
    if size is None or not size.gpus:
        return {"note": f"the planner models GPU clusters; {facts.vm_size} has no GPU in the catalog"}
    if not processes or not per_node or not world.get("gradient_mbytes") or not images:
        return {"note": "metrics.json lacks the world (processes, gradient_mbytes) or any epoch: nothing to plan"}
    batch = config.get("batch_size") or (config.get("global_batch_size") or 0) // processes
    batch *= config.get("backward_passes_per_step") or 1
    transport = planner.nccl_transport(size)
    grad = float(world["gradient_mbytes"]) * 1e6
    # The launcher sets HOROVOD_HIERARCHICAL_ALLREDUCE=0 (launcher/interconnect.py): the ring model.
    efficiency = planner.efficiency(processes, per_node, batch, facts.gpu_images_per_sec, grad, transport, False)
    predicted = efficiency * processes * facts.gpu_images_per_sec
    planned_seconds = images / predicted
    return {
        "gpu_images_per_sec": facts.gpu_images_per_sec,
        "processes": processes,
        "per_node": per_node,
        "batch_per_step": batch,
        "gradient_mbytes": world["gradient_mbytes"],
        "efficiency": efficiency,
        "predicted_images_per_sec": predicted,
        "measured_images_per_sec": measured,
        "speed_ratio": measured / predicted if measured else None,
        "planned_training_seconds": planned_seconds,
        "planned_usd": planned_seconds * per_second,
        "ledger_training_usd": training_seconds * per_second,
        "cost_ratio": training_seconds / planned_seconds if planned_seconds else None,
        "note": f"ring allreduce over {processes} GPUs at batch {batch}, {efficiency:.0%} efficiency; "
        "its figure is steps only, the ledger's training is the held time after start-up",
    }


# ---- printing ---------------------------------------------------------------------------------------------------


def _money(usd: float | None) -> str:
    return "?" if usd is None else f"${usd:,.2f}"


def render(book: dict[str, Any]) -> str:
    price = book["price"]
    nodes = book["nodes"]
    lines = [
        f"cost of job {book['job']} ({book['status']}) on {book['compute'] or '?'}: {nodes} x {price['vm_size']}, "
        f"{book['priority']}",
        f"price: ${price['usd_per_node_hour']:.3f}/node-hour ({price['kind']}) in {price['region']}, "
        f"{'dated ' + price['date'] if price['date'] else 'undated'} ({price['source']})"
        + (
            ""
            if price["region"] == price["job_region"]
            else f" -- NOT the job's region ({price['job_region'] or 'unknown'}): `python -m launcher.prices "
            f"--refresh {price['job_region'] or 'REGION'}`"
        ),
        f"history: {book['history']}" + (f"; as of {book['as_of'][:19]}Z" if book["end"] is None else ""),
        "",
        f"{'':22}{'time':>10}{'node-hours':>12}{'cost':>12}",
    ]
    names = {
        "queue": "queue",
        "preparation": "preparation",
        "startup": "start-up",
        "training": "training",
        "lost_to_preemption": "lost to preemption",
    }
    for key, label in names.items():
        p = book["phases"][key]
        charged = key in ("startup", "training", "lost_to_preemption") and p["seconds"] is not None
        hours = p["seconds"] * nodes / 3600 if charged else None
        lines.append(
            f"{label:22}{clock(p['seconds']):>10}{'--' if hours is None else f'{hours:.2f}':>12}{_money(p['usd']):>12}"
            f"  {p['note']}"
        )
    t = book["total"]
    lines.append(
        f"{'total':22}{clock(t['held_seconds']):>10}{t['node_hours']:>12.2f}{_money(t['usd']):>12}  nodes held"
    )
    idle = book["idle_before_scale_down"]
    if idle:
        lines.append(
            f"{'idle before scale-down':22}{clock(idle['seconds']):>10}{idle['seconds'] * nodes / 3600:>12.2f}"
            f"{_money(idle['usd_at_most']):>12}  at most: {idle['note']}"
        )
    since = book["since_last_checkpoint"]
    if since:
        lines.append(
            f"{'since last checkpoint':22}{clock(since['seconds']):>10}{'':12}{_money(since['usd']):>12}  {since['note']}"
        )
    lines.append("")
    per = book["per"]
    if per["epochs_done"]:
        lines.append(
            f"per epoch: {_money(per['usd_per_epoch'])} all in, {_money(per['training_usd_per_epoch'])} of training "
            f"({per['epochs_done']} epoch(s) done"
            + (f" of {per['epochs_target']})" if per["epochs_target"] else ")")
            + (
                f"; per million images: {_money(per['usd_per_million_images'])} ({per['images'] / 1e6:.3f} M images)"
                if per["images"]
                else ""
            )
        )
    else:
        lines.append(
            "per epoch: no epoch recorded" + ("" if book["sources"].get("metrics") else " (no metrics.json read)")
        )
    proj = book["projection"]
    if proj:
        if "usd_total" in proj:
            lines.append(
                f"to finish: {clock(proj['seconds_left'])} more, {_money(proj['usd_more'])}; projected total "
                f"{_money(proj['usd_total'])} ({proj['note']})"
            )
        else:
            lines.append(f"to finish: {proj['note']}")
    plan = book["planner"]
    if plan and "predicted_images_per_sec" in plan:
        lines.append(
            f"planner: {plan['predicted_images_per_sec']:,.0f} images/sec predicted, {plan['measured_images_per_sec'] or 0:,.0f} "
            f"measured ({plan['speed_ratio'] or 0:.2f}x); training {clock(plan['planned_training_seconds'])} "
            f"{_money(plan['planned_usd'])} planned vs {clock(book['phases']['training']['seconds'])} "
            f"{_money(plan['ledger_training_usd'])} in the ledger ({plan['cost_ratio']:.2f}x); {plan['note']}"
        )
    elif plan:
        lines.append(f"planner: {plan['note']}")
    for key, value in book["sources"].items():
        lines.append(f"{key}: {value}")
    lines += [f"note: {n}" for n in book["notes"]]
    return "\n".join(lines)


# ---- a local run (launcher/local.py) -------------------------------------------------------------------------------


def local_split(metrics_path: pathlib.Path, wall_seconds: float) -> dict[str, Any]:
    """A local run's time split as the ledger splits a job's held time: start-up (the payload's startup_seconds),
    training (the rest of the run). No queue, no preparation, no money. metrics.json, or its spare copy when a
    crash cut it short (payloads/common/metrics.py)."""
    data = None
    for candidate in (metrics_path, metrics_path.with_name(f".{metrics_path.name}.spare")):
        try:
            data = json.loads(candidate.read_text())
            break
        except (OSError, ValueError):
            continue
    summary = (data or {}).get("summary") or {}
    epochs = [e for e in (data or {}).get("epochs", []) if isinstance(e, dict)]
    raw = summary.get("startup_seconds")
    startup = min(wall_seconds, float(raw)) if isinstance(raw, (int, float)) else None
    return {
        "wall_seconds": wall_seconds,
        "startup_seconds": startup,
        "training_seconds": wall_seconds - (startup or 0.0),
        "epochs": len(epochs),
        "images": sum(int(e.get("images") or 0) for e in epochs),
        "in_epochs_seconds": sum(float(e.get("epoch_seconds") or 0.0) for e in epochs),
        "metrics": str(metrics_path) if data is not None else None,
    }


def render_local(split: dict[str, Any]) -> str:
    if split["metrics"] is None:
        return f"time: {clock(split['wall_seconds'])} in all; no metrics.json, so no split"
    startup = split["startup_seconds"]
    return (
        f"time: {clock(split['wall_seconds'])} in all = start-up {clock(startup)} "
        f"({'the payload start to its first timed step' if startup is not None else 'not recorded: the payload did not finish'})"
        f" + training {clock(split['training_seconds'])} ({split['epochs']} epoch(s), {split['images']:,} images; "
        f"{clock(split['in_epochs_seconds'])} of it inside the epochs' timed loops)"
    )


# ---- reading the job from Azure -----------------------------------------------------------------------------------


def _status(value) -> str:
    return str(getattr(value, "value", value) or "")


def run_details(ml, name: str) -> dict[str, Any]:
    """Run history's details of the job as Azure answers them (the fields azure-ai-ml's model drops kept), through
    azure-ai-ml's own run-history client: the call ml.jobs.stream() polls."""
    runs = ml.jobs._runs_operations
    scope = runs._operation_scope
    return runs._operation.get_details(
        scope.subscription_id,
        scope.resource_group_name,
        runs._workspace_name,
        name,
        cls=lambda response, _deserialized, _headers: response.http_response.json(),
    )


def read_status_log(credential, workspace_id: str, name: str, since: dt.datetime, transport=None):
    """Every status change of run `name` from AmlRunStatusChangedEvent (Log Analytics query API: POST
    /v1/workspaces/{id}/query, answer {"tables": [{"columns": [{"name", "type"}], "rows": [[...]]}]})."""
    from azure.core import PipelineClient
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
    from azure.core.pipeline import policies
    from azure.core.rest import HttpRequest

    client = PipelineClient(
        base_url=LOGS_ENDPOINT,
        transport=transport,
        policies=[
            policies.RequestIdPolicy(),
            policies.HeadersPolicy(),
            policies.UserAgentPolicy("azure-horovod-training-cost"),
            policies.RetryPolicy(),
            policies.BearerTokenCredentialPolicy(credential, LOGS_SCOPE),
            policies.RedirectPolicy(),
        ],
    )
    query = (
        f'AmlRunStatusChangedEvent | where RunId == "{name}" | project TimeGenerated, Status '
        "| order by TimeGenerated asc"
    )
    frm = (since - dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    request = HttpRequest(
        "POST",
        f"{LOGS_ENDPOINT}/v1/workspaces/{workspace_id}/query",
        json={"query": query, "timespan": f"{frm}/{utcnow().strftime('%Y-%m-%dT%H:%M:%SZ')}"},
    )
    response = client.send_request(request)
    if response.status_code == 401:
        raise ClientAuthenticationError(response=response)
    if response.status_code != 200:
        raise HttpResponseError(response=response)
    tables = response.json().get("tables") or []
    out = []
    for table in tables[:1]:
        columns = [c["name"] for c in table.get("columns", [])]
        for row in table.get("rows", []):
            record = dict(zip(columns, row))
            when, status = parse_time(record.get("TimeGenerated")), record.get("Status")
            if when and status:
                out.append((when, str(status)))
    return out


def _blob_folder(outputs: StackOutputs, path: str | None) -> str | None:
    """The folder inside the logs container that an output's azureml:// path names, or None elsewhere."""
    head = f"azureml://datastores/{outputs.datastore('logs')}/paths/"
    if not path or not path.startswith(head):
        return None
    return path[len(head) :].strip("/") + "/"


def _container(outputs: StackOutputs, credential):
    from azure.storage.blob import ContainerClient

    logs = outputs["datastores"]["logs"]
    return ContainerClient(f"https://{logs['account']}.blob.core.windows.net", logs["container"], credential=credential)


def read_metrics(outputs: StackOutputs, folder: str, credential) -> dict | None:
    """metrics.json of a run folder in the logs container, or its spare copy when a crash cut it short
    (payloads/common/metrics.py); None when there is neither."""
    from azure.core.exceptions import ResourceNotFoundError

    client = _container(outputs, credential)
    for name in ("metrics.json", ".metrics.json.spare"):
        try:
            data = json.loads(client.download_blob(folder + name).readall())
        except (ResourceNotFoundError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def read_checkpoint_times(outputs: StackOutputs, folder: str, credential) -> list[tuple[dt.datetime, int | None]]:
    """(time, epoch) of every checkpoint completion marker under the folder's checkpoints/, every version the
    container keeps: the payload rotates old checkpoints out and their versions stay 7 days (docs/jobs.md). Without
    markers (a payload older than them), the checkpoint files' own times."""
    markers, files = [], []
    for blob in _container(outputs, credential).list_blobs(
        name_starts_with=folder + "checkpoints/", include=["versions"]
    ):
        m = MARKER.search(blob.name)
        (markers if m else files).append((blob.last_modified.astimezone(dt.UTC), int(m.group(1)) if m else None))
    return sorted(set(markers or files))


def _describe(error: Exception, doing: str) -> str:
    from .checks.arm import describe

    return describe(error, doing)


def gather(
    name: str,
    outputs: StackOutputs,
    ml=None,
    credential=None,
    status_log: str | None = None,
    metrics_file: pathlib.Path | None = None,
    gpu_images_per_sec: float | None = None,
    price_per_node_hour: float | None = None,
    now: dt.datetime | None = None,
    status_log_from: str = "--status-log",
) -> Facts:
    """Read the job, its cluster, run history, the status log and its output folder; JobError when the job, its
    size or its price cannot be found (naming the fix). What is merely unreadable becomes a note. `status_log_from`:
    where the status log's workspace id came from, said in the ledger's sources."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    ws, rg = outputs["workspace_name"], outputs["resource_group"]
    if not JOB_NAME.match(name):
        raise JobError(
            f"{name!r} is not an Azure ML job name (letters, digits, _ and -, e.g. witty_jackal_3d4kq79d3v): "
            "copy it from the studio or `az ml job list`"
        )
    if status_log is not None and not GUID.match(status_log):
        raise JobError(
            f"{status_log_from} {status_log!r}: expected the Log Analytics workspace's id (a GUID): `az monitor "
            "log-analytics workspace show -g <group> -n <name> --query customerId -o tsv`"
        )
    if credential is None:
        from .credential import azure_credential

        credential = azure_credential()
    if ml is None:
        from azure.ai.ml import MLClient

        ml = MLClient(credential, outputs["subscription_id"], rg, ws)
    now = now or utcnow()
    try:
        job = ml.jobs.get(name)
    except ResourceNotFoundError:
        raise JobError(
            f"workspace {ws} has no job {name}: check the name (`az ml job list -g {rg} -w {ws} --query "
            "[].name -o tsv`) and that the stack outputs are this workspace's"
        ) from None
    except AzureError as e:
        raise JobError(_describe(e, f"reading job {name} in workspace {ws}")) from None
    try:
        run = run_details(ml, name)
    except ResourceNotFoundError:
        run = {}
    except AzureError as e:
        raise JobError(_describe(e, f"reading run history of job {name}")) from None
    notes: list[str] = []
    sources = {"job": f"workspace {ws}, job {name}"}
    status = _status(job.status) or str(run.get("status") or "")
    created = parse_time(run.get("createdTimeUtc")) or getattr(job.creation_context, "created_at", None)
    if created is None:
        raise JobError(f"job {name}: neither the job nor run history records when it was created")
    created = created.astimezone(dt.UTC)

    compute_name = str(job.compute or "").rsplit("/", 1)[-1]
    cluster = None
    if compute_name:
        try:
            cluster = ml.compute.get(compute_name)
        except ResourceNotFoundError:
            notes.append(f"cluster {compute_name} no longer exists: its scale-down settings are unknown")
        except AzureError as e:
            notes.append(_describe(e, f"cluster {compute_name} not read"))
    ran_on = run.get("compute") or {}
    vm_size = ran_on.get("vmSize") or getattr(cluster, "size", None)
    if not vm_size:
        raise JobError(
            f"job {name}: no VM size: run history records none and cluster {compute_name or '(none)'} was not "
            "read; the ledger prices command jobs on a compute cluster"
        )
    priority = ran_on.get("priority")
    if priority:  # run history: "Dedicated", "LowPriority"
        low = any(word in str(priority).lower() for word in ("low", "spot"))
    else:
        low = getattr(cluster, "tier", "") == "low_priority"
    nodes = ran_on.get("instanceCount") or getattr(getattr(job, "resources", None), "instance_count", None) or 1
    region = getattr(cluster, "location", None) or outputs.values.get("location")
    if price_per_node_hour is not None:
        quote = prices.Quote(
            vm_size=vm_size,
            per_node_hour=price_per_node_hour,
            kind="given",
            region=region or "unknown",
            wanted_region=region or "unknown",
            date=None,
            source="--price-per-node-hour",
            no_low_priority_price=False,
        )
    else:
        quote, missing = prices.quote(vm_size, low, region, prices.TABLE)
        if quote is None:
            raise JobError(f"job {name}: {missing}, or pass --price-per-node-hour USD")
    scale_min = getattr(cluster, "min_instances", None)
    idle = getattr(cluster, "idle_time_before_scale_down", None)
    facts = Facts(
        name=name,
        status=status,
        created=created,
        now=now,
        nodes=int(nodes),
        vm_size=vm_size,
        low_priority=low,
        quote=quote,
        run=run,
        compute=compute_name,
        min_nodes=None if scale_min is None else int(scale_min),
        idle_seconds=None if idle is None else float(idle),
        gpu_images_per_sec=gpu_images_per_sec,
        sources=sources,
        notes=notes,
    )
    if status_log:
        try:
            facts.transitions = read_status_log(credential, status_log, name, created) or None
            sources["status log"] = (
                f"Log Analytics workspace {status_log} ({status_log_from}): {len(facts.transitions or [])} status "
                "change(s)"
            )
            if not facts.transitions:
                notes.append(
                    f"the status log has no AmlRunStatusChangedEvent for {name}: is the workspace's diagnostic "
                    "setting sending it there (it arrives minutes late)?"
                )
        except AzureError as e:
            notes.append(
                _describe(e, f"status log not read from Log Analytics workspace {status_log} ({status_log_from})")
                + " (the Azure ML workspace needs a diagnostic setting that sends AmlRunStatusChangedEvent there, "
                "and you need Log Analytics Reader on it)"
            )
    output = getattr((job.outputs or {}).get("run"), "path", None)
    from .jobspec import earlier_output_path

    folder = _blob_folder(outputs, earlier_output_path(output, name) if output else None)
    facts.own_folder = folder is None or folder.rstrip("/").endswith("/" + name)
    if metrics_file is not None:
        try:
            facts.metrics = json.loads(metrics_file.read_text())
            sources["metrics"] = str(metrics_file)
        except (OSError, ValueError) as e:
            raise JobError(f"--metrics {metrics_file}: not a readable metrics.json ({e})") from None
    logs = outputs["datastores"]["logs"]
    if folder is None:
        notes.append("the job's output `run` is not in the logs container: no metrics.json or checkpoint times")
    elif not logs.get("account") or not logs.get("container"):
        notes.append(
            "the stack outputs lack datastores.logs.account and .container (a stack older than this tool): no "
            "metrics.json or checkpoint times; run pulumi up and write the outputs again, or pass --metrics FILE"
        )
    else:
        account = f" (storage account {logs.get('account')})"
        where = f"{logs.get('container')}/{folder}"
        fix = f"pass --metrics FILE (`az ml job download -n {name} --output-name run -g {rg} -w {ws}`)"
        if metrics_file is None:
            try:
                facts.metrics = read_metrics(outputs, folder, credential)
                sources["metrics"] = (
                    f"{where}metrics.json" if facts.metrics else f"no metrics.json in {where}"
                ) + account
            except AzureError as e:
                notes.append(
                    _describe(e, f"{where}metrics.json{account} not read")
                    + f": epochs, images and start-up unknown; {fix}"
                )
        try:
            facts.checkpoints = read_checkpoint_times(outputs, folder, credential)
            sources["checkpoints"] = f"{len(facts.checkpoints)} checkpoint time(s) in {where}checkpoints/{account}"
        except AzureError as e:
            notes.append(_describe(e, f"{where}checkpoints/{account} not listed") + ": checkpoint times unknown")
    return facts


def after_watch(ml, name: str, outputs: StackOutputs) -> None:
    """The ledger at the end of a followed job; a failure to compute it is one line, never the job's exit status."""
    try:
        print(render(ledger(gather(name, outputs, ml=ml))), flush=True)
    except JobError as e:
        print(f"cost: not computed: {e}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("cost: skipped (interrupted)", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001  the job has ended; its ledger is extra
        print(
            f"cost: not computed ({type(e).__name__}: {e}); later: python -m launcher cost {name} --stack-outputs ...",
            file=sys.stderr,
            flush=True,
        )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher cost",
        description="The cost ledger of an Azure ML job: time and money per phase (docs/jobs.md#what-a-job-cost).",
    )
    p.add_argument("job", help="the job's name (its run id), e.g. witty_jackal_3d4kq79d3v")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--stack-outputs", type=pathlib.Path, help="JSON from `pulumi stack output --json`")
    src.add_argument("--stack", help="ask the Pulumi CLI for this stack's outputs")
    p.add_argument("--json", type=pathlib.Path, metavar="PATH", help="also write the ledger as JSON here")
    p.add_argument(
        "--status-log",
        metavar="WORKSPACE_ID",
        help="the Log Analytics workspace (its id, a GUID) that receives the Azure ML workspace's "
        f"AmlRunStatusChangedEvent log: splits queue from preparation and places each requeue (default: the stack "
        f"output {STATUS_LOG_OUTPUT})",
    )
    p.add_argument("--metrics", type=pathlib.Path, help="a metrics.json to use instead of the output folder's")
    p.add_argument(
        "--gpu-images-per-sec",
        type=float,
        help="one GPU's measured images/sec for this model and batch: the planner's estimate beside the ledger",
    )
    p.add_argument("--price-per-node-hour", type=float, metavar="USD", help="instead of launcher/vm_prices.csv")
    return p


def default_status_log(given: str | None, outputs: StackOutputs) -> tuple[str | None, str]:
    """(the Log Analytics workspace id to read the status log from, where it came from): --status-log, else the
    stack output (the platform stack's own Log Analytics workspace, which its diagnostic setting feeds), else none."""
    if given is not None:
        return given, "--status-log"
    found = outputs.values.get(STATUS_LOG_OUTPUT)
    if found:
        return str(found), f"the stack output {STATUS_LOG_OUTPUT}"
    return None, "none"


def main(argv: list[str]) -> int:
    from . import stack

    args = parser().parse_args(argv)
    try:
        outputs = stack.load_file(args.stack_outputs) if args.stack_outputs else stack.load_from_pulumi(args.stack)
        status_log, status_log_from = default_status_log(args.status_log, outputs)
        facts = gather(
            args.job,
            outputs,
            status_log=status_log,
            metrics_file=args.metrics,
            gpu_images_per_sec=args.gpu_images_per_sec,
            price_per_node_hour=args.price_per_node_hour,
            status_log_from=status_log_from,
        )
        if status_log is None:
            facts.notes.append(
                f"no status log: the stack outputs have no {STATUS_LOG_OUTPUT} (a stack deployed before the "
                "workspace's diagnostic setting: run pulumi up and write the outputs again), and no --status-log "
                "WORKSPACE_ID was given"
            )
        book = ledger(facts)
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(book))
    if args.json:
        args.json.write_text(json.dumps(book, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
