"""How data-parallel training scales on a VM size: predicted step time and efficiency at N GPUs.

The product's model (the cost ledger compares a job with it: launcher/cost); benchmarks/planner.py prints it,
calibrates it on the source documents' figures and plots it.

Model (per step, per-GPU batch b, gradient bytes S, N GPUs on M = N/g nodes of g GPUs):
  compute      T_c = b / (single-GPU images/sec); the backward pass is 2/3 of it
  ring         2(N-1)/N * S / B_ring       with B_ring = the slowest link a flat ring crosses
  hierarchical 2(g-1)/g * S / B_intra  +  2(M-1)/M * S / B_inter   (reduce-scatter in the node, allreduce of
               the shards across nodes over all of the node's links, all-gather in the node)
  latency      2(N-1) * alpha per allreduce, alpha = 10 us on InfiniBand, 50 us on TCP
  overhead     T_o = t_sync * log2(N): what a step costs beyond compute and the allreduce's bandwidth and
               latency (waiting for the slowest rank, the last gradients' allreduce that nothing overlaps,
               the coordination), fitted to NVIDIA's published 8-GPU ResNet-50 figure (fit_sync)
  step         T_c + max(0, T_comm - overlap * backward) + T_o      efficiency = T_c / step
Bandwidths come from the VM-size catalog (vm_sizes.py): NVLink 150 GB/s, PCIe 10 GB/s, InfiniBand aggregate per
node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import vm_sizes

RESNET50_BYTES = 25_557_032 * 4  # fp32 gradients of torchvision/Keras ResNet-50
INTRA_GBPS = {"nvlink": 150.0, "pcie": 10.0, "none": 10.0}


@dataclass(frozen=True)
class Transport:
    name: str
    inter_gbps: float  # per node
    intra_gbps: float
    alpha: float  # seconds per ring hop
    overlap: float  # share of the backward pass that hides communication
    sync: float = 0.0  # per-step overhead, seconds per doubling of the processes (t_sync)


def overhead(n: int, t: Transport) -> float:
    """Seconds a step of n processes spends beyond compute and the allreduce's bandwidth and latency terms:
    waiting for the slowest of n ranks and the coordination grow with the depth of a tree over them."""
    return t.sync * math.log2(n) if n > 1 else 0.0


def step_time(n: int, g: int, batch: int, rate1: float, grad_bytes: float, t: Transport, hierarchical: bool) -> float:
    compute = batch / rate1
    if n == 1:
        return compute
    g = min(g, n)
    m = max(1, n // g)
    if hierarchical and m > 1:
        comm = 2 * (g - 1) / g * grad_bytes / (t.intra_gbps * 1e9) + 2 * (m - 1) / m * grad_bytes / (t.inter_gbps * 1e9)
    else:
        link = t.intra_gbps if m == 1 else min(t.intra_gbps, t.inter_gbps)
        comm = 2 * (n - 1) / n * grad_bytes / (link * 1e9)
    comm += 2 * (n - 1) * t.alpha
    return compute + max(0.0, comm - t.overlap * compute * 2 / 3) + overhead(n, t)


def efficiency(n, g, batch, rate1, grad_bytes, t, hierarchical) -> float:
    return (batch / rate1) / step_time(n, g, batch, rate1, grad_bytes, t, hierarchical)


# ---- the per-step overhead term ---------------------------------------------------------------------------
# NVIDIA's published ResNet-50 v1.5 PyTorch figures, 1 and 8 GPUs of one DGX (NVIDIA/DeepLearningExamples
# PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance results", pytorch-21.03 NGC
# container): name -> (per-GPU batch, ConvNets/configs.yml resnet50; images/sec on 1 GPU; on 8 GPUs).
DLE_8GPU = {
    "A100 80GB AMP": (256, 2470, 16621),  # 6.72x: the fit
    "A100 80GB TF32": (256, 938, 7248),  # 7.72x
    "V100 16GB AMP": (256, 1200, 8322),  # 6.93x
    "V100 16GB FP32": (112, 367, 2855),  # 7.76x
    "V100 32GB AMP": (256, 1156, 8056),  # 6.96x
    "V100 32GB FP32": (112, 356, 2766),  # 7.75x
}
OVERHEAD_FIT_ON = "A100 80GB AMP"
# A DGX's 8 GPUs on NVLink, as the model sees an ND A100 v4 node (8 GPUs of one node: no inter-node hop).
DGX = Transport("nccl", 0.0, INTRA_GBPS["nvlink"], 10e-6, 0.8)


def fit_sync(name: str = OVERHEAD_FIT_ON) -> float:
    """t_sync from one published 8-GPU figure: its measured step time less the model's without overhead."""
    batch, r1, r8 = DLE_8GPU[name]
    measured = batch / (r8 / 8)
    modelled = step_time(8, 8, batch, r1, RESNET50_BYTES, DGX, False)
    return (measured - modelled) / math.log2(8)


SYNC_SECONDS = fit_sync()


def speedup_8(name: str, sync: float | None = None) -> float:
    """The model's 8-GPU speed-up for a DLE_8GPU row (sync=0: the model without its overhead term)."""
    batch, r1, _ = DLE_8GPU[name]
    t = replace(DGX, sync=SYNC_SECONDS if sync is None else sync)
    return 8 * efficiency(8, 8, batch, r1, RESNET50_BYTES, t, False)


def nccl_transport(size: vm_sizes.VmSize) -> Transport:
    """NCCL's allreduce on `size`'s links: InfiniBand where the size has it (Gb/s per node), else TCP (~25 Gb/s)."""
    inter = size.ib_gbps_per_node / 8 if size.infiniband else 3.0
    return Transport("nccl", inter, INTRA_GBPS[size.intra_node], 10e-6 if size.infiniband else 50e-6, 0.8, SYNC_SECONDS)
