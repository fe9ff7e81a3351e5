"""Catalog of VM sizes for training clusters: the one home of GPUs per node and interconnect facts.

Job submission reads GPUs per node from the stack outputs, which come from here. Retirement dates are
Azure's published ones; a retired size fails validation with its successors named.
"""

from __future__ import annotations

import dataclasses
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
    # What a healthy node of this size delivers, as Azure's node health checks publish it (HEALTH below), one
    # figure per check the health check runs on each node (payloads/healthcheck/verdicts.py); a check with
    # no published figure for the size is listed in NO_FIGURE with the reason.
    health: tuple[Expected, ...] = ()
    # The node's memory, GiB (Azure's size pages, "Memory"): what /dev/shm can hold (launcher/cachehome.py).
    memory_gib: int | None = None


# ---- What Azure's node health checks expect of each size ------------------------------------------------------
# Azure/azurehpc-health-checks (AzureHPC Node Health Checks; what Azure ML's own health-check job runs, Azure/
# azureml-examples best-practices/largescale-deep-learning/Debugging/Compute) judges each node against one conf
# file per size. Read at this commit (2026-05-01, the repository's newest when read); every conf line below is
# quoted from conf/<size>.conf there, the measurement from the customTests/ script named.
AZURE_NHC = "Azure/azurehpc-health-checks"
AZURE_NHC_COMMIT = "0e0a1ac26a64b32ac4dd7632a529638505d3314a"

# The checks, in the health check's names:
# - allreduce_in_node (check_nccl_allreduce, customTests/azure_nccl_allreduce.nhc): nccl-tests all_reduce_perf
#   with one process per GPU of the node (mpirun -np <nvidia-smi GPU count>), one message size
#   (-b SIZE -e SIZE; nccl-tests reads G as 2^30 bytes), judged on the "Avg bus bandwidth" line, GB/s.
#   Traffic stays on NVLink (NVSwitch) on the ND sizes.
# - allreduce_over_ib (check_nccl_allreduce_ib_loopback, customTests/azure_nccl_allreduce_ib_loopback.nhc):
#   the same run of 8 processes on one node with NCCL_SHM_DISABLE=1 and NCCL_P2P_DISABLE=1, so that every
#   byte leaves its GPU through the GPU's InfiniBand card; bus bandwidth, GB/s.
# - ib_write_bw (check_ib_bw_gdr, customTests/azure_ib_write_bw_gdr.nhc): perftest's ib_write_bw per
#   InfiniBand card (link layer InfiniBand), server and client on the same card (loopback), 8388608-byte
#   messages from GPU memory (--use_cuda), "BW average" with --report_gbits, Gb/s, every card at once.
ALLREDUCE_IN_NODE, ALLREDUCE_OVER_IB, IB_WRITE_BW = "allreduce_in_node", "allreduce_over_ib", "ib_write_bw"
GIB = 2**30
IB_WRITE_BW_MESSAGE = 8388608  # azure_ib_write_bw_gdr.nhc: MESSAGE_SIZE=8388608


@dataclass(frozen=True)
class Expected:
    check: str  # ALLREDUCE_IN_NODE, ALLREDUCE_OVER_IB or IB_WRITE_BW
    value: float  # the least a healthy node shows, in `unit`
    unit: str  # GB/s (bus bandwidth, nccl-tests' definition) or Gb/s (ib_write_bw --report_gbits)
    message_bytes: int  # the message size Azure measures at
    processes: int | None  # processes on the node the figure is for (one per GPU); None: per IB card
    conf: str  # the conf line, quoted
    path: str  # its file in AZURE_NHC at AZURE_NHC_COMMIT

    @property
    def source(self) -> str:
        return f"{AZURE_NHC} {self.path}@{AZURE_NHC_COMMIT[:12]}: {self.conf}"


def _nhc(check: str, conf_file: str, line: str, gpus: int) -> Expected:
    """One figure from its quoted conf line: 'check_x VALUE [REPEATS SIZE ...]'."""
    words = line.split()
    value = float(words[1])
    if check == IB_WRITE_BW:
        return Expected(check, value, "Gb/s", IB_WRITE_BW_MESSAGE, None, line, f"conf/{conf_file}")
    size = words[3]
    assert size.endswith("G"), line  # nccl-tests' suffixes: G = 2^30
    processes = gpus if check == ALLREDUCE_IN_NODE else None  # the IB figure is per card: any pairing
    return Expected(check, value, "GB/s", int(size[:-1]) * GIB, processes, line, f"conf/{conf_file}")


def _health(conf_file: str, gpus: int, **lines: str) -> tuple[Expected, ...]:
    return tuple(_nhc(check, conf_file, line, gpus) for check, line in lines.items())


# Checks a supported size has no published figure for, and why (the health check reports them unjudged).
NO_FIGURE: dict[tuple[str, str], str] = {
    ("Standard_ND96isr_H100_v5", ALLREDUCE_OVER_IB): (
        f"{AZURE_NHC} conf/nd96isr_h100_v5.conf has no check_nccl_allreduce_ib_loopback since commit "
        "c6742502016d (2023-10-13), which removed its 40.0 GB/s; ib_write_bw per card covers the cards"
    ),
    ("Standard_ND96isr_H200_v5", ALLREDUCE_OVER_IB): (
        f"{AZURE_NHC} conf/nd96isr_h200_v5.conf has never had check_nccl_allreduce_ib_loopback; ib_write_bw "
        "per card covers the cards"
    ),
    ("Standard_NC64as_T4_v3", ALLREDUCE_IN_NODE): (
        f"{AZURE_NHC} has no conf for nc64as_t4_v3 (nor for any T4 size) at {AZURE_NHC_COMMIT[:12]}"
    ),
}


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
    VmSize(
        "Standard_NC96ads_A100_v4",
        4,
        "A100",
        80,
        96,
        None,
        0,
        "pcie",
        health=_health(
            "nc96ads_a100_v4.conf",
            4,
            allreduce_in_node="check_nccl_allreduce 25 1 8G $AZ_NHC_ROOT/topofiles/ncv4-topo.xml",
        ),
    ),
    VmSize("Standard_NC40ads_H100_v5", 1, "H100 NVL", 94, 40, None, 0, "none"),
    # Current InfiniBand sizes (8 GPUs, NVLink inside the node, one IB link per GPU).
    # Bandwidth floors (min_busbw_gbytes_per_sec), for the all-reduce across every process of the job, well
    # below what these sizes deliver so that only a broken fabric fails them: Azure's node health checks
    # (`health`, above) require a single-node NCCL allreduce busbw of 228 GB/s (A100 v4), 460 (H100 v5), 431
    # (H200 v5), and on the A100 v4 sizes an NCCL allreduce through the IB cards (ib_loopback) of 18 GB/s
    # (HDR, 200 Gb/s = 25 GB/s line rate; the NDR sizes' 40 GB/s was dropped, NO_FIGURE). The worst healthy
    # layout here is one process per node (each rank on one IB link): floors of 10 and 20 GB/s pass it, while
    # NCCL falling back to TCP sockets on the Ethernet NIC (80 Gb/s = 10 GB/s line rate at most on these
    # sizes, and NCCL's sockets stay well under line rate) does not reach them.
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
        health=_health(
            "nd96asr_v4.conf",
            8,
            allreduce_in_node="check_nccl_allreduce 228.0 1 8G $AZ_NHC_ROOT/topofiles/ndv4-topo.xml",
            allreduce_over_ib="check_nccl_allreduce_ib_loopback 18.0 1 8G $AZ_NHC_ROOT/topofiles/ndv4-topo.xml",
            ib_write_bw="check_ib_bw_gdr 180.0",
        ),
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
        health=_health(
            "nd96amsr_a100_v4.conf",
            8,
            allreduce_in_node="check_nccl_allreduce 228.0 1 16G $AZ_NHC_ROOT/topofiles/ndv4-topo.xml",
            allreduce_over_ib="check_nccl_allreduce_ib_loopback 18.0 1 16G $AZ_NHC_ROOT/topofiles/ndv4-topo.xml",
            ib_write_bw="check_ib_bw_gdr 180.0",
        ),
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
        health=_health(
            "nd96isr_h100_v5.conf",
            8,
            allreduce_in_node="check_nccl_allreduce 460.0 1 16G $AZ_NHC_ROOT/topofiles/ndv5-topo.xml",
            ib_write_bw="check_ib_bw_gdr 380",
        ),
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
        health=_health(
            "nd96isr_h200_v5.conf",
            8,
            allreduce_in_node="check_nccl_allreduce 431.0 1 16G $AZ_NHC_ROOT/topofiles/ndv5-topo.xml",
            ib_write_bw="check_ib_bw_gdr 360",
        ),
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

# Memory per node, GiB, from Azure's size pages (learn.microsoft.com/azure/virtual-machines/sizes/, each series'
# "Memory" column or host specifications: Dsv5, NCasT4_v3, NC_A100_v4, NCads_H100_v5, NDasrA100_v4, NDm_A100_v4,
# ND_H100_v5, ND_H200_v5).
MEMORY_GIB = {
    "Standard_D4s_v5": 16,
    "Standard_D8s_v5": 32,
    "Standard_D16s_v5": 64,
    "Standard_NC4as_T4_v3": 28,
    "Standard_NC64as_T4_v3": 440,
    "Standard_NC24ads_A100_v4": 220,
    "Standard_NC96ads_A100_v4": 880,
    "Standard_NC40ads_H100_v5": 320,
    "Standard_ND96asr_v4": 900,
    "Standard_ND96amsr_A100_v4": 1900,
    "Standard_ND96isr_H100_v5": 1900,
    "Standard_ND96isr_H200_v5": 1850,
}
_SIZES = [dataclasses.replace(s, memory_gib=MEMORY_GIB.get(s.name)) for s in _SIZES]

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


def expected(size: VmSize, check: str) -> Expected | None:
    """Azure's figure for this check on this size, or None (NO_FIGURE says why, where the size has the hardware)."""
    return next((e for e in size.health if e.check == check), None)
