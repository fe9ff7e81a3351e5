"""Stop on SIGTERM and checkpoint on a clock, at a step every rank agrees on (issue 31, items 1-2).

Framework-free: the payload's loop calls, after each optimizer step, `due()` (an integer compare), and when it is
True `agree(exchange)` with one small sum over ranks (the payload's collective, on host values: no device sync).

- SIGTERM: the handler only stores the signal number (signal-safe; nothing else runs inside it). A cancel and a
  low-priority preemption deliver it on Azure ML; the local launcher forwards it to every rank (launcher/local.py).
- The ranks agree every `every` steps, not every step: each rank contributes its flag, and rank 0 alone its clock's
  verdict (a checkpoint is due) and the next `every`, chosen so that agreements come about AGREE_SECONDS apart
  (from rank 0's measured step time; 1 until measured, at most MAX_EVERY). One sum of three numbers answers all:
  stop if any rank was signalled, checkpoint if rank 0's clock says so, and every rank takes the same next `every`.
  A rank that was signalled alone (one node's SIGTERM) thus stops every rank at the same step.
- After the agreed step the payload writes a mid-epoch checkpoint (checkpoint.path_for(..., step=)) with the
  position and the random states, and, on a stop, exits with EXIT_CODE and one line saying so.

Azure ML documents no grace between SIGTERM and SIGKILL for a cancel or a preemption. What Azure documents is the
virtual machine's: a Spot/low-priority eviction is announced by a Scheduled Event `Preempt` at least 30 seconds
ahead (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events, "Preempt | 30 seconds"), and Azure ML
fails a job on "Received pre-emption warning signal". So the design assumes 30 s from the signal to the end: the
stop comes within AGREE_SECONDS plus one step, then one checkpoint write (docs/jobs.md#preempted-and-resumed).

--checkpoint-every-minutes N: a mid-epoch checkpoint when N minutes have passed since the last checkpoint (of either
kind), by rank 0's clock. `auto` (the default): the measured cost of a checkpoint (the job waits while rank 0
writes it) over COST_FRACTION, never below FLOOR_MINUTES: a checkpoint that takes 6 s or less is written every
10 minutes (1% or less), one that takes 30 s every 25 minutes (2%). Until a checkpoint has been timed, the floor.
0 turns the clock off (SIGTERM still checkpoints).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence

EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: stopped with a checkpoint, run again to resume
AUTO = "auto"
AGREE_SECONDS = 2.0  # target time between agreements: the stop comes this long (at most) after the signal
MAX_EVERY = 500
FLOOR_MINUTES = 10.0
COST_FRACTION = 0.02


class Stopped(Exception):
    """Raised on every rank after the stop checkpoint is written; main() prints it and exits EXIT_CODE."""


def parse_minutes(text: str | float) -> float | str:
    if isinstance(text, str) and text.strip().lower() == AUTO:
        return AUTO
    value = float(text)
    if value < 0 or value != value:
        raise ValueError(f"expected minutes >= 0 or auto, got {text!r}")
    return value


def auto_interval(write_seconds: float | None) -> float:
    """Seconds between clock checkpoints for `auto`: cost at most COST_FRACTION of the time, at least the floor."""
    floor = FLOOR_MINUTES * 60
    return floor if write_seconds is None else max(floor, write_seconds / COST_FRACTION)


class Preemption:
    """One per process. install() takes SIGTERM; due(), agree() and saved() are called by the training loop."""

    def __init__(self, rank: int, every_minutes: float | str = AUTO, clock: Callable[[], float] = time.monotonic):
        self.rank, self.minutes, self.clock = rank, every_minutes, clock
        self.signalled: int | None = None
        self.every = 1  # steps between agreements: rank 0's choice, the same on every rank after each agreement
        self.since = 0  # steps since the last agreement
        self.write_seconds: float | None = None  # the last checkpoint's measured cost
        self.last_save = self._agreed_at = clock()
        self._previous = None

    # ---- the signal
    def _handler(self, signum, frame) -> None:
        self.signalled = signum  # a store only: signal-safe

    def install(self) -> Preemption:
        self._previous = signal.signal(signal.SIGTERM, self._handler)
        return self

    def uninstall(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    # ---- the clock
    def interval(self) -> float | None:
        """Seconds between clock checkpoints; None when off."""
        if self.minutes == AUTO:
            return auto_interval(self.write_seconds)
        return float(self.minutes) * 60 or None

    def saved(self, seconds: float) -> None:
        """A checkpoint (mid-epoch or an epoch's) was written in `seconds`: the clock starts again, and its cost is
        what `auto` is derived from."""
        self.write_seconds = seconds
        self.last_save = self.clock()

    # ---- the agreement
    def due(self) -> bool:
        """After each optimizer step: True when this step ends an agreement window (the same step on every rank)."""
        self.since += 1
        return self.since >= self.every

    def proposal(self) -> list[float]:
        """This rank's part of the sum: its signal flag; rank 0 adds its clock's verdict and the next window."""
        flag = 1.0 if self.signalled is not None else 0.0
        if self.rank != 0:
            return [flag, 0.0, 0.0]
        now = self.clock()
        step = (now - self._agreed_at) / max(self.since, 1)
        self._agreed_at = now
        every = max(1, min(MAX_EVERY, int(AGREE_SECONDS / step))) if step > 0 else 1
        interval = self.interval()
        clock_due = 1.0 if interval is not None and now - self.last_save >= interval else 0.0
        return [flag, clock_due, float(every)]

    def settle(self, sums: Sequence[float]) -> str | None:
        """The sums over ranks of proposal(): "signal" (some rank was signalled: stop), "clock" (checkpoint and go
        on), or None."""
        self.since, self.every = 0, max(1, int(round(sums[2])))
        if sums[0] > 0:
            return "signal"
        return "clock" if sums[1] > 0 else None

    def agree(self, exchange: Callable[[list[float]], Sequence[float]]) -> str | None:
        """One agreement: `exchange` sums a list of floats over ranks (one small collective)."""
        return self.settle(exchange(self.proposal()))

    def stop_line(self, where: str, seconds: float) -> str:
        name = signal.Signals(self.signalled).name if self.signalled else "a signal on another rank"
        return (
            f"stopped by {name}: wrote {where} in {seconds:.1f}s; run the same command again (same output folder) "
            f"to resume at that step (exit {EXIT_CODE})"
        )
