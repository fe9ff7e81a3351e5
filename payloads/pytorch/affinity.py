"""Each rank's CPUs follow its GPU: before any loader or decode worker starts, the process is bound to the CPUs
NVML names as its GPU's (the GPU's NUMA node on a multi-socket machine), so that pinned buffers, decoding and the
host-to-device copies stay on the GPU's socket (docs/pytorch-gpu.md#cpu-affinity).

NVML comes from nvidia-ml-py (import name `pynvml`), which is optional: without it, or without a GPU, or when NVML
fails, nothing changes and the record says why. The GPU is found by its PCI bus id, not its index: CUDA's indices
follow CUDA_VISIBLE_DEVICES, NVML's do not. The new set is the GPU's CPUs that the process may already use (the
launcher's binding, the cgroup's or container's cpuset): it is never widened. PAYLOAD_GPU_AFFINITY=0 turns it off,
for a binding of one's own (mpirun --bind-to/--map-by, numactl, taskset)."""

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


def gpu_cpus(pynvml, bus_id: str) -> set[int]:
    """The CPUs NVML names as near the GPU at `bus_id`. Raises pynvml.NVMLError when NVML fails (no driver
    library, an unknown bus id)."""
    pynvml.nvmlInit()
    try:
        # bytes: every nvidia-ml-py takes them (the newer ones also take str)
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
        size = max(os.cpu_count() or 1, max(os.sched_getaffinity(0), default=0) + 1)
        return mask_to_cpus(pynvml.nvmlDeviceGetCpuAffinity(handle, -(-size // WORD)))
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def threads() -> list[int]:
    """This process's threads: sched_setaffinity binds one thread, and those started before (Horovod's background
    thread, the watchdog's) would keep their own set. Empty where /proc is not readable."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def bind_to_gpu(device: int | None, environ=None) -> dict:
    """Bind this process to the CPUs near CUDA device `device` that it may already use. Returns what it did:
    numa_cpus (how many CPUs NVML names for the GPU; None when not asked), cpus (the set now in force, as ranges;
    None when the affinity was left alone) and why. Never raises for NVML or the OS: a failure is a warning and
    the affinity stays as it was."""
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
        bus_id = pci_bus_id(device)
    except (AttributeError, RuntimeError) as e:  # a torch older than 2.4 has no PCI numbers
        record["why"] = f"no PCI bus id for CUDA device {device}: {e}"
        return record
    try:
        import pynvml  # optional (nvidia-ml-py): imported here so that the payloads run without it
    except ImportError:
        record["why"] = "pynvml not installed (pip install nvidia-ml-py)"
        return record
    try:
        near = gpu_cpus(pynvml, bus_id)
    except pynvml.NVMLError as e:  # and its subclasses (NVMLError_LibraryNotFound, ...): never stops training
        record["why"] = f"NVML failed for GPU {bus_id}: {type(e).__name__}: {e}"
        log.warning("CPU affinity left unchanged: %s", record["why"])
        return record
    record["numa_cpus"] = len(near)
    allowed = os.sched_getaffinity(0)
    cpus = near & allowed  # never wider than what the launcher, cgroup or container allowed
    if not near:
        record["why"] = f"NVML names no CPUs for GPU {bus_id}"
    elif not cpus:
        record["why"] = (
            f"none of GPU {bus_id}'s CPUs ({ranges(near)}) is allowed to this process ({ranges(allowed)}): unchanged"
        )
    elif cpus == allowed:
        record["why"] = (
            f"already within GPU {bus_id}'s CPUs ({ranges(allowed)})"
            if allowed < near
            else f"already GPU {bus_id}'s CPUs ({ranges(allowed)})"
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
        record["why"] = f"bound to GPU {bus_id}'s CPUs" + (" allowed here" if cpus < near else "")
    return record
