"""The ledger as text: a table of the phases, then per epoch, the projection, the planner and the sources."""

from __future__ import annotations

from typing import Any

from .ledger import clock


def _money(usd: float | None) -> str:
    return "?" if usd is None else f"${usd:,.2f}"


def render(book: dict[str, Any]) -> str:
    """The heading and the table of phases, then what follows it (_below)."""
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
    return "\n".join(lines + [""] + _below(book))


def _below(book: dict[str, Any]) -> list[str]:
    """Per epoch, the projection to finish, the planner's estimate, the sources and the notes."""
    lines = []
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
    return lines + [f"note: {n}" for n in book["notes"]]
