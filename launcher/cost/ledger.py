"""The ledger: pure arithmetic on what was read (history.gather reads it; tests build Facts by hand).

Money is the time the job held nodes (Running, Finalizing, CancelRequested) x nodes x the dated price of its VM
size and priority in launcher/vm_prices.csv (launcher/prices.py). The split:

    queue         NotStarted, Starting, Provisioning, Queued (and a requeue's wait): no node is held for the job
    preparation   Preparing (the environment; the image is prebuilt, so mostly its lookup)
    start-up      per start, the payload's startup_seconds: its process start to its first timed step
    training      the rest of the held time
    lost          per requeue (a preemption on a low-priority cluster): the held time after the last checkpoint
                  completed in that stretch, or the whole stretch after its start-up when no checkpoint time is
                  known (the ledger says which)
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from .. import prices

HELD = ("Running", "Finalizing", "CancelRequested")  # the job's nodes are allocated: charged
PREPARING = ("Preparing",)
TERMINAL = ("Completed", "Failed", "Canceled", "NotResponding")
DURATION = re.compile(r"^(?:(\d+)\.)?(\d+):(\d\d):(\d\d(?:\.\d+)?)$")  # .NET TimeSpan: [d.]hh:mm:ss[.fffffff]


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
    startup = (metrics.get("summary") or {}).get("startup_seconds")
    if not isinstance(startup, (int, float)):
        startup = None
    held = _held(facts, end, notes)
    times = None if facts.checkpoints is None else sorted(when for when, _ in facts.checkpoints)
    lost_method = _losses(held.stretches, startup, times)
    stretches = held.stretches
    seconds = sum(s.seconds for s in stretches)
    training = seconds - sum(s.startup for s in stretches) - sum(s.lost or 0.0 for s in stretches)
    total = {"held_seconds": seconds, "node_hours": seconds * facts.nodes / 3600, "usd": seconds * per_second}
    epochs = _this_jobs_epochs(facts, end, notes)
    if facts.quote.no_low_priority_price:
        notes.append(
            f"the cluster is low priority but the table has no low-priority price for {facts.quote.vm_size}: priced "
            "at the dedicated rate, an upper bound"
        )
    return {
        "job": facts.name,
        "status": facts.status,
        "compute": facts.compute,
        "nodes": facts.nodes,
        "vm_size": facts.vm_size,
        "priority": "low priority" if facts.low_priority else "dedicated",
        "created": facts.created.isoformat(),
        "first_start": held.first_start.isoformat() if held.first_start else None,
        "end": end.isoformat() if terminal else None,
        "as_of": facts.now.isoformat(),
        "history": held.history,
        "sources": facts.sources,
        "price": _price(facts),
        "phases": _phases(facts, held, startup, training, per_second, lost_method),
        "total": total,
        "idle_before_scale_down": _idle(facts, terminal, seconds, per_second),
        "since_last_checkpoint": _since_checkpoint(facts, stretches, times, per_second),
        "starts": sum(s.starts for s in stretches),
        "requeues": _requeues(stretches),
        "stretches": [_stretch_record(s) for s in stretches],
        "per": _per(metrics, epochs, total["usd"], training * per_second),
        "projection": None
        if terminal
        else _projection(facts, metrics, epochs, stretches, times, end, total["usd"], per_second),
        "planner": planner_estimate(facts, epochs, training, per_second) if facts.metrics else None,
        "notes": notes,
    }


@dataclass
class Held:
    """When the job held its nodes and waited, and what told us."""

    queue: float
    preparation: float | None  # None: run history alone cannot tell it from the queue
    stretches: list[Stretch]
    history: str
    first_start: dt.datetime | None


def _held(facts: Facts, end: dt.datetime, notes: list[str]) -> Held:
    """From the status log where it was read (each status change), else from run history's totals."""
    if facts.transitions:
        queue, preparation, stretches = _stretches_from_log(facts, end)
        held_log = sum(s.seconds for s in stretches)
        reported = parse_duration(facts.run.get("computeDuration")) if facts.status in TERMINAL else None
        if reported is not None and abs(reported - held_log) > max(60.0, 0.05 * reported):
            notes.append(
                f"the status log holds nodes for {clock(held_log)}, run history's computeDuration says "
                f"{clock(reported)}: charged from the status log"
            )
        history = "status log (AmlRunStatusChangedEvent in Log Analytics) and run history"
        return Held(queue, preparation, stretches, history, stretches[0].start if stretches else None)
    before, between, stretches = _held_from_history(facts, end, notes)
    history = "run history only (no status log): queue and preparation are one figure"
    return Held(before + between, None, stretches, history, parse_time(facts.run.get("startTimeUtc")))


def _requeues(stretches: list[Stretch]) -> int:
    return sum(s.starts if s.lost is None else 1 for s in stretches if s.requeued)


def _losses(stretches: list[Stretch], startup: float | None, times: list[dt.datetime] | None) -> str | None:
    """Sets each stretch's start-up and the time a requeue lost (after the last checkpoint in it); returns how the
    loss was counted."""
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
    return lost_method


def _phases(
    facts: Facts, held: Held, startup: float | None, training: float, per_second: float, lost_method: str | None
) -> dict[str, dict[str, Any]]:
    stretches = held.stretches
    startups = sum(s.startup for s in stretches)
    unknown_loss = any(s.lost is None for s in stretches)
    lost = sum(s.lost or 0.0 for s in stretches)
    requeues = _requeues(stretches)
    if facts.min_nodes == 0:
        waiting_note = (
            f"not charged: {facts.compute or 'the cluster'} scales to zero, no node is held while the job waits"
        )
    elif facts.min_nodes:
        waiting_note = (
            f"not charged to the job: the cluster keeps {facts.min_nodes} node(s) on whether or not jobs wait"
        )
    else:
        waiting_note = "not charged: no node is held for the job while it waits"
    if held.preparation is not None:
        prep = _phase(held.preparation, 0.0, "not charged: no node is held for the job while Azure ML prepares it")
    else:
        prep = _phase(None, None, "in the queue figure: run history has no per-status times (pass --status-log)")
        waiting_note += "; includes preparation and any wait between starts"
    starts = sum(s.starts for s in stretches)
    return {
        "queue": _phase(held.queue, 0.0, waiting_note),
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
            None if unknown_loss else lost,
            None if unknown_loss else lost * per_second,
            f"{requeues} requeue(s): {lost_method}" if requeues else "no requeue",
        ),
    }


def _idle(facts: Facts, terminal: bool, held: float, per_second: float) -> dict[str, Any] | None:
    if not (terminal and facts.min_nodes == 0 and facts.idle_seconds and held > 0):
        return None
    return {
        "seconds": facts.idle_seconds,
        "usd_at_most": facts.idle_seconds * per_second,
        "note": f"the nodes wait {facts.idle_seconds:.0f} s (nodeIdleTimeBeforeScaleDown) before the cluster "
        "scales down, charged unless another job takes them",
    }


def _per(metrics: dict[str, Any], epochs: list[dict], usd: float, training_usd: float) -> dict[str, Any]:
    done = len({e.get("epoch") for e in epochs})
    images = sum(int(e.get("images") or 0) for e in epochs)
    return {
        "epochs_done": done,
        "epochs_target": _target(metrics),
        "images": images,
        "usd_per_epoch": usd / done if done else None,
        "training_usd_per_epoch": training_usd / done if done else None,
        "usd_per_million_images": usd / images * 1e6 if images else None,
    }


def _target(metrics: dict[str, Any]):
    return ((metrics.get("run") or {}).get("config") or {}).get("epochs")


def _projection(
    facts: Facts,
    metrics: dict[str, Any],
    epochs: list[dict],
    stretches: list[Stretch],
    times: list[dt.datetime] | None,
    end: dt.datetime,
    usd: float,
    per_second: float,
) -> dict[str, Any]:
    """A running job's cost to finish: the epochs left at the recorded epochs' mean, less the current one's part."""
    epoch_seconds = [float(e["epoch_seconds"]) for e in epochs if isinstance(e.get("epoch_seconds"), (int, float))]
    target = _target(metrics)
    recorded = max((int(e.get("epoch") or 0) for e in (metrics.get("epochs") or []) if isinstance(e, dict)), default=0)
    if not (isinstance(target, int) and epoch_seconds and recorded < target):
        return {
            "note": "nothing to project from: no finished epoch recorded yet"
            if not epoch_seconds
            else f"all {target} epochs recorded"
            if isinstance(target, int)
            else "metrics.json gives no --epochs target",
        }
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
    return {
        "epochs_left": remaining,
        "seconds_per_epoch": mean,
        "seconds_into_current_epoch": done_of_current,
        "seconds_left": left,
        "usd_more": more,
        "usd_total": usd + more,
        "note": f"{remaining} epoch(s) of {target} left at the {len(epoch_seconds)} recorded epochs' mean "
        f"{clock(mean)}, less {clock(done_of_current)} into the current one; without further preemptions, "
        "evaluation or checkpoint time",
    }


def _since_checkpoint(
    facts: Facts, stretches: list[Stretch], times: list[dt.datetime] | None, per_second: float
) -> dict[str, Any] | None:
    """A failed or cancelled job's held time since its last checkpoint: what a --resume-from job redoes."""
    if facts.status not in ("Failed", "Canceled", "NotResponding") or not stretches or times is None:
        return None
    last = stretches[-1]
    if last.end is None:
        return None
    inside = [t for t in times if last.start and last.start <= t <= last.end]
    since = (last.end - max(inside)).total_seconds() if inside else last.seconds
    return {
        "seconds": since,
        "usd": since * per_second,
        "note": "held time since the last checkpoint: a --resume-from job redoes it",
    }


def _price(facts: Facts) -> dict[str, Any]:
    quote = facts.quote
    return {
        "usd_per_node_hour": quote.per_node_hour,
        "kind": quote.kind,
        "vm_size": quote.vm_size,
        "region": quote.region,
        "job_region": quote.wanted_region,
        "date": quote.date,
        "source": quote.source,
        "line": quote.line(facts.nodes),
    }


def _stretch_record(s: Stretch) -> dict[str, Any]:
    return {
        "start": s.start.isoformat() if s.start else None,
        "end": s.end.isoformat() if s.end else None,
        "seconds": s.seconds,
        "starts": s.starts,
        "requeued": s.requeued,
        "startup_seconds": s.startup,
        "lost_seconds": s.lost,
        "last_checkpoint": s.last_checkpoint.isoformat() if s.last_checkpoint else None,
    }


def _phase(seconds: float | None, usd: float | None, note: str) -> dict[str, Any]:
    return {"seconds": seconds, "usd": usd, "note": note}


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def planner_estimate(facts: Facts, epochs: list[dict], training_seconds: float, per_second: float) -> dict[str, Any]:
    """The scaling model's predicted images/sec (trainingplatform/scaling.py, what benchmarks/planner.py prints) for this job's GPUs, batch and gradient size beside what the job
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
    from trainingplatform import scaling, vm_sizes

    size = vm_sizes.lookup(facts.vm_size)
    processes, per_node = world.get("processes"), world.get("local_processes")
    if size is None or not size.gpus:
        return {"note": f"the planner models GPU clusters; {facts.vm_size} has no GPU in the catalog"}
    if not processes or not per_node or not world.get("gradient_mbytes") or not images:
        return {"note": "metrics.json lacks the world (processes, gradient_mbytes) or any epoch: nothing to plan"}
    batch = config.get("batch_size") or (config.get("global_batch_size") or 0) // processes
    batch *= config.get("backward_passes_per_step") or 1
    transport = scaling.nccl_transport(size)
    grad = float(world["gradient_mbytes"]) * 1e6
    # The launcher sets HOROVOD_HIERARCHICAL_ALLREDUCE=0 (launcher/interconnect.py): the ring model.
    efficiency = scaling.efficiency(processes, per_node, batch, facts.gpu_images_per_sec, grad, transport, False)
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
