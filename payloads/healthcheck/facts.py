"""What each node is: driver, CUDA and NCCL versions, GPUs, InfiniBand devices, disks and free space, private IP and
physical host (what Azure support asks for when a node is reported), and the grace of mpirun's stop (mpistop.py).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import struct
import tempfile

from ..common import devices
from . import mpistop

# The node's private IP (what Azure ML's node list matches it by): eth0, the interface the launcher names
# for every collective (launcher/interconnect.py).
INTERFACE = "eth0"


# Hyper-V's key-value pool from the host (Azure writes PhysicalHostName there; Azure's kvp_client reads the
# same pool): what Azure support asks for when a node is reported. Absent in most containers.
KVP_POOL = pathlib.Path("/var/lib/hyperv/.kvp_pool_3")


# Where a job writes on a node: the container's root and temporary folder (the decoded cache's default home),
# shared memory (the loaders' batches), and Azure's local NVMe or resource disk where the node has one.
DISK_PLACES = ("/", tempfile.gettempdir(), "/dev/shm", "/mnt", "/mnt/resource", "/mnt/nvme")


def disks(places=DISK_PLACES) -> list[dict]:
    """Free and total space of each place that exists, one entry per file system (the first place naming it)."""
    seen, found = set(), []
    for place in places:
        try:
            device = os.stat(place).st_dev
            usage = shutil.disk_usage(place)
        except OSError:
            continue
        if device in seen:
            continue
        seen.add(device)
        found.append(
            {"path": place, "free_gbytes": round(usage.free / 1e9, 1), "total_gbytes": round(usage.total / 1e9, 1)}
        )
    return found


def disks_line(entries: list[dict]) -> str:
    return ", ".join(f"{d['path']} {d['free_gbytes']:g} of {d['total_gbytes']:g} GB free" for d in entries) or "none"


def node_facts(torch) -> dict:
    """What this process sees of its node: versions ('none' where absent), InfiniBand devices and disks."""
    gpu = torch.cuda.is_available()
    nccl = "none"
    if gpu:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    ib = pathlib.Path("/sys/class/infiniband")
    # The CUDA torch was built for, against the host's driver (whether or not torch sees a GPU with it).
    driver = devices.driver_version()
    problem = devices.mismatch(driver, torch.version.cuda, os.environ.get(devices.FORWARD_COMPAT) or None)
    return {
        "host": socket.gethostname(),
        "private_ip": private_ip(),
        "physical_host": physical_host(),
        "driver": driver or "none",
        "driver_mismatch": problem,
        "cuda": (torch.version.cuda or "none") if gpu else "none",
        "nccl": nccl,
        "gpus_visible": torch.cuda.device_count() if gpu else 0,
        "infiniband_devices": sorted(p.name for p in ib.iterdir()) if ib.is_dir() else [],
        "infiniband_cards": devices.infiniband_cards(),  # the InfiniBand link layer's (not the Ethernet NIC)
        "nccl_ib_hca": os.environ.get("NCCL_IB_HCA"),  # devices.pin_nccl_to_infiniband, or the job file's
        "disks": disks(),
        "mpi_stop": mpistop.settings(),  # mpirun's stop grace as this node's Open MPI reads it (mpistop.py)
    }


def private_ip(interface: str = INTERFACE) -> str | None:
    """The node's address on `interface` (SIOCGIFADDR), else the source address of its default route; None
    if neither answers."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", interface.encode()[:15]))  # SIOCGIFADDR
            return socket.inet_ntoa(packed[20:24])
        except OSError:
            pass
        try:
            s.connect(("168.63.129.16", 80))  # Azure's host address; a UDP connect sends nothing
            return s.getsockname()[0]
        except OSError:
            return None


def physical_host(pool: pathlib.Path = KVP_POOL) -> str | None:
    """PhysicalHostName from Hyper-V's key-value pool (records of a 512-byte key and a 2048-byte value)."""
    try:
        data = pool.read_bytes()
    except OSError:
        return None
    for offset in range(0, len(data) - 2559, 2560):
        key = data[offset : offset + 512].split(b"\0", 1)[0]
        if key == b"PhysicalHostName":
            return data[offset + 512 : offset + 2560].split(b"\0", 1)[0].decode(errors="replace") or None
    return None
