"""What every PyTorch run does around the step, one object per concern, each attached to the loop's named events
(loop.py lists them in the order they fire). A concern defines only the events it needs, as methods taking the
run (loop.Run) and the event's arguments; `for_run` lists the concerns of a run, in the order each event reaches
them. Adding a concern: write one class here (or beside your task) and add it to that list; nothing else changes
(docs/payload-contract.md#a-new-concern)."""

from __future__ import annotations

import logging
import os
import time
from functools import partial

import torch
from tqdm import tqdm

from ..common import preemption as preempt
from ..common import stragglers, watchdog
from ..common.metrics import MetricsFile, finish
from . import checkpoints, models, runtime

log = logging.getLogger("payloads.pytorch")
PROGRESS_EVERY = 25  # steps between the progress bar's loss readings (each one waits for the device)


class Watch:
    """The stall watchdog (payloads/common/watchdog.py): what this rank is doing, marked by attribute stores; a
    rank that stops making progress ends the job, named (docs/jobs.md#a-job-is-stuck-or-slow). Started at
    construction, before the device and the data, so a hang there is named too. One broadcast gives every rank
    rank 0's name for the run, which tells this run's heartbeats from an earlier run's in the same folder."""

    def __init__(self, cfg, backend):
        self.watch = watchdog.started(
            cfg.output_dir,
            backend.rank(),
            backend.size(),
            cfg.stall_timeout,
            lambda token: backend.broadcast_object(token, name="watchdog_run"),
        )

    def doing(self, run, what: str) -> None:
        self.watch.doing(what)

    def step_end(self, run) -> None:
        self.watch.step_done()

    def epoch_end(self, run) -> None:
        self.watch.doing("epoch end")

    def validation_step(self, run) -> None:
        self.watch.tick()

    def stopped(self, run) -> None:
        self.watch.stop("stopped")

    def finished(self, run) -> None:
        self.watch.stop()


class Stragglers:
    """The ranks' step-part times (stragglers.Phases), compared every --straggler-every steps in one small
    collective: every rank's row of seconds summed into the matrix; rank 0 logs the stragglers it names (every rank
    would name the same). Hosts are gathered once, at construction."""

    def __init__(self, cfg, backend, watch: watchdog.Watchdog):
        self.phases = stragglers.Phases(watch, backend.allgather_object(watch.host, "hosts"), cfg.straggler_every)

    def compare(self, run) -> None:
        doing = self.phases.watch.what
        run.doing("exchange")
        matrix = torch.tensor(self.phases.matrix(), dtype=torch.float64)
        rows = run.backend.allreduce_sum(matrix, "step_phases").tolist()
        for line in self.phases.add(rows):
            if run.root:
                log.warning("%s", line)
        run.doing(doing)

    def step_end(self, run) -> None:
        if self.phases.due():
            self.compare(run)

    def epoch_end(self, run) -> None:
        self.compare(run)  # the epoch's last steps, for its per-rank totals

    def epoch_record(self, run, record: dict) -> None:
        record.update(self.phases.epoch_record())


class Checkpoints:
    """The epoch's checkpoint, and the mid-epoch ones: on SIGTERM (then the stop, preemption.Stopped) and on the
    checkpoint clock, at a step every rank agrees on (payloads/common/preemption.py,
    docs/jobs.md#preempted-and-resumed). Never after an epoch's last step: the epoch's end (a task's averaging, the evaluation, the epoch's
    checkpoint) follows, and a SIGTERM then stops at the epoch's checkpoint (after_epoch)."""

    def __init__(self, run):
        self.stop = preempt.Preemption(run.backend.rank(), run.cfg.checkpoint_every_minutes)

    def save(self, run, epochs_done: int, step: int = 0, wait: bool = False) -> float:
        return checkpoints.save(
            run.cfg,
            run.backend,
            epochs_done,
            run.model,
            run.optimizer,
            run.scaler,
            step,
            run.steps_per_epoch,
            wait=wait,
            config=run.config_record(),
        )

    def agree(self, run) -> str | None:
        """One sum of three host numbers over ranks, on the CPU (Gloo under DDP with NCCL too): no device sync."""
        return self.stop.agree(
            lambda values: run.backend.allreduce_sum(torch.tensor(values, dtype=torch.float64), "preemption").tolist()
        )

    def run_start(self, run) -> None:
        self.stop.install()

    def step_end(self, run) -> None:
        if self.stop.due() and run.step + 1 < run.steps:
            self.pause(run, self.agree(run))

    def pause(self, run, verdict: str | None) -> None:
        """After the ranks agreed on `verdict` at run.step: the mid-epoch checkpoint of a signal (then the stop) or
        of the clock."""
        if verdict is None:
            return
        run.doing("checkpoint")
        done = run.step + 1
        # A stop's checkpoint is complete before the process exits; the clock's is written while training goes on.
        seconds = self.save(run, run.epoch, done, wait=verdict == "signal")
        self.stop.saved(seconds)
        where = checkpoints.checkpoint_path(run.cfg, run.epoch, done)
        if verdict == "signal":
            raise preempt.Stopped(self.stop.stop_line(str(where), seconds))
        if run.root:
            log.info("checkpoint on the clock: %s (%.1fs)", where.name, seconds)

    def checkpoint(self, run) -> None:
        run.doing("checkpoint")
        self.stop.saved(self.save(run, run.epoch + 1))

    def after_epoch(self, run) -> None:
        """A SIGTERM during an epoch's end (sums, validation, checkpoint): the ranks agree once more, and the epoch's
        checkpoint is the one to resume from, complete on disk before the exit. Not after the last epoch: the run
        ends anyway (and run_end waits for that checkpoint)."""
        done = run.epoch + 1
        if done < run.cfg.epochs and self.agree(run) == "signal":
            where = checkpoints.checkpoint_path(run.cfg, done)
            seconds = (self.stop.write_seconds or 0.0) + checkpoints.finish_checkpoints(run.backend)
            raise preempt.Stopped(self.stop.stop_line(str(where), seconds))

    def run_end(self, run) -> None:
        """Every rank waits for rank 0's last write: its failure ends every rank with rank 0's one line."""
        run.doing("checkpoint")
        checkpoints.finish_checkpoints(run.backend)

    def close(self, run) -> None:
        """Whatever the ending: SIGTERM's handler goes, and rank 0's write in flight ends complete or not at all."""
        self.stop.uninstall()
        checkpoints.settle()


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
        record = {"config": run.config_record(), **run.task.run_record(run), "world": world}
        self.metrics = MetricsFile(run.cfg.metrics_path, {**record, "resolved": run.settings.to_json()})
        self.writer = runtime.summary_writer(run.cfg.tensorboard_dir)
        run.task.log.info("%s", run.task.opening(run))
        run.task.log.info("resolved: %s", run.settings.line())
        if os.environ.get("HOROVOD_TIMELINE"):
            log.info("Horovod timeline: %s", os.environ["HOROVOD_TIMELINE"])

    def log(self, run, record: dict) -> None:
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
    compared or checkpointed), the outputs last (they record what the others measured)."""
    return [watch, stragglers, Checkpoints(run), clock, Progress(run), Outputs(run, clock)]
