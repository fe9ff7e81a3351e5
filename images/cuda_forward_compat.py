"""CUDA forward compatibility for the PyTorch image: load CUDA 13's user-mode driver on older host drivers.

The image's torch wheels are built for CUDA 13, which needs an NVIDIA driver of branch 580 or newer (NVIDIA,
"CUDA Compatibility": minor version compatibility covers drivers of the same major CUDA only). Azure's GPU
nodes carry what their node image installs (Azure/azhpc-images moved from 570 to 580 in November 2025;
Azure ML does not document its hosts' driver). NVIDIA's forward compatibility package (cuda-compat-13-0,
copied to /usr/local/cuda/compat) holds libcuda and its companions from a 580 driver; on data-centre GPUs
it lets CUDA 13 run on older kernel drivers of the branches NVIDIA's forward-compatibility matrix lists.

It must be used only when the host driver is older: a compat libcuda older than the host's kernel module
fails with CUDA error 803 ("unsupported display driver / cuda driver combination"). NVIDIA's own container
images decide this in their entrypoint; Azure ML runs its own command and mpirun starts the ranks, so this
module decides it in every Python process instead: the image's site-packages holds a .pth file that calls
activate() at interpreter start-up. Preloading the compat libraries by path, with RTLD_GLOBAL, makes every
later dlopen("libcuda.so.1") (torch's CUDA runtime) get them: the dynamic loader reuses a loaded soname.

Standard library only (it runs before anything else); it never raises: a failure leaves the host's driver
in place, and the payloads' start-up check (payloads/common/devices.py) names a driver that is too old.
CUDA_FORWARD_COMPAT in the environment records what was loaded; CUDA_FORWARD_COMPAT=off disables it.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re

COMPAT_DIR = "/usr/local/cuda/compat"
VERSION_FILE = "/proc/driver/nvidia/version"
ENV = "CUDA_FORWARD_COMPAT"
# libcuda loads these by soname while it works (PTX JIT, NVVM); they must come from the same driver.
COMPANIONS = ["libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"]


def host_driver(version_file: str = VERSION_FILE) -> str | None:
    """The host's kernel driver version from /proc/driver/nvidia/version (proprietary or open module)."""
    try:
        text = pathlib.Path(version_file).read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def compat_driver(compat_dir: str = COMPAT_DIR) -> str | None:
    """The driver version of the compat package: its libcuda.so.<version> file."""
    try:
        names = os.listdir(compat_dir)
    except OSError:
        return None
    versions = [m.group(1) for n in names if (m := re.fullmatch(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)", n))]
    return max(versions, key=lambda v: tuple(int(x) for x in v.split("."))) if versions else None


def branch(version: str) -> int:
    return int(version.split(".")[0])


def needed(host: str | None, compat: str | None) -> bool:
    """Forward compatibility is for hosts whose driver branch is older than the compat package's; a host of
    the same or a newer branch runs the image's CUDA natively and must keep its own libcuda."""
    return host is not None and compat is not None and branch(host) < branch(compat)


def activate(version_file: str = VERSION_FILE, compat_dir: str = COMPAT_DIR, environ=None, load=None) -> str | None:
    """Preload the compat driver when the host's is older; returns what was loaded (also in $CUDA_FORWARD_COMPAT)."""
    environ = os.environ if environ is None else environ
    load = load or (lambda path: ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
    try:
        if environ.get(ENV, "").lower() == "off":
            return None
        host, compat = host_driver(version_file), compat_driver(compat_dir)
        if not needed(host, compat):
            return None
        for name in COMPANIONS + ["libcuda.so.1"]:
            path = os.path.join(compat_dir, name)
            if os.path.exists(path):
                load(path)
        what = f"libcuda {compat} from {compat_dir} (host driver {host})"
        environ[ENV] = what
        return what
    except Exception:  # noqa: BLE001 - start-up of every Python process: never fail it, devices.py reports
        return None
