"""Start-up of the PyTorch payloads, resolved once: the device and its defaults (precision, memory format, threads),
the batch and learning rate, into one record (Settings) that the loop reads and the run logs; the optimizer and its
step; exact sums over ranks; and the run's world record. Collectives go through the backend (backends.py: Horovod,
DDP, or Single where Horovod is not installed), the same calls for all."""

from __future__ import annotations

import dataclasses
import logging
import os
import re

import torch

from ..common import config, devices, watchdog
from . import affinity, inputs, models, precision

log = logging.getLogger("payloads.pytorch")

# torch.amp.GradScaler(device) (2.3), torch.compile on Python 3.12 and torchvision 0.19's batched nvJPEG decode
# for --gpu-decode (2.4): docs/pytorch-gpu.md#which-torch.
OLDEST_TORCH = (2, 4)


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of torch.__version__: "2.14.1+cpu", "2.11.0a0+gitabc" (NVIDIA's images) -> (2, 14), (2, 11)."""
    m = re.match(r"(\d+)\.(\d+)", version or torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@dataclasses.dataclass(frozen=True)
class Settings(config.Resolved):
    """What start-up decided from the configuration and this process's world: the one record the loop reads
    (never the configuration's None defaults), logged in the run's first lines and written to metrics.json."""

    device: str
    precision: str  # fp32 | bf16 | fp16
    amp: bool
    loss_scaler: bool
    channels_last: bool
    batch: int  # per process and step (every micro-batch of it)
    backward_passes: int
    base_lr: float  # one process at its batch (Goyal et al.: LR_PER_256 x batch / 256 unless --base-lr)
    lr_scale: float  # the global batch's multiple of it: processes (or Adasum's) x backward passes
    threads: int  # intra-op threads of this process
    workers: int
    decoder: str | None  # the CPU JPEG decoder for images read from files (--decoder auto: the fastest installed)

    RECORDED = ("amp", "channels_last", "base_lr")  # written back into the recorded config, as always


def resolve(cfg: config.TrainConfig, backend) -> tuple[torch.device, precision.Precision, Settings]:
    """This process's device, its precision and the run's settings (Settings); sets the device, threads and CPU
    affinity. Before any data is read: a loader's workers start on the CPUs chosen here."""
    device = _device(cfg, backend)
    chosen = precision.choose(device, cfg.amp, cfg.amp_dtype, cfg.adasum)
    if cfg.adasum or cfg.fp16_allreduce:  # what the backend cannot do with them (backends.py: check)
        backend.check(cfg)
    if cfg.amp is None and device.type == "cuda" and chosen.name == "fp32":
        log.info("mixed precision off: --adasum steps on unscaled gradients and this GPU's native dtype is fp16")
    batch = cfg.per_process_batch(backend.size())
    files = cfg.data in ("imagefolder", "shards")  # images decoded from files
    # Goyal et al.: LR scales with the global batch (processes x backward passes); Adasum has its own rule.
    scale = backend.adasum_lr_scale(device) if cfg.adasum else backend.size()
    settings = Settings(
        device=str(device),
        precision=chosen.name,
        amp=chosen.name != "fp32",
        loss_scaler=chosen.needs_scaler,
        channels_last=device.type == "cuda" if cfg.channels_last is None else cfg.channels_last,
        batch=batch * cfg.backward_passes_per_step,
        backward_passes=cfg.backward_passes_per_step,
        base_lr=cfg.lr_for(batch),
        lr_scale=scale * cfg.backward_passes_per_step,
        threads=torch.get_num_threads(),
        workers=cfg.workers if files else 0,  # synthetic images and land cover's blocks need no loader workers
        decoder=_decoder(cfg, device) if files else None,
    )
    return device, chosen, settings


def _decoder(cfg: config.TrainConfig, device: torch.device) -> str:
    """The JPEG decoder the training images go through: nvJPEG with --gpu-decode on a GPU (torchvision's CPU
    decoder in the training process without one), else the decode workers' CPU decoder."""
    if cfg.gpu_decode:
        return "nvjpeg" if device.type == "cuda" else "torchvision (cpu, --gpu-decode without a GPU)"
    return inputs.decoder_of(cfg)


def _device(cfg: config.TrainConfig, backend) -> torch.device:
    """This process's device: its GPU (bound to the GPU's CPUs) or the CPU, with its share of the node's cores."""
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
    if not torch.cuda.is_available():
        return torch.device("cpu")
    torch.cuda.set_device(backend.local_rank())
    # Before any loader or decode worker exists, so that they start on the GPU's CPUs (affinity.py).
    bound = affinity.bind_to_gpu(backend.local_rank(), local_size=backend.local_size())
    log.info("CPU affinity %s: %s", bound["cpus"] or "unchanged", bound["why"])
    if bound["cpus"] and threads > len(os.sched_getaffinity(0)):
        # --threads or the node's CPUs per process may be more: no more intra-op threads than CPUs allowed.
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.backends.cudnn.benchmark = True
    return torch.device("cuda", backend.local_rank())


def optimizer(cfg: config.TrainConfig, model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.SGD:
    """SGD with momentum, fused (one kernel for all parameters) where this torch offers it for the device."""
    kwargs = dict(lr=lr, momentum=cfg.momentum)
    groups = parameter_groups(model, cfg.weight_decay)
    try:
        return torch.optim.SGD(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError, TypeError) as e:  # a device or dtype without a fused kernel
        log.info("fused SGD unavailable on %s (%s): using the foreach implementation", device, e)
        return torch.optim.SGD(groups, foreach=True, **kwargs)


def scaler_in_kernel(optimizer, scaler) -> None:
    """fp16's loss scaler without a host sync per step: GradScaler hands a fused optimizer its found-inf flag and
    the kernel skips the update on overflow, where for any other optimizer it reads the flag on the host (.item(),
    which drains the GPU every step). Fused SGD's first step would make its momentum buffers with empty_like before
    that kernel (torch/optim/sgd.py, _fused_sgd), so an overflowing first step (fp16's usual start) would leave
    them uninitialised (NaN weights, different on every rank: seen under DDP); they are made here as zeros, in each
    parameter's layout, after any checkpoint is restored. A zero buffer gives the same first update as none (with
    no dampening, 0 * momentum + grad is grad, bit for bit)."""
    if scaler is None or not all(g.get("fused") for g in optimizer.param_groups):
        optimizer._step_supports_amp_scaling = False  # GradScaler skips step() on overflow, as for any optimizer
        return
    for group in optimizer.param_groups:
        if group["momentum"] == 0:
            continue
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    optimizer._step_supports_amp_scaling = True


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


def summary_writer(folder):
    """TensorBoard's writer (rank 0). tensorboard does its file I/O through tensorboard.compat.tf, which imports
    TensorFlow when it is installed: seconds at start-up in .venv (docs/benchmarks.md#process-start-up-and-exit),
    and TF's threads in a PyTorch process. The marker module tensorboard.compat.notf (the no_tensorflow target in tensorboard/compat/__init__.py)
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


def world(backend, model, device, settings: Settings, cfg) -> dict:
    """The run's world as metrics.json records it: backend (horovod | ddp) and its controller or process group."""
    return {
        "processes": backend.size(),
        "local_processes": backend.local_size(),
        "device": str(device),
        "torch": torch.__version__,
        **backend.describe(),
        "gradient_mbytes": models.gradient_bytes(model) / 1e6,
        "threads_per_process": torch.get_num_threads(),
        "precision": settings.precision,
        "loss_scaler": settings.loss_scaler,
        "memory_format": "channels_last" if settings.channels_last else "contiguous",
        "compiled": bool(cfg.compile),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }


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
