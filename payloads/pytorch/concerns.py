"""What every PyTorch run does around the step, one object per concern, each attached to the loop's named events
(loop.py lists them in the order they fire). A concern defines only the events it needs, as methods taking the
run (loop.Run) and the event's arguments; `for_run` lists the concerns of a run, in the order each event reaches
them. The watchdog, stragglers and checkpoints are every framework's (payloads/common/concerns.py); the clock,
progress and outputs are PyTorch's, here. Adding a concern: write one class and add it to that list; nothing
else changes (docs/payload-contract.md#a-new-concern)."""

from __future__ import annotations

import logging
import os
import time
from functools import partial

import torch
from tqdm import tqdm

from ..common.concerns import Checkpoints, Stragglers, Watch
from ..common.metrics import MetricsFile, finish
from . import ema, models, runtime
from .sentinel import Replicas

log = logging.getLogger("payloads.pytorch")
PROGRESS_EVERY = 25  # steps between the progress bar's loss readings (each one waits for the device)


class Clock:
    """Steady-state timing. The first `startup_steps` steps of a run (loader workers starting, cuDNN autotuning,
    compilation) are start-up: timed apart and left out of the throughput. Reads the device clock only at the
    end of start-up and of each epoch."""

    def __init__(self, device: torch.device, startup_steps: int, started: float):
        self.device, self.startup_steps, self.started = device, startup_steps, started
        self.steps = self.images = 0
        self.steady_seconds = 0.0
        self.steady_since: float | None = None
        self.startup_seconds: float | None = None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def step_end(self, run) -> None:
        self.steps += 1
        if self.steps == self.startup_steps:
            self.steady_since = self._now()
            self.startup_seconds = self.steady_since - self.started
        elif self.steps > self.startup_steps:
            self.images += run.last.samples

    def epoch_start(self, run) -> None:
        if self.startup_seconds is not None:
            self.steady_since = time.perf_counter()

    def epoch_end(self, run) -> None:
        now = self._now()
        if self.startup_seconds is not None and self.steady_since is not None:
            self.steady_seconds += now - self.steady_since
        self.steady_since = None


class Progress:
    """Rank 0's progress bar (--no-progress: none), with the loss and LR every PROGRESS_EVERY steps."""

    def __init__(self, run):
        self.bar_of = partial(tqdm, disable=not (run.root and run.cfg.progress))
        self.bar = None

    def epoch_start(self, run) -> None:
        if self.bar is not None:
            self.bar.close()  # an epoch left by a rollback (sentinel.py)
        self.bar = self.bar_of(total=run.steps, initial=run.skip, desc=f"epoch {run.epoch + 1}/{run.cfg.epochs}")

    def step_end(self, run) -> None:
        self.bar.update(1)
        if not self.bar.disable and run.step % PROGRESS_EVERY == 0:
            self.bar.set_postfix(loss=f"{run.last.loss.item():.3f}", lr=f"{run.lr:.4f}")

    def epoch_end(self, run) -> None:
        self.bar.close()


class Outputs:
    """What a run leaves for its users, rank 0's: metrics.json (and MLflow through it), TensorBoard, the opening
    line, a line per epoch, and the summary with the closing lines ("Total images/sec"). Every rank takes part in
    the summary's two collectives."""

    def __init__(self, run, clock: Clock):
        self.clock = clock
        self.metrics = self.writer = None
        self.images, self.seconds = 0, 0.0

    def run_start(self, run) -> None:
        if not run.root:
            return
        world = {**runtime.world(run.backend, run.model, run.device, run.settings, run.cfg), **run.task.world(run)}
        record = {"config": run.settings.config_record(run.cfg), **run.task.run_record(run), "world": world}
        self.metrics = MetricsFile(run.cfg.metrics_path, {**record, "resolved": run.settings.to_json()})
        self.writer = runtime.summary_writer(run.cfg.tensorboard_dir)
        run.task.log.info("%s", run.task.opening(run))
        run.task.log.info("resolved: %s", run.settings.line())
        if os.environ.get("HOROVOD_TIMELINE"):
            log.info("Horovod timeline: %s", os.environ["HOROVOD_TIMELINE"])

    def epoch_done(self, run, record: dict) -> None:
        self.images += record["images"]
        self.seconds += record["epoch_seconds"]
        if not run.root:
            return
        self.metrics.add_epoch(record)
        for key, value in run.task.scalars(record).items():
            self.writer.add_scalar(key, value, record["epoch"])
        self.writer.flush()
        run.task.log.info("%s", run.task.epoch_line(run, record))

    def summary(self, run) -> None:
        if run.root:
            self.writer.close()
        images, seconds, extra = self.images, self.seconds, {}
        epochs_run = run.cfg.epochs - run.start.epoch
        if run.task.steady_throughput:
            # The clock counted this rank's images; the throughput is the job's (ranks' batches may differ by one).
            (steady_images,) = runtime.global_sums(run.backend, "steady_images", self.clock.images)
            steady = self.clock.steady_seconds > 0 and steady_images > 0
            if not steady and run.root and epochs_run > 0:
                log.warning(
                    "the run had no more than %d steps (--startup-steps): Total images/sec includes start-up",
                    run.cfg.startup_steps,
                )
            if steady:
                images, seconds = int(steady_images), self.clock.steady_seconds
            extra = {
                "startup_seconds": self.clock.startup_seconds,
                "steady_state": steady,
                "all_images": self.images,
                "all_train_seconds": self.seconds,
            }
        digest = models.parameters_digest(run.model)
        run.summary = finish(run.cfg, run.backend, self.metrics, digest, epochs_run, images, seconds, extra=extra)


def for_run(run, watch: Watch, stragglers: Stragglers, clock: Clock) -> list:
    """The run's concerns, in the order each event reaches them: the watchdog first (a step is done before it is
    compared or checkpointed), the replicas' check and the EMA's step before the checkpoints (a checkpoint is
    written agreed, with the step's average), the outputs last (they record what the others measured)."""
    averaged = [ema.EMA(run)] if run.cfg.ema_decay else []
    return [watch, stragglers, Replicas(run), *averaged, Checkpoints(run), clock, Progress(run), Outputs(run, clock)]
