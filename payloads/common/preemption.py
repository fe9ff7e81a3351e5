"""Stop on SIGTERM and checkpoint on a clock, at a step every rank agrees on (issue 31, items 1-2).

Framework-free: the payload's loop calls, after each optimizer step, `due()` (an integer compare), and when it is
True `agree(exchange)` with one small sum over ranks (the payload's collective, on host values: no device sync).

- SIGTERM: the handler only stores the signal number (signal-safe; nothing else runs inside it). A cancel and a
  low-priority preemption deliver it on Azure ML; the local launcher forwards it to every rank (launcher/local.py).
- The ranks agree every `every` steps, not every step: each rank contributes its flag, and rank 0 alone its clock's
  verdict (a checkpoint is due), the next `every`, chosen so that agreements come about AGREE_SECONDS apart
  (from rank 0's measured step time; 1 until measured, at most MAX_EVERY), and whether its last checkpoint write,
  in the background, failed. One sum of four numbers answers all: end every rank with rank 0's line if its write
  failed (a full output folder is known within AGREE_SECONDS, not at the next save an epoch later), stop if any rank
  was signalled, checkpoint if rank 0's clock says so, and every rank takes the same next `every`. A rank that was
  signalled alone (one node's SIGTERM) thus stops every rank at the same step.
- After the agreed step the payload writes a mid-epoch checkpoint (checkpoint.path_for(..., step=)) with the
  position and the random states, and, on a stop, exits with EXIT_CODE and one line saying so.

Azure ML documents no grace between SIGTERM and SIGKILL for a cancel or a preemption. What Azure documents is the
virtual machine's: a Spot/low-priority eviction is announced by a Scheduled Event `Preempt` at least 30 seconds
ahead (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events, "Preempt | 30 seconds"), and Azure ML
fails a job on "Received pre-emption warning signal". So the design assumes 30 s from the signal to the end: the
stop comes within AGREE_SECONDS plus one step, then one checkpoint write (docs/preempted-and-resumed.md#preempted-and-resumed).

--checkpoint-every-minutes N: a mid-epoch checkpoint when N minutes have passed since the last checkpoint (of either
kind), by rank 0's clock. `auto` (the default): the measured cost of a checkpoint (the job waits while rank 0
writes it) over COST_FRACTION, never below FLOOR_MINUTES: a checkpoint that takes 6 s or less is written every
10 minutes (1% or less), one that takes 30 s every 25 minutes (2%). Until a checkpoint has been timed, the floor.
0 turns the clock off (SIGTERM still checkpoints).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence

EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: stopped with a checkpoint, run again to resume
# The launcher sets it for jobs mpirun starts (launcher/interconnect.py MPI_STOP_ENV): SIGCONT is mpirun's stop.
STOP_ON_SIGCONT = "TRAINING_STOP_ON_SIGCONT"
MPIRUN_STOP = "mpirun's stop (SIGCONT, SIGTERM to follow)"
AUTO = "auto"
WRITE_FAILED = "write failed"  # the agreement's verdict when rank 0's background checkpoint write failed
log = logging.getLogger("payloads")
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
        self.signalled: int | str | None = None  # the signal, or an announced end (notice)
        self.every = 1  # steps between agreements: rank 0's choice, the same on every rank after each agreement
        self.since = 0  # steps since the last agreement
        self.write_seconds: float | None = None  # the last checkpoint's measured cost
        self.last_save = self._agreed_at = clock()
        self._previous = None

    # ---- the signal
    def _handler(self, signum, frame) -> None:
        # A store only: signal-safe. The first cause is kept: under mpirun its SIGTERM follows its SIGCONT by
        # odls_base_sigkill_timeout, often while the stop's checkpoint is being written, and the line says what
        # started the stop.
        if self.signalled is None:
            self.signalled = signum

    def _mpirun_stopping(self, signum, frame) -> None:
        if self.signalled is None:
            self.signalled = MPIRUN_STOP  # a store only: signal-safe

    def install(self, environ=None) -> Preemption:
        """Take SIGTERM; under mpirun with STOP_ON_SIGCONT set (the launcher's MPI jobs), SIGCONT too: Open MPI's
        daemons stop a job with SIGCONT, then SIGTERM odls_base_sigkill_timeout seconds later, then SIGKILL as long
        again (Open MPI 4.1, orte/mca/odls; tests/launcher/test_interconnect.py measures it), so SIGCONT is the
        first word a rank gets and the stop starts there."""
        environ = os.environ if environ is None else environ
        self._previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, self._handler)}
        if environ.get(STOP_ON_SIGCONT) == "1" and "OMPI_COMM_WORLD_RANK" in environ:
            self._previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._mpirun_stopping)
        return self

    def uninstall(self) -> None:
        for signum, previous in (self._previous or {}).items():
            signal.signal(signum, previous)
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

    def proposal(self, write_failed: bool = False) -> list[float]:
        """This rank's part of the sum: its signal flag; rank 0 adds its clock's verdict, the next window and whether
        its last background checkpoint write failed (`write_failed`)."""
        flag = 1.0 if self.signalled is not None else 0.0
        if self.rank != 0:
            return [flag, 0.0, 0.0, 0.0]
        now = self.clock()
        step = (now - self._agreed_at) / max(self.since, 1)
        self._agreed_at = now
        every = max(1, min(MAX_EVERY, int(AGREE_SECONDS / step))) if step > 0 else 1
        interval = self.interval()
        clock_due = 1.0 if interval is not None and now - self.last_save >= interval else 0.0
        return [flag, clock_due, float(every), 1.0 if write_failed else 0.0]

    def settle(self, sums: Sequence[float]) -> str | None:
        """The sums over ranks of proposal(): WRITE_FAILED (rank 0's last checkpoint write failed: every rank ends
        with its line), "signal" (some rank was signalled: stop), "clock" (checkpoint and go on), or None."""
        self.since, self.every = 0, max(1, int(round(sums[2])))
        if sums[3] > 0:
            return WRITE_FAILED
        if sums[0] > 0:
            return "signal"
        return "clock" if sums[1] > 0 else None

    def agree(self, exchange: Callable[[list[float]], Sequence[float]], write_failed: bool = False) -> str | None:
        """One agreement: `exchange` sums a list of floats over ranks (one small collective)."""
        return self.settle(exchange(self.proposal(write_failed)))

    def notice(self, reason: str) -> None:
        """An announced end of this VM (ScheduledEvents): the same stop as a SIGTERM, named by `reason`."""
        if self.signalled is None:
            self.signalled = reason

    def stop_line(self, where: str, seconds: float) -> str:
        if isinstance(self.signalled, str):
            name = self.signalled
        else:
            name = signal.Signals(self.signalled).name if self.signalled else "a signal on another rank"
        return (
            f"stopped by {name}: wrote {where} in {seconds:.1f}s; run the same command again (same output folder) "
            f"to resume at that step (exit {EXIT_CODE})"
        )


# Azure's Scheduled Events (learn.microsoft.com/azure/virtual-machines/linux/scheduled-events): the instance
# metadata service (IMDS) lists what will happen to this VM, a Spot/low-priority eviction (Preempt) at least 30 s
# ahead, a deletion (Terminate) with its own notice. The launcher gives Azure ML jobs this variable (launcher/
# interconnect.py); where it is set, one process per node polls it (the node's local rank 0) and an event that ends
# its VM stops the run as a SIGTERM would, before the signal: the notice is that rank's flag in the next agreement,
# so every rank of every node stops at the same step.
SCHEDULED_EVENTS = "TRAINING_SCHEDULED_EVENTS"
ENDING_EVENTS = ("Preempt", "Terminate")
IMDS = "169.254.169.254"
VM_NAME_URL = f"http://{IMDS}/metadata/instance/compute/name?api-version=2021-02-01&format=text"
# The same page, "Enabling and Disabling Scheduled Events": "Scheduled Events is enabled for your service the first
# time you make a request for events. You should expect a delayed response in your first call of up to two
# minutes." So every call until the first answer may take FIRST_TIMEOUT; later ones TIMEOUT.
FIRST_TIMEOUT = 120.0
TIMEOUT = 10.0
POLL_SECONDS = 5.0  # between answered polls
# A call that fails (no answer in time, refused, 429 Too Many Requests, a body that is not JSON) is tried again
# after POLL_SECONDS, doubled per failure in a row up to BACKOFF_MAX: never given up, since a fresh node's endpoint
# answers late. IMDS allows 5 requests a second per VM (instance-metadata-service, "Rate limiting"), shared with
# every other client on the node: one poller per node asking every 5 s takes a twenty-fifth of it.
BACKOFF_MAX = 300.0
# Which process of its node this one is, as each launcher says it: mpirun (Horovod on Azure ML), horovodrun, torchrun
# and Azure ML's PyTorch distribution. A process alone (none set) is its node's first.
LOCAL_RANK_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_RANK", "HOROVOD_LOCAL_RANK", "LOCAL_RANK")


def local_rank(environ=None) -> int:
    environ = os.environ if environ is None else environ
    for name in LOCAL_RANK_VARIABLES:
        if environ.get(name, "").strip().isdigit():
            return int(environ[name])
    return 0


# IMDS "is not intended to be used behind a proxy and doing so is unsupported" (instance-metadata-service,
# "Proxies"): an opener whose ProxyHandler has no proxies ignores HTTP_PROXY, HTTPS_PROXY and NO_PROXY alike.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ScheduledEvents:
    """A daemon thread polling the Scheduled Events endpoint; the first event that ends this VM (ENDING_EVENTS
    naming this VM, or naming no VM, or any where this VM's name is unknown) calls stop.notice(). Until the endpoint
    has answered once each call may take `first_timeout`, later ones `timeout`; answered polls come `poll` seconds
    apart, and a failed call is tried again after `poll` doubled per failure in a row, at most `backoff_max`: the
    thread polls until the run closes it. Never through a proxy."""

    def __init__(
        self,
        url: str,
        stop: Preemption,
        vm_name: str | None = None,
        poll: float = POLL_SECONDS,
        first_timeout: float = FIRST_TIMEOUT,
        timeout: float = TIMEOUT,
        backoff_max: float = BACKOFF_MAX,
    ):
        self.url, self.stop, self.vm_name = url, stop, vm_name
        self.poll, self.first_timeout, self.timeout, self.backoff_max = poll, first_timeout, timeout, backoff_max
        self.answered = False  # the endpoint has answered once
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduled-events", daemon=True)

    @classmethod
    def from_env(cls, stop: Preemption, environ=None) -> ScheduledEvents | None:
        """Started where the job names the endpoint, on the node's first process only (local_rank 0)."""
        environ = os.environ if environ is None else environ
        url = environ.get(SCHEDULED_EVENTS)
        return cls(url, stop).start() if url and local_rank(environ) == 0 else None

    def start(self) -> ScheduledEvents:
        self._thread.start()
        return self

    def close(self) -> None:
        self._ended.set()

    def _get(self, url: str, timeout: float) -> bytes:
        request = urllib.request.Request(url, headers={"Metadata": "true"})
        with _NO_PROXY.open(request, timeout=timeout) as answer:
            return answer.read()

    def ending(self, document: dict) -> str | None:
        """The type of the first event in `document` that ends this VM, or None."""
        for event in document.get("Events") or []:
            names = event.get("Resources") or []
            if event.get("EventType") in ENDING_EVENTS and (not names or not self.vm_name or self.vm_name in names):
                return event["EventType"]
        return None

    def backoff(self, failures: int) -> float:
        """Seconds before the next call after `failures` failed calls in a row."""
        return min(self.backoff_max, self.poll * 2 ** min(failures, 30))

    def _run(self) -> None:
        if self.vm_name is None and IMDS in self.url:
            try:
                self.vm_name = self._get(VM_NAME_URL, self.timeout).decode().strip() or None
            except (OSError, ValueError):
                self.vm_name = None
        failures = 0
        while not self._ended.is_set():
            try:
                document = json.loads(self._get(self.url, self.timeout if self.answered else self.first_timeout))
                found = self.ending(document if isinstance(document, dict) else {})
            except (OSError, ValueError) as e:
                failures += 1
                if failures == 1:
                    log.warning(
                        "Scheduled Events at %s: no answer (%s); asking again, up to every %.0f s: until it answers "
                        "a preemption is met by SIGTERM",
                        self.url,
                        e,
                        self.backoff_max,
                    )
                self._ended.wait(self.backoff(failures))
                continue
            if failures:
                log.info("Scheduled Events at %s answer (after %d failed calls)", self.url, failures)
            self.answered, failures = True, 0
            if found:
                self.stop.notice(f"Scheduled Event {found}")
                return
            self._ended.wait(self.poll)
