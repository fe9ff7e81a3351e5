"""Each rank's CPUs follow its GPU: before any loader or decode worker starts, the process is bound to its share of
the CPUs NVML names as its GPU's (the GPU's NUMA node), so that pinned buffers, decoding and the host-to-device
copies stay on the GPU's socket (docs/pytorch-gpu.md#cpu-affinity). The GPUs of one node's ranks that share a NUMA
node share its CPUs in equal, disjoint parts (ND H100 v5: 4 GPUs and 48 vCPUs per node, 12 each), so one rank's
decode workers never take another's cores.

NVML comes from nvidia-ml-py (import name `pynvml`), which is optional: without it, or without a GPU, or when NVML
fails, nothing changes and the record says why. GPUs are found by their PCI bus id, not an index: CUDA's indices
follow CUDA_VISIBLE_DEVICES, NVML's do not. The new set never leaves the container's cpuset (the cgroup's
cpuset.cpus.effective; the process's affinity where that cannot be read). A launcher's binding inside the rank's
share is kept; one outside it is replaced: Open MPI binds more than two processes to a socket or NUMA node in turn
(rank 1 to the second one, whatever its GPU), which left half the ranks of a node on the wrong NUMA node.
PAYLOAD_GPU_AFFINITY=0 turns it off, for a binding of one's own (mpirun --bind-to/--map-by, numactl, taskset)."""

from __future__ import annotations

import itertools
import logging
import os

import torch

log = logging.getLogger("payloads.pytorch")
OPT_OUT = "PAYLOAD_GPU_AFFINITY"
WORD = 64  # CPUs per element of nvmlDeviceGetCpuAffinity's array (an unsigned long on Linux x86-64 and arm64)


def mask_to_cpus(words) -> set[int]:
    """nvmlDeviceGetCpuAffinity's array -> CPU ids: CPU 0 is bit 0 of element 0, CPU 64 bit 0 of element 1."""
    return {i * WORD + bit for i, word in enumerate(words) for bit in range(WORD) if int(word) >> bit & 1}


def ranges(cpus) -> str:
    """{0, 1, 2, 5, 7, 8} -> "0-2,5,7-8" (the form of /sys/devices/system/node/node*/cpulist and taskset -c)."""
    out = []
    for _, run in itertools.groupby(enumerate(sorted(cpus)), key=lambda ic: ic[1] - ic[0]):  # consecutive ids
        run = [c for _, c in run]
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
    return ",".join(out)


def pci_bus_id(device: int) -> str:
    """The PCI address of CUDA device `device` (as torch numbers it, after CUDA_VISIBLE_DEVICES) in NVML's form,
    "DDDDDDDD:BB:DD.0" (nvmlPciInfo_t.busId); torch 2.4+ gives the three numbers."""
    p = torch.cuda.get_device_properties(device)
    return f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"


def gpu_cpus(pynvml, bus_ids: list[str]) -> list[set[int]]:
    """The CPUs NVML names as near each GPU of `bus_ids`. Raises pynvml.NVMLError when NVML fails (no driver
    library, an unknown bus id)."""
    pynvml.nvmlInit()
    try:
        size = max(os.cpu_count() or 1, max(os.sched_getaffinity(0), default=0) + 1)
        # bytes: every nvidia-ml-py takes them (the newer ones also take str)
        return [
            mask_to_cpus(
                pynvml.nvmlDeviceGetCpuAffinity(pynvml.nvmlDeviceGetHandleByPciBusId(b.encode()), -(-size // WORD))
            )
            for b in bus_ids
        ]
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


CGROUP_CPUSETS = ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus")


def parse_ranges(text: str) -> set[int]:
    """ "0-2,5,7-8" -> {0, 1, 2, 5, 7, 8} (the kernel's cpulist form; ranges() writes it)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def container_cpus() -> set[int]:
    """The CPUs the container may use (cgroup v2, then v1); this process's affinity where neither reads."""
    for path in CGROUP_CPUSETS:
        try:
            with open(path) as f:
                cpus = parse_ranges(f.read())
        except (OSError, ValueError):
            continue
        if cpus:
            return cpus
    return os.sched_getaffinity(0)


def share(near: dict[int, set[int]], device: int) -> tuple[set[int], int]:
    """`device`'s part of its NUMA node's CPUs among the node's ranks whose GPUs have the same CPUs (near[d] for
    local rank d's GPU): equal contiguous parts in CPU order. Returns (the part, how many share the node)."""
    mine = near[device]
    peers = sorted(d for d in near if near[d] == mine)
    if len(peers) <= 1:
        return set(mine), 1
    ordered, k, m = sorted(mine), peers.index(device), len(peers)
    return set(ordered[k * len(ordered) // m : (k + 1) * len(ordered) // m]), m


def threads() -> list[int]:
    """This process's threads: sched_setaffinity binds one thread, and those started before (Horovod's background
    thread, the watchdog's) would keep their own set. Empty where /proc is not readable."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def bind_to_gpu(device: int | None, environ=None, local_size: int = 1) -> dict:
    """Bind this process to its share of the CPUs near CUDA device `device` (the GPUs of local ranks 0 to
    local_size - 1 that have the same CPUs share them), within the container's cpuset. Returns what it did:
    numa_cpus (how many CPUs NVML names for the GPU; None when not asked), cpus (the set now in force, as ranges;
    None when the affinity was left alone) and why. Never raises for NVML or the OS: a failure is a warning and the
    affinity stays as it was."""
    record = {"numa_cpus": None, "cpus": None, "why": ""}
    env = os.environ if environ is None else environ
    if env.get(OPT_OUT, "").strip() == "0":
        record["why"] = f"{OPT_OUT}=0: left as the launcher set it"
        return record
    if device is None or not torch.cuda.is_available():
        record["why"] = "no CUDA device"
        return record
    if not hasattr(os, "sched_setaffinity"):
        record["why"] = "this OS has no sched_setaffinity"
        return record
    try:
        local = sorted(set(range(local_size)) | {device})  # the GPUs of this node's ranks
        buses = {d: pci_bus_id(d) for d in local}
    except (AttributeError, RuntimeError) as e:  # a torch older than 2.4 has no PCI numbers
        record["why"] = f"no PCI bus id for CUDA device {device}: {e}"
        return record
    bus_id = buses[device]
    try:
        import pynvml  # optional (nvidia-ml-py): imported here so that the payloads run without it
    except ImportError:
        record["why"] = "pynvml not installed (pip install nvidia-ml-py)"
        return record
    try:
        near = dict(zip(local, gpu_cpus(pynvml, [buses[d] for d in local])))
    except pynvml.NVMLError as e:  # and its subclasses (NVMLError_LibraryNotFound, ...): never stops training
        record["why"] = f"NVML failed for GPU {bus_id}: {type(e).__name__}: {e}"
        log.warning("CPU affinity left unchanged: %s", record["why"])
        return record
    record["numa_cpus"] = len(near[device])
    part, sharing = share(near, device)
    allowed, current = container_cpus(), os.sched_getaffinity(0)
    cpus = part & allowed  # never wider than what the cgroup or container allowed
    whose = f"GPU {bus_id}'s CPUs" + (f" (1/{sharing} of them)" if sharing > 1 else "")
    if not near[device]:
        record["why"] = f"NVML names no CPUs for GPU {bus_id}"
    elif not cpus:
        record["why"] = f"none of {whose} ({ranges(part)}) is allowed to this container ({ranges(allowed)}): unchanged"
    elif current <= cpus:
        record["why"] = (
            f"already within {whose} ({ranges(current)})" if current < cpus else f"already {whose} ({ranges(current)})"
        )
    else:
        try:
            os.sched_setaffinity(0, cpus)  # this thread, and every thread and process it starts from now on
        except OSError as e:
            record["why"] = f"sched_setaffinity failed: {e}"
            log.warning("CPU affinity left unchanged: %s", record["why"])
            return record
        for tid in threads():  # the threads already running
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # a thread that ended meanwhile
                pass
        record["cpus"] = ranges(cpus)
        moved = "" if current & part else f", away from the launcher's {ranges(current)}"
        record["why"] = f"bound to {whose}" + (" allowed here" if cpus < part else "") + moved
    return record
