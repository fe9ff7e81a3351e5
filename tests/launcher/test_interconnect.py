"""The interconnect environment per cluster kind, and what it does to a real 2-rank MPI job.

Azure ML's MPI distribution runs the job's command under mpirun with the job's environment_variables over
the image's ENV; here Debian's Open MPI (built with UCX, as the images' Ubuntu Open MPI is) runs 2 ranks the
same way, on a machine without InfiniBand, like a CPU or NC node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import helpers
import pytest

from launcher import interconnect
from payloads.healthcheck import expected as node_figures
from trainingplatform import clusterconfig, compute, vm_sizes

# What both images set before issue 12 (images/*/Dockerfile ENV).
OLD_IMAGE_ENV = {"OMPI_MCA_pml": "ucx", "OMPI_MCA_btl": "^openib,uct", "NCCL_DEBUG": "WARN"}


def cluster(size_name: str) -> dict:
    """A `clusters` entry of the stack outputs, written by the function the stack writes them with."""
    c = clusterconfig.Cluster(
        name="c",
        vm_size=size_name,
        min_nodes=0,
        max_nodes=2,
        low_priority=False,
        idle_seconds_before_scale_down=1800,
        ssh_enabled=False,
    )
    return compute.describe(c, "c")


CURRENT = [n for n in vm_sizes.available()]


@pytest.mark.parametrize("size", CURRENT)
def test_every_current_size_resolves_to_its_kind(size):
    s = vm_sizes.CATALOG[size]
    env = interconnect.environment(cluster(size), max(1, s.gpus))
    which = interconnect.kind(cluster(size))
    assert env[interconnect.GPUS_PER_NODE] == str(s.gpus)
    assert env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] != "0"
    if which == "cpu":
        assert s.gpus == 0
        assert env["OMPI_MCA_pml"] == "ob1" and "tcp" in env["OMPI_MCA_btl"].split(",")
        assert env["HOROVOD_CPU_OPERATIONS"] == "mpi"
        assert env["OMP_NUM_THREADS"] == str(s.vcpus)
        assert not any(k.startswith(("UCX_", "NCCL_IB", "NCCL_TOPO")) for k in env)
    elif which == "gpu-tcp":
        assert s.gpus and not s.infiniband
        assert env["OMPI_MCA_pml"] == "ob1" and env["NCCL_IB_DISABLE"] == "1"
        assert "NCCL_TOPO_FILE" not in env and not any(k.startswith("UCX_") for k in env)
    else:
        assert s.infiniband
        assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_SOCKET_IFNAME"] == "eth0"
        # one home per fact: the topology file is the catalog's, in the folder the images fill
        assert env["NCCL_TOPO_FILE"] == f"{interconnect.TOPOLOGY_DIR}/{s.nccl_topology}"
        assert env[node_figures.MIN_BUSBW] == f"{s.min_busbw_gbytes_per_sec:g}"


# What each GPU size resolves to: MPI (Horovod's coordination) over TCP on eth0 everywhere, InfiniBand for NCCL
# only. Azure's NCCL tests run MPI so on the IB sizes and leave IB to NCCL (Azure/azhpc-images
# tests/health_checks/NDv4/test-nccl.sh: UCX_TLS=tcp, UCX_NET_DEVICES=eth0, NCCL_SOCKET_IFNAME=eth0,
# NCCL_TOPO_FILE=/opt/microsoft/ndv4-topo.xml, CUDA_DEVICE_ORDER=PCI_BUS_ID); Azure ML's NCCL-test job names
# eth0 as the cure for "Failed to resolve UCX endpoint" (Azure/azureml-examples
# cli/jobs/single-step/gpu_perf/gpu_perf_job.yml).
MPI_OVER_ETH0 = {"OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": "eth0"}
NCCL_BY_SIZE = {
    # size: (NCCL over IB?, topology file, extra /etc/nccl.conf settings of Azure's HPC images)
    "Standard_NC4as_T4_v3": (False, None, {}),
    "Standard_NC64as_T4_v3": (False, None, {}),
    "Standard_NC24ads_A100_v4": (False, None, {}),
    "Standard_NC96ads_A100_v4": (False, None, {}),
    "Standard_NC40ads_H100_v5": (False, None, {}),
    "Standard_ND96asr_v4": (True, "ndv4-topo.xml", {"NCCL_IB_PCI_RELAXED_ORDERING": "1"}),
    "Standard_ND96amsr_A100_v4": (True, "ndv4-topo.xml", {"NCCL_IB_PCI_RELAXED_ORDERING": "1"}),
    "Standard_ND96isr_H100_v5": (
        True,
        "ndv5-topo.xml",
        {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_IGNORE_CPU_AFFINITY": "1"},
    ),
    "Standard_ND96isr_H200_v5": (
        True,
        "ndv5-topo.xml",
        {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_IGNORE_CPU_AFFINITY": "1"},
    ),
}


def test_every_current_gpu_size_is_in_the_table():
    assert sorted(NCCL_BY_SIZE) == sorted(n for n in CURRENT if vm_sizes.CATALOG[n].gpus)


@pytest.mark.parametrize("size", sorted(NCCL_BY_SIZE))
def test_resolved_environment_per_gpu_size(size):
    """MPI over TCP on eth0 on every GPU size, no UCX setting at all (nothing left for UCX to guess); NCCL on
    InfiniBand with the size's topology file where the size has IB, on TCP sockets over eth0 elsewhere."""
    ib, topology, conf = NCCL_BY_SIZE[size]
    env = interconnect.environment(cluster(size), vm_sizes.CATALOG[size].gpus)
    assert {k: env[k] for k in MPI_OVER_ETH0} == MPI_OVER_ETH0
    assert not [k for k in env if k.startswith("UCX_")]
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    if ib:
        assert env["NCCL_IB_DISABLE"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["NCCL_TOPO_FILE"] == f"/opt/microsoft/{topology}"
        assert {k: env[k] for k in conf} == conf
    else:
        assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_TOPO_FILE" not in env
        assert "NCCL_IB_PCI_RELAXED_ORDERING" not in env and "CUDA_DEVICE_ORDER" not in env


def test_every_current_infiniband_size_has_a_topology_file_and_a_bandwidth_floor():
    """A new IB size added to the catalog without them would run NCCL blind and the health check unjudged."""
    for name in CURRENT:
        s = vm_sizes.CATALOG[name]
        if s.infiniband:
            assert s.nccl_topology in interconnect.NCCL_CONF, name
            assert s.min_busbw_gbytes_per_sec, name


def test_bandwidth_floors_are_below_one_infiniband_link():
    """The floor must pass the worst healthy layout, one process per node, where each rank's traffic crosses
    one IB link (ib_gbps_per_node / GPUs, in Gb/s): a floor above that fails healthy clusters."""
    for s in vm_sizes.CATALOG.values():
        if s.min_busbw_gbytes_per_sec:
            link_gbytes = s.ib_gbps_per_node / s.gpus / 8
            assert s.min_busbw_gbytes_per_sec < 0.5 * link_gbytes, s.name


def test_stall_shutdown_is_not_ignored_by_horovod():
    """Horovod ignores a shutdown time below the check time (stall_inspector.cc: 'will not shutdown')."""
    check = int(interconnect.STALL_ENV["HOROVOD_STALL_CHECK_TIME_SECONDS"])
    shutdown = int(interconnect.STALL_ENV["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
    assert 0 < check <= shutdown


# ---- real 2-rank MPI jobs -------------------------------------------------------------------------------


def _mpi_ready() -> bool:
    if not shutil.which("mpirun"):
        return False
    from horovod.common.util import mpi_built

    return bool(mpi_built())


needs_mpi = pytest.mark.skipif(not _mpi_ready(), reason="needs Open MPI and a Horovod built with MPI")


def _has_ucx_pml() -> bool:
    out = subprocess.run(["ompi_info"], capture_output=True, text=True).stdout if shutil.which("ompi_info") else ""
    return "MCA pml: ucx" in out


def mpirun(job_env: dict, command: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    """2 ranks on this machine, the job's environment over the old image's (as Azure ML layers them)."""
    env = {**helpers.env(), **OLD_IMAGE_ENV, **job_env}
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return subprocess.run(
        ["mpirun", *root, "--oversubscribe", "--bind-to", "none", "-np", "2", *command],
        cwd=helpers.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


ALLREDUCE = (
    "import sys, horovod.torch as hvd, torch; hvd.init(); "
    "s = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum); "
    "sys.stdout.write(f'rank {hvd.rank()} of {hvd.size()} sum {s.item()}\\n')"
)


@pytest.mark.skipif(not shutil.which("ompi_info"), reason="needs Open MPI's ompi_info")
@pytest.mark.parametrize("size", ["Standard_D4s_v5", "Standard_NC24ads_A100_v4", "Standard_ND96isr_H100_v5"])
def test_every_open_mpi_setting_names_a_parameter_open_mpi_has(size):
    """Open MPI takes any OMPI_MCA_<name> from the environment and ignores a name it does not have, silently: each
    one the launcher sets must be a parameter of the installed Open MPI (the images' is Ubuntu's 4.1, as Debian's
    here), or the setting does nothing (issue 43, item 3: the oob wire-up held to eth0)."""
    out = subprocess.run(["ompi_info", "--all", "--parsable"], capture_output=True, text=True).stdout
    known = {line.split(":")[4] for line in out.splitlines() if line.startswith("mca:") and ":param:" in line}
    env = interconnect.environment(cluster(size), 1)
    names = {k.removeprefix("OMPI_MCA_") for k in env if k.startswith("OMPI_MCA_")}
    assert {"pml", "btl_tcp_if_include", "oob_tcp_if_include"} <= names
    assert names <= known, sorted(names - known)


@pytest.mark.launches
@needs_mpi
@pytest.mark.skipif(not _has_ucx_pml(), reason="this Open MPI has no UCX pml")
def test_the_old_image_setting_fails_without_infiniband():
    """What issue 12 reported: OMPI_MCA_pml=ucx on a node without a Mellanox device dies in MPI_Init."""
    proc = mpirun({}, [sys.executable, "-c", ALLREDUCE], timeout=120)
    assert proc.returncode != 0
    assert "PML ucx cannot be selected" in proc.stdout + proc.stderr


@pytest.mark.launches
@needs_mpi
def test_gpu_settings_select_a_working_pml():
    """The MPI half of a GPU job (Horovod's coordination runs over MPI), IB sizes included, works over TCP
    without InfiniBand, even under an image that still forces the UCX pml. Rank sums 1 + 2 = 3 on both ranks. One
    run per distinct set of the settings MPI reads (OMPI_*, UCX_*: today the sizes share one)."""
    sizes = {s: cluster(s) for s in ("Standard_NC24ads_A100_v4", "Standard_NC64as_T4_v3", "Standard_ND96isr_H100_v5")}
    assert {interconnect.kind(c) for c in sizes.values()} == {"gpu-tcp", "infiniband"}
    distinct = {}
    for size, c in sizes.items():
        env = interconnect.environment(c, 1)
        distinct.setdefault(frozenset((k, v) for k, v in env.items() if k.startswith(("OMPI_", "UCX_"))), (size, env))
    for size, env in distinct.values():
        proc = mpirun(env, [sys.executable, "-c", ALLREDUCE])
        assert proc.returncode == 0, (size, proc.stdout[-3000:] + proc.stderr[-3000:])
        assert "rank 0 of 2 sum 3.0" in proc.stdout and "rank 1 of 2 sum 3.0" in proc.stdout, (size, proc.stdout)


# ---- hung jobs: Azure ML's timeout and Horovod's stall shutdown -----------------------------------------

JOBS = sorted((helpers.ROOT / "jobs").glob("*.yaml"))


@pytest.mark.launches
@pytest.mark.parametrize("job", JOBS, ids=[j.stem for j in JOBS])
def test_every_job_has_a_timeout_that_azure_ml_sends(dev_outputs, job):
    """azure-ai-ml's own schema reads limits.timeout (CommandJobLimitsSchema: an integer of seconds) and the
    REST body carries it as an ISO 8601 duration; it outlasts Horovod's stall shutdown, which goes first."""
    import isodate

    from azureaccess import stack
    from launcher import jobspec, target

    template = jobspec.read_template(job)
    outs = stack.load_file(dev_outputs)
    filled = jobspec.fill(
        template, outs, target.resolve(outs, "gpu-ib", template["resources"]["instance_count"], None), []
    )
    sdk_job = jobspec.validate(filled, job)
    assert sdk_job.limits is not None, f"{job.name} has no limits.timeout: a hung job would hold its nodes"
    wire = sdk_job.limits._to_rest_object().as_dict()  # the body azure-ai-ml would send
    assert wire["jobLimitsType"] == "Command"
    seconds = isodate.parse_duration(wire["timeout"]).total_seconds()
    assert seconds == template["limits"]["timeout"]
    assert seconds > int(filled["environment_variables"]["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])


# mpirun's grace between its SIGCONT and SIGTERM (MPI_STOP_ENV: 30 s) also runs when a rank fails: mpirun then
# takes about twice the grace to end, every rank already gone (measured: 61 s for a health check refused at
# start-up). Cut to 3 s where a test is about something else.
SHORT_GRACE = {"OMPI_MCA_odls_base_sigkill_timeout": "3"}

STALLED = """
import time, horovod.torch as hvd, torch
hvd.init()
if hvd.rank() == 1:
    time.sleep(120)          # a rank that never arrives (a dead data mount, a deadlock)
hvd.allreduce(torch.ones(4), name="stalled")
print("allreduce returned", flush=True)
"""


@pytest.mark.launches
@needs_mpi
@pytest.mark.one_core  # mostly waiting (a held rank, a grace, a stall): about one core
def test_a_stalled_rank_ends_the_job_instead_of_hanging():
    """With the launcher's environment (stall times scaled down from 60 s / 600 s to 2 s / 5 s), a job whose
    rank 1 never submits its tensor fails within seconds instead of waiting for it (120 s)."""
    import time

    env = interconnect.environment(cluster("Standard_D4s_v5"), 2)
    assert {"HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"} <= set(env)
    env.update(HOROVOD_STALL_CHECK_TIME_SECONDS="2", HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="5")
    env.update(SHORT_GRACE)
    start = time.monotonic()
    proc = mpirun(env, [sys.executable, "-c", STALLED], timeout=110)
    assert proc.returncode != 0 and "allreduce returned" not in proc.stdout
    assert time.monotonic() - start < 100
    assert "Will shutdown" in proc.stdout + proc.stderr, "Horovod's stall inspector named the stalled rank"


# ---- the launcher's variables reach the payloads ----------------------------------------------------------


@pytest.mark.launches
def test_launcher_and_payloads_name_the_same_variables():
    from payloads.common import devices

    assert interconnect.GPUS_PER_NODE == devices.GPUS_PER_NODE


@pytest.mark.launches
@needs_mpi
def test_a_gpu_cluster_job_on_a_node_without_visible_gpus_fails_naming_the_driver(tmp_path):
    """The environment of an NC24ads_A100_v4 job (1 GPU per node) on this GPU-less machine: the health check's
    two ranks stop at start-up with the cause, instead of measuring (or training) on the CPU."""
    env = {**interconnect.environment(cluster("Standard_NC24ads_A100_v4"), 1), **SHORT_GRACE}
    report = tmp_path / "allreduce.json"
    proc = mpirun(env, [sys.executable, "-m", "payloads.healthcheck", "--sizes-mb", "1", "--output", str(report)])
    assert proc.returncode != 0
    assert "this node should have 1 GPUs (TRAINING_GPUS_PER_NODE" in proc.stderr
    assert "NVIDIA driver" in proc.stderr and not report.exists()


# ---- PyTorch DDP jobs (distribution pytorch): NCCL's settings, none of MPI's or Horovod's ------------------


@pytest.mark.parametrize("size", CURRENT)
def test_ddp_jobs_get_the_same_nccl_settings_and_no_mpi_ones(size):
    procs = max(1, vm_sizes.CATALOG[size].gpus)
    mpi = interconnect.environment(cluster(size), procs)
    ddp = interconnect.environment(cluster(size), procs, "pytorch")
    assert not [k for k in ddp if k.startswith(("OMPI_", "HOROVOD_", "UCX_"))]
    assert not [k for k in ddp if k in interconnect.MPI_STOP_ENV]  # torchrun sends SIGTERM itself
    mpi_only = ("OMPI_", "HOROVOD_", *interconnect.MPI_STOP_ENV)
    assert {k: v for k, v in mpi.items() if not k.startswith(mpi_only)} == {
        k: v for k, v in ddp.items() if k not in interconnect.GLOO_ENV
    }
    assert ddp["GLOO_SOCKET_IFNAME"] == "eth0"


@pytest.mark.launches
def test_cpu_cluster_ddp_environment_trains_two_processes_over_gloo_on_eth0(tmp_path):
    """The environment the launcher gives a DDP job on cpu-smoke (D4s_v5, 2 processes) trains 2 torchrun
    processes to bitwise-equal weights; Gloo reads GLOO_SOCKET_IFNAME (an interface that does not exist fails)."""
    base = helpers.env()
    base.update(interconnect.environment(cluster("Standard_D4s_v5"), 2, "pytorch"))
    args = helpers.TINY + ["--epochs", "1", "--batch-size", "8", "--output-dir", str(tmp_path / "ok")]
    proc = subprocess.run(
        helpers.torchrun(2, args), cwd=helpers.ROOT, env=base, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = helpers.metrics(tmp_path / "ok")
    assert m["summary"]["ranks_identical"] is True and m["run"]["world"]["backend"] == "ddp"
    base["GLOO_SOCKET_IFNAME"] = "docker9"
    args[-1] = str(tmp_path / "bad")
    proc = subprocess.run(
        helpers.torchrun(2, args), cwd=helpers.ROOT, env=base, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0 and "docker9" in proc.stdout + proc.stderr


# ---- a stop under mpirun: SIGTERM, then SIGKILL after odls_base_sigkill_timeout ------------------------------

STOP_ARGS = helpers.TINY + ["--synthetic-samples", "8192", "--batch-size", "2", "--max-steps-per-epoch", "40"]
STOP_ARGS += ["--epochs", "2", "--checkpoint-every-minutes", "0"]


def _stopped_under_mpirun(out, job_env: dict) -> tuple[subprocess.CompletedProcess, list]:
    """The payload's 2 ranks under a real mpirun with `job_env` over the tests' environment; both ranks wait after
    step 1 (tests/stop_at, STOP_HOLD) and their stop's checkpoint write is held 3 s; mpirun gets the SIGTERM (what
    Azure ML signals) once both say they hold there."""
    import signal

    from payloads.common import checkpoint

    marks = out.parent / f"{out.name}-held"
    marks.mkdir()
    env = {**helpers.stop_at_env(1, [0, 1], hold=True), **job_env, "STOP_SAVE_SECONDS": "3", "STOP_MARK": str(marks)}
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = ["mpirun", *root, "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, "-m"]
    cmd += ["payloads.pytorch.train", *STOP_ARGS, "--output-dir", str(out)]
    proc = subprocess.Popen(cmd, cwd=helpers.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        helpers.wait_until(proc, lambda: len(list(marks.iterdir())) == 2, "both ranks held after step 1")
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), checkpoint.list_checkpoints(
        out / "checkpoints", ".pt"
    )


SIGNALS = """
import os, signal, sys, time
def say(signum, frame):
    sys.stdout.write(f"{os.environ['OMPI_COMM_WORLD_RANK']} {signal.Signals(signum).name} {time.time():.2f}\\n")
    sys.stdout.flush()
for s in (signal.SIGCONT, signal.SIGTERM):
    signal.signal(s, say)
sys.stdout.write("ready\\n"); sys.stdout.flush()
time.sleep(60)
"""


@pytest.mark.launches
@needs_mpi
@pytest.mark.one_core  # mostly waiting (a held rank, a grace, a stall): about one core
def test_mpirun_stops_ranks_with_sigcont_then_sigterm_after_the_grace():
    """What the payloads' SIGCONT stop rests on: Open MPI's mpirun, signalled, sends each rank SIGCONT at once and
    SIGTERM odls_base_sigkill_timeout seconds later (then SIGKILL): measured here with a 3 s grace."""
    import signal
    import time

    env = {**helpers.env(), **OLD_IMAGE_ENV, "OMPI_MCA_odls_base_sigkill_timeout": "3"}
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = ["mpirun", *root, "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable, "-c", SIGNALS]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)  # both ranks up (their "ready" lines reach us only at the end: mpirun holds the output)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    got = [line.split() for line in stdout.splitlines() if line.split()[1:2] in (["SIGCONT"], ["SIGTERM"])]
    for rank in ("0", "1"):
        mine = {name: float(t) - sent for r, name, t in got if r == rank}
        assert mine.keys() == {"SIGCONT", "SIGTERM"}, stdout
        assert mine["SIGCONT"] < 1.5 and 2.5 < mine["SIGTERM"] - mine["SIGCONT"] < 5, mine


@pytest.mark.launches
@needs_mpi
@pytest.mark.one_core  # mostly waiting (a held rank, a grace, a stall): about one core
def test_without_the_jobs_stop_settings_a_stop_through_mpirun_leaves_nothing_to_resume_from(tmp_path):
    """Why every MPI job carries MPI_STOP_ENV: the payload's 2 ranks under mpirun with Open MPI's defaults (no SIGCONT
    stop, 1 s from SIGTERM to SIGKILL) are stopped while rank 0's mid-epoch checkpoint is held 3 s (a slow output
    mount): the write is cut short and nothing is left to resume from. With the job's settings, the same stop writes
    the checkpoint on every rank of 2 simulated nodes, within the job's own 2 x 30 s with a 40 s write
    (tests/cluster/test_simulated_nodes.py)."""
    env = interconnect.environment(cluster("Standard_D4s_v5"), 2)
    assert {k: env[k] for k in interconnect.MPI_STOP_ENV} == {
        "OMPI_MCA_odls_base_sigkill_timeout": "30",
        "TRAINING_STOP_ON_SIGCONT": "1",
    }
    default = {k: v for k, v in env.items() if k not in interconnect.MPI_STOP_ENV}
    proc, kept = _stopped_under_mpirun(tmp_path / "default", default)
    assert proc.returncode != 0 and "stopped by" not in proc.stdout + proc.stderr and kept == [], proc.stdout[-2000:]


# Each rank writes its count to a file: Open MPI 4.1's output forwarding can drop the last line of a process that
# exits at once (seen in CI), which would read as a missing rank.
AFFINITY = (
    "import os, sys, pathlib; pathlib.Path(sys.argv[1], str(os.getpid())).write_text(str(len(os.sched_getaffinity(0))))"
)


@pytest.mark.launches
def test_mpi_jobs_leave_the_ranks_unbound_for_the_payload_to_bind(tmp_path):
    """Open MPI binds two processes to a core each (more to sockets or NUMA nodes in turn), whatever their GPU;
    the jobs' MPI_BIND_ENV turns that off (a real mpirun, no --bind-to given, as Azure ML starts it), and the
    payload binds each rank to its GPU's CPUs (tests/test_affinity.py)."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one CPU: a binding to a core cannot be told from none")
    env = interconnect.environment(cluster("Standard_ND96isr_H100_v5"), 8)
    assert {k: env[k] for k in interconnect.MPI_BIND_ENV} == {"OMPI_MCA_hwloc_base_binding_policy": "none"}
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    seen = {}
    for name, extra in (("default", {}), ("job", interconnect.MPI_BIND_ENV)):
        out = tmp_path / name
        out.mkdir()
        proc = subprocess.run(
            ["mpirun", *root, "-np", "2", sys.executable, "-c", AFFINITY, str(out)],
            env={**os.environ, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen[name] = sorted(int(f.read_text()) for f in out.iterdir())
    assert seen == {"default": [1, 1], "job": [cpus, cpus]}, seen
