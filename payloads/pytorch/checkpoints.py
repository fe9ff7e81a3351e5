"""Checkpoints of the PyTorch payloads: rank 0 writes them off the step path (a snapshot, then one writer thread),
every rank restores from the newest, mid-epoch ones included, with its own random states and running statistics,
and optimizer state is given its parameter's memory layout back. The data order needs no state of its own: it is a
function of (--seed, epoch, rank), rebuilt on resume and entered at the saved step."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from ..common import checkpoint
from ..common.errors import ConfigError
from .runtime import same_layout

SUFFIX = ".pt"
log = logging.getLogger("payloads.pytorch")


class Rollback(Exception):
    """Raised out of a step, every rank at the same one (the replica sentinel's finding): the loop fires rollback,
    then restores the newest checkpoint left, as a resume does (loop.Run.restore)."""


class Position(NamedTuple):
    """Where a resumed run starts: `epoch` whole epochs done and `step` steps of the next (0: an epoch's start)."""

    epoch: int
    step: int = 0


def stateful(concerns) -> dict:
    """The concerns that carry state (state_dict, load_state_dict), by their class's name: a checkpoint holds each
    one's under that name."""
    return {type(c).__name__: c for c in concerns if hasattr(c, "state_dict")}


def restore(cfg, backend, model, opt, scaler, steps_per_epoch=None, concerns=(), resume=None) -> Position:
    """Rank 0 loads the newest checkpoint (if any, and `resume`: --resume unless given); every rank ends with its
    weights, optimizer state and loss scaler state, each stateful concern's state, and, from a mid-epoch
    checkpoint, the position inside the epoch and its own random states. Returns the position, agreed by all
    ranks. `steps_per_epoch`: this run's; a mid-epoch checkpoint of a run with another step count (another world
    size or batch) resumes at the start of its epoch, with a warning."""
    start, step, state = 0, 0, None
    _writer.settle()  # a checkpoint this process is still writing (rank 0) is complete before one is looked for
    if backend.rank() == 0 and (cfg.resume if resume is None else resume):
        found = checkpoint.latest(cfg.checkpoint_dir, SUFFIX)
        if found:
            start, path = found
            try:
                state = torch.load(path, map_location="cpu", weights_only=False)
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["optimizer"])
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
                start = -1
                log.error(
                    "cannot resume from %s: %s: move it away, or pass --no-resume to start over in a new --output-dir",
                    path,
                    e,
                )
            else:
                step = int(state.get("step", 0))
                saved_steps = state.get("steps_per_epoch")
                if step and steps_per_epoch is not None and saved_steps != steps_per_epoch:
                    log.warning(
                        "%s was written %d steps into an epoch of %s steps; this run's epoch has %d (another world "
                        "size or batch): epoch %d starts again from its first step",
                        path.name,
                        step,
                        saved_steps,
                        steps_per_epoch,
                        start + 1,
                    )
                    step = 0
                where = f", {step} steps of epoch {start + 1}" if step else ""
                log.info("resuming from %s (%d epochs done%s)", path, start, where)
    start, step = backend.broadcast_object((start, step), name="resume_epoch")
    if start < 0:
        raise ConfigError("the newest checkpoint could not be loaded (see the message above)")
    if start > 0 or step > 0:
        # Rank 0's state loaded by the others, without an optimizer step (backends.load_root_optimizer_state).
        backend.broadcast_optimizer_state(opt)
        if scaler is not None:
            # Every rank must scale its loss by the same factor: the averaged gradient is unscaled by each rank's
            # own scale, so a rank left at the default scale would step on a differently scaled gradient.
            saved = state.get("scaler") if state is not None else None
            saved = backend.broadcast_object(saved, name="resume_scaler")
            if saved:
                scaler.load_state_dict(saved)
            elif backend.rank() == 0:
                log.warning(
                    "the checkpoint holds no loss-scaler state (written without fp16): starting at the default scale"
                )
        rngs = backend.broadcast_object(state.get("rng") if state is not None else None, name="resume_rng")
        if rngs and len(rngs) == backend.size():
            set_rng_state(rngs[backend.rank()])
    backend.broadcast_parameters(model.state_dict())
    if start > 0 or step > 0:
        own = backend.broadcast_object(state.get("rank_buffers") if state is not None else None, name="resume_buffers")
        if own and len(own) == backend.size():
            set_rank_buffers(model, own[backend.rank()])
        for name, concern in stateful(concerns).items():
            saved = backend.broadcast_object((state or {}).get("concerns", {}).get(name), name=f"resume_{name}")
            if saved is not None:
                concern.load_state_dict(saved)
    align_state_layouts(opt)
    return Position(start, step)


def rank_buffers(model: torch.nn.Module) -> dict:
    """This rank's floating-point buffers (running statistics), on the CPU."""
    return {name: b.detach().cpu() for name, b in model.named_buffers() if b.is_floating_point()}


def set_rank_buffers(model: torch.nn.Module, saved: dict) -> None:
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in saved.items():
            if name in buffers and buffers[name].shape == value.shape:
                buffers[name].copy_(value)


def rng_state() -> dict:
    """This process's random states: torch's (CPU and this process's GPU), NumPy's and Python's global ones."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def align_state_layouts(opt: torch.optim.Optimizer) -> None:
    """Give every optimizer state tensor its parameter's memory layout. A fused optimizer walks parameter, gradient
    and state memory element by element, so a momentum buffer laid out differently from its channels_last
    parameter pairs the wrong elements (tests/test_layouts.py; docs/benchmarks.md#fused-sgd-and-memory-layouts).
    Resume can make such buffers: a checkpoint written without --channels-last holds default-layout state, and
    load_state_dict keeps the layout it is given."""
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            for key, value in state.items():
                if torch.is_tensor(value) and value.shape == p.shape and not same_layout(value, p):
                    state[key] = torch.empty_like(p, dtype=value.dtype).copy_(value)


class _Writer:
    """Rank 0's checkpoint writes, off the step path: one background thread, at most one write in flight. A write's
    exception is kept and raised by the next finish() (the next save, or the end of training), where every rank
    waits for it together (checkpoint.on_root). Not a daemon thread: an interpreter that exits waits for the write."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, job: Callable[[], None]) -> None:
        self.finish()

        def run() -> None:
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - raised again by the next finish(), on the training thread
                self._error = e

        self._thread = threading.Thread(target=run, name="checkpoint-writer")
        self._thread.start()

    def wait(self) -> BaseException | None:
        """Until the write in flight (if any) has ended; its exception, handed out once."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        return error

    def failed(self) -> bool:
        """Whether the last write has ended in an exception; never waits (asked at every agreement)."""
        return self._thread is not None and not self._thread.is_alive() and self._error is not None

    def finish(self) -> None:
        """Wait, and raise the write's exception (an OutputFull is shared with every rank by on_root)."""
        error = self.wait()
        if error is not None:
            raise error

    def settle(self) -> None:
        """Wait where no rank can be told (an exit on an exception): the write ends complete or not at all; a
        failure is logged."""
        error = self.wait()
        if error is not None:
            log.error("the last checkpoint write failed: %s", error)


_writer = _Writer()


def snapshot(state):
    """A copy of `state` that training cannot change while it is written: every tensor copied to CPU memory (from a
    GPU, the copy torch.save makes anyway; on the CPU a clone, because model.state_dict(), optimizer.state_dict() and
    Single's gathers hand out the live tensors that the next step updates in place), dicts, lists and tuples
    rebuilt, other values (numbers, strings, NumPy's fresh RNG arrays) kept. Tensors that were one stay one."""
    copies: dict[int, torch.Tensor] = {}

    def freeze(value):
        if torch.is_tensor(value):
            if id(value) not in copies:
                copies[id(value)] = value.detach().to("cpu", copy=True)
            return copies[id(value)]
        if isinstance(value, dict):
            out = value.copy()  # its own type (a module's state_dict is an OrderedDict)
            for key, item in value.items():
                out[key] = freeze(item)
            if hasattr(value, "_metadata"):  # a module's state_dict: the versions load_state_dict reads
                out._metadata = value._metadata
            return out
        if type(value) in (list, tuple):
            return type(value)(freeze(v) for v in value)
        return value

    return freeze(state)


def _write(path, state: dict, keep: int) -> None:
    checkpoint.write(path, lambda p: torch.save(state, p), keep)
    checkpoint.prune(path.parent, SUFFIX, keep)


def save(
    cfg,
    backend,
    epoch_done: int,
    model,
    opt,
    scaler,
    step: int = 0,
    steps_per_epoch: int | None = None,
    wait: bool = False,
    config: dict | None = None,
    concerns=(),
) -> float:
    """Rank 0 writes the checkpoint: after `epoch_done` epochs and, mid-epoch, `step` steps of the next one. `model`
    is the plain module (never DDP's wrapper, whose names carry a `module.` prefix), so a checkpoint resumes under
    either backend. Every rank calls it: every rank's random states are gathered into it (one collective), and a
    full output folder ends every rank with rank 0's one line (checkpoint.on_root). The data order needs no state
    of its own: it is a function of (--seed, epoch, rank), rebuilt on resume and entered at `step`.

    Rank 0 takes a snapshot (CPU copies) and a background thread writes it (checkpoint.write, then prune), so the
    next steps run during the copy to the output folder; `wait`: written before it returns (the stop checkpoint).
    Each save first waits for the write before it: that write's failure is raised here on every rank (the one
    broadcast every save makes), and the end of training does the same for the last (finish_checkpoints). Returns
    the seconds the job waited: the snapshot, any wait for the previous write, and with `wait` the write. `config`:
    the configuration as the run resolved it (runtime.Settings.config_record); the parsed one where not given.
    `concerns`: the run's; each stateful one's state_dict() is saved under its name (stateful)."""
    started = time.perf_counter()
    rngs = backend.allgather_object(rng_state(), "rng_states")
    # Each rank's own floating buffers (BatchNorm's running statistics are per rank under both backends): a resume
    # gives every rank its own back, so that a run stopped and resumed ends where the uninterrupted run does.
    buffers = backend.allgather_object(rank_buffers(model), "rank_buffers")

    def write() -> None:
        _writer.finish()  # the previous write: its failure ends the job here, before anything newer is written
        state = {
            "epoch": epoch_done,
            "step": step,
            "steps_per_epoch": steps_per_epoch,
            "data_order": {"seed": cfg.seed, "epoch": epoch_done, "skip": step},
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rngs,
            "rank_buffers": buffers,
            "concerns": {name: concern.state_dict() for name, concern in stateful(concerns).items()},
            "config": config if config is not None else cfg.to_json(),
            "world_size": backend.size(),
            "backend": backend.name,
        }
        path = checkpoint.path_for(cfg.checkpoint_dir, epoch_done, SUFFIX, step)
        frozen = snapshot(state)
        _writer.start(lambda: _write(path, frozen, cfg.keep_checkpoints))
        if wait:
            _writer.finish()

    checkpoint.on_root(backend.rank() == 0, write, lambda failure: backend.broadcast_object(failure, name="saved"))
    return time.perf_counter() - started


def finish_checkpoints(backend) -> float:
    """Every rank, at one place (the end of the epochs, a stop at an epoch's end): rank 0 waits for its checkpoint
    write in flight, and a failure of it ends every rank with rank 0's one line, as in save. Returns the seconds
    waited."""
    started = time.perf_counter()
    checkpoint.on_root(
        backend.rank() == 0, _writer.finish, lambda failure: backend.broadcast_object(failure, name="written")
    )
    return time.perf_counter() - started


def settle() -> None:
    """Where no rank can be told (an exit on an exception): rank 0's write in flight ends complete or not at all;
    a failure is logged."""
    _writer.settle()


def checkpoint_path(cfg, epoch_done: int, step: int = 0):
    return checkpoint.path_for(cfg.checkpoint_dir, epoch_done, SUFFIX, step)


class Saver:
    """The loop's checkpoints (what payloads/common/concerns.Checkpoints calls): the run's state written by save(),
    with the configuration as the run resolved it."""

    def save(self, run, epochs_done: int, step: int = 0, wait: bool = False) -> float:
        return save(
            run.cfg,
            run.backend,
            epochs_done,
            run.model,
            run.optimizer,
            run.scaler,
            step,
            run.steps,
            wait=wait,
            config=run.settings.config_record(run.cfg),
            concerns=run.concerns,
        )

    def path(self, run, epochs_done: int, step: int = 0):
        return checkpoint_path(run.cfg, epochs_done, step)

    def finish(self, run) -> float:
        return finish_checkpoints(run.backend)

    def settle(self) -> None:
        settle()

    def failed(self) -> bool:
        return _writer.failed()
