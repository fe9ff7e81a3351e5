"""N simulated nodes on this machine, each what an Azure ML node is to the job it runs (docs/rehearse.md).

- A node is a network namespace (`trainsim-<launcher pid>-n<i>`) with its own `eth0` on a switch (a bridge in a
  namespace of its own, `...-sw`), and a holder process (node.py) whose UTS and mount namespaces give it a
  hostname (`node-<i>`), a private /tmp and /dev/shm, /etc/hosts naming every node, and an instance metadata
  endpoint at 169.254.169.254. Nothing is added to this machine's own network namespace and nothing routes
  out: the nodes' only addresses are on the switch's subnet and on their own loopback.
- Every process of a node enters the holder's namespaces (`nsenter`) with a fresh node's environment: the
  image's PATH and HOME plus the job's environment, never the launcher's. The launch agent (`ssh` first on
  the nodes' PATH, agent.py) does the same for Open MPI's daemons and horovodrun.
- Where cgroup v1's cpuset is mounted, each node gets its share of this machine's cores.
- Everything goes when the cluster is closed; what a SIGKILLed launcher left is removed by the next start
  (`sweep`), which says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

from azureaccess.errors import JobError

PREFIX = "trainsim-"
STATE_ROOT = pathlib.Path("/run/trainsim")
NETNS_ROOT = pathlib.Path("/run/netns")
CPUSET = pathlib.Path("/sys/fs/cgroup/cpuset")
SUBNET = "198.18.0"  # RFC 2544's range for testing interconnects: no real host answers it, and none is reached
TOOLS = ("ip", "nsenter", "unshare", "mount")
ROOT = pathlib.Path(__file__).resolve().parents[2]
READY_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Spec:
    """What the simulated cluster is: its nodes and what each one has."""

    nodes: int
    shm_bytes: int
    tmp_bytes: int
    infiniband: bool = False
    shared: tuple[str, ...] = ()  # folders every node sees at the same path: the job's inputs and outputs
    node_env: tuple[tuple[str, str], ...] = ()  # the job's environment on every node (Azure ML sets it so)


def host(i: int) -> str:
    return f"node-{i}"


def address(i: int) -> str:
    return f"{SUBNET}.{i + 1}"


def missing() -> str | None:
    """What this machine lacks for a simulated cluster, in one line; None when it has everything."""
    if sys.platform != "linux":
        return f"simulated nodes are Linux namespaces; this is {sys.platform}"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"{', '.join(absent)} not found (Debian: apt-get install iproute2 util-linux mount)"
    if os.geteuid() != 0:
        return (
            "simulated nodes need root (network, mount and UTS namespaces, a bridge): run as root, e.g. with sudo; "
            "unprivileged user namespaces are not supported yet (docs/rehearse.md#what-it-needs)"
        )
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise JobError(f"simulated cluster: ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _started(pid: int) -> str | None:
    """A process's start time (field 22 of /proc/PID/stat), which tells it from a later process with its pid."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _kill_namespace(ns: str) -> int:
    """SIGKILL every process in a network namespace; how many there were."""
    pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    killed, deadline = len(pids), time.monotonic() + 10
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _state(p) not in ("Z", "X")]
        time.sleep(0.05)
    return killed


def _state(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _remove(owner: str, namespaces: list[str]) -> None:
    for ns in namespaces:
        _kill_namespace(ns)
    for ns in namespaces:
        _ip("netns", "del", ns, check=False)
    for cg in CPUSET.glob(f"{PREFIX}{owner}-n*") if CPUSET.is_dir() else ():
        for pid in (cg / "tasks").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in range(100):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.05)
    shutil.rmtree(STATE_ROOT / owner, ignore_errors=True)


def leftovers() -> dict[str, list[str]]:
    """What simulated clusters whose launcher is gone left behind: {launcher pid: its network namespaces}; a
    cluster whose launcher still runs (another job's, beside this one) is not in it."""
    owners: dict[str, list[str]] = {}
    names = [p.name for p in NETNS_ROOT.iterdir()] if NETNS_ROOT.is_dir() else []
    for name in names:
        if name.startswith(PREFIX):
            owners.setdefault(name[len(PREFIX) :].split("-")[0], []).append(name)
    for folder in STATE_ROOT.iterdir() if STATE_ROOT.is_dir() else ():
        owners.setdefault(folder.name, [])
    gone = {}
    for owner, namespaces in owners.items():
        try:
            recorded = json.loads((STATE_ROOT / owner / "cluster.json").read_text())["started"]
        except (OSError, ValueError, KeyError):
            recorded = None
        started = _started(int(owner)) if owner.isdigit() else None
        # no record yet: a launcher making its cluster now (the record is its first write)
        if started is None or (recorded is not None and started != recorded):
            gone[owner] = namespaces
    return gone


def sweep(say=print) -> list[str]:
    """Remove what simulated clusters whose launcher is gone left behind; the namespaces removed."""
    removed = []
    for owner, namespaces in leftovers().items():
        _remove(owner, namespaces)
        say(
            f"simulated cluster: removed what a launcher (pid {owner}) left behind when it was killed: "
            f"{len(namespaces)} network namespaces ({', '.join(sorted(namespaces)) or 'none'}) and their processes"
        )
        removed.extend(namespaces)
    return removed


class Cluster:
    """The simulated nodes of one launcher, made by `with Cluster(spec) as c:` and gone after it."""

    def __init__(self, spec: Spec, say=print):
        self.spec, self.say = spec, say
        self.owner = str(os.getpid())
        self.state = STATE_ROOT / self.owner
        self.switch = f"{PREFIX}{self.owner}-sw"
        self.namespaces = [namespace(self.owner, i) for i in range(spec.nodes)]
        self.hosts = [host(i) for i in range(spec.nodes)]
        self.holders: list[int] = []
        self.cgroups: list[pathlib.Path | None] = []

    # ---- making and removing
    def __enter__(self) -> Cluster:
        why = missing()
        if why:
            raise JobError(f"--nodes {self.spec.nodes}: {why}")
        sweep(self.say)
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        _remove(self.owner, [*self.namespaces, self.switch])

    def _make(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        record = {"started": _started(os.getpid()), "hosts": self.hosts}
        self._record(record)
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "switch", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "switch", "up")
        for i, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            # both ends are made inside the switch's namespace, and one is moved into the node's: no interface of
            # the cluster ever exists in this machine's own namespace
            _ip("-n", self.switch, "link", "add", f"port{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", f"port{i}", "master", "switch", "up")
            _ip("-n", ns, "addr", "add", f"{address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", "169.254.169.254/32", "dev", "lo")
        self._agent()
        (self.state / "node-env.json").write_text(json.dumps(self.environment()))
        self.cgroups = [self._cpuset(i) for i in range(self.spec.nodes)]
        for i in range(self.spec.nodes):
            self.holders.append(self._holder(i))
        record["holders"] = self.holders
        # the nodes' mount namespaces have a sysfs of their own, without cgroupfs: the agent reaches the cpusets
        # through the launcher's root
        record["cgroups"] = [f"/proc/{self.owner}/root{c}" if c else None for c in self.cgroups]
        self._record(record)

    def _record(self, record: dict) -> None:
        """cluster.json, whole or not at all (another launcher's sweep may read it meanwhile)."""
        tmp = self.state / "cluster.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.state / "cluster.json")

    def _cpuset(self, i: int) -> pathlib.Path | None:
        """Node i's share of this machine's cores (cgroup v1 cpuset), or None where there is no cpuset."""
        if not (CPUSET / "cpuset.cpus").exists():
            return None
        cpus = sorted(os.sched_getaffinity(0))
        share = [c for k, c in enumerate(cpus) if k * self.spec.nodes // len(cpus) == i % len(cpus)] or cpus
        if len(cpus) < self.spec.nodes:
            share = [cpus[i % len(cpus)]]
        group = CPUSET / f"{PREFIX}{self.owner}-n{i}"
        group.mkdir(exist_ok=True)
        (group / "cpuset.mems").write_text((CPUSET / "cpuset.mems").read_text())
        (group / "cpuset.cpus").write_text(",".join(map(str, share)))
        return group

    def cores(self, i: int) -> int:
        group = self.cgroups[i] if self.cgroups else None
        if group is None:
            return max(1, len(os.sched_getaffinity(0)) // self.spec.nodes)
        return len(_cpu_list((group / "cpuset.cpus").read_text()))

    def _agent(self) -> None:
        """`ssh` for the nodes' PATH: Open MPI's default launch agent and horovodrun's (agent.py)."""
        bin_dir = self.state / "bin"
        bin_dir.mkdir(exist_ok=True)
        ssh = bin_dir / "ssh"
        ssh.write_text(
            "#!/bin/sh\n# The simulated cluster's ssh: enters the named node's namespaces (launcher/simcluster/agent.py)\n"
            f'PYTHONPATH={ROOT} exec {sys.executable} -m launcher.simcluster.agent {self.state} "$@"\n'
        )
        ssh.chmod(0o755)

    def _holder(self, i: int) -> int:
        node_state = self.state / f"node-{i}"
        node_state.mkdir(exist_ok=True)
        spec = {
            "state": str(node_state),
            "hostname": host(i),
            "vm_name": f"{host(i)}-vm",
            "hosts": {host(k): address(k) for k in range(self.spec.nodes)},
            "shared": list(self.spec.shared),
            "shm_bytes": self.spec.shm_bytes,
            "tmp_bytes": self.spec.tmp_bytes,
            "infiniband": self.spec.infiniband,
        }
        (node_state / "spec.json").write_text(json.dumps(spec))
        argv = ["ip", "netns", "exec", self.namespaces[i], "unshare", "--uts", "--mount", "--propagation", "private"]
        argv += [sys.executable, "-m", "launcher.simcluster.node", str(node_state / "spec.json")]
        log = open(node_state / "holder.log", "w")
        proc = subprocess.Popen(
            argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=log,
            start_new_session=True, preexec_fn=self._joiner(i),
        )  # fmt: skip
        deadline = time.monotonic() + READY_SECONDS
        while not (node_state / "ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise JobError(f"simulated {host(i)} did not start: {(node_state / 'holder.log').read_text()[-800:]}")
            time.sleep(0.05)
        return int((node_state / "ready").read_text())

    def _joiner(self, i: int):
        group = self.cgroups[i] if i < len(self.cgroups) else None
        if group is None:
            return None
        tasks = str(group / "tasks")

        def join():
            with open(tasks, "w") as f:
                f.write(str(os.getpid()))

        return join

    # ---- running on a node
    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A fresh node's environment: the image's PATH (this environment's python first, as the image's is) with
        the launch agent's `ssh` before it, HOME, and the job's environment; nothing of the launcher's."""
        path = f"{self.state / 'bin'}:{pathlib.Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:"
        env = {"PATH": path + "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
        # root in the container, as on Azure ML's images: Open MPI refuses root without these two
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        env.update(dict(self.spec.node_env))
        env.update(extra or {})
        return env

    def enter(self, i: int, env: dict[str, str]) -> list[str]:
        """The command prefix that runs a command on node i with `env` as its whole environment."""
        # entering a mount namespace moves the working directory to its root: the job's is the code's folder
        argv = ["nsenter", "-t", str(self.holders[i]), "-n", "-u", "-m", f"--wd={ROOT}", "--"]
        return [*argv, "env", "-i", *_pairs(env)]

    def popen(self, i: int, argv: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
        return subprocess.Popen([*self.enter(i, env), *argv], cwd=ROOT, preexec_fn=self._joiner(i), **kw)

    # ---- faults, for the tests and the rehearsal
    def post_event(self, i: int, event_type: str, resources: list[str] | None = None) -> None:
        post_event(self.state, i, event_type, resources)

    def cut_link(self, i: int) -> None:
        _ip("-n", self.namespaces[i], "link", "set", "eth0", "down")

    def slow_link(self, i: int, rate: str = "20mbit") -> str:
        return slow_link(self.owner, i, rate)

    def fill_output(self, folder: pathlib.Path, size: str = "64k") -> None:
        """The job's output folder full as every node sees it (a shared disk out of room): a tmpfs of `size` over
        `folder` in each node's mount namespace. What the job wrote there stays beneath it, in this machine's
        folder, and the tmpfs goes with the nodes (their mounts are private: nothing reaches this machine's)."""
        folder.mkdir(parents=True, exist_ok=True)
        for i, holder in enumerate(self.holders):
            mount = ["nsenter", "-t", str(holder), "-m", "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs"]
            proc = subprocess.run([*mount, str(folder)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise JobError(f"simulated {host(i)}: a full {folder}: mount: {proc.stderr.strip()}")

    def lose(self, i: int) -> int:
        """Node i lost: every process in it killed, its metadata service with them; how many were killed."""
        return _kill_namespace(self.namespaces[i])

    def processes(self) -> int:
        """Processes still in the nodes, their holders included."""
        return sum(len(_ip("netns", "pids", ns, check=False).stdout.split()) for ns in self.namespaces)


def namespace(owner: int | str, i: int) -> str:
    """Node i's network namespace in the simulated cluster of the launcher whose pid is `owner`."""
    return f"{PREFIX}{owner}-n{i}"


def slow_link(owner: int | str, i: int, rate: str = "20mbit") -> str:
    """Limit node i's eth0 in the cluster of launcher `owner` (tc's token bucket: netem's delay is absent from some
    kernels, this one's too)."""
    cmd = ["ip", "netns", "exec", namespace(owner, i), "tc", "qdisc", "replace", "dev", "eth0", "root"]
    proc = subprocess.run([*cmd, "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"], capture_output=True)
    if proc.returncode != 0:
        raise JobError(f"tc on {host(i)}: {proc.stderr.decode().strip()}")
    return f"tbf rate {rate}"


def state_of(launcher_pid: int) -> pathlib.Path:
    """The state folder of the simulated cluster a running launcher made."""
    return STATE_ROOT / str(launcher_pid)


def post_event(state: pathlib.Path, i: int, event_type: str, resources: list[str] | None = None) -> None:
    """A Scheduled Event on node i's metadata endpoint, as Azure posts one (a Preempt 30 s ahead, say)."""
    document = {
        "DocumentIncarnation": 1,
        "Events": [
            {
                "EventId": f"sim-{event_type.lower()}-{i}",
                "EventType": event_type,
                "ResourceType": "VirtualMachine",
                "Resources": resources if resources is not None else [f"{host(i)}-vm"],
                "EventStatus": "Scheduled",
                "NotBefore": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30)),
                "Description": "simulated",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
        ],
    }
    target = state / f"node-{i}" / "scheduledevents.json"
    target.with_suffix(".tmp").write_text(json.dumps(document))
    target.with_suffix(".tmp").replace(target)


def _pairs(env: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


def _cpu_list(text: str) -> list[int]:
    cpus = []
    for part in text.strip().split(","):
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        elif part:
            cpus.append(int(part))
    return cpus
