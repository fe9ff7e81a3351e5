"""The collective layer under both PyTorch payloads: Horovod (the default) or PyTorch DDP (--backend ddp), and
Single, one process without any collective library, where Horovod is not installed.

train.py, segmentation/train.py and runtime.py reach ranks, gradients and collectives through these methods
only, so the backends run the same training: the same shards (by global rank), the same averaged
gradients, the same checkpoints (the plain model's state, never DDP's `module.`-prefixed one).

- Horovod: hvd.DistributedOptimizer averages gradients in the optimizer; ranks come from hvd (horovodrun,
  mpirun, Azure ML's MPI distribution).
- DDP: DistributedDataParallel averages them during backward; ranks come from the environment torchrun and
  Azure ML's PyTorch distribution set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). NCCL carries
  GPU tensors and Gloo CPU ones ("cpu:gloo,cuda:nccl"), so the metric sums, which are CPU tensors, and the
  object collectives work with either; on a CPU, Gloo carries everything.
- Single: --backend horovod (the default) in a Python without Horovod (a vendor GPU image, say) and started
  by no launcher: rank 0 of 1, every collective an identity. It says so in its first line and in metrics.json
  (`world.backend` "single"). Started by a launcher that made several processes (horovodrun, mpirun, torchrun),
  it refuses instead: each process would train its own copy of the model.

The one step where they differ (runtime.optimizer_step): under fp16 with a loss scaler, Horovod's gradients
are averaged only when the optimizer synchronises, so it must synchronise before GradScaler unscales them and
not again when GradScaler steps; DDP's gradients are already averaged when backward returns.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from ..common.config import BACKENDS
from ..common.entry import UNDER_MPIRUN
from ..common.errors import ConfigError

log = logging.getLogger("payloads.pytorch")

# What torchrun (and Azure ML's PyTorch distribution) sets for every process: env:// rendezvous reads them.
RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# Set by mpirun / horovodrun: a DDP process started there has no RENDEZVOUS and would train alone.
MPI_MARKERS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_RANK")
# What launchers set in each process they start: (variable, what it counts). A size above 1 or a rank above 0
# means this process is one of several (horovodrun: HOROVOD_*; Open MPI's mpirun and Azure ML's MPI
# distribution: OMPI_COMM_WORLD_*; MPICH and Intel MPI: PMI_*; torchrun and Azure ML's PyTorch distribution).
LAUNCHER_COUNTS = (
    ("HOROVOD_SIZE", "size"),
    ("HOROVOD_RANK", "rank"),
    ("OMPI_COMM_WORLD_SIZE", "size"),
    ("OMPI_COMM_WORLD_RANK", "rank"),
    ("PMI_SIZE", "size"),
    ("PMI_RANK", "rank"),
    ("WORLD_SIZE", "size"),
    ("RANK", "rank"),
)
ALONE = "Horovod is not installed: training alone in one process (no collectives)"


def create(name: str, timeout: float | None = None):
    """The backend named by --backend (not yet initialised). --backend horovod in a Python without Horovod:
    Single when no launcher started several processes, else a ConfigError naming the fix. `timeout`: DDP's
    collective timeout in seconds (runtime.collective_timeout; None: torch's default)."""
    if name == "horovod":
        try:
            import horovod.torch as hvd  # late: --help and config errors need no Horovod
        except ModuleNotFoundError as e:
            if e.name != "horovod":  # Horovod is there but broken: its own error says why
                raise
            several = several_processes(os.environ)
            if several:
                raise ConfigError(
                    f"Horovod is not installed in this Python ({e}), and a launcher started this process as "
                    f"one of several ({several}): each would train its own copy of the model alone. Install "
                    "Horovod here (the training image has it; toolchain/build_horovod.sh builds it), or under "
                    "torchrun pass --backend ddp, or start one process without a launcher (plain python -m ...), "
                    "which trains alone"
                ) from None
            return Single(reason=str(e))
        return Horovod(hvd)
    if name == "ddp":
        return DDP(timeout)
    raise ConfigError(f"--backend {name!r}: choose {' or '.join(BACKENDS)}")


def several_processes(env) -> str | None:
    """The launcher variable that says this process is one of several (`NAME=value`), or None. A value that is
    not a whole number counts as several: better a refusal naming it than N copies training apart."""
    for key, kind in LAUNCHER_COUNTS:
        value = env.get(key)
        if value is None:
            continue
        try:
            n = int(value)
        except ValueError:
            return f"{key}={value!r}"
        if (kind == "size" and n > 1) or (kind == "rank" and n > 0):
            return f"{key}={value}"
    return None


class Single:
    """One process, no collective library: rank 0 of 1. Collectives are identities (the sum or mean over one
    rank is the tensor itself), broadcasts return what rank 0 holds, wrap leaves the model and the optimizer as
    they are. --adasum and --fp16-allreduce combine the gradients of several processes: with one they would do
    nothing, so they are refused (check) rather than accepted and ignored."""

    name = "single"

    def __init__(self, reason: str = "Horovod is not installed"):
        self.reason = reason

    def init(self) -> None:
        log.warning(ALONE)

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def local_rank(self) -> int:
        return 0

    def local_size(self) -> int:
        return 1

    def check(self, cfg) -> None:
        for flag, asked in (("--adasum", cfg.adasum), ("--fp16-allreduce", cfg.fp16_allreduce)):
            if asked:
                raise ConfigError(
                    f"{flag} combines the gradients of several processes, and this run trains alone in one "
                    f"(Horovod is not installed): drop {flag}, or install Horovod and start the job with horovodrun "
                    "or mpirun"
                )

    def adasum_lr_scale(self, device: torch.device) -> int:
        return 1  # not reached: check() refuses --adasum

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg, device: torch.device):
        """(the module to train, the optimizer to step): both as they are."""
        return model, optimizer

    def before_exchange(self, optimizer, see) -> None:
        """Nothing is exchanged: a gradient that is not finite shows in the next step's loss."""

    def accumulate(self, model: torch.nn.Module, last: bool):
        """Micro-batches add to p.grad; nothing to hold back."""
        return nullcontext()

    def averaged(self, optimizer):
        """The gradients are already the average over the one process."""
        return nullcontext()

    def broadcast_parameters(self, state: dict[str, torch.Tensor]) -> None:
        """Rank 0's tensors are this process's."""

    def broadcast_optimizer_state(self, optimizer) -> None:
        """Rank 0's optimizer state is this process's."""

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return obj

    def allgather_object(self, obj: Any, name: str) -> list:
        return [obj]

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """A new tensor, as the other backends return: the sum over one rank."""
        return tensor.detach().clone(memory_format=torch.contiguous_format)

    def allreduce_mean(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return self.allreduce_sum(tensor, name)

    def describe(self) -> dict:
        return {"backend": self.name, "alone": True, "collectives": "none", "why_alone": self.reason}

    def shutdown(self, stopped: bool = False) -> None:
        pass


class Horovod:
    name = "horovod"

    def __init__(self, hvd=None):
        if hvd is None:
            import horovod.torch as hvd  # late: --help and config errors need no Horovod
        self.hvd = hvd

    def init(self) -> None:
        self.hvd.init()

    def rank(self) -> int:
        return self.hvd.rank()

    def size(self) -> int:
        return self.hvd.size()

    def local_rank(self) -> int:
        return self.hvd.local_rank()

    def local_size(self) -> int:
        return self.hvd.local_size()

    def check(self, cfg) -> None:
        cfg.check_adasum_world(self.size(), self.hvd.mpi_enabled())

    def adasum_lr_scale(self, device: torch.device) -> int:
        """Adasum adds gradients instead of averaging them, so it needs no LR scaling across nodes, only across
        the GPUs of a node that NCCL averages before Adasum combines the nodes."""
        return self.local_size() if device.type == "cuda" and self.hvd.nccl_built() else 1

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg, device: torch.device):
        """(the module to train, the optimizer to step): the model as it is, Horovod's averaging optimizer."""
        hvd = self.hvd
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            groups=buckets(model),
            compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
            # One allreduce after the N-th backward pass of a step: Horovod's hook counts the passes and
            # asserts when there are more than this (horovod/torch/optimizer.py, _make_hook). The passes'
            # gradients add up in p.grad, so the loop weights each micro-batch's loss by its share of the step.
            backward_passes_per_step=cfg.backward_passes_per_step,
            op=hvd.Adasum if cfg.adasum else hvd.Average,
        )
        return model, optimizer

    def before_exchange(self, optimizer, see) -> None:
        """`see(grads)` on each group of this rank's gradients (wrap's buckets) once backward has made them all,
        just before Horovod exchanges it (horovod/torch/optimizer.py, _make_hook); one process exchanges nothing.
        Adasum's optimizer (_DistributedAdasumOptimizer) takes no groups: it steps and exchanges each parameter on
        its own, so there each gradient is seen alone."""
        if self.size() == 1:
            return
        grouped = hasattr(optimizer, "_grouped_allreduce_grad_async")
        name = "_grouped_allreduce_grad_async" if grouped else "_allreduce_grad_async"
        exchange = getattr(optimizer, name)

        def seen(params):  # a group, or Adasum's one parameter
            see([p.grad for p in params] if grouped else [params.grad])
            return exchange(params)

        setattr(optimizer, name, seen)

    def accumulate(self, model: torch.nn.Module, last: bool):
        """Context for one backward pass of a step; Horovod's hooks count the passes themselves."""
        return nullcontext()

    @contextmanager
    def averaged(self, optimizer) -> Iterator[None]:
        """Inside: the gradients are averaged, and stepping does not average them again."""
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            yield

    def broadcast_parameters(self, state: dict[str, torch.Tensor]) -> None:
        self.hvd.broadcast_parameters(state, root_rank=0)

    def broadcast_optimizer_state(self, optimizer) -> None:
        """Not hvd.broadcast_optimizer_state: on the ranks whose optimizer has no state yet, it creates the state
        with a step on zero gradients made by p.data.new(p.size()) (horovod/torch/functions.py), in the default
        layout; CUDA's fused SGD refuses parameters and gradients whose strides differ
        (check_fast_path_restrictions), so every resume of a channels_last model died there on GPUs."""
        load_root_optimizer_state(self, optimizer)

    def broadcast_object(self, obj: Any, name: str) -> Any:
        # Always named: unnamed, Horovod names the broadcast after the object's type, which differs between
        # rank 0 (the object) and the others (None), and every rank waits forever.
        return self.hvd.broadcast_object(obj, root_rank=0, name=name)

    def allgather_object(self, obj: Any, name: str) -> list:
        return self.hvd.allgather_object(obj, name=name)

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name=name)

    def allreduce_mean(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Average, name=name)

    def describe(self) -> dict:
        return {"backend": self.name, "horovod_controller": "mpi" if self.hvd.mpi_enabled() else "gloo"}

    def shutdown(self, stopped: bool = False) -> None:
        if stopped and UNDER_MPIRUN in os.environ:
            return  # entry.finish: after a stop under mpirun, no MPI_Finalize
        self.hvd.shutdown()


class DDP:
    name = "ddp"

    def __init__(self, timeout: float | None = None):
        self._rank = self._size = self._local_rank = self._local_size = None
        self.process_group = None
        self.timeout = timeout

    def init(self) -> None:
        import torch.distributed as dist

        env = os.environ
        given = [k for k in RENDEZVOUS if k in env]
        if not given:
            started_by = [k for k in MPI_MARKERS if k in env]
            if started_by:
                raise ConfigError(
                    f"--backend ddp in a process started by mpirun or horovodrun ({started_by[0]} is "
                    "set, RANK and WORLD_SIZE are not): start DDP with torchrun --nproc-per-node N, "
                    "or on Azure ML with `distribution: type: pytorch` (python -m launcher --backend "
                    "ddp); or drop --backend ddp to train with Horovod"
                )
            # Plain `python -m ...`: a world of one, as Horovod gives without horovodrun.
            rank, size, local_rank, store = 0, 1, 0, dist.HashStore()
        else:
            missing = [k for k in RENDEZVOUS if k not in env]
            if missing:
                raise ConfigError(
                    f"--backend ddp: {', '.join(missing)} not set (only {', '.join(given)} are): "
                    "torchrun and Azure ML's PyTorch distribution set all of "
                    f"{', '.join(RENDEZVOUS)}; start the job with one of them"
                )
            try:
                rank, size, local_rank = int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
            except ValueError:
                raise ConfigError(
                    "--backend ddp: RANK, WORLD_SIZE and LOCAL_RANK must be integers, got "
                    f"{env['RANK']!r}, {env['WORLD_SIZE']!r}, {env['LOCAL_RANK']!r}"
                ) from None
            if not (0 <= rank < size and 0 <= local_rank < size):
                raise ConfigError(
                    f"--backend ddp: RANK {rank}, LOCAL_RANK {local_rank}, WORLD_SIZE {size} are "
                    "inconsistent (both ranks from 0 to WORLD_SIZE - 1)"
                )
            store = None
        self.process_group = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        # A collective that takes longer fails (NCCL's watchdog aborts it): the backstop behind the stall watchdog.
        limit = {"timeout": datetime.timedelta(seconds=self.timeout)} if self.timeout else {}
        if store is None:
            dist.init_process_group(self.process_group, init_method="env://", rank=rank, world_size=size, **limit)
        else:
            dist.init_process_group(self.process_group, store=store, rank=rank, world_size=size, **limit)
        self._rank, self._size, self._local_rank = rank, size, local_rank
        # torchrun sets LOCAL_WORLD_SIZE; Azure ML's PyTorch distribution documents only the variables above,
        # so without it the processes count the ones on their own host.
        local = env.get("LOCAL_WORLD_SIZE")
        if local and local.isdigit():
            self._local_size = int(local)
        else:
            host = socket.gethostname()
            self._local_size = sum(h == host for h in self.allgather_object(host, "hosts"))

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def local_rank(self) -> int:
        return self._local_rank

    def local_size(self) -> int:
        return self._local_size

    def check(self, cfg) -> None:
        """What DDP cannot do is refused with the configuration (config.TrainConfig.validate): nothing left."""

    def adasum_lr_scale(self, device: torch.device) -> int:
        raise ConfigError("--adasum is a Horovod option: DDP has no Adasum reduction (use --backend horovod)")

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg, device: torch.device):
        """(the module to train, the optimizer to step). DDP's constructor broadcasts rank 0's parameters and
        buffers. forward_sync_buffers=False: as under Horovod, each rank keeps its own batch-norm statistics
        (DDP's default overwrites them with rank 0's before every forward pass)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, **no_forward_buffer_sync()
        )
        self._ddp, self._exchange = ddp, None
        if cfg.fp16_allreduce:
            # Each gradient bucket cast to fp16, divided by the world size, summed, cast back: Horovod's
            # Compression.fp16 on the wire. fp16 (not bf16) on both backends, so --fp16-allreduce means one thing.
            self._exchange_by(default_hooks.fp16_compress_hook)
        return ddp, optimizer

    def before_exchange(self, optimizer, see) -> None:
        """`see(grads)` on each bucket of this rank's gradients just before its allreduce (a comm hook: called
        before the first backward)."""
        if self._exchange is None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            self._exchange_by(default_hooks.allreduce_hook)
        self._exchange.before.append(see)

    def _exchange_by(self, hook) -> None:
        self._exchange = _Exchange(hook)
        self._ddp.register_comm_hook(self._exchange, _exchanged)

    def accumulate(self, model: torch.nn.Module, last: bool):
        """Context for one backward pass of a step: every pass but the last only adds to p.grad (no_sync), the
        last one's backward averages the sum, the step's one allreduce as under Horovod."""
        return nullcontext() if last else model.no_sync()

    @contextmanager
    def averaged(self, optimizer) -> Iterator[None]:
        """DDP's gradients are averaged when backward returns."""
        yield

    def broadcast_parameters(self, state: dict[str, torch.Tensor]) -> None:
        """Rank 0's tensors into every rank's, in place. Through a contiguous copy: Gloo sends only contiguous
        tensors, and copy_ writes a channels_last parameter back in logical order."""
        import torch.distributed as dist

        if self._size == 1:
            return
        with torch.no_grad():
            for name in sorted(state):
                t = state[name]
                buf = t.detach().contiguous()
                dist.broadcast(buf, src=0)
                if buf.data_ptr() != t.data_ptr():
                    t.copy_(buf)

    def broadcast_optimizer_state(self, optimizer) -> None:
        load_root_optimizer_state(self, optimizer)

    def broadcast_object(self, obj: Any, name: str) -> Any:
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather_object(self, obj: Any, name: str) -> list:
        import torch.distributed as dist

        out = [None] * self._size
        dist.all_gather_object(out, obj)
        return out

    def allreduce_sum(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """A new tensor (as Horovod's allreduce returns one): the sum over ranks, on the input's device."""
        import torch.distributed as dist

        out = tensor.detach().clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def allreduce_mean(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        return self.allreduce_sum(tensor, name).div_(self._size)

    def describe(self) -> dict:
        return {"backend": self.name, "process_group": self.process_group, "collective_timeout_seconds": self.timeout}

    def shutdown(self, stopped: bool = False) -> None:
        """Every rank past its last collective and rank 0's writes before any rank tears Gloo down: a rank that
        destroys its group while a peer still holds the pair can die in Gloo's teardown ("terminate called
        without an active exception", SIGABRT at exit, seen once in CI), failing a job that trained."""
        import torch.distributed as dist

        if dist.is_initialized():
            if self._size > 1:
                dist.barrier()
            dist.destroy_process_group()


def no_forward_buffer_sync() -> dict:
    """DDP's argument that keeps each rank's buffers its own in forward: forward_sync_buffers=False from torch
    2.13, which deprecates broadcast_buffers (and warns on it); broadcast_buffers=False before (vendor images
    with torch 2.4 to 2.12). The old flag also skips the buffers' broadcast at construction; restore() sends rank
    0's whole state_dict, buffers included, right after wrap, so both start every rank from rank 0's buffers."""
    from torch.nn.parallel import DistributedDataParallel

    try:
        params = inspect.signature(DistributedDataParallel).parameters
    except (TypeError, ValueError):  # no signature to read: assume the current one
        return {"forward_sync_buffers": False}
    if "forward_sync_buffers" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def load_root_optimizer_state(backend, optimizer) -> None:
    """Rank 0's optimizer state (momentum buffers, step counts, param groups) loaded by every other rank, with
    no optimizer step: load_state_dict moves each tensor to its parameter's device and dtype keeping its
    strides, and checkpoints.align_state_layouts then gives any other layout the parameter's. Sent as host
    tensors: a CUDA tensor would be unpickled onto rank 0's GPU on every rank."""
    state = backend.broadcast_object(
        _to_cpu(optimizer.state_dict()) if backend.rank() == 0 else None, name="optimizer_state"
    )
    if backend.rank() != 0:
        optimizer.load_state_dict(state)


def _to_cpu(value):
    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def buckets(model: torch.nn.Module, limit: int = 25 << 20) -> list[list[torch.Tensor]]:
    """Horovod's groups: the trained parameters in runs of about `limit` bytes, last first (as backward makes their
    gradients; DDP's buckets' rule). A group is exchanged once all its gradients are in: one fused check each."""
    groups, size = [[]], 0
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        if size >= limit:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.numel() * p.element_size()
    return groups


class _Exchange:
    """DDP's comm hook state: the hook that exchanges a bucket (allreduce, or fp16's) and what sees it first."""

    def __init__(self, hook):
        self.hook, self.before = hook, []


def _exchanged(state: _Exchange, bucket):
    for see in state.before:
        see([bucket.buffer()])
    return state.hook(None, bucket)
