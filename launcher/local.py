"""Run a job definition on this machine: horovodrun (over MPI where Horovod has it, else Gloo) for an mpi job,
torchrun for a pytorch (DDP) one; inputs mapped to local folders, outputs to a local folder. The command is the
job's own command, so the local run is the cloud run, smaller."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time

from azureaccess.errors import JobError

from . import sizing
from .endings import every_rank_stopped
from .interconnect import MPI_CPU_ENV, check_under_mpi
from .jobspec import REFERENCE, ROOT

CONTROLLERS = ("auto", "mpi", "gloo")


def controller(choice: str = "auto") -> str:
    """The Horovod controller for local runs. auto: MPI when Horovod was built with it and mpirun is on
    PATH (the faster path here, see docs/benchmarks.md#what-the-benchmarks-changed), else Gloo, which every build has."""
    if choice not in CONTROLLERS:
        raise JobError(f"--controller {choice!r}: choose {', '.join(CONTROLLERS)}")
    if choice != "auto":
        if choice == "mpi" and not _mpi_available():
            raise JobError(
                "--controller mpi: this Horovod was built without MPI or mpirun is not on PATH "
                "(toolchain/bootstrap.sh installs Open MPI where it can), use --controller gloo"
            )
        return choice
    return "mpi" if _mpi_available() else "gloo"


# Unbound, so that the OS can run Horovod's background thread on whichever core is free.
MPI_CPU_ARGS = ["--mpi-args=--bind-to none"]


def horovodrun_options(choice: str) -> tuple[list[str], dict[str, str]]:
    """(horovodrun flags, environment) of the fast local configuration for a controller."""
    if choice == "mpi":
        return ["--mpi", *MPI_CPU_ARGS], dict(MPI_CPU_ENV)
    return ["--gloo"], {}


def _mpi_available() -> bool:
    import shutil

    # read from Horovod's library file (toolchain/patch_horovod.py): no framework imported, no process forked
    from horovod.common.util import mpi_built

    return bool(shutil.which("mpirun")) and bool(mpi_built())


def job_command(
    job: dict,
    source: pathlib.Path,
    inputs: dict[str, str],
    output_root: pathlib.Path,
    processes: int,
    extra_args: list[str],
) -> tuple[str, dict[str, pathlib.Path], dict[str, pathlib.Path]]:
    """(the job's command with its inputs and outputs as local folders and its sizes for `processes` processes,
    output name -> local folder, input name -> local path); checks every input before anything runs."""
    if processes < 1:
        raise JobError(f"--np {processes}: at least one process")
    declared_inputs = job.get("inputs") or {}
    unknown = set(inputs) - set(declared_inputs)
    if unknown:
        raise JobError(
            f"--input {', '.join(sorted(unknown))}: {source.name} declares no such input "
            f"(it has: {', '.join(sorted(declared_inputs)) or 'none'})"
        )
    local_in = {}
    for name in declared_inputs:
        if name not in inputs:
            raise JobError(f"input {name!r} of {source.name} needs a local path here: --input {name}=/path/to/data")
        path = pathlib.Path(inputs[name]).expanduser().resolve()
        if not path.exists():
            raise JobError(f"--input {name}={inputs[name]}: data path not found")
        local_in[name] = path
    local_out = {name: output_root / name for name in (job.get("outputs") or {})}

    def substitute(m):
        kind, name = m.group(1), m.group(2)
        return shlex.quote(str(local_in[name] if kind == "inputs" else local_out[name]))

    command = REFERENCE.sub(substitute, job["command"])
    if sizing.uses_placeholders(command):
        fit = sizing.for_local(processes)
        if sizing.SAMPLES in command:
            fit = sizing.with_timed_samples(fit, processes, command.split() + list(extra_args))
        command = sizing.apply(command, fit, extra_args)
    if extra_args:
        command += " " + shlex.join(extra_args)
    return command, local_out, local_in


def plan(
    job: dict,
    source: pathlib.Path,
    inputs: dict[str, str],
    output_root: pathlib.Path,
    processes: int,
    extra_args: list[str],
    control: str = "auto",
) -> tuple[list[str], dict[str, pathlib.Path]]:
    """(horovodrun or torchrun command line, output name -> local folder)."""
    command, local_out, _ = job_command(job, source, inputs, output_root, processes, extra_args)
    if job["distribution"]["type"] == "pytorch":
        if control != "auto":
            raise JobError(
                f"--controller {control}: the controller is Horovod's; this job trains with PyTorch DDP "
                "(--backend ddp), which torchrun starts: drop --controller"
            )
        # --standalone: torchrun's own rendezvous on a free local port; every process gets RANK, WORLD_SIZE,
        # LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as Azure ML's pytorch distribution sets them.
        torchrun = str(pathlib.Path(sys.executable).with_name("torchrun"))
        return [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            str(processes),
            "--no-python",
            "bash",
            "-c",
            command,
        ], local_out
    horovodrun = str(pathlib.Path(sys.executable).with_name("horovodrun"))
    chosen = controller(control)
    if chosen == "mpi":
        check_under_mpi(os.environ, "this shell's environment", ", or run with --controller gloo")
    flags, env = horovodrun_options(chosen)
    # The environment rides on the command line (`env K=V bash -c ...`) so that a dry run shows all of it.
    prefix = ["env", *(f"{k}={v}" for k, v in env.items())] if env else []
    return [
        horovodrun,
        "-np",
        str(processes),
        "-H",
        f"localhost:{processes}",
        *flags,
        *prefix,
        "bash",
        "-c",
        command,
    ], local_out


def run(argv: list[str], outputs: dict[str, pathlib.Path], env_overrides: dict[str, str], execute=None) -> int:
    """Run the job and say how it ended; `execute(env)`, the simulated cluster's, runs it instead of this machine
    (launcher/simcluster/run.py)."""
    for folder in outputs.values():
        folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines, as the image does
    env.update(env_overrides)
    # `python` in the job's command is this environment's python; the payloads import from the checkout.
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    print("+ " + shlex.join(argv), flush=True)
    start = time.time()
    code = _supervise(argv, env) if execute is None else execute(env)
    wall = time.time() - start
    if 0 < code < 128 and code != STOPPED and "run" in outputs and stopped_for_resume(outputs["run"], start):
        # horovodrun, torchrun and mpirun end non-zero (1, or mpirun's own code) when a rank ends non-zero; every
        # rank stopped with a checkpoint (75). A signal to this launcher keeps its 128 + signal (_stop).
        print(f"local job: every rank stopped with a checkpoint: exit {STOPPED}; run the same command again to resume")
        code = STOPPED
    print(f"local job exited {code} after {wall:.0f}s; outputs:", flush=True)
    for name, folder in outputs.items():
        print(f"  {name}: {folder}", flush=True)
    if "run" in outputs:
        # The same split as a cluster job's ledger (docs/job-cost.md#what-a-job-cost), without queue or money.
        from .cost.local import local_split, render_local

        print(render_local(local_split(outputs["run"] / "metrics.json", wall)), flush=True)
    return code


STOPPED = 75  # payloads/common/preemption.py EXIT_CODE: stopped with a checkpoint, run again to resume


def stopped_for_resume(run: pathlib.Path, since: float) -> bool:
    """Whether every rank of the run that ended after `since` (wall clock) stopped with a checkpoint, by their
    last heartbeats (payloads/common/watchdog.py: <output>/progress/rankN.json, doing "stopped")."""
    beats = []
    for path in sorted((run / "progress").glob("rank*.json")):
        try:
            beats.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            return False
    return every_rank_stopped(beats) and all(b.get("written_at", 0) >= since for b in beats)


# How long the ranks get to end after the forwarded signal before they are killed. Azure ML's own grace is the
# payloads' business (issue 31, item 1); here it bounds how long a stopped local job can take.
GRACE_SECONDS = 30.0
FORWARDED = (signal.SIGTERM, signal.SIGINT)


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _tree(pid: int) -> list:
    """The processes under horovodrun/torchrun (psutil), taken when the signal comes: horovodrun starts each rank
    in a session of its own (safe_shell_exec's os.setsid), so the group alone does not reach them."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _signal_all(pid: int, procs: list, signum: int) -> None:
    import psutil

    try:
        os.killpg(pid, signum)  # horovodrun/torchrun and everything still in its group
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.send_signal(signum)
        except psutil.NoSuchProcess:
            pass


def _running(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stop(proc: subprocess.Popen, signum: int, grace: float) -> int:
    """Forward `signum` to the job's processes, wait at most `grace` seconds for them all, kill what is left;
    returns 128 + signum, as a shell reports a process ended by that signal."""
    import psutil

    name = signal.Signals(signum).name
    procs = _tree(proc.pid)
    _signal_all(proc.pid, procs, signum)
    started = time.monotonic()
    print(
        f"local job: {name} received, sent to {pathlib.Path(proc.args[0]).name} and its {len(procs)} processes; "
        f"waiting up to {grace:.0f}s for them to end",
        file=sys.stderr,
        flush=True,
    )
    _, alive = psutil.wait_procs(procs, timeout=grace)
    try:
        proc.wait(timeout=max(0.0, grace - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        pass
    alive = [p for p in alive if _running(p)]
    if proc.poll() is None or alive:
        _signal_all(proc.pid, alive, signal.SIGKILL)
        proc.wait()
        psutil.wait_procs(alive, timeout=5)
        ended = f"{len(alive) + (proc.returncode == -signal.SIGKILL)} still running after {grace:.0f}s, killed"
    else:
        ended = f"all ended after {time.monotonic() - started:.0f}s"
    print(f"local job stopped by {name}: {ended}; no process of it is left", file=sys.stderr, flush=True)
    return 128 + signum


def _supervise(argv: list[str], env: dict[str, str], grace: float | None = None) -> int:
    """Run the job in a session of its own and wait; SIGTERM or SIGINT to this process (a `kill`, Ctrl-C) is
    forwarded to every process of the job, which gets `grace` seconds before it is killed: none is left training
    as an orphan. Signal handlers can only be set in the main thread; elsewhere the job just runs."""
    grace = GRACE_SECONDS if grace is None else grace
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    if threading.current_thread() is not threading.main_thread():
        return proc.wait()

    def raise_stop(signum, frame):
        raise _Stop(signum)

    previous = {s: signal.signal(s, raise_stop) for s in FORWARDED}
    try:
        return proc.wait()
    except _Stop as stop:
        for s in FORWARDED:  # a second signal during the grace changes nothing: the grace is bounded already
            signal.signal(s, signal.SIG_IGN)
        return _stop(proc, stop.signum, grace)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
