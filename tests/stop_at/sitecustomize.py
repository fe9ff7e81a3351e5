"""The SIGTERM tests' pacing, for every Python process started with this folder on PYTHONPATH and STOP_AT set:
the ranks agree after every step (preemption.MAX_EVERY = 1), poll Scheduled Events (where a test serves them) and
write heartbeats every 0.2 s
(watchdog.HEARTBEAT_MAX_SECONDS), and the ranks named in STOP_RANKS (comma-separated HOROVOD_RANK or RANK values)
wait after their STOP_AT-th step until a signal reaches them (at most STOP_WAIT seconds, default 60). A test or the
launcher's drill sends its SIGTERM once the heartbeats show that step, so the ranks stop at that step on any
machine under any load, and an epoch of tens of steps holds the stop. A run that starts with a checkpoint in its
output folder (a resume) never waits; with STOP_IN set, neither does a run whose --output-dir does not contain it
(the drill's uninterrupted run, started with the same environment). Without this pacing the stop came up to 2 s
of steps (at most 500) after a heartbeat up to 2 s late: epochs of 600-800 steps, and still a stop past the epoch's
end on a quiet machine. Only the pacing changes: the signal handler, the agreement's sum and the checkpoint are the
payload's own. STOP_SAVE_SECONDS holds each mid-epoch checkpoint's write that long (a slow output mount); under
mpirun the rank is OMPI_COMM_WORLD_RANK."""

import os
import pathlib
import sys
import time

AT = int(os.environ.get("STOP_AT", "0"))
RANKS = {r for r in os.environ.get("STOP_RANKS", "").split(",") if r}
WAIT = float(os.environ.get("STOP_WAIT", "60"))
SAVE_SECONDS = float(os.environ.get("STOP_SAVE_SECONDS") or 0)  # a mid-epoch checkpoint's write held so long
IN = os.environ.get("STOP_IN", "")
_rank = os.environ.get("HOROVOD_RANK", os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK")))
CALLS = [0]
WAITS = [False]


def _waits() -> bool:
    """At the first step (sys.argv is the payload's by then): this rank, this run's folder, not a resume."""
    argv = sys.argv
    out = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--output-dir"), "")
    resumed = any(pathlib.Path(out, "checkpoints").glob("checkpoint-*")) if out else False
    return _rank in RANKS and IN in out and not resumed


def _preemption(preemption) -> None:
    preemption.MAX_EVERY = 1
    preemption.POLL_SECONDS = 0.2  # Scheduled Events, where a test serves them
    real = preemption.Preemption.due

    def due(self):
        CALLS[0] += 1
        if CALLS[0] == 1:
            WAITS[0] = _waits()
        if CALLS[0] == AT and WAITS[0]:
            deadline = time.monotonic() + WAIT
            while self.signalled is None and time.monotonic() < deadline:
                time.sleep(0.01)
        return real(self)

    preemption.Preemption.due = due


def _checkpoint(checkpoint) -> None:
    real = checkpoint.write

    def write(path, save, keep=None):
        if "-step-" in pathlib.Path(path).name:  # a mid-epoch checkpoint: the stop's
            time.sleep(SAVE_SECONDS)
        return real(path, save, keep)

    checkpoint.write = write


def _watchdog(watchdog) -> None:
    watchdog.HEARTBEAT_MAX_SECONDS = 0.2


if AT > 0:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: import_hooks
    from import_hooks import after_import

    sys.path.pop(0)
    after_import("payloads.common.preemption", _preemption)
    after_import("payloads.common.watchdog", _watchdog)
    if SAVE_SECONDS:
        after_import("payloads.common.checkpoint", _checkpoint)
