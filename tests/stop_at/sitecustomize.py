"""A SIGTERM at a chosen step, for every Python process started with this folder on PYTHONPATH and STOP_AT set: the
ranks named in STOP_RANKS (comma-separated HOROVOD_RANK, RANK or OMPI_COMM_WORLD_RANK values) send themselves
SIGTERM after their STOP_AT-th optimizer step. With STOP_HOLD=1 they wait there instead, until a signal from
outside reaches them (at most STOP_WAIT seconds, default 60): the launcher's drill sends its signal once the
heartbeats show that step; a test that signals mpirun itself waits for the file `held-<rank>` each holding rank
writes in STOP_MARK, when set.

Nothing else changes: the agreement window, the Scheduled Events poll and the heartbeats are the payload's. The
stop therefore lands at the first agreement after the signal: step 1 when STOP_AT is 1 (the first window is one
step), otherwise wherever rank 0's measured step time put the window's end (at most preemption.MAX_EVERY steps
later, or the epoch's end). A run that starts with a checkpoint in its output folder (a resume) never signals;
with STOP_IN set, neither does a run whose --output-dir does not contain it (the drill's uninterrupted run,
started with the same environment). STOP_SAVE_SECONDS holds each mid-epoch checkpoint's write that long (a slow
output mount)."""

import os
import pathlib
import signal
import sys
import time

AT = int(os.environ.get("STOP_AT", "0"))
RANKS = {r for r in os.environ.get("STOP_RANKS", "").split(",") if r}
HOLD = os.environ.get("STOP_HOLD") == "1"
WAIT = float(os.environ.get("STOP_WAIT", "60"))
SAVE_SECONDS = float(os.environ.get("STOP_SAVE_SECONDS") or 0)  # a mid-epoch checkpoint's write held so long
IN = os.environ.get("STOP_IN", "")
MARK = os.environ.get("STOP_MARK", "")
_rank = os.environ.get("HOROVOD_RANK", os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK")))
CALLS = [0]
SIGNALS = [False]


def _signals() -> bool:
    """At the first step (sys.argv is the payload's by then): this rank, this run's folder, not a resume."""
    argv = sys.argv
    out = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--output-dir"), "")
    resumed = any(pathlib.Path(out, "checkpoints").glob("checkpoint-*")) if out else False
    return _rank in RANKS and IN in out and not resumed


def _preemption(preemption) -> None:
    real = preemption.Preemption.due

    def due(self):
        CALLS[0] += 1
        if CALLS[0] == 1:
            SIGNALS[0] = _signals()
        if CALLS[0] == AT and SIGNALS[0]:
            if not HOLD:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
            elif MARK:
                pathlib.Path(MARK, f"held-{_rank}").touch()
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


if AT > 0:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: import_hooks
    from import_hooks import after_import

    sys.path.pop(0)
    after_import("payloads.common.preemption", _preemption)
    if SAVE_SECONDS:
        after_import("payloads.common.checkpoint", _checkpoint)
