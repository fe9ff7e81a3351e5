"""Start-up check every payload runs: a GPU cluster's process must see a GPU of its own.

The launcher sets TRAINING_GPUS_PER_NODE from the VM-size catalog (launcher/interconnect.py). A node whose
driver is older than the image's CUDA needs shows the framework no GPU at all, and the payloads would
otherwise train on the CPU, silently and hundreds of times slower. Unset or 0 (CPU clusters, local runs):
nothing to check.
"""
from __future__ import annotations

import os
import pathlib
import re
import sys

from .errors import ConfigError

GPUS_PER_NODE = "TRAINING_GPUS_PER_NODE"

# Oldest driver each CUDA major version runs on, with minor version compatibility (NVIDIA, "CUDA
# Compatibility", minor-version-compatibility table: CUDA 13.x >= 580, CUDA 12.x >= 525; the CUDA 13.0
# release notes list 580.65.06 as the driver of 13.0 GA). The PyTorch image is CUDA 13, the TensorFlow one 12.
MIN_DRIVER = {13: "580.65.06", 12: "525.60.13"}


class GpuError(ConfigError):
    """The node shows this process fewer GPUs than the job needs; raised before any training."""


def expected_gpus(environ=None) -> int:
    environ = os.environ if environ is None else environ
    raw = environ.get(GPUS_PER_NODE, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{GPUS_PER_NODE}={raw!r} is not a GPU count: the launcher sets it from the VM-size "
                          "catalog; unset it for a CPU run, or set the node's GPU count")
    return value


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version, as the host exposes it to the container, or None."""
    try:
        text = pathlib.Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def require_gpus(visible: int, local_processes: int, framework: str, cuda: str | None = None, environ=None) -> None:
    """Raise GpuError naming the likely cause when this node's processes cannot each have a GPU.

    visible: GPUs the framework sees in this process; local_processes: the job's processes on this node
    (hvd.local_size()); cuda: the CUDA version the framework was built with (the image's)."""
    expected = expected_gpus(environ)
    if expected == 0 or visible >= local_processes:
        if 0 < visible < expected:
            print(f"warning: {framework} sees {visible} of the node's {expected} GPUs ({GPUS_PER_NODE}); "
                  "enough for this job's processes", file=sys.stderr, flush=True)
        return
    cuda = cuda or (environ if environ is not None else os.environ).get("CUDA_VERSION") or "unknown"
    driver = driver_version()
    try:
        need = MIN_DRIVER.get(int(str(cuda).split(".")[0]))
    except ValueError:
        need = None
    cause = (f"the node's NVIDIA driver ({driver or 'none found in /proc/driver/nvidia/version'}) is older than "
             f"CUDA {cuda} in the image needs" + (f" (driver >= {need})" if need else ""))
    raise GpuError(
        f"this node should have {expected} GPUs ({GPUS_PER_NODE}, set by the launcher from the VM-size catalog) "
        f"for {local_processes} processes, one GPU each, but {framework} sees {visible}. Likely cause: {cause}, "
        "or the container was started without GPU access. Fix: run the health check job on this cluster "
        "(it prints the driver and CUDA versions it finds), then use a node image with a newer driver or an "
        "image built on an older CUDA (images/*/Dockerfile, ARG CUDA_VERSION). Nothing was trained.")
