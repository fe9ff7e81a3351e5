"""The preemption drill (issue 31, item 5): `python -m launcher JOB.yaml --target local --drill term|kill`.

It runs the local job three times under one folder: `straight` (uninterrupted), then `drilled`, whose rank R
gets the signal once its heartbeat (payloads/common/watchdog.py, <output>/progress/rankR.json) shows step S, then
`drilled` again with the same output folder, which resumes from its newest checkpoint. It reports the step the
stop was saved at, the steps lost (done before the stop, not in the checkpoint resumed from: redone after the
resume), the seconds from the signal to the end, and whether the resumed run's final checkpoint equals the
uninterrupted run's tensor by tensor. R and S are drawn from --drill-seed (printed, so a drill can be repeated):
S in the first 60% of the run's steps, so that the stop lands before the run ends.

- term: SIGTERM, what an Azure ML cancel and a low-priority preemption deliver: the ranks agree on a step, write a
  mid-epoch checkpoint and exit 75; nothing is lost (docs/preempted-and-resumed.md#preempted-and-resumed).
- kill: SIGKILL, a node lost without warning: the job fails, and the resume starts from the last checkpoint
  (an epoch's, or --checkpoint-every-minutes'); the steps since are lost.

The PyTorch payloads (both backends) and land cover end bitwise equal; TensorFlow and Keras resume at the step
but are not bitwise exact (docs/tensorflow.md). Exit 0 when the resumed run completed and its weights equal the
uninterrupted run's, 1 otherwise. The report also goes to <folder>/drill.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from azureaccess.errors import JobError

SIGNALS = {"term": signal.SIGTERM, "kill": signal.SIGKILL}
EARLIEST, LATEST = 0.1, 0.6  # the signal's step, as fractions of the run's steps


@dataclass
class Report:
    signal: str
    seed: int
    rank: int
    at_step: int  # the step the signal was meant for
    total_steps: int
    steps_per_epoch: int
    signalled_at_step: int | None = None  # the rank's heartbeat when the signal went
    stopped_exit: int | None = None
    stop_seconds: float | None = None  # from the signal to the job's end
    steps_reached: int | None = None  # the most any rank's last heartbeat showed
    resumed_from: str | None = None
    resumed_from_step: int | None = None  # steps of the run that checkpoint holds
    steps_lost: int | None = None
    resumed_exit: int | None = None
    equal: bool | None = None
    different: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"drill ({self.signal}, --drill-seed {self.seed}): signal to rank {self.rank} at step "
            f"{self.signalled_at_step} (drawn: {self.at_step} of {self.total_steps}); the job ended "
            f"{self.stop_seconds:.1f}s later with exit {self.stopped_exit}"
        ]
        if self.resumed_from:
            out.append(
                f"drill: resumed from {self.resumed_from} (step {self.resumed_from_step} of the run); steps done "
                f"before the stop: at least {self.steps_reached}; lost: {self.steps_lost}"
            )
        else:
            out.append("drill: no checkpoint was left to resume from: the resumed run started over")
        if self.equal:
            verdict = "bitwise equal"
        elif self.different:
            verdict = f"DIFFERENT ({len(self.different)} tensors, first {self.different[0]})"
        else:
            verdict = "not compared (the resumed run failed or left no checkpoint)"
        out.append(f"drill: resumed run exit {self.resumed_exit}; final weights vs the uninterrupted run: {verdict}")
        return out


def choose(seed: int, total_steps: int, size: int) -> tuple[int, int]:
    """(rank, step) for a drill: a rank, and a step in [EARLIEST, LATEST] of the run's steps."""
    rng = random.Random(seed)
    low = max(1, int(total_steps * EARLIEST))
    high = max(low, int(total_steps * LATEST))
    return rng.randrange(size), rng.randint(low, high)


def heartbeat(run: pathlib.Path, rank: int) -> dict | None:
    try:
        return json.loads((run / "progress" / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def run_steps(run: pathlib.Path, size: int) -> int:
    """Steps the run's ranks completed, by their last heartbeats (every rank steps in lockstep)."""
    beats = [heartbeat(run, r) for r in range(size)]
    return max((b["steps"] for b in beats if b), default=0)


def epochs_and_steps(run: pathlib.Path, size: int) -> tuple[int, int]:
    """A finished run's (epochs, steps in all): its metrics.json's epochs and its ranks' heartbeats."""
    return len(json.loads((run / "metrics.json").read_text()).get("epochs", [])), run_steps(run, size)


def position(name: str, steps_per_epoch: int) -> int:
    """Steps of the run a checkpoint holds, from its name (payloads/common/checkpoint.py)."""
    from payloads.common import checkpoint

    try:
        epochs, steps = checkpoint.position(pathlib.Path(name))
    except ValueError:
        raise JobError(f"drill: {name} is not a checkpoint name this project writes") from None
    return epochs * steps_per_epoch + steps


def newest_checkpoint(run: pathlib.Path) -> pathlib.Path | None:
    from payloads.common import checkpoint

    for suffix in (".pt", ".npz"):
        found = checkpoint.latest(run / "checkpoints", suffix)
        if found:
            return found[1]
    return None


def compare(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    """The names of the tensors that differ between two final checkpoints (model, then optimizer state)."""
    if a.suffix == ".npz":
        import numpy as np

        with np.load(a) as x, np.load(b) as y:
            keys = sorted((set(x.files) | set(y.files)) - {"meta"})
            return [k for k in keys if k not in x.files or k not in y.files or not np.array_equal(x[k], y[k])]
    import torch

    x = torch.load(a, map_location="cpu", weights_only=False)["model"]
    y = torch.load(b, map_location="cpu", weights_only=False)["model"]
    keys = sorted(set(x) | set(y))
    return [k for k in keys if k not in x or k not in y or not torch.equal(x[k], y[k])]


def _send_at(run: pathlib.Path, rank: int, step: int, signum: int, report: Report, done: threading.Event) -> None:
    """Polls the rank's heartbeat; once it shows `step`, sends the signal to the rank's process."""
    while not done.is_set():
        beat = heartbeat(run, rank)
        if beat and beat["steps"] >= step:
            try:
                os.kill(beat["pid"], signum)
            except ProcessLookupError:
                return
            report.signalled_at_step = beat["steps"]
            report.stop_seconds = time.monotonic()  # made relative when the job ends
            return
        time.sleep(0.05)


def drill(
    plan_for: Callable[[pathlib.Path], tuple[list[str], dict[str, pathlib.Path]]],
    run_job: Callable[[list[str], dict[str, pathlib.Path]], int],
    root: pathlib.Path,
    how: str,
    seed: int | None,
    size: int,
) -> int:
    """`plan_for(folder)`: the job's command line and outputs under `folder` (local.plan); `run_job`: local.run."""
    if how not in SIGNALS:
        raise JobError(f"--drill {how}: expected one of {', '.join(SIGNALS)}")
    if size < 2:
        raise JobError("--drill needs --np 2 or more: a drill stops one rank of several")
    seed = random.SystemRandom().randrange(10**6) if seed is None else seed
    straight_argv, straight_out = plan_for(root / "straight")
    drilled_argv, drilled_out = plan_for(root / "drilled")
    if "run" not in straight_out:
        raise JobError("--drill: the job declares no `run` output, where the payloads write heartbeats and checkpoints")
    for folder in drilled_out.values():
        if folder.exists() and any(folder.iterdir()):
            raise JobError(f"--drill: {folder} is not empty: pass a new --output-dir")

    print(f"drill: 1/3 the uninterrupted run, in {straight_out['run']}", flush=True)
    code = run_job(straight_argv, straight_out)
    if code != 0:
        raise JobError(f"drill: the uninterrupted run failed (exit {code}): fix the job first")
    epochs, total = epochs_and_steps(straight_out["run"], size)
    if total < 10 or epochs < 1:
        raise JobError(f"drill: the run has {total} steps: too short to stop in the middle (10 at least)")
    rank, step = choose(seed, total, size)
    report = Report(how, seed, rank, step, total, total // epochs)

    print(
        f"drill: 2/3 the same run, SIG{how.upper()} to rank {rank} at step {step}, in {drilled_out['run']}", flush=True
    )
    done = threading.Event()
    sender = threading.Thread(
        target=_send_at, args=(drilled_out["run"], rank, step, SIGNALS[how], report, done), daemon=True
    )
    sender.start()
    report.stopped_exit = run_job(drilled_argv, drilled_out)
    ended = time.monotonic()
    done.set()
    sender.join()
    if report.signalled_at_step is None or report.stopped_exit == 0:
        raise JobError(
            f"drill: the run ended (exit {report.stopped_exit}) before the signal to rank {rank} at step {step} "
            "stopped it: run the drill again with another --drill-seed, or with more steps per epoch"
        )
    report.stop_seconds = ended - report.stop_seconds
    report.steps_reached = run_steps(drilled_out["run"], size)
    saved = newest_checkpoint(drilled_out["run"])
    if saved is not None:
        report.resumed_from = saved.name
        report.resumed_from_step = position(saved.name, report.steps_per_epoch)
        report.steps_lost = max(0, report.steps_reached - report.resumed_from_step)
    else:
        report.steps_lost = report.steps_reached

    print(
        f"drill: 3/3 the stopped run again, same folder: it resumes from {saved.name if saved else 'nothing'}",
        flush=True,
    )
    report.resumed_exit = run_job(drilled_argv, drilled_out)
    a, b = newest_checkpoint(straight_out["run"]), newest_checkpoint(drilled_out["run"])
    if report.resumed_exit == 0 and a is not None and b is not None:
        report.different = compare(a, b)
        report.equal = not report.different
    else:
        report.equal = False
    for line in report.lines():
        print(line, flush=True)
    (root / "drill.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 0 if report.equal else 1
