"""Catalog of VM sizes for training clusters: the one home of GPUs per node and interconnect facts.

Job submission reads GPUs per node from the stack outputs, which come from here. Retirement dates are
Azure's published ones; a retired size fails validation with its successors named.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class VmSize:
    name: str
    gpus: int
    gpu_model: str | None
    gpu_memory_gib: int
    vcpus: int
    infiniband: str | None  # IB generation (EDR/HDR/NDR) with SR-IOV for MPI/NCCL, or None
    ib_gbps_per_node: int  # aggregate InfiniBand bandwidth per node
    intra_node: str  # how the GPUs of one node talk: nvlink | pcie | none
    retired: dt.date | None = None
    successors: tuple[str, ...] = ()
    # NCCL topology file Azure's HPC images ship for the size (Azure/azhpc-images topology/); the images
    # carry it in /opt/microsoft/ and the launcher points NCCL_TOPO_FILE at it (launcher/interconnect.py).
    nccl_topology: str | None = None
    # Health-check floor: the least allreduce bus bandwidth (GB/s, NCCL-tests' busbw) a healthy cluster of
    # this size shows in any layout, including one process per node where each rank has one IB link.
    min_busbw_gbytes_per_sec: float | None = None


IB_SUCCESSORS = (
    "Standard_ND96asr_v4",
    "Standard_ND96amsr_A100_v4",
    "Standard_ND96isr_H100_v5",
    "Standard_ND96isr_H200_v5",
)

_SIZES = [
    # CPU sizes: smoke runs of the same jobs (Horovod's MPI operations over shared memory/TCP), image builds.
    VmSize("Standard_D4s_v5", 0, None, 0, 4, None, 0, "none"),
    VmSize("Standard_D8s_v5", 0, None, 0, 8, None, 0, "none"),
    VmSize("Standard_D16s_v5", 0, None, 0, 16, None, 0, "none"),
    # Current GPU sizes without InfiniBand: single-node or TCP multi-node.
    VmSize("Standard_NC4as_T4_v3", 1, "T4", 16, 4, None, 0, "none"),
    VmSize("Standard_NC64as_T4_v3", 4, "T4", 16, 64, None, 0, "pcie"),
    VmSize("Standard_NC24ads_A100_v4", 1, "A100", 80, 24, None, 0, "none"),
    VmSize("Standard_NC96ads_A100_v4", 4, "A100", 80, 96, None, 0, "pcie"),
    VmSize("Standard_NC40ads_H100_v5", 1, "H100 NVL", 94, 40, None, 0, "none"),
    # Current InfiniBand sizes (8 GPUs, NVLink inside the node, one IB link per GPU).
    # Bandwidth floors, well below what these sizes deliver so that only a broken fabric fails them:
    # Azure's node health checks (Azure/azurehpc-health-checks conf/nd96asr_v4.conf, nd96amsr_a100_v4.conf,
    # nd96isr_h100_v5.conf, nd96isr_h200_v5.conf) require a single-node NCCL allreduce busbw of 228 GB/s
    # (A100 v4), 460 (H100 v5), 431 (H200 v5), and an NCCL allreduce through one IB link (ib_loopback) of
    # 18 GB/s (HDR, 200 Gb/s = 25 GB/s line rate) and 40 GB/s (NDR, 400 Gb/s = 50 GB/s). The worst healthy
    # layout here is one process per node (each rank on one IB link), measured by Horovod at <= 256 MB
    # (below NCCL-tests' 8-16 GB peak): floors of 10 and 20 GB/s pass it, while NCCL falling back to TCP
    # sockets on the Ethernet NIC (80 Gb/s = 10 GB/s line rate at most on these sizes, and NCCL's sockets
    # stay well under line rate) does not reach them.
    VmSize(
        "Standard_ND96asr_v4",
        8,
        "A100",
        40,
        96,
        "HDR",
        1600,
        "nvlink",
        nccl_topology="ndv4-topo.xml",
        min_busbw_gbytes_per_sec=10.0,
    ),
    VmSize(
        "Standard_ND96amsr_A100_v4",
        8,
        "A100",
        80,
        96,
        "HDR",
        1600,
        "nvlink",
        nccl_topology="ndv4-topo.xml",
        min_busbw_gbytes_per_sec=10.0,
    ),
    # The H200 v5 is the H100 v5 host with H200 GPUs: Azure's health checks use ndv5-topo.xml for both.
    VmSize(
        "Standard_ND96isr_H100_v5",
        8,
        "H100",
        80,
        96,
        "NDR",
        3200,
        "nvlink",
        nccl_topology="ndv5-topo.xml",
        min_busbw_gbytes_per_sec=20.0,
    ),
    VmSize(
        "Standard_ND96isr_H200_v5",
        8,
        "H200",
        141,
        96,
        "NDR",
        3200,
        "nvlink",
        nccl_topology="ndv5-topo.xml",
        min_busbw_gbytes_per_sec=20.0,
    ),
    # The source documents' sizes, all retired.
    VmSize("Standard_NC24rs_v3", 4, "V100", 16, 24, "EDR", 100, "pcie", dt.date(2025, 9, 30), IB_SUCCESSORS),
    VmSize("Standard_NC24rs_v2", 4, "P100", 16, 24, "FDR", 56, "pcie", dt.date(2023, 9, 6), IB_SUCCESSORS),
    VmSize("Standard_ND24rs", 4, "P40", 24, 24, "FDR", 56, "pcie", dt.date(2023, 9, 6), IB_SUCCESSORS),
    # NC24r: InfiniBand without SR-IOV, so no MPI/NCCL over IB on today's images.
    VmSize("Standard_NC24r", 4, "K80", 12, 24, None, 0, "pcie", dt.date(2023, 8, 31), IB_SUCCESSORS),
    VmSize("Standard_NC24", 4, "K80", 12, 24, None, 0, "pcie", dt.date(2023, 8, 31), ("Standard_NC64as_T4_v3",)),
    VmSize("Standard_NC6", 1, "K80", 12, 6, None, 0, "none", dt.date(2023, 8, 31), ("Standard_NC4as_T4_v3",)),
]

CATALOG: dict[str, VmSize] = {s.name: s for s in _SIZES}


def lookup(name: str) -> VmSize | None:
    """Case-insensitive, as Azure treats size names."""
    for key, size in CATALOG.items():
        if key.lower() == name.lower():
            return size
    return None


def available(today: dt.date | None = None) -> list[str]:
    today = today or dt.date.today()
    return sorted(s.name for s in _SIZES if s.retired is None or s.retired > today)
