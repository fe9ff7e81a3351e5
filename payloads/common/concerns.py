"""The concerns every payload's loop has, written once for every framework: the stall watchdog, the stragglers'
comparison, and checkpoints with the SIGTERM stop and the checkpoint clock. Each is one object with a method per
event it attaches to; a loop holds them in a list and fires the events in order (`Events.fire`).

The events these attach to, fired by payloads/pytorch/loop.py from its loop, payloads/tensorflow/train.py from its
custom loop and payloads/keras/train.py through one Keras callback (KerasEvents): EVENTS. The PyTorch loop fires a
few more for its own concerns (loop.Run.EVENTS). A concern's public methods are its handlers: attach() refuses one
that names no event (a misspelt `step_ended` would otherwise never be called); its helpers start with `_`.

What a concern reads from the run: `cfg`, `log` (the framework's logger), `backend` (rank, size,
broadcast_object(obj, name), allgather_object(obj, name)), `root`, `epoch`, `step` (the step just trained,
0-based in its epoch), `steps` (the epoch's), `sum_floats(values, name)` (one sum over ranks of host numbers) and
`saver` (the framework's checkpoints: save, path, finish, settle, failed). A framework's own concerns (PyTorch's sentinel,
clock, progress and outputs: payloads/pytorch/concerns.py) sit in the same list."""

from __future__ import annotations

import contextlib

from . import preemption as preempt
from . import stragglers, watchdog

EVENTS = (
    "doing",
    "run_start",
    "step_end",
    "epoch_end",
    "epoch_record",
    "validation_start",
    "validation_step",
    "checkpoint",
    "after_epoch",
    "run_end",
    "stopped",
    "close",
    "finished",
)


class Events:
    """What a run's state object needs to fire events: its `concerns`, in the order each event reaches them."""

    EVENTS = EVENTS
    concerns: list

    def attach(self, concerns: list) -> None:
        """The run's concerns, each public method checked against the events (state_dict and load_state_dict: a
        concern's state, which the checkpoints carry)."""
        for concern in concerns:
            for name in dir(type(concern)):
                known = name.startswith("_") or name in (*self.EVENTS, "state_dict", "load_state_dict")
                if not known and callable(getattr(concern, name)):
                    raise TypeError(
                        f"{type(concern).__name__}.{name} is no event: a concern's handlers are named "
                        f"{', '.join(self.EVENTS)} (helpers start with _)"
                    )
        self.concerns = concerns

    def fire(self, event: str, *args) -> None:
        """Call `event` on every concern that has it, in the order they are listed."""
        for concern in self.concerns:
            handler = getattr(concern, event, None)
            if handler is not None:
                handler(self, *args)

    def doing(self, what: str) -> None:
        """What this rank is doing now (input, compute, exchange, step, validation, checkpoint, finishing)."""
        self.fire("doing", what)

    def validation_step(self) -> None:
        self.fire("validation_step")


@contextlib.contextmanager
def ending(run: Events, shutdown=None):
    """Around a run's epochs: run_end after the last one; on preemption.Stopped every rank shuts its collectives
    down (`shutdown`: all stopped at the same step, so DDP's barrier passes) and fires stopped; close fires
    whatever the ending."""
    try:
        yield
        run.fire("run_end")
    except preempt.Stopped:
        run.doing("finishing")
        if shutdown is not None:
            shutdown()
        run.fire("stopped")
        raise
    finally:
        run.fire("close")


class Watch:
    """The stall watchdog (watchdog.py): what this rank is doing, marked by attribute stores; a rank that stops
    making progress ends the job, named (docs/stuck-or-slow.md#a-job-is-stuck-or-slow). Started at construction, right
    after the collectives, so a hang in the device's set-up or the data's is named too. One broadcast gives every
    rank rank 0's name for the run, which tells this run's heartbeats from an earlier run's in the same folder."""

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
        self.watch.at = (run.epoch, run.step + 1)
        self.watch.step_done()

    def epoch_end(self, run) -> None:
        self.watch.doing("epoch end")

    def validation_start(self, run) -> None:
        self.watch.doing("validation")

    def validation_step(self, run) -> None:
        self.watch.tick()

    def stopped(self, run) -> None:
        self.watch.stop("stopped")

    def finished(self, run) -> None:
        self.watch.stop()


class Stragglers:
    """The ranks' step-part times (stragglers.Phases), compared every --straggler-every steps in one small sum over
    ranks: every rank's row of seconds summed into the matrix; rank 0 logs the stragglers it names (every rank
    would name the same). Hosts are gathered once, at construction."""

    def __init__(self, cfg, backend, watch: watchdog.Watchdog):
        self.phases = stragglers.Phases(watch, backend.allgather_object(watch.host, "hosts"), cfg.straggler_every)

    def _compare(self, run) -> None:
        doing = self.phases.watch.what
        run.doing("exchange")
        for line in self.phases.add(run.sum_floats(self.phases.matrix(), "step_phases")):
            if run.root:
                run.log.warning("%s", line)
        run.doing(doing)

    def step_end(self, run) -> None:
        if self.phases.due():  # every rank at the same step: the sum is safe here
            self._compare(run)

    def epoch_end(self, run) -> None:
        self._compare(run)  # the epoch's last steps, for its per-rank totals

    def epoch_record(self, run, record: dict) -> None:
        record.update(self.phases.epoch_record())


class Checkpoints:
    """The epoch's checkpoint, and the mid-epoch ones: on SIGTERM (then the stop, preemption.Stopped) and on the
    checkpoint clock, at a step every rank agrees on (preemption.py, docs/preempted-and-resumed.md#preempted-and-resumed). Never
    after an epoch's last step: the epoch's end (a task's averaging, the evaluation, the epoch's checkpoint)
    follows, and a SIGTERM then stops at the epoch's checkpoint (after_epoch). The writing is the framework's
    (`run.saver`)."""

    def __init__(self, run):
        self.stop = preempt.Preemption(run.backend.rank(), run.cfg.checkpoint_every_minutes)
        self.events: preempt.ScheduledEvents | None = None

    def _agree(self, run) -> str | None:
        """One sum of four host numbers over ranks: no device sync. Rank 0's failed background write ends every rank
        here, with its one line (an OutputFull raised on every rank by the saver's finish)."""
        verdict = self.stop.agree(lambda values: run.sum_floats(values, "preemption"), run.saver.failed())
        if verdict == preempt.WRITE_FAILED:
            run.doing("checkpoint")
            run.saver.finish(run)
            return None
        return verdict

    def run_start(self, run) -> None:
        self.stop.install()
        self.events = preempt.ScheduledEvents.from_env(self.stop)  # Azure's earlier notice, where the job has it

    def step_end(self, run) -> None:
        if self.stop.due() and run.step + 1 < run.steps:
            self._pause(run, self._agree(run))

    def _pause(self, run, verdict: str | None) -> None:
        """After the ranks agreed on `verdict` at run.step: the mid-epoch checkpoint of a signal (then the stop) or
        of the clock."""
        if verdict is None:
            return
        run.doing("checkpoint")
        done = run.step + 1
        # A stop's checkpoint is complete before the process exits; the clock's is written while training goes on.
        seconds = run.saver.save(run, run.epoch, done, wait=verdict == "signal")
        self.stop.saved(seconds)
        where = run.saver.path(run, run.epoch, done)
        if verdict == "signal":
            raise preempt.Stopped(self.stop.stop_line(str(where), seconds))
        if run.root:
            run.log.info("checkpoint on the clock: %s (%.1fs)", where.name, seconds)

    def checkpoint(self, run) -> None:
        run.doing("checkpoint")
        self.stop.saved(run.saver.save(run, run.epoch + 1))

    def after_epoch(self, run) -> None:
        """A SIGTERM during an epoch's end (sums, validation, checkpoint): the ranks agree once more, and the epoch's
        checkpoint is the one to resume from, complete on disk before the exit. Not after the last epoch: the run
        ends anyway (and run_end waits for that checkpoint)."""
        done = run.epoch + 1
        if done < run.cfg.epochs and self._agree(run) == "signal":
            where = run.saver.path(run, done)
            seconds = (self.stop.write_seconds or 0.0) + run.saver.finish(run)
            raise preempt.Stopped(self.stop.stop_line(str(where), seconds))

    def run_end(self, run) -> None:
        """Every rank waits for rank 0's last write: its failure ends every rank with rank 0's one line."""
        run.doing("checkpoint")
        run.saver.finish(run)

    def close(self, run) -> None:
        """Whatever the ending: SIGTERM's handler goes, and rank 0's write in flight ends complete or not at all."""
        self.stop.uninstall()
        if self.events is not None:
            self.events.close()
        run.saver.settle()
