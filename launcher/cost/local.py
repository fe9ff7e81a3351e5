"""A local run's time split the way the ledger splits a job's held time (launcher/local.py prints it)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from .ledger import clock


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
