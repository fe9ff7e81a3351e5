"""What both PyTorch payloads (classification and land cover) do around the training step: the device and its
defaults, the optimizer and its step, checkpoints and resume, exact sums over ranks, and the run's world record.
Collectives go through the backend (backends.py: Horovod, DDP, or Single where Horovod is not installed), the same
calls for all."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from ..common import checkpoint, config, devices, watchdog
from ..common import preemption as preempt
from ..common.errors import ConfigError
from . import affinity, models, precision

SUFFIX = ".pt"
log = logging.getLogger("payloads.pytorch")
# torch.amp.GradScaler(device) (2.3), torch.compile on Python 3.12 and torchvision 0.19's batched nvJPEG decode
# for --gpu-decode (2.4): docs/pytorch-gpu.md#which-torch.
OLDEST_TORCH = (2, 4)


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of torch.__version__: "2.14.1+cpu", "2.11.0a0+gitabc" (NVIDIA's images) -> (2, 14), (2, 11)."""
    m = re.match(r"(\d+)\.(\d+)", version or torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def setup(cfg: config.TrainConfig, backend) -> tuple[torch.device, precision.Precision]:
    """The device of this process and its precision; fills the device-dependent defaults (amp, channels_last)."""
    if backend.local_rank() == 0:  # one line per node: the driver, the CUDA torch was built for, any mismatch
        log.info("%s", devices.report("PyTorch", torch.version.cuda))
        if torch_version() < OLDEST_TORCH:
            log.warning(
                "torch %s is older than %d.%d, the oldest these payloads support (docs/pytorch-gpu.md#which-torch)",
                torch.__version__,
                *OLDEST_TORCH,
            )
    devices.require_gpus(torch.cuda.device_count(), backend.local_size(), "PyTorch", torch.version.cuda)
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // backend.local_size())
    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        torch.cuda.set_device(backend.local_rank())
        # Before any loader or decode worker exists, so that they start on the GPU's CPUs (affinity.py).
        bound = affinity.bind_to_gpu(backend.local_rank())
        log.info("CPU affinity %s: %s", bound["cpus"] or "unchanged", bound["why"])
        if bound["cpus"] and threads > len(os.sched_getaffinity(0)):
            # --threads or the node's CPUs per process may be more: no more intra-op threads than CPUs allowed.
            torch.set_num_threads(len(os.sched_getaffinity(0)))
        torch.backends.cudnn.benchmark = True
        device = torch.device("cuda", backend.local_rank())
    else:
        device = torch.device("cpu")
    chosen = precision.choose(device, cfg.amp, cfg.amp_dtype, cfg.adasum)
    if cfg.adasum or cfg.fp16_allreduce:  # what the backend cannot do with them (backends.py: check)
        backend.check(cfg)
    if cfg.amp is None and device.type == "cuda" and chosen.name == "fp32":
        log.info("mixed precision off: --adasum steps on unscaled gradients and this GPU's native dtype is fp16")
    cfg.amp = chosen.name != "fp32"
    if cfg.channels_last is None:
        cfg.channels_last = device.type == "cuda"
    return device, chosen


def optimizer(cfg: config.TrainConfig, model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.SGD:
    """SGD with momentum, fused (one kernel for all parameters) where this torch offers it for the device."""
    kwargs = dict(lr=lr, momentum=cfg.momentum)
    groups = parameter_groups(model, cfg.weight_decay)
    try:
        opt = torch.optim.SGD(groups, fused=True, **kwargs)
        # GradScaler hands a fused optimizer its found-inf flag and always calls its step, which then skips the
        # update in the kernel; but fused SGD's first step creates the momentum buffers with empty_like before
        # that kernel (torch/optim/sgd.py, _fused_sgd), so an overflowing first step (fp16's usual start) leaves
        # them uninitialised: NaN weights, different on every rank (seen under DDP here). Without the flag,
        # GradScaler skips step() on overflow, as it does for every other optimizer (and for Horovod's, whose
        # wrapper never had the flag).
        opt._step_supports_amp_scaling = False
        return opt
    except (RuntimeError, ValueError, TypeError) as e:  # a device or dtype without a fused kernel
        log.info("fused SGD unavailable on %s (%s): using the foreach implementation", device, e)
        return torch.optim.SGD(groups, foreach=True, **kwargs)


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: the weights that decay (config.decays: kernels and dense matrices) and those that do not
    (BatchNorm's scale and shift, biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if config.decays(p.shape)], "weight_decay": weight_decay},
        {"params": [p for p in params if not config.decays(p.shape)], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def optimizer_step(optimizer, scaler, backend) -> None:
    """The step after a step's backward passes. With fp16's loss scaler: unscale the averaged gradients, step
    unless they hold an inf or NaN (the same decision on every rank, since every rank holds the same average),
    then update the scale. backend.averaged: Horovod averages when its optimizer synchronises, so it does that
    before unscaling and not again inside scaler.step; DDP has averaged them in backward."""
    if scaler is None:
        optimizer.step()
        return
    with backend.averaged(optimizer):
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
    scaler.update()


class Position(NamedTuple):
    """Where a resumed run starts: `epoch` whole epochs done and `step` steps of the next (0: an epoch's start)."""

    epoch: int
    step: int = 0


def restore(cfg, backend, model, opt, scaler, steps_per_epoch: int | None = None) -> Position:
    """Rank 0 loads the newest checkpoint (if any); every rank ends with its weights, optimizer state and loss
    scaler state, and, from a mid-epoch checkpoint, the position inside the epoch and its own random states.
    Returns the position, agreed by all ranks. `steps_per_epoch`: this run's; a mid-epoch checkpoint of a run
    with another step count (another world size or batch) resumes at the start of its epoch, with a warning."""
    start, step, state = 0, 0, None
    _writer.settle()  # a checkpoint this process is still writing (rank 0) is complete before one is looked for
    if backend.rank() == 0 and cfg.resume:
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


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """CUDA's fused and foreach optimizers take a parameter, its gradient and its state only in one layout:
    check_fast_path_restrictions (ATen/native/ForeachUtils.h) compares sizes, and strides except in
    dimensions of size 1 (where a stride means nothing)."""
    return a.shape == b.shape and all(n == 1 or x == y for n, x, y in zip(a.shape, a.stride(), b.stride()))


def fused_layout_problem(*lists) -> str | None:
    """What CUDA's fused SGD (torch._fused_sgd_) would refuse in these lists (params, grads, momentum
    buffers): "params, grads, and momentum_buffer_list must have same dtype, device, and layout"
    (aten/src/ATen/native/cuda/FusedSgdKernel.cu). None where it would run. The CPU kernel has no such check:
    tests/gpu_rules and the images' build check apply this one on the CPU."""
    first = lists[0]
    for other in lists[1:]:
        for a, b in zip(first, other or ()):
            if a.dtype != b.dtype or a.device != b.device or not same_layout(a, b):
                return (
                    "params, grads, and momentum_buffer_list must have same dtype, device, and layout: "
                    f"{tuple(a.shape)} {a.dtype} strides {a.stride()} vs {tuple(b.shape)} {b.dtype} "
                    f"strides {b.stride()}"
                )
    return None


def align_state_layouts(opt: torch.optim.Optimizer) -> None:
    """Give every optimizer state tensor its parameter's memory layout. A fused optimizer walks parameter, gradient
    and state memory element by element, so a momentum buffer laid out differently from its channels_last
    parameter pairs the wrong elements (measured: 0.36 off after one fused SGD step; tests/test_layouts.py).
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
    the seconds the job waited: the snapshot, any wait for the previous write, and with `wait` the write."""
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
            "config": cfg.to_json(),
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


def pauser(cfg, backend, model, optimizer, scaler, stop, watch):
    """What a training loop calls at each agreement: the verdict's mid-epoch checkpoint, and on SIGTERM the stop."""

    def pause(epoch: int, done: int, steps: int, verdict: str | None) -> None:
        if verdict is None or (verdict == "clock" and done == steps):  # the epoch's own checkpoint follows
            return
        watch.doing("checkpoint")
        # After the epoch's last step the state is the epoch's end: (epoch + 1, 0), the name an epoch's checkpoint has.
        at = (epoch + 1, 0) if done == steps else (epoch, done)
        # A stop's checkpoint is complete before the process exits; the clock's is written while training goes on.
        seconds = save(cfg, backend, at[0], model, optimizer, scaler, at[1], steps, wait=verdict == "signal")
        stop.saved(seconds)
        where = checkpoint_path(cfg, *at)
        if verdict == "signal":
            raise preempt.Stopped(stop.stop_line(str(where), seconds))
        if backend.rank() == 0:
            log.info("checkpoint on the clock: %s (%.1fs)", where.name, seconds)
        watch.doing("input")

    return pause


def checkpoint_path(cfg, epoch_done: int, step: int = 0):
    return checkpoint.path_for(cfg.checkpoint_dir, epoch_done, SUFFIX, step)


def preemption(cfg, backend) -> preempt.Preemption:
    """This rank's SIGTERM flag and checkpoint clock (payloads/common/preemption.py), installed."""
    return preempt.Preemption(backend.rank(), cfg.checkpoint_every_minutes).install()


def agree(backend, stop: preempt.Preemption) -> str | None:
    """The ranks' agreement (preemption.py): one sum of three host numbers over ranks, on the CPU (Gloo under DDP
    with NCCL too): no device sync."""
    return stop.agree(
        lambda values: backend.allreduce_sum(torch.tensor(values, dtype=torch.float64), "preemption").tolist()
    )


def stop_at_epoch_end(cfg, backend, stop: preempt.Preemption, epochs_done: int) -> None:
    """A SIGTERM during an epoch's end (sums, validation, checkpoint): the ranks agree once more, and the epoch's
    checkpoint is the one to resume from, complete on disk before the exit. Not after the last epoch: the run ends
    anyway (and stopping() waits for that checkpoint)."""
    if epochs_done < cfg.epochs and agree(backend, stop) == "signal":
        where = checkpoint_path(cfg, epochs_done)
        seconds = (stop.write_seconds or 0.0) + finish_checkpoints(backend)
        raise preempt.Stopped(stop.stop_line(str(where), seconds))


@contextlib.contextmanager
def stopping(backend, stop: preempt.Preemption, watch):
    """Around a payload's epochs: after the last one every rank waits for rank 0's last checkpoint write
    (finish_checkpoints: its failure ends every rank with one line); on preempt.Stopped every rank shuts the backend
    down (all stopped at the same step, so DDP's barrier passes) and marks its heartbeat "stopped"; the SIGTERM
    handler goes either way, and on any other exit rank 0 still lets its write in flight end."""
    try:
        yield
        watch.doing("checkpoint")
        finish_checkpoints(backend)
    except preempt.Stopped:
        watch.doing("finishing")
        backend.shutdown()
        watch.stop("stopped")
        raise
    finally:
        stop.uninstall()
        _writer.settle()


def summary_writer(folder):
    """TensorBoard's writer (rank 0). tensorboard does its file I/O through tensorboard.compat.tf, which imports
    TensorFlow when it is installed: about 4 s at start-up in .venv (measured), and TF's threads in a PyTorch
    process. The marker module tensorboard.compat.notf (the no_tensorflow target in tensorboard/compat/__init__.py)
    selects tensorboard's own stub, which writes the same event files, as in the PyTorch image, where TF is absent."""
    import sys
    import types

    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(folder))


def global_sums(backend, name: str, *values) -> list[float]:
    """Sum over ranks (floats or device tensors, read here once): losses and counts are summed, then divided, so
    means are exact."""
    t = torch.stack(
        [
            torch.as_tensor(v, dtype=torch.float64, device="cpu")
            if not torch.is_tensor(v)
            else v.detach().to("cpu", torch.float64)
            for v in values
        ]
    )
    return backend.allreduce_sum(t, name).tolist()


def world(backend, model, device, chosen: precision.Precision, cfg) -> dict:
    """The run's world as metrics.json records it: backend (horovod | ddp) and its controller or process group."""
    return {
        "processes": backend.size(),
        "local_processes": backend.local_size(),
        "device": str(device),
        "torch": torch.__version__,
        **backend.describe(),
        "gradient_mbytes": models.gradient_bytes(model) / 1e6,
        "threads_per_process": torch.get_num_threads(),
        "precision": chosen.name,
        "loss_scaler": chosen.needs_scaler,
        "memory_format": "channels_last" if cfg.channels_last else "contiguous",
        "compiled": bool(cfg.compile),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }


def watch(cfg: config.TrainConfig, backend) -> watchdog.Watchdog:
    """This rank's stall watchdog (payloads/common/watchdog.py), started. One broadcast gives every rank rank 0's
    name for the run, which tells this run's heartbeats from an earlier run's in the same folder."""
    return watchdog.started(
        cfg.output_dir,
        backend.rank(),
        backend.size(),
        cfg.stall_timeout,
        lambda token: backend.broadcast_object(token, name="watchdog_run"),
    )


def phases(cfg: config.TrainConfig, backend, watch: watchdog.Watchdog) -> watchdog.Phases:
    """The ranks' step-part times (watchdog.Phases), compared every --straggler-every steps; hosts gathered once."""
    return watchdog.Phases(watch, backend.allgather_object(watch.host, "hosts"), cfg.straggler_every)


def compare_phases(backend, phases: watchdog.Phases) -> None:
    """One small collective: every rank's row of step-part seconds summed into the matrix; rank 0 logs the
    stragglers it names (every rank would name the same)."""
    phases.watch.doing("exchange")
    rows = backend.allreduce_sum(torch.tensor(phases.matrix(), dtype=torch.float64), "step_phases").tolist()
    for line in phases.add(rows):
        if backend.rank() == 0:
            log.warning("%s", line)


# Where NCCL's flight recorder writes its dump (<prefix><rank>) when a collective times out: torch 2.4 reads the
# first name, later ones also the second (torch/csrc/distributed/c10d; TorchTitan sets both the same way).
FLIGHT_RECORDER_FILE = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")


def collective_timeout(cfg: config.TrainConfig, environ=None) -> float | None:
    """DDP's process-group timeout, seconds (None: torch's default). NCCL's watchdog aborts a collective that
    takes longer, and dumps its flight recorder where the launcher turned it on (TORCH_NCCL_DUMP_ON_TIMEOUT,
    launcher/jobspec.py): beyond the stall watchdog's start-up bound and its limit, so that the watchdog, which
    names the ranks, acts first and NCCL's timeout is the backstop. Also points the dump at
    <output>/stalls/nccl-trace-rank<r> unless the job chose a file."""
    environ = os.environ if environ is None else environ
    if cfg.stall_timeout == 0:
        return None
    if environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "0") not in ("", "0") and not any(
        k in environ for k in FLIGHT_RECORDER_FILE
    ):
        folder = watchdog.stalls_dir(cfg.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for key in FLIGHT_RECORDER_FILE:
            environ[key] = str(folder / "nccl-trace-rank")
    steady = 0.0 if cfg.stall_timeout == watchdog.AUTO else float(cfg.stall_timeout)
    return max(watchdog.STARTUP_SECONDS, steady) + 300
