"""The PyTorch training loop every PyTorch payload runs: `train(task, cfg)`.

What differs per payload is a Task (its data for an epoch, its model, the loss and sums of one step, its evaluation,
its lines and scalars): payloads/pytorch/classification.py and payloads/segmentation/train.py (land cover).
What every run does around the step is a concern, one object attached to named events (payloads/common/
concerns.py: the stall watchdog, stragglers, checkpoints with the SIGTERM stop and the checkpoint clock; concerns.py
here: the replica sentinel, the steady-state clock, the progress bar, the outputs). The run's state travels as one
object, Run; the configuration is parsed once and frozen, and what start-up decides from it is Run.settings
(runtime.Settings). docs/payload-contract.md shows how a task and a concern are written.

One epoch, in this order on every rank (task.X: the task's methods; the rest are events):

    task.epoch_start, epoch_start, doing("input"), task.batches
    for each step:      doing("compute"), LR, zero_grad, task.step (doing("exchange") inside DDP's backward),
                        doing("exchange"), the optimizer step, step_end, doing("input")
    epoch_end           the epoch's steps are done (stragglers' last window, clock, bar)
    task.train_record, epoch_record(record)    the epoch's sums over ranks; concerns add to the record
    task.epoch_end      (land cover averages BatchNorm's statistics)
    validation_start, task.evaluate (validation_step after each batch), validation_end(record): when the data
                        has a validation split (the EMA evaluates its weights at validation_end)
    checkpoint          the replicas' check, then the epoch's checkpoint
    epoch_done(record)  metrics.json, TensorBoard, the epoch's line
    after_epoch         a SIGTERM during the epoch's end stops here, at that checkpoint

Around the epochs: run_start after the restore (outputs: metrics.json's run record, the opening lines); then
run_end (the last checkpoint write complete) and close; then summary and finished. On a stop: stopped, close.
On checkpoints.Rollback (the replica sentinel's finding): rollback, then Run.restore, the resume's own path.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from ..common import concerns as common_concerns
from ..common import config, schedule
from ..common.concerns import EVENTS, Events
from . import backends, checkpoints, concerns, runtime

log = logging.getLogger("payloads.pytorch")


class Step(NamedTuple):
    """What a task's step returns: the samples it trained on, and a loss to show (read only when shown)."""

    samples: int
    loss: torch.Tensor


class Task:
    """What a payload defines; the loop calls these, in this order. Defaults are what most tasks want."""

    log = log  # the payload's logger: its opening and epoch lines
    steady_throughput = True  # the closing "Total images/sec" leaves out the first --startup-steps steps
    has_validation = False  # set by load() when the data has a validation split

    def load(self, run: Run) -> int:
        """Read (or open) the data, before the model is built; returns the steps of one epoch (equal on every
        rank). A problem with the data is a ConfigError raised on every rank."""
        raise NotImplementedError

    def model(self, run: Run) -> torch.nn.Module:
        """The model, on the CPU; built after torch.manual_seed(--seed), so every rank starts from the same
        weights before rank 0's (or a checkpoint's) are broadcast."""
        raise NotImplementedError

    def batches(self, run: Run, epoch: int, skip: int) -> Iterable:
        """The batches of `epoch` from step `skip` (a resumed mid-epoch run enters there without reading the
        steps before); a function of (--seed, epoch, rank) only."""
        raise NotImplementedError

    def epoch_start(self, run: Run) -> None:
        """Zero the epoch's sums (on the device: read once, at the epoch's end)."""

    def step(self, run: Run, batch) -> Step:
        """Forward and backward of one step on run.trained (run.backward applies the loss scaler), adding to the
        epoch's sums. The loop sets the LR and zeroes the gradients before, and steps the optimizer after."""
        raise NotImplementedError

    def train_record(self, run: Run, epoch: int) -> dict[str, Any]:
        """The epoch's training figures, summed over ranks; "images" is the samples trained on."""
        raise NotImplementedError

    def epoch_end(self, run: Run, epoch: int, record: dict[str, Any]) -> None:
        """After the epoch's steps, before its evaluation and checkpoint (land cover averages BatchNorm's
        statistics here); may add to the record."""

    def evaluate(self, run: Run, epoch: int) -> dict[str, Any]:
        """The validation figures, summed over ranks; called when has_validation. Call run.validation_step()
        after each batch (the watchdog's sign of life)."""
        return {}

    def run_record(self, run: Run) -> dict[str, Any]:
        """Keys metrics.json's "run" adds beside config, world and resolved."""
        return {}

    def world(self, run: Run) -> dict[str, Any]:
        """Keys the world record adds (runtime.world)."""
        return {}

    def opening(self, run: Run) -> str:
        """Rank 0's first line about the run."""
        raise NotImplementedError

    def scalars(self, record: dict[str, Any]) -> dict[str, float]:
        """TensorBoard's scalars of an epoch's record."""
        return {}

    def epoch_line(self, run: Run, record: dict[str, Any]) -> str:
        raise NotImplementedError


@dataclass
class Run(Events):
    """One run's state: configuration and settings (read-only), backend, device, precision, the model (plain:
    checkpoints, digest) and what the steps run (DDP's wrapper, compiled), optimizer and loss scaler, and the
    position: `epoch` (0-based), `step` (the current step's index in the epoch), `steps` (the epoch's), `skip`
    (the step this epoch was entered at)."""

    log: ClassVar[logging.Logger] = log  # the concerns' lines (a task's own lines: Task.log)
    EVENTS: ClassVar[tuple] = (*EVENTS, "epoch_start", "validation_end", "epoch_done", "summary", "rollback")
    cfg: config.TrainConfig
    settings: runtime.Settings
    backend: Any
    device: torch.device
    prec: Any
    task: Task
    concerns: list = field(default_factory=list)
    model: torch.nn.Module | None = None
    trained: Any = None
    optimizer: Any = None
    scaler: Any = None
    start: checkpoints.Position = checkpoints.Position(0, 0)
    epoch: int = 0
    step: int = 0
    steps: int = 0
    skip: int = 0
    lr: float = 0.0
    last: Step | None = None  # the last step's result
    summary: dict = field(default_factory=dict)
    saver: checkpoints.Saver = field(default_factory=checkpoints.Saver)

    @property
    def root(self) -> bool:
        return self.backend.rank() == 0

    def sum_floats(self, values: list, name: str) -> list:
        """One sum over ranks of host numbers (a list, or a list of lists), on the CPU: no device sync."""
        return self.backend.allreduce_sum(torch.tensor(values, dtype=torch.float64), name).tolist()

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        """Backward through the loss scaler (fp16). DDP averages the gradients during the last micro-batch's
        backward: that is the step's exchange."""
        if last and self.backend.name == "ddp":
            self.doing("exchange")
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def restore(self, resume: bool) -> checkpoints.Position:
        """The newest checkpoint back into the run (a resume: any; a rollback: the agreed one left), the concerns'
        state included; its position."""
        return checkpoints.restore(
            self.cfg, self.backend, self.model, self.optimizer, self.scaler, self.steps, self.concerns, resume
        )


def start(task: Task, cfg: config.TrainConfig, started: float) -> Run:
    """Everything before the first step: the backend, the watchdog (from here on a rank that stops making progress
    ends the job, named), the device and settings, then prepare(), and the run's concerns."""
    backend = backends.create(cfg.backend, runtime.collective_timeout(cfg) if cfg.backend == "ddp" else None)
    backend.init()
    watch = common_concerns.Watch(cfg, backend)
    stragglers = common_concerns.Stragglers(cfg, backend, watch.watch)

    def attach(run: Run) -> list:
        return concerns.for_run(run, watch, stragglers, concerns.Clock(run.device, cfg.startup_steps, started))

    return prepare(task, cfg, backend, *runtime.resolve(cfg, backend), attach)


def prepare(task: Task, cfg: config.TrainConfig, backend, device, prec, settings: runtime.Settings, attach=None) -> Run:
    """A run ready for its first step: the task's data and model, the optimizer and loss scaler, its concerns
    (`attach(run)`; none for the health check, which calls this too), and the newest checkpoint restored (its
    position in run.start)."""
    run = Run(cfg, settings, backend, device, prec, task)
    run.steps = task.load(run)
    torch.manual_seed(cfg.seed)
    model = task.model(run).to(device)
    if settings.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = runtime.optimizer(cfg, model, settings.base_lr * settings.lr_scale, device)
    # `model` stays the plain module (checkpoints, digest); `trained` is what the steps run (DDP's wrapper).
    trained, optimizer = backend.wrap(model, optimizer, cfg, device)
    # The compiled module shares the weights (traced at the first step, after the restore); checkpoints keep the
    # plain names.
    run.model, run.trained = model, torch.compile(trained) if cfg.compile else trained
    run.optimizer, run.scaler = optimizer, prec.grad_scaler(cfg.loss_scale_init)
    run.attach(attach(run) if attach else [])
    run.start = run.restore(cfg.resume)
    runtime.scaler_in_kernel(optimizer, run.scaler)
    return run


def train(task: Task, cfg: config.TrainConfig) -> dict:
    """The whole run; returns its summary (metrics.json's). Raises preemption.Stopped after a stop's checkpoint."""
    run = start(task, cfg, time.perf_counter())
    with ending(run):
        run.fire("run_start")
        epoch, skip = run.start
        while epoch < cfg.epochs:
            try:
                train_epoch(run, epoch, skip)
                epoch, skip = epoch + 1, 0
            except checkpoints.Rollback:  # every rank at the same step: back to the last agreed checkpoint
                run.fire("rollback")
                epoch, skip = run.restore(resume=True)
    run.doing("finishing")
    run.fire("summary")
    run.backend.shutdown()
    run.fire("finished")
    return run.summary


def ending(run: Run):
    """Around the epochs (payloads/common/concerns.ending): on a stop, every rank shuts its backend down."""
    return common_concerns.ending(run, lambda: run.backend.shutdown(stopped=True))


def train_epoch(run: Run, epoch: int, skip: int = 0) -> None:
    """One epoch, or its rest from step `skip`, then its evaluation, checkpoint and record."""
    cfg, task, settings = run.cfg, run.task, run.settings
    run.epoch, run.skip = epoch, skip
    run.lr = settings.base_lr * settings.lr_scale
    run.trained.train()
    task.epoch_start(run)
    run.fire("epoch_start")
    started = time.perf_counter()
    run.doing("input")
    batches = iter(task.batches(run, epoch, skip))
    # A generator's clean-up (a prefetch thread) runs even when a stop or a rollback leaves the epoch.
    with contextlib.closing(batches) if hasattr(batches, "close") else contextlib.nullcontext():
        for step, batch in enumerate(batches, start=skip):
            run.step = step
            run.doing("compute")
            run.lr = schedule.learning_rate(
                settings.base_lr, settings.lr_scale, epoch, run.step, run.steps, cfg.warmup_epochs, cfg.lr_decay_epochs
            )
            for group in run.optimizer.param_groups:
                group["lr"] = run.lr
            run.optimizer.zero_grad()  # Horovod's wrapper takes no set_to_none
            run.last = task.step(run, batch)
            run.doing("exchange")  # Horovod waits for the averaged gradients here
            runtime.optimizer_step(run.optimizer, run.scaler, run.backend)
            run.fire("step_end")
            run.doing("input")
    run.fire("epoch_end")
    seconds = time.perf_counter() - started
    record = {"epoch": epoch + 1, **task.train_record(run, epoch)}
    record.update(epoch_seconds=seconds, images_per_sec=record["images"] / seconds, lr=run.lr)
    if skip:
        record["resumed_at_step"] = skip
    run.fire("epoch_record", record)
    task.epoch_end(run, epoch, record)
    if task.has_validation:
        run.trained.eval()
        run.fire("validation_start")
        with torch.no_grad():
            record.update(task.evaluate(run, epoch))
            run.fire("validation_end", record)
    run.fire("checkpoint")
    run.fire("epoch_done", record)
    run.fire("after_epoch")
