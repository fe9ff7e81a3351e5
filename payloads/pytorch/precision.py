"""Mixed precision by device: which autocast dtype, and whether a loss scaler is needed.

- GPUs: fp16 autocast with a GradScaler (NVIDIA's ResNet-50 recipe). On Hopper it is faster than bf16
  (docs/benchmarks.md#one-gpu): cuDNN's NHWC BatchNorm kernels take fp16, and bf16 BatchNorm falls back to
  PyTorch's own, slower ones.
- With --adasum, whose optimizer steps inside backward before a scaler could unscale, auto picks bf16 where the GPU
  has it (compute capability 8.0+: bf16 has fp32's exponent range and needs no scaler) and no autocast below.
- A CPU runs bf16 autocast when --amp is asked for (off by default there), so CI exercises the same path; fp16
  with its scaler runs on a CPU too (--amp-dtype fp16), which is how CI tests the scaler and its resume.

Adasum applies the inner optimizer inside each gradient's hook (horovod/torch/optimizer.py,
_DistributedAdasumOptimizer), before a GradScaler could unscale: fp16 with Adasum is refused, bf16 needs no
scaler and runs.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..common.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    name: str  # "fp32" | "bf16" | "fp16": recorded in metrics.json
    device_type: str  # "cuda" | "cpu"

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.name)

    @property
    def needs_scaler(self) -> bool:
        return self.name == "fp16"

    def autocast(self):
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self, init_scale: float = 2.0**16) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type, init_scale=init_scale) if self.needs_scaler else None


def native_dtype(device: torch.device, adasum: bool = False) -> str:
    """The mixed-precision dtype `auto` means: fp16 on GPUs (bf16 with Adasum on compute capability 8.0+, which
    fp16 cannot join), bf16 on CPUs."""
    if device.type != "cuda":
        return "bf16"
    if adasum:
        major, _ = torch.cuda.get_device_capability(device)
        return "bf16" if major >= 8 else "fp16"
    return "fp16"


def choose(device: torch.device, amp: bool | None, amp_dtype: str = "auto", adasum: bool = False) -> Precision:
    """amp None: on with a GPU, off on a CPU (and with Adasum on a GPU without bf16). amp_dtype auto: native_dtype."""
    if amp_dtype not in ("auto", *DTYPES):
        raise ConfigError(f"--amp-dtype {amp_dtype!r}: choose auto, bf16 or fp16")
    dtype = native_dtype(device, adasum) if amp_dtype == "auto" else amp_dtype
    if amp is None:
        amp = device.type == "cuda" and not (adasum and dtype == "fp16")
    if not amp:
        return Precision("fp32", device.type)
    if adasum and dtype == "fp16":
        raise ConfigError(
            "--adasum cannot be combined with fp16 mixed precision: Horovod's Adasum optimizer steps on "
            "each gradient inside backward, before GradScaler can unscale it. Use --amp-dtype bf16 "
            "(GPUs of compute capability 8.0+, and CPUs), --no-amp, or drop --adasum"
        )
    if device.type == "cuda" and dtype == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"--amp-dtype bf16: {torch.cuda.get_device_name(device)} has no bfloat16 support "
            "(compute capability 8.0 and up has): use --amp-dtype fp16 or auto"
        )
    return Precision(dtype, device.type)
