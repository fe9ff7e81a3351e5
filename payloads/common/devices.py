"""Start-up check every payload runs: a GPU cluster's process must see a GPU of its own.

The launcher sets TRAINING_GPUS_PER_NODE from the VM-size catalog (launcher/interconnect.py). A node whose
driver is older than the image's CUDA needs shows the framework no GPU at all, and the payloads would
otherwise train on the CPU, silently and hundreds of times slower. Unset or 0 (CPU clusters, local runs):
nothing to check. report() is the line each payload prints at start-up: the driver, the framework's CUDA,
whether the image's CUDA forward-compatibility driver is in use, and the mismatch when there is one.
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
VERSION_FILE = "/proc/driver/nvidia/version"
# Set by images/cuda_forward_compat.py (the PyTorch image) when it loaded CUDA's forward-compatibility driver.
FORWARD_COMPAT = "CUDA_FORWARD_COMPAT"


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
        raise ConfigError(
            f"{GPUS_PER_NODE}={raw!r} is not a GPU count: the launcher sets it from the VM-size "
            "catalog; unset it for a CPU run, or set the node's GPU count"
        )
    return value


def parse_driver_version(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version's text (proprietary or open kernel module), or None."""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def driver_version(version_file: str = VERSION_FILE) -> str | None:
    """The NVIDIA kernel driver's version, as the host exposes it to the container, or None."""
    try:
        return parse_driver_version(pathlib.Path(version_file).read_text())
    except OSError:
        return None


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def required_driver(cuda: str | None) -> str | None:
    """The oldest driver the CUDA version runs on without forward compatibility, or None when unknown."""
    try:
        return MIN_DRIVER.get(int(str(cuda).split(".")[0]))
    except ValueError:
        return None


def mismatch(driver: str | None, cuda: str | None, forward_compat: str | None = None) -> str | None:
    """Why this driver cannot run this CUDA, or None when it can (or when either is unknown: a CPU node, a
    CPU build of the framework). forward_compat: what images/cuda_forward_compat.py loaded, if anything."""
    need = required_driver(cuda)
    if not driver or not need or _version(driver) >= _version(need):
        return None
    text = f"the node's NVIDIA driver ({driver}) is older than CUDA {cuda} in the image needs (driver >= {need})"
    if forward_compat:
        return (
            text + f"; the image's forward-compatibility driver is in use ({forward_compat}), which works on "
            "data-centre GPUs with a driver branch NVIDIA's forward-compatibility matrix lists; if the "
            "framework sees no GPU, this combination is not one of them"
        )
    return text + "; the image has no forward-compatibility driver for it"


def report(framework: str, cuda_version: str | None, version_file: str = VERSION_FILE, environ=None) -> str:
    """One line for the job's log at start-up: the driver, the framework's CUDA, and a mismatch if any."""
    environ = os.environ if environ is None else environ
    driver = driver_version(version_file)
    compat = environ.get(FORWARD_COMPAT) or None
    line = (
        f"{framework}: CUDA {cuda_version or 'none (CPU build)'}; NVIDIA driver "
        f"{driver or f'none ({version_file} absent: no GPU in this container)'}"
    )
    if compat and driver:
        line += f"; forward compatibility: {compat}"
    problem = mismatch(driver, cuda_version, compat)
    return line + (f"; MISMATCH: {problem}" if problem else "")


def require_gpus(visible: int, local_processes: int, framework: str, cuda: str | None = None, environ=None) -> None:
    """Raise GpuError naming the likely cause when this node's processes cannot each have a GPU.

    visible: GPUs the framework sees in this process; local_processes: the job's processes on this node
    (hvd.local_size()); cuda: the CUDA version the framework was built with (the image's)."""
    expected = expected_gpus(environ)
    if expected == 0 or visible >= local_processes:
        if 0 < visible < expected:
            print(
                f"warning: {framework} sees {visible} of the node's {expected} GPUs ({GPUS_PER_NODE}); "
                "enough for this job's processes",
                file=sys.stderr,
                flush=True,
            )
        return
    env = environ if environ is not None else os.environ
    cuda = cuda or env.get("CUDA_VERSION") or "unknown"
    driver = driver_version()
    cause = mismatch(driver, cuda, env.get(FORWARD_COMPAT))
    if cause is None:
        cause = (
            f"no NVIDIA driver found in {VERSION_FILE} (the node has no GPU, or the container has no GPU access)"
            if not driver
            else f"the node's NVIDIA driver {driver} is new enough for CUDA {cuda}, so the GPUs "
            "are likely hidden from the container (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES)"
        )
    raise GpuError(
        f"this node should have {expected} GPUs ({GPUS_PER_NODE}, set by the launcher from the VM-size catalog) "
        f"for {local_processes} processes, one GPU each, but {framework} sees {visible}. Likely cause: {cause}, "
        "or the container was started without GPU access. Fix: run the health check job on this cluster "
        "(it prints the driver and CUDA versions it finds), then use a node image with a newer driver or an "
        "image built on an older CUDA (images/*/Dockerfile, ARG CUDA_VERSION). Nothing was trained."
    )


# ---- InfiniBand: which cards NCCL may use
IB_SYSFS = pathlib.Path("/sys/class/infiniband")


def infiniband_cards(sysfs: pathlib.Path = IB_SYSFS) -> list[str]:
    """RDMA devices whose port 1 runs the InfiniBand link layer. An ND node's accelerated-networking NIC is an mlx5
    device too, with the Ethernet link layer (Azure's HPC images name them mlx5_ib<N> and mlx5_an<N> by exactly that
    test: Azure/azhpc-images components/install_azure_persistent_rdma_naming.sh)."""
    if not sysfs.is_dir():
        return []
    found = []
    for dev in sorted(p.name for p in sysfs.iterdir()):
        try:
            if (sysfs / dev / "ports" / "1" / "link_layer").read_text().strip() == "InfiniBand":
                found.append(dev)
        except OSError:
            continue
    return found


def pin_nccl_to_infiniband(environ=None, sysfs: pathlib.Path = IB_SYSFS) -> str | None:
    """On an InfiniBand size (the launcher sets NCCL_IB_DISABLE=0 there), NCCL_IB_HCA names this node's InfiniBand
    cards exactly ("=" prefix: exact names, NCCL's environment documentation), before NCCL starts: left to itself
    NCCL takes every RDMA device, the Ethernet NIC included, and a name prefix such as mlx5_ib matches nothing on a
    node whose devices kept the kernel's names. A job file's own NCCL_IB_HCA wins. Returns what it set, or None."""
    environ = os.environ if environ is None else environ
    if environ.get("NCCL_IB_DISABLE") != "0" or environ.get("NCCL_IB_HCA"):
        return None
    cards = infiniband_cards(sysfs)
    if not cards:
        return None
    environ["NCCL_IB_HCA"] = "=" + ",".join(cards)
    return environ["NCCL_IB_HCA"]
