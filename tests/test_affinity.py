"""Each rank's CPU affinity follows its GPU (payloads/pytorch/affinity.py, docs/pytorch-gpu.md#cpu-affinity), on this
CPU: NVML is a fake `pynvml` module in sys.modules, the GPUs are fake torch.cuda properties, and os.sched_*affinity
record what would be set. The fake machine has 96 CPUs in 4 NUMA nodes, GPUs 2i and 2i+1 on node i, and each GPU
at its own PCI domain, bus 0 (as Azure's Hyper-V VMs number them), so that only the domain tells two GPUs apart."""

from __future__ import annotations

import logging
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from payloads.pytorch import affinity, runtime

GPUS = 8
NODE = 24  # CPUs per NUMA node


def words_for(cpus, size):
    words = [0] * size
    for c in cpus:
        if c // 64 < size:
            words[c // 64] |= 1 << (c % 64)
    return words


class FakeNVML(types.ModuleType):
    """The part of nvidia-ml-py's pynvml that affinity.py uses, strict where NVML is: the bus id must be in
    nvmlPciInfo_t.busId's form, and the mask has exactly cpuSetSize elements."""

    class NVMLError(Exception):
        pass

    def __init__(self, near: dict[int, set[int]]):
        super().__init__("pynvml")
        self.near = near  # physical GPU index -> its CPUs
        self.calls = []
        self.fail = None  # the call name that raises NVMLError

    def _call(self, name):
        self.calls.append(name)
        if self.fail == name:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlInit(self):
        self._call("nvmlInit")

    def nvmlShutdown(self):
        self._call("nvmlShutdown")

    def nvmlDeviceGetHandleByIndex(self, index):  # NVML's own numbering: what a wrong lookup would use
        self._call("nvmlDeviceGetHandleByIndex")
        return ("handle", index)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        self._call("nvmlDeviceGetHandleByPciBusId")
        bus_id = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
        self.calls.append(bus_id)
        for gpu in self.near:
            if bus_id == f"{gpu + 1:08X}:00:00.0":
                return ("handle", gpu)
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetCpuAffinity(self, handle, size):
        self._call("nvmlDeviceGetCpuAffinity")
        self.calls.append(size)
        return words_for(self.near[handle[1]], size)


@pytest.fixture
def machine(monkeypatch):
    """A node with GPUS GPUs and 4 * NODE CPUs; returns its state: allowed (the process's affinity), set (the
    sched_setaffinity calls) and nvml (the fake module, installed)."""
    state = SimpleNamespace(allowed=set(range(4 * NODE)), set=[], cpu_count=4 * NODE, cpuset=set(range(4 * NODE)))
    state.nvml = FakeNVML({g: set(range(g // 2 * NODE, (g // 2 + 1) * NODE)) for g in range(GPUS)})

    def properties(device):
        visible = [int(v) for v in os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(GPUS)))).split(",")]
        return SimpleNamespace(pci_domain_id=visible[device] + 1, pci_bus_id=0, pci_device_id=0)

    def setaffinity(pid, cpus):
        state.set.append((pid, set(cpus)))
        if pid == 0:
            state.allowed = set(cpus)

    monkeypatch.setitem(sys.modules, "pynvml", state.nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(os, "cpu_count", lambda: state.cpu_count)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(state.allowed))
    monkeypatch.setattr(os, "sched_setaffinity", setaffinity)
    monkeypatch.setattr(affinity, "threads", lambda: [])
    monkeypatch.setattr(affinity, "container_cpus", lambda: set(state.cpuset))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(affinity.OPT_OUT, raising=False)
    return state


def own(state):
    """The sets given to this thread (pid 0)."""
    return [cpus for pid, cpus in state.set if pid == 0]


def test_the_mask_is_read_across_words():
    low, high = (1 << 24) - 1, ((1 << 24) - 1) << 32  # CPUs 0-23 in word 0, 96-119 (64 + 32...) in word 1
    assert affinity.mask_to_cpus([low, high]) == set(range(24)) | set(range(96, 120))
    assert affinity.mask_to_cpus([0, 1 << 63]) == {127}
    assert affinity.ranges(set(range(24)) | set(range(96, 120)) | {200}) == "0-23,96-119,200"


def test_a_gpu_whose_cpus_span_two_words_gets_them_all(machine):
    """192 CPUs: NVML is asked for 3 words and CPUs 96-119 (word 1) are not lost."""
    machine.cpu_count = 192
    machine.allowed = machine.cpuset = set(range(192))
    machine.nvml.near[0] = set(range(24)) | set(range(96, 120))
    record = affinity.bind_to_gpu(0)
    assert 3 in machine.nvml.calls  # cpuSetSize
    assert own(machine) == [set(range(24)) | set(range(96, 120))]
    assert record == {"numa_cpus": 48, "cpus": "0-23,96-119", "why": "bound to GPU 00000001:00:00.0's CPUs"}


def test_the_gpu_is_found_by_its_bus_id_not_its_index(machine, monkeypatch):
    """CUDA_VISIBLE_DEVICES=3,1: torch's device 0 is physical GPU 3 (node 1, CPUs 24-47); NVML's index 0 is GPU 0
    (node 0, CPUs 0-23), which a lookup by index would bind to."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    record = affinity.bind_to_gpu(0)
    assert "00000004:00:00.0" in machine.nvml.calls and "nvmlDeviceGetHandleByIndex" not in machine.nvml.calls
    assert own(machine) == [set(range(24, 48))]
    assert record["cpus"] == "24-47" and record["numa_cpus"] == 24
    machine.allowed = set(range(96))
    assert affinity.bind_to_gpu(1)["cpus"] == "0-23"  # device 1: GPU 1, node 0


def test_the_new_set_is_the_gpus_cpus_the_process_may_use(machine):
    """A cgroup or launcher allowing 0-11 and 30-40: GPU 3's CPUs are 24-47, so 30-40, never 24-47."""
    machine.allowed = machine.cpuset = set(range(12)) | set(range(30, 41))
    record = affinity.bind_to_gpu(3)
    assert own(machine) == [set(range(30, 41))]
    assert record == {"numa_cpus": 24, "cpus": "30-40", "why": "bound to GPU 00000004:00:00.0's CPUs allowed here"}


def test_a_narrower_binding_of_the_launchers_is_kept(machine):
    machine.allowed = {25, 26}  # mpirun --bind-to core (two hardware threads) on GPU 3's node
    record = affinity.bind_to_gpu(3)
    assert machine.set == [] and record["cpus"] is None
    assert record["why"] == "already within GPU 00000004:00:00.0's CPUs (25-26)"


def test_a_launchers_binding_off_the_gpus_node_is_replaced_but_the_container_is_never_left(machine):
    """Open MPI with more than two processes binds them to sockets or NUMA nodes in turn: rank 3 on node 1's GPU
    was bound to node 0's CPUs. It is moved to its GPU's node; a container whose cpuset excludes that node keeps
    the rank where it is."""
    machine.allowed = set(range(12))  # bound to another NUMA node by the launcher
    record = affinity.bind_to_gpu(3)
    assert own(machine) == [set(range(24, 48))] and record["cpus"] == "24-47"
    assert record["why"] == "bound to GPU 00000004:00:00.0's CPUs, away from the launcher's 0-11"
    machine.set.clear()
    machine.allowed = machine.cpuset = set(range(12))
    record = affinity.bind_to_gpu(3)
    assert machine.set == [] and machine.allowed == set(range(12))
    assert record["cpus"] is None and record["numa_cpus"] == 24
    assert record["why"] == "none of GPU 00000004:00:00.0's CPUs (24-47) is allowed to this container (0-11): unchanged"


def test_the_ranks_of_a_node_split_their_numa_nodes_cpus_and_mpis_binding_is_undone(machine):
    """8 ranks on 8 GPUs, two per NUMA node of 24 CPUs: each rank gets 12, disjoint, together every CPU, each on
    its own GPU's node, whatever Open MPI's round-robin binding by NUMA node had left it on."""
    parts = []
    for rank in range(GPUS):
        machine.allowed = set(range((rank % 4) * NODE, (rank % 4 + 1) * NODE))  # --bind-to numa, --map-by numa
        record = affinity.bind_to_gpu(rank, local_size=GPUS)
        parts.append(machine.allowed)
        assert record["numa_cpus"] == NODE and "(1/2 of them)" in record["why"], record
        assert machine.allowed <= set(range(rank // 2 * NODE, (rank // 2 + 1) * NODE))
    assert [len(p) for p in parts] == [NODE // 2] * GPUS
    assert set().union(*parts) == set(range(4 * NODE)) and sum(map(len, parts)) == 4 * NODE
    assert parts[1] == set(range(12, 24)) and parts[2] == set(range(24, 36))
    # One process on an 8-GPU node shares with nobody: its GPU's whole node.
    machine.allowed = set(range(4 * NODE))
    assert affinity.bind_to_gpu(0, local_size=1)["cpus"] == "0-23"


def test_without_pynvml_nothing_changes(machine, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    record = affinity.bind_to_gpu(0)
    assert machine.set == [] and record == {
        "numa_cpus": None,
        "cpus": None,
        "why": "pynvml not installed (pip install nvidia-ml-py)",
    }


@pytest.mark.parametrize("failing", ["nvmlInit", "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetCpuAffinity"])
def test_an_nvml_error_is_a_warning_not_an_exception(machine, caplog, failing):
    machine.nvml.fail = failing
    with caplog.at_level(logging.WARNING, logger="payloads.pytorch"):
        record = affinity.bind_to_gpu(0)
    assert machine.set == [] and record["cpus"] is None
    assert record["why"] == "NVML failed for GPU 00000001:00:00.0: NVMLError: Driver Not Loaded"
    assert "CPU affinity left unchanged: NVML failed" in caplog.text
    assert failing == "nvmlInit" or machine.nvml.calls[-1] == "nvmlShutdown"  # shut down after an init


def test_an_unknown_bus_id_is_an_nvml_error(machine, caplog):
    del machine.nvml.near[5]
    assert affinity.bind_to_gpu(5)["why"] == "NVML failed for GPU 00000006:00:00.0: NVMLError: Not Found"


@pytest.mark.parametrize("value, binds", [("0", False), (" 0 ", False), ("1", True), ("", True)])
def test_the_opt_out(machine, monkeypatch, value, binds):
    monkeypatch.setenv(affinity.OPT_OUT, value)
    record = affinity.bind_to_gpu(0)
    assert bool(machine.set) == binds and bool(machine.nvml.calls) == binds
    if not binds:
        assert record == {"numa_cpus": None, "cpus": None, "why": "PAYLOAD_GPU_AFFINITY=0: left as the launcher set it"}


def test_without_cuda_nothing_is_asked(machine, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert affinity.bind_to_gpu(0)["why"] == "no CUDA device"
    assert machine.set == [] and machine.nvml.calls == []


def test_threads_already_running_are_bound_too(machine, monkeypatch):
    monkeypatch.setattr(affinity, "threads", lambda: [101, 102])
    affinity.bind_to_gpu(2)
    assert machine.set == [(0, set(range(24, 48))), (101, set(range(24, 48))), (102, set(range(24, 48)))]


def test_this_process_threads_are_listed():
    assert os.getpid() in affinity.threads()


def test_setup_binds_after_choosing_the_gpu_and_caps_the_threads(machine, monkeypatch, caplog):
    """runtime.resolve on a fake CUDA node: local rank 1 of 2 takes GPU 1, is bound to its half of the node's 24 CPUs
    (GPU 0, local rank 0's, has the same node) before setup returns, and the default thread count (96 CPUs / 2
    processes = 48) comes down to those 12."""
    from payloads.common.config import TrainConfig

    order = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: order.append(("set_device", d)))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: order.append(("threads", n)))
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(
        affinity,
        "bind_to_gpu",
        lambda d, bind=affinity.bind_to_gpu, **kw: order.append(("bind", d)) or bind(d, **kw),
    )
    backend = SimpleNamespace(local_rank=lambda: 1, local_size=lambda: 2, size=lambda: 2)
    cfg = TrainConfig(amp=False, amp_dtype="fp16")
    with caplog.at_level(logging.INFO, logger="payloads.pytorch"):
        device, _, settings = runtime.resolve(cfg, backend)
    assert device == torch.device("cuda", 1) and settings.channels_last  # the GPU's default
    assert order == [("threads", 48), ("set_device", 1), ("bind", 1), ("threads", 12)]
    assert own(machine) == [set(range(12, 24))]
    assert "CPU affinity 12-23: bound to GPU 00000002:00:00.0's CPUs (1/2 of them)" in caplog.text


def test_the_container_cpuset_is_read_from_the_cgroup(tmp_path, monkeypatch):
    v2 = tmp_path / "cpuset.cpus.effective"
    v2.write_text("0-2,5,7-8\n")
    monkeypatch.setattr(affinity, "CGROUP_CPUSETS", (str(tmp_path / "absent"), str(v2)))
    assert affinity.container_cpus() == {0, 1, 2, 5, 7, 8}
    assert affinity.ranges(affinity.parse_ranges("0-2,5,7-8")) == "0-2,5,7-8"
    monkeypatch.setattr(affinity, "CGROUP_CPUSETS", (str(tmp_path / "absent"),))
    assert affinity.container_cpus() == os.sched_getaffinity(0)
