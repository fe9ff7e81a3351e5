"""A job's command on the simulated cluster, started as Azure ML starts it on N nodes (docs/rehearse.md):

- distribution mpi: one mpirun on node 0 with the nodes as its hosts (`-H node-0:P,node-1:P`); Open MPI starts
  its daemons on the other nodes through `ssh` (agent.py), and each rank inherits its node's environment. A stop
  (SIGTERM to the launcher, as Azure ML stops the job) goes to mpirun alone, which stops the nodes in its own
  order: the head node's ranks first, the others after its SIGKILL (docs/rehearse.md#a-stop-across-nodes).
- distribution pytorch: every node's processes with the variables Azure ML sets (MASTER_ADDR, MASTER_PORT,
  NODE_RANK, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE); a stop goes to every process on every node.

`faults`, for the tests and the rehearsal: a callable given the running cluster, called once the job started.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from azureaccess.errors import JobError

from .. import endings
from .cluster import Cluster, Spec, host

MASTER_PORT = "29500"  # torch.distributed's default: Azure ML picks a free port on node 0 as torchrun does
AML_SHM_DEFAULT = 2 * 2**30  # Azure ML's shm_size when a job names none (JobResourceConfiguration: "2g")
UNITS = {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
STOP_SLACK = 30.0  # beyond mpirun's own 2x sigkill timeout, before the launcher kills what is left


@dataclasses.dataclass(frozen=True)
class Plan:
    """One job on the simulated cluster."""

    command: str
    distribution: str  # mpi | pytorch
    nodes: int
    processes_per_node: int
    env: dict[str, str]  # the job's environment on every node: the launcher's cluster settings, the job file's
    spec: Spec

    @property
    def world(self) -> int:
        return self.nodes * self.processes_per_node


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def size_bytes(text: str | None, default: int) -> int:
    if not text:
        return default
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)b?\s*", str(text).lower())
    if not m:
        raise JobError(f"shm_size {text!r}: expected a size such as 2g or 512m")
    return int(float(m.group(1)) * UNITS[m.group(2) or "b"])


def spec_for(job: dict, nodes: int, shared: list[pathlib.Path], infiniband: bool, env: dict[str, str]) -> Spec:
    """Each node's /dev/shm of the job's shm_size, scaled so that all nodes' together fit in half of this machine's
    memory; /tmp a quarter of it shared out (tmpfs sizes are limits, not reservations)."""
    shm = size_bytes((job.get("resources") or {}).get("shm_size"), AML_SHM_DEFAULT)
    shm = min(shm, memory_bytes() // (2 * nodes))
    folders = sorted({str(p) for p in [*shared, pathlib.Path(sys.prefix), pathlib.Path.cwd()]})
    return Spec(nodes, shm, memory_bytes() // (4 * nodes), infiniband, tuple(folders), tuple(env.items()))


def _mpirun(plan: Plan) -> list[str]:
    hosts = ",".join(f"{host(i)}:{plan.processes_per_node}" for i in range(plan.nodes))
    return ["mpirun", "-np", str(plan.world), "-H", hosts, "bash", "-c", plan.command]


def start_line(plan: Plan) -> list[str]:
    """What starts the job, as a command line to print: mpirun on node 0, or each node's processes."""
    if plan.distribution == "mpi":
        return ["env", *(f"{k}={v}" for k, v in sorted(plan.env.items())), *_mpirun(plan)]
    ranks = f"{plan.processes_per_node} processes on each of node-0..node-{plan.nodes - 1}"
    return [f"({ranks}, with MASTER_ADDR={host(0)} NODE_RANK RANK LOCAL_RANK WORLD_SIZE={plan.world})", "bash", "-c",
            plan.command]  # fmt: skip


def _ddp_env(plan: Plan, node: int, local: int) -> dict[str, str]:
    return {
        "MASTER_ADDR": host(0),
        "MASTER_PORT": MASTER_PORT,
        "NODE_RANK": str(node),
        "WORLD_SIZE": str(plan.world),
        "RANK": str(node * plan.processes_per_node + local),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(plan.processes_per_node),
    }


def start(cluster: Cluster, plan: Plan, heard: list[str]) -> list[subprocess.Popen]:
    if plan.distribution == "mpi":
        mpirun = cluster.popen(0, _mpirun(plan), cluster.environment(), start_new_session=True, stderr=subprocess.PIPE)
        threading.Thread(target=_listen, args=(mpirun.stderr, heard), daemon=True).start()
        return [mpirun]
    return [
        cluster.popen(
            i, ["bash", "-c", plan.command], cluster.environment(_ddp_env(plan, i, lr)), start_new_session=True
        )
        for i in range(plan.nodes)
        for lr in range(plan.processes_per_node)
    ]


def _listen(stream, heard: list[str]) -> None:
    """mpirun's stderr passed on as it comes; Open MPI's word of a lost node or a signalled rank kept for the job's
    ending (endings.LOST_NODE, RANK_SIGNALLED)."""
    for raw in iter(stream.readline, b""):
        sys.stderr.buffer.write(raw)
        sys.stderr.flush()
        line = raw.decode(errors="replace")
        if any(r.search(line) for r in (endings.LOST_NODE, endings.LOST_HOST, endings.RANK_SIGNALLED)):
            heard.append(line.strip())


def sigkill_timeout(env: dict[str, str]) -> float:
    return float(env.get("OMPI_MCA_odls_base_sigkill_timeout", "1"))


class _Stop(Exception):
    pass


def run(plan: Plan, faults: Callable[[Cluster], None] | None = None, say=print, heard: list[str] | None = None) -> int:
    """Run the plan on a cluster made for it and removed after it; the job's exit code (mpirun's, or for
    pytorch the first non-zero rank's, 75 when every rank stopped with a checkpoint). `heard` gets Open MPI's
    lines about a lost node."""
    heard = [] if heard is None else heard
    heard.clear()
    with Cluster(plan.spec, say) as cluster:
        kind = "InfiniBand " if plan.spec.infiniband else ""
        say(
            f"simulated cluster: {plan.nodes} {kind}nodes ({', '.join(cluster.hosts)}; each its own network, /tmp, "
            f"/dev/shm of {plan.spec.shm_bytes / 2**30:.1f} GiB and {cluster.cores(0)} cores), "
            f"{plan.processes_per_node} processes per node, distribution {plan.distribution}",
            flush=True,
        )
        procs = start(cluster, plan, heard)
        if faults is not None:
            threading.Thread(target=faults, args=(cluster,), daemon=True).start()
        return _wait(cluster, plan, procs, say)


def _wait(cluster: Cluster, plan: Plan, procs: list[subprocess.Popen], say) -> int:
    main = threading.current_thread() is threading.main_thread()

    def raise_stop(signum, frame):
        raise _Stop(signum)

    previous = {s: signal.signal(s, raise_stop) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        return _codes(procs, plan)
    except _Stop as stop:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        return _stop(cluster, plan, procs, stop.args[0], say)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _codes(procs: list[subprocess.Popen], plan: Plan) -> int:
    if plan.distribution == "mpi":
        return procs[0].wait()
    # Azure ML's pytorch distribution: a process that fails ends the job; the others are stopped.
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if None not in codes or failed:
            break
        time.sleep(0.2)
    if failed and None in codes:
        _signal(procs, signal.SIGTERM)
        _reap(procs, 30.0)
    codes = [p.poll() for p in procs]
    bad = [c for c in codes if c != 0]
    return 0 if not bad else (75 if all(c == 75 for c in codes) else bad[0])


def _signal(procs: list[subprocess.Popen], signum: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def _reap(procs: list[subprocess.Popen], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def _stop(cluster: Cluster, plan: Plan, procs, signum: int, say) -> int:
    """Azure ML's stop: SIGTERM to mpirun (it stops the nodes in its order), or to every process of a pytorch
    job; what is still running after mpirun's own schedule (2x its sigkill timeout) and STOP_SLACK is killed."""
    name = signal.Signals(signum).name
    grace = 2 * sigkill_timeout(plan.env) + STOP_SLACK if plan.distribution == "mpi" else 30.0
    say(f"simulated cluster: {name} received, sent to {'mpirun on node-0' if plan.distribution == 'mpi' else 'every rank'}; "
        f"waiting up to {grace:.0f}s", file=sys.stderr, flush=True)  # fmt: skip
    if plan.distribution == "mpi":  # mpirun alone: its children share its process group, Azure ML's are not told
        procs[0].send_signal(signal.SIGTERM)
    else:
        _signal(procs, signal.SIGTERM)
    _reap(procs, grace)
    left = cluster.processes() - plan.nodes  # the holders stay until the cluster is closed
    codes = [p.poll() for p in procs]
    if None in codes:
        _signal(procs, signal.SIGKILL)
        _reap(procs, 5)
    say(f"simulated cluster: stopped by {name}; {max(0, left)} processes were left in the nodes", file=sys.stderr,
        flush=True)  # fmt: skip
    code = codes[0] if plan.distribution == "mpi" else next((c for c in codes if c not in (0, None)), None)
    return 128 + signum if code is None else code
