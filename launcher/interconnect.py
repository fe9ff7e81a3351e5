"""Environment variables each kind of cluster needs for fast collectives (one home per fact).

InfiniBand sizes (ND A100 v4, ND H100/H200 v5): NCCL over IB verbs (GPUDirect RDMA) and UCX over RC for
Open MPI; the eth0 interface only for bootstrap. GPU sizes without IB: NCCL over TCP sockets. CPU sizes:
Horovod's MPI operations (faster than Gloo's in shared memory, benchmarks/allreduce.py; a draw with them
when both are forced onto TCP, README "Benchmarks") with Open MPI yielding when idle
(its busy-polling takes the cores the training threads need; figures below), one
OpenMP thread pool per process.
"""
from __future__ import annotations

from .errors import JobError

# Horovod's background thread runs a coordination collective every cycle; Open MPI busy-polls in it by
# default, taking the core from the training thread when the processes use every core (CPU training).
# Measured here (ResNet-18, 64 px, 2 processes on 2 cores): with no tensor reduced at all, a step took
# 519 ms under MPI's busy-polling vs 304 ms with yield_when_idle; with Horovod's optimizer 503-532 ms vs
# 354-380 ms (benchmarks/scaling.py shows the end-to-end effect).
MPI_CPU_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}


def environment(cluster: dict, processes_per_node: int) -> dict[str, str]:
    env = {"NCCL_DEBUG": "WARN", "HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}
    if cluster["gpus_per_node"] == 0:
        env.update({"HOROVOD_CPU_OPERATIONS": "mpi", **MPI_CPU_ENV,
                    "OMP_NUM_THREADS": str(max(1, cluster.get("vcpus_per_node", 1) // processes_per_node))})
    elif cluster["infiniband"]:
        env.update({"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_PCI_RELAXED_ORDERING": "1",
                    "UCX_TLS": "rc,sm,self", "UCX_IB_PCI_RELAXED_ORDERING": "on",
                    "OMPI_MCA_pml": "ucx", "OMPI_MCA_btl": "^openib,uct"})
    else:
        env.update({"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0", "OMPI_MCA_btl_tcp_if_include": "eth0"})
    return env


def check_under_mpi(env: dict, where: str, alternative: str = "") -> None:
    """Refuse settings that break a job started by mpirun (Azure ML's MPI distribution, the local MPI
    controller). Horovod 0.28.1 with HOROVOD_CPU_OPERATIONS=gloo under mpirun segfaults in its first
    allreduce (GlooAllreduce::Execute, signal 11; seen here): only Horovod's own Gloo launcher sets up the
    Gloo context those operations need."""
    if str(env.get("HOROVOD_CPU_OPERATIONS", "")).lower() == "gloo":
        raise JobError(f"{where}: HOROVOD_CPU_OPERATIONS=gloo crashes Horovod 0.28.1 when mpirun starts the job "
                       "(a segmentation fault in the first allreduce): remove it (mpi is the default and the "
                       f"faster, see README Benchmarks){alternative}")
