"""Run metrics: one JSON file per run, rewritten after every epoch by rank 0 (crash-safe without rename), and the same
params and metrics in MLflow when the environment configures it (Azure ML does: see tracking.py).

Schema (stable; the jobs and benchmarks read it):
    {"run": {...config and world...}, "epochs": [{"epoch", "train_loss", "train_accuracy",
     "val_loss", "val_accuracy", "images_per_sec", "epoch_seconds", "lr"}...],
     "summary": {"total_images_per_sec", "images", "train_seconds", ...}}
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

from . import durable, tracking


class MetricsFile:
    """Rank 0's record of the run. Constructing it starts the MLflow run (params = the flattened `run`),
    so every payload that writes metrics.json is tracked the same way; run["config"]["mlflow"] False
    (--no-mlflow) leaves MLflow out."""

    def __init__(self, path: pathlib.Path, run: dict[str, Any]):
        self.path = path
        self.tracker = tracking.start(run)
        self.data: dict[str, Any] = {"run": run, "epochs": [], "summary": {}}
        old = read(path)  # a resumed run keeps the epochs it already has
        if old is not None:
            self.data["epochs"] = list(old.get("epochs", []))

    def add_epoch(self, record: dict[str, Any]) -> None:
        self.data["epochs"] = [e for e in self.data["epochs"] if e.get("epoch") != record["epoch"]]
        self.data["epochs"].append(record)
        self.write()
        if self.tracker:
            self.tracker.epoch(record)

    def set_summary(self, summary: dict[str, Any]) -> None:
        self.data["summary"] = summary
        self.write()
        if self.tracker:
            self.tracker.summary(summary)  # the final throughput; ends the MLflow run

    def write(self) -> None:
        """Without rename (the logs mount may not have an atomic one, see durable.py): the whole new text goes to
        the spare copy first, then over metrics.json. A crash while either is written leaves the other whole,
        and read() takes whichever parses, so a resume never loses the epochs already recorded."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = (json.dumps(self.data, indent=2, sort_keys=True) + "\n").encode()
        durable.write_bytes(spare_for(self.path), text)
        durable.write_bytes(self.path, text)


def spare_for(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(f".{path.name}.spare")


def read(path: pathlib.Path) -> dict[str, Any] | None:
    """The recorded metrics: metrics.json, or its spare copy when a crash cut metrics.json short."""
    for candidate in (path, spare_for(path)):
        try:
            data = json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def throughput_line(images_per_sec: float) -> str:
    """The line every payload ends with; benchmarks and job logs grep for it."""
    return f"Total images/sec: {images_per_sec:.1f}"


def say(*lines: str) -> None:
    """Print lines to stdout in one write: unbuffered (horovodrun sets PYTHONUNBUFFERED), print() writes the
    text and its newline separately, and mpirun's output tagging puts a stray "[1,0]<stdout>:" between them."""
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def finish(
    cfg,
    hvd,
    metrics: MetricsFile | None,
    digest: str,
    epochs_run: int,
    images: int,
    seconds: float,
    extra: dict[str, Any] | None = None,
) -> dict:
    """The run's summary, with every rank's parameter digest (allgathered, so a test or a suspicious user can
    see the ranks agree); rank 0 (the one holding `metrics`) records it and prints the closing lines. `images`
    and `seconds` are what the throughput is computed from (steady state where the payload measures it);
    `extra` adds keys such as startup_seconds."""
    summary = {
        "epochs_run": epochs_run,
        "images": images,
        "train_seconds": seconds,
        "total_images_per_sec": images / seconds if seconds else 0.0,
        "parameters_sha256": digest,
        **(extra or {}),
    }
    digests = hvd.allgather_object(digest, name="digests")
    summary["ranks_identical"] = len(set(digests)) == 1
    if metrics is not None:
        metrics.set_summary(summary)
        lines = [throughput_line(summary["total_images_per_sec"])] if seconds else []
        lines += [
            f"Checkpoints: {cfg.checkpoint_dir}",
            f"TensorBoard: {cfg.tensorboard_dir}",
            f"Metrics: {cfg.metrics_path}",
        ]
        say(*lines)
    return summary
