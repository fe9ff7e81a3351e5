"""What both PyTorch payloads (classification and land cover) do around the training step: the device and its
defaults, the optimizer, checkpoints and resume, exact sums over ranks, and the run's world record."""
from __future__ import annotations

import logging
import os

import torch

from ..common import checkpoint, config, devices
from ..common.errors import ConfigError
from . import models, precision

SUFFIX = ".pt"
log = logging.getLogger("payloads.pytorch")


def setup(cfg: config.TrainConfig, hvd) -> tuple[torch.device, precision.Precision]:
    """The device of this process and its precision; fills the device-dependent defaults (amp, channels_last)."""
    if hvd.local_rank() == 0:   # one line per node: the driver, the CUDA torch was built for, any mismatch
        log.info("%s", devices.report("PyTorch", torch.version.cuda))
    devices.require_gpus(torch.cuda.device_count(), hvd.local_size(), "PyTorch", torch.version.cuda)
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        torch.backends.cudnn.benchmark = True
        device = torch.device("cuda", hvd.local_rank())
    else:
        device = torch.device("cpu")
    if cfg.xla:
        raise ConfigError("--xla is a TensorFlow/Keras option: for PyTorch, mixed precision (--amp) and --compile "
                          "are the speed levers")
    chosen = precision.choose(device, cfg.amp, cfg.amp_dtype, cfg.adasum)
    if cfg.adasum:
        cfg.check_adasum_world(hvd.size(), hvd.mpi_enabled())
    if cfg.amp is None and device.type == "cuda" and chosen.name == "fp32":
        log.info("mixed precision off: --adasum steps on unscaled gradients and this GPU's native dtype is fp16")
    cfg.amp = chosen.name != "fp32"
    if cfg.channels_last is None:
        cfg.channels_last = device.type == "cuda"
    return device, chosen


def optimizer(cfg: config.TrainConfig, model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.SGD:
    """SGD with momentum, fused (one kernel for all parameters) where this torch offers it for the device."""
    kwargs = dict(lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    try:
        return torch.optim.SGD(model.parameters(), fused=True, **kwargs)
    except (RuntimeError, ValueError, TypeError) as e:   # a device or dtype without a fused kernel
        log.info("fused SGD unavailable on %s (%s): using the foreach implementation", device, e)
        return torch.optim.SGD(model.parameters(), foreach=True, **kwargs)


def restore(cfg, hvd, model, opt, scaler) -> int:
    """Rank 0 loads the newest checkpoint (if any); every rank ends with its weights, optimizer state and loss
    scaler state. Returns the epochs already done, agreed by all ranks."""
    start, state = 0, None
    if hvd.rank() == 0 and cfg.resume:
        found = checkpoint.latest(cfg.checkpoint_dir, SUFFIX)
        if found:
            start, path = found
            try:
                state = torch.load(path, map_location="cpu", weights_only=False)
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["optimizer"])
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
                start = -1
                log.error("cannot resume from %s: %s: move it away, or pass --no-resume to start over "
                          "in a new --output-dir", path, e)
            else:
                log.info("resuming from %s (%d epochs done)", path, start)
    start = hvd.broadcast_object(start, root_rank=0, name="resume_epoch")
    if start < 0:
        raise ConfigError("the newest checkpoint could not be loaded (see the message above)")
    if start > 0:
        # Fresh optimizers on the other ranks have no state; Horovod initialises it with a zero-gradient
        # step that moves the weights, so the parameters are broadcast after it.
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        if scaler is not None:
            # Every rank must scale its loss by the same factor: the averaged gradient is unscaled by each rank's
            # own scale, so a rank left at the default scale would step on a differently scaled gradient.
            saved = state.get("scaler") if state is not None else None
            saved = hvd.broadcast_object(saved, root_rank=0, name="resume_scaler")
            if saved:
                scaler.load_state_dict(saved)
            elif hvd.rank() == 0:
                log.warning("the checkpoint holds no loss-scaler state (written without fp16): starting at the "
                            "default scale")
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    align_state_layouts(opt)
    return start


def align_state_layouts(opt: torch.optim.Optimizer) -> None:
    """Give every optimizer state tensor its parameter's memory layout. A fused optimizer walks parameter, gradient
    and state memory element by element, so a momentum buffer laid out differently from its channels_last
    parameter pairs the wrong elements (measured: 0.36 off after one fused SGD step; tests/test_layouts.py).
    Resume makes such buffers: broadcast_optimizer_state creates the other ranks' state in the default layout,
    and a checkpoint written without --channels-last holds default-layout state."""
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state.get(p, {})
            for key, value in state.items():
                if torch.is_tensor(value) and value.shape == p.shape and value.stride() != p.stride():
                    state[key] = torch.empty_like(p, dtype=value.dtype).copy_(value)


def save(cfg, hvd, epoch_done: int, model, opt, scaler) -> None:
    if hvd.rank() != 0:
        return
    state = {"epoch": epoch_done, "model": model.state_dict(), "optimizer": opt.state_dict(),
             "scaler": scaler.state_dict() if scaler is not None else None, "config": cfg.to_json(),
             "world_size": hvd.size()}
    checkpoint.write(checkpoint.path_for(cfg.checkpoint_dir, epoch_done, SUFFIX),
                                lambda p: torch.save(state, p))
    checkpoint.prune(cfg.checkpoint_dir, SUFFIX, cfg.keep_checkpoints)


def global_sums(hvd, name: str, *values) -> list[float]:
    """Sum over ranks (floats or device tensors, read here once): losses and counts are summed, then divided, so
    means are exact."""
    t = torch.stack([torch.as_tensor(v, dtype=torch.float64, device="cpu") if not torch.is_tensor(v)
                     else v.detach().to("cpu", torch.float64) for v in values])
    return hvd.allreduce(t, op=hvd.Sum, name=name).tolist()


def world(hvd, model, device, chosen: precision.Precision, cfg) -> dict:
    """The run's world as metrics.json records it."""
    return {"processes": hvd.size(), "local_processes": hvd.local_size(), "device": str(device),
            "torch": torch.__version__, "horovod_controller": "mpi" if hvd.mpi_enabled() else "gloo",
            "gradient_mbytes": models.gradient_bytes(model) / 1e6, "threads_per_process": torch.get_num_threads(),
            "precision": chosen.name, "loss_scaler": chosen.needs_scaler,
            "memory_format": "channels_last" if cfg.channels_last else "contiguous",
            "compiled": bool(cfg.compile), "cuda": torch.version.cuda if device.type == "cuda" else None,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
