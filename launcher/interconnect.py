"""Environment variables each kind of cluster needs for its collectives (one home per fact: the images set
none of them, so that one image serves every size).

Three kinds, from the cluster's VM size:
- cpu: Horovod's MPI operations (faster than Gloo's in shared memory, benchmarks/allreduce.py; a draw with
  them when both are forced onto TCP, docs/benchmarks.md#what-the-benchmarks-changed) over Open MPI's ob1 pml (shared memory inside a
  node, TCP on eth0 between nodes), Open MPI yielding when idle, one OpenMP thread pool per process.
- gpu-tcp: GPU sizes without InfiniBand: NCCL over TCP sockets on eth0, MPI (Horovod's coordination only)
  over ob1 as on CPU sizes.
- infiniband: NCCL over IB verbs (GPUDirect RDMA) with the size's topology file, eth0 for its bootstrap;
  MPI (Horovod's coordination only) over ob1/TCP on eth0, as on the other GPU sizes.

A PyTorch DDP job (distribution pytorch, no mpirun) gets the same NCCL settings and none of MPI's or
Horovod's: NCCL carries its GPU gradients as it carries Horovod's, and Gloo (its CPU collectives, and all of
them on CPU sizes) is kept to eth0 as MPI is (GLOO_ENV).

Open MPI's UCX pml only offers itself where a Mellanox/InfiniBand device exists: forcing it (as the images
once did) kills every job on a CPU or NC size in MPI_Init with "PML ucx cannot be selected"
(tests/launcher/test_interconnect.py shows it with Debian's Open MPI). Setting the pml per kind here also
overrides whatever a base image might set, since Azure ML applies a job's environment_variables over the
image's ENV.
"""

from __future__ import annotations

from azureaccess.errors import JobError
from payloads.healthcheck import expected as node_figures
from trainingplatform import vm_sizes  # a plain module (no Pulumi import): the facts the stack was built from

# Horovod's background thread runs a coordination collective every cycle; Open MPI busy-polls in it by
# default, taking the core from the training thread when the processes use every core (CPU training): the step
# times with and without it are in docs/benchmarks.md#what-the-benchmarks-changed.
MPI_CPU_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}

# Open MPI without InfiniBand: the ob1 pml over shared memory (vader) inside a node and TCP between nodes,
# on eth0 only (Azure ML nodes also carry docker0, whose identical subnet on every node makes Open MPI's
# TCP btl try unreachable peers). The daemons' own wire-up (the oob framework, before any MPI message) meets
# the same docker0, so it is held to eth0 too.
# The daemons' keepalive, so that a node whose link went down is declared lost after about 25 s: with Open MPI
# 4.1's defaults (300 s idle, then 9 probes 20 s apart) mpirun waited 358 s on a simulated node whose eth0 was cut
# before it ended the job (docs/rehearse.md).
MPI_TCP_ENV = {
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_btl": "self,vader,tcp",
    "OMPI_MCA_btl_tcp_if_include": "eth0",
    "OMPI_MCA_oob_tcp_if_include": "eth0",
    "OMPI_MCA_oob_tcp_keepalive_time": "10",
    "OMPI_MCA_oob_tcp_keepalive_intvl": "5",
    "OMPI_MCA_oob_tcp_keepalive_probes": "3",
}

# MPI on InfiniBand sizes: TCP on eth0 too, with InfiniBand left to NCCL. Horovod moves every GPU tensor
# through NCCL and uses MPI only for its coordination (a few small messages per cycle), so MPI gains nothing
# from IB, while UCX with no device named (UCX_NET_DEVICES unset) is left to choose among all of the node's
# devices, where a wrong pick ends the job in MPI_Init ("Failed to resolve UCX endpoint"). Azure runs its
# own NCCL tests so:
# Azure/azhpc-images tests/health_checks/NDv4/test-nccl.sh (mpirun ... -x UCX_TLS=tcp -x UCX_NET_DEVICES=eth0
# -x NCCL_SOCKET_IFNAME=eth0 -x NCCL_TOPO_FILE=/opt/microsoft/ndv4-topo.xml), and Azure ML's NCCL-test job
# (Azure/azureml-examples cli/jobs/single-step/gpu_perf/gpu_perf_job.yml) names UCX_TLS=tcp with
# UCX_NET_DEVICES=eth0 "if you have Error: Failed to resolve UCX endpoint". Those run HPC-X, whose Open MPI
# goes through UCX; the images here carry Ubuntu's Open MPI, whose ob1 pml and TCP btl do the same without
# UCX (and work on this machine, tests/launcher/test_interconnect.py), so every GPU size gets MPI_TCP_ENV.
MPI_IB_ENV = MPI_TCP_ENV

# Where the images put Azure's NCCL topology files: the path Azure's HPC images use
# (Azure/azhpc-images customizations/ndv4.sh, ndv5.sh), so Azure's guides apply unchanged.
TOPOLOGY_DIR = "/opt/microsoft"

# What Azure's HPC images write to /etc/nccl.conf beside each topology file (Azure/azhpc-images
# customizations/ndv4.sh, ndv5.sh): relaxed PCI ordering for GPUDirect RDMA, and on ND v5 hosts NCCL told
# to ignore the process's CPU affinity (the topology file already says which NUMA node each GPU is on).
NCCL_CONF = {
    "ndv4-topo.xml": {"NCCL_IB_PCI_RELAXED_ORDERING": "1"},
    "ndv5-topo.xml": {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_IGNORE_CPU_AFFINITY": "1"},
}

# Horovod's stall inspector (horovod/common/stall_inspector.cc): when some ranks have submitted a tensor and
# others have not for CHECK seconds it logs the missing ranks; past SHUTDOWN seconds it shuts Horovod down,
# so the job fails instead of holding its nodes. A SHUTDOWN below CHECK is ignored ("will not shutdown"),
# and 0 (Horovod's default) never shuts down. 10 minutes leaves room for a rank that legitimately lags
# (rank 0 writing a checkpoint, a first read through a cold data mount). A hang inside a collective that
# every rank entered (a dead link under NCCL) is not a stall to Horovod: the job's limits.timeout ends that.
STALL_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600"}

# A job stopped by Azure ML (a cancel, a low-priority preemption) is stopped through mpirun, whose daemons send
# each rank SIGCONT, then SIGTERM odls_base_sigkill_timeout seconds later, then SIGKILL as long again (Open MPI
# 4.1: default 1 s, `ompi_info --param odls base --level 9`; the sequence is measured in
# tests/launcher/test_interconnect.py). SIGTERM cannot be forwarded instead (ess_base_forward_signals refuses it).
# So the payloads take SIGCONT as the stop (payloads/common/preemption.py, STOP_ON_SIGCONT), and 30 s each way
# leave the stop (the ranks agree, rank 0 writes the mid-epoch checkpoint to the output mount) a minute before
# SIGKILL, where the default left it two seconds.
MPI_STOP_ENV = {"OMPI_MCA_odls_base_sigkill_timeout": "30", "TRAINING_STOP_ON_SIGCONT": "1"}

# Open MPI binds each rank it starts: to a core with up to two processes, to a socket or NUMA node in turn with
# more (Open MPI 4.1's rmaps defaults), whatever GPU the rank drives. On ND H100 v5 that put half of a node's ranks
# on the other socket's CPUs, which the payload's binding to its GPU's CPUs (payloads/pytorch/affinity.py) could
# only keep; with two CPU processes per node, one core each under OMP_NUM_THREADS of half the node. No binding
# from mpirun: the payloads bind each rank to its share of its GPU's NUMA node.
MPI_BIND_ENV = {"OMPI_MCA_hwloc_base_binding_policy": "none"}

# Every cluster job polls Azure's Scheduled Events (payloads/common/preemption.ScheduledEvents): a Preempt event
# comes at least 30 s before the eviction, so the stop starts before the signal. The instance metadata service's
# address from inside an Azure ML job: reachable or not there is for the first low-priority job to show
# (docs/status.md). One poller per node (local rank 0), never through a proxy: an endpoint that does not answer is
# asked again, backing off up to every 300 s, and the stop waits for the signal meanwhile.
SCHEDULED_EVENTS_ENV = {
    "TRAINING_SCHEDULED_EVENTS": "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"
}

# torch.distributed's Gloo on eth0, for the reason MPI_TCP_ENV names eth0: docker0's subnet is the same on every
# node. GLOO_SOCKET_IFNAME is the variable torch.distributed reads for Gloo's interface (torch.distributed docs,
# "Common environment variables").
GLOO_ENV = {"GLOO_SOCKET_IFNAME": "eth0"}

# The payloads' start-up check (payloads/common/devices.py) reads these.
GPUS_PER_NODE = "TRAINING_GPUS_PER_NODE"
VM_SIZE = "TRAINING_VM_SIZE"


def kind(cluster: dict) -> str:
    if not cluster["gpus_per_node"]:
        return "cpu"
    return "infiniband" if cluster["infiniband"] else "gpu-tcp"


DISTRIBUTIONS = ("mpi", "pytorch")


def environment(cluster: dict, processes_per_node: int, distribution: str = "mpi") -> dict[str, str]:
    """The full interconnect environment of a job on `cluster` (a `clusters` entry of the stack outputs), started
    by `distribution`: mpi (Horovod under mpirun) or pytorch (PyTorch DDP: no MPI, no Horovod)."""
    if distribution not in DISTRIBUTIONS:
        raise JobError(f"distribution {distribution!r}: choose {' or '.join(DISTRIBUTIONS)}")
    mpi = distribution == "mpi"
    size = vm_sizes.lookup(cluster["vm_size"])
    env = {
        "NCCL_DEBUG": "WARN",
        **({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0", **STALL_ENV, **MPI_STOP_ENV, **MPI_BIND_ENV} if mpi else GLOO_ENV),
        GPUS_PER_NODE: str(cluster["gpus_per_node"]),
        VM_SIZE: cluster["vm_size"],
        **SCHEDULED_EVENTS_ENV,
    }
    which = kind(cluster)
    if which == "cpu":
        if mpi:
            env.update({"HOROVOD_CPU_OPERATIONS": "mpi", **MPI_TCP_ENV, **MPI_CPU_ENV})
        env["OMP_NUM_THREADS"] = str(max(1, cluster.get("vcpus_per_node", 1) // processes_per_node))
    elif which == "gpu-tcp":
        env.update({**(MPI_TCP_ENV if mpi else {}), "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"})
    else:
        env.update(
            {
                **(MPI_IB_ENV if mpi else {}),
                "NCCL_IB_DISABLE": "0",
                "NCCL_SOCKET_IFNAME": "eth0",
                "NCCL_IB_PCI_RELAXED_ORDERING": "1",
                # GPU indices in PCI bus order, the order the topology file describes (Azure's NCCL
                # tests run so: Azure/azhpc-images tests).
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            }
        )
        if size is not None and size.nccl_topology:
            env["NCCL_TOPO_FILE"] = f"{TOPOLOGY_DIR}/{size.nccl_topology}"
            env.update(NCCL_CONF[size.nccl_topology])
    if size is not None and size.min_busbw_gbytes_per_sec:
        env[node_figures.MIN_BUSBW] = f"{size.min_busbw_gbytes_per_sec:g}"
    if size is not None and size.health:
        env[node_figures.EXPECTED] = node_figures.write(size.health)  # the health check's format
    return env


def check_under_mpi(env: dict, where: str, alternative: str = "") -> None:
    """Refuse settings that break a job started by mpirun (Azure ML's MPI distribution, the local MPI
    controller). Horovod 0.28.1 with HOROVOD_CPU_OPERATIONS=gloo under mpirun segfaults in its first
    allreduce (GlooAllreduce::Execute, signal 11; seen here): only Horovod's own Gloo launcher sets up the
    Gloo context those operations need."""
    if str(env.get("HOROVOD_CPU_OPERATIONS", "")).lower() == "gloo":
        raise JobError(
            f"{where}: HOROVOD_CPU_OPERATIONS=gloo crashes Horovod 0.28.1 when mpirun starts the job "
            "(a segmentation fault in the first allreduce): remove it (mpi is the default and the "
            f"faster, see docs/benchmarks.md#what-the-benchmarks-changed){alternative}"
        )
