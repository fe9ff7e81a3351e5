"""python -m launcher rehearse JOB --nodes N [--processes-per-node P] [--faults a,b] [--output-dir D] [-- payload args]

The job on the simulated cluster straight, then once per fault of the matrix, each in a folder of its own: the fault
injected on node 1 (the last node) once every rank has trained AT_STEP steps, the job's ending read as
`--auto-resume` reads it (endings.classify, autoresume.decide), and, where auto-resume would resume, the resume run
and its final checkpoint compared with the straight run's. One row per fault (docs/rehearse.md): seconds from the
fault to the job's end, who was named (rank, host), steps of work lost, what auto-resume would do, and whether the
final numbers equal the straight run's. Written as rehearsal.json beside the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shlex
import signal
import sys
import time

from azureaccess.errors import JobError

from .. import autoresume, drill, endings, jobspec
from . import launch
from . import plan as plan_job
from .cluster import Cluster, host

AT_STEP = 4
REHEARSAL_ARGS = ["--stall-timeout", "20", "--checkpoint-every-minutes", "0"]  # a hang named within 20 s
# A PyTorch job rehearsed without payload arguments: a model this machine's CPUs train in about half a minute per
# run, with epochs long enough (2048 steps, about 10 s here) for a fault at step 4 to land mid-epoch, however late
# it is seen (ResNet-50 at 224 px would take an hour a run here). Arguments after `--` replace these.
CPU_SCALE = ["--model", "tiny_cnn", "--image-size", "32", "--num-classes", "10", "--synthetic-samples", "32768",
             "--batch-size", "8", "--epochs", "2", "--workers", "0", "--threads", "1", "--no-progress"]  # fmt: skip
ROOT = pathlib.Path(__file__).resolve().parents[2]
FAULT_HOOK = ROOT / "tests" / "fault"  # the replica faults' injector (tests/fault/sitecustomize.py)


@dataclasses.dataclass
class Row:
    fault: str
    exit_code: int | None = None
    detected_s: float | None = None
    named: str = ""
    steps_lost: int | None = None
    auto_resume: str = ""
    equal: bool | None = None
    ending: str = ""


def _last_rank_pid(run: pathlib.Path, world: int) -> int:
    return drill.heartbeat(run, world - 1)["pid"]


def _kill_rank(signum):
    def inject(cluster: Cluster, run: pathlib.Path, world: int) -> None:
        os.kill(_last_rank_pid(run, world), signum)

    return inject


def _sigterm(cluster: Cluster, run: pathlib.Path, world: int) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # as Azure ML stops a job: the launcher forwards it to mpirun


def input_workers(pid: int) -> list[int]:
    """The input workers of a training process: the shard loader's decode workers and DataLoader's workers are
    the children of its multiprocessing forkserver (itself a child of the process, as its resource tracker is)."""
    import psutil

    found = []
    for child in psutil.Process(pid).children():
        try:
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                found += [w.pid for w in child.children()]
        except psutil.NoSuchProcess:
            pass
    return found


def _kill_input_worker(cluster: Cluster, run: pathlib.Path, world: int) -> None:
    import psutil

    pid = _last_rank_pid(run, world)
    try:
        workers = input_workers(pid)
    except psutil.NoSuchProcess:
        raise JobError(f"the last rank (pid {pid}) ended before its input worker could be killed") from None
    if not workers:
        raise JobError("the last rank has no input worker to kill (synthetic data, or --workers 0)")
    os.kill(workers[0], signal.SIGKILL)  # as the kernel's OOM killer takes one


FAULTS = {
    "rank killed": _kill_rank(signal.SIGKILL),
    "rank hung": _kill_rank(signal.SIGSTOP),
    "node lost": lambda c, run, world: c.lose(c.spec.nodes - 1),
    "link cut": lambda c, run, world: c.cut_link(c.spec.nodes - 1),
    "slow link": lambda c, run, world: c.slow_link(c.spec.nodes - 1),
    "Preempt notice": lambda c, run, world: c.post_event(c.spec.nodes - 1, "Preempt"),
    "SIGTERM": _sigterm,
    "full output disk": lambda c, run, world: c.fill_output(run / "checkpoints"),  # every node's view of it
    "decode worker died": _kill_input_worker,
    # numbers gone wrong on the last rank (tests/fault): the replica sentinel's to find
    "NaN": None,
    "flipped replica": None,
}
NUMERIC = {"NaN": "nan", "flipped replica": "flip"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m launcher rehearse", description=__doc__.split("\n\n")[1])
    p.add_argument("job", type=pathlib.Path)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--processes-per-node", type=int, default=1)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"a comma-separated subset of: {', '.join(FAULTS)}")
    p.add_argument("--output-dir", type=pathlib.Path, default=None)
    return p


def main(argv: list[str]) -> int:
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    args = _parser().parse_args(argv)
    try:
        return rehearse(args, extra)
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def rehearse(args, extra: list[str]) -> int:
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise JobError(f"--faults {', '.join(unknown)}: choose among {', '.join(FAULTS)}")
    if args.nodes < 2:
        raise JobError(f"--nodes {args.nodes}: a rehearsal of faults across nodes needs at least 2")
    template = jobspec.read_template(args.job)
    root = (args.output_dir or ROOT / "runs" / f"rehearsal-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if not extra and "payloads.pytorch" in template["command"]:
        extra = CPU_SCALE
        print(f"rehearsal: no payload arguments after `--`: scaled for this machine's CPUs: {' '.join(extra)}")
    payload_args = [*REHEARSAL_ARGS, *extra]
    started = time.time()

    def planned(folder: pathlib.Path, env: dict | None = None):
        p, out, notes = plan_job(template, args.job, {}, folder, args.nodes, args.processes_per_node, payload_args,
                                 overrides={"HOROVOD_GLOO_TIMEOUT_SECONDS": "120", **(env or {})})  # fmt: skip
        if "run" not in out:
            raise JobError(f"{args.job.name} declares no `run` output: a rehearsal reads the run's checkpoints")
        return p, out

    straight_plan, straight = planned(root / "straight")
    print(f"rehearsal: the job straight on {args.nodes} simulated nodes ({root / 'straight'})", flush=True)
    code = launch.run(straight_plan)
    reference = drill.newest_checkpoint(straight["run"])
    if code != 0 or reference is None:
        raise JobError(f"the straight run ended {code} without a final checkpoint: fix it before rehearsing faults")
    world = args.nodes * args.processes_per_node
    epochs, total = drill.epochs_and_steps(straight["run"], world)
    base = Straight(reference, world, total // max(epochs, 1))
    rows = [_one(fault, planned, root, base) for fault in faults]
    report = {
        "job": str(args.job),
        "nodes": args.nodes,
        "processes_per_node": args.processes_per_node,
        "fault_at_step": AT_STEP,
        "wall_seconds": round(time.time() - started, 1),
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    (root / "rehearsal.json").write_text(json.dumps(report, indent=1) + "\n")
    print(table(rows))
    print(f"rehearsal: {len(rows)} faults in {report['wall_seconds']:.0f}s; {root / 'rehearsal.json'}", flush=True)
    return 0


@dataclasses.dataclass(frozen=True)
class Straight:
    """What every fault's run is held to: the straight run's last checkpoint, its world and steps per epoch."""

    reference: pathlib.Path
    world: int
    steps_per_epoch: int


def _one(fault: str, planned, root: pathlib.Path, base: Straight) -> Row:
    folder = root / fault.lower().replace(" ", "-")
    world_env = {}
    if fault in NUMERIC:  # the last rank's, in the environment every node is given
        world_env = {"PYTHONPATH": str(FAULT_HOOK), "FAULT": NUMERIC[fault], "FAULT_AT": str(AT_STEP + 1),
                     "FAULT_RANK": str(base.world - 1)}  # fmt: skip
    job_plan, out = planned(folder, world_env)
    run, world = out["run"], base.world
    row = Row(fault)
    if FAULTS[fault] is _kill_input_worker and not decodes_in_workers(job_plan.command):
        row.ending = "not run: the job decodes no images in worker processes (synthetic data, or --workers 0)"
        return row
    injected: list[float] = []
    refused: list[str] = []

    def inject(cluster: Cluster) -> None:
        deadline = time.monotonic() + 300
        while drill.run_steps(run, world) < AT_STEP:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        injected.append(time.time())
        if FAULTS[fault] is not None:
            try:
                FAULTS[fault](cluster, run, world)
            except (JobError, OSError) as e:  # said in the row, not as a thread's traceback
                refused.append(str(e))

    print(f"rehearsal: {fault} on {host(job_plan.nodes - 1)} at step {AT_STEP} ({folder})", flush=True)
    started = time.time()
    heard: list[str] = []
    row.exit_code = launch.run(job_plan, faults=inject, heard=heard)
    ended = time.time()
    row.detected_s = round(ended - injected[0], 1) if injected else None
    ending = endings.classify("Completed" if row.exit_code == 0 else "Failed", row.exit_code,
                              endings.local_reader(run), world, message="\n".join(heard), since=started)  # fmt: skip
    row.ending = ending.line() if not refused else f"the fault was not injected: {refused[0]}; {ending.line()}"
    row.named = _named(run, ending)
    reached = drill.run_steps(run, world)
    saved = drill.newest_checkpoint(run)
    held = drill.position(saved.name, base.steps_per_epoch) if saved is not None else 0  # none: from the start
    row.steps_lost = max(0, reached - held)
    decision = autoresume.decide(ending, autoresume.Chain(folder.name, 1), 0.0)
    row.auto_resume = decision.line
    if decision.action != autoresume.STOP:
        resumed_plan, _ = planned(folder)  # the same job again, without the fault: the payload resumes
        row.equal = launch.run(resumed_plan) == 0 and drill.compare(base.reference, drill.newest_checkpoint(run)) == []
    elif ending.kind == endings.COMPLETED:
        row.equal = drill.compare(base.reference, drill.newest_checkpoint(run)) == []
    return row


def decodes_in_workers(command: str) -> bool:
    """Whether the payload's command line (its last --data and --workers win, as argparse reads them) decodes
    images in worker processes: real data with at least one worker."""
    tokens = shlex.split(command)

    def last(flag: str, value: str) -> str:
        for i, token in enumerate(tokens):
            if token == flag and i + 1 < len(tokens):
                value = tokens[i + 1]
            elif token.startswith(flag + "="):
                value = token.split("=", 1)[1]
        return value

    return last("--data", "synthetic") != "synthetic" and last("--workers", "2") != "0"


def _named(run: pathlib.Path, ending: endings.Ending) -> str:
    """Who the job's own reports named: the ending's hosts, the replica sentinel's ranks (replicas.json), the
    stragglers of the epochs' records (metrics.json)."""
    names = list(ending.hosts)
    try:
        findings = json.loads((run / "replicas.json").read_text())["findings"]
    except (OSError, ValueError, KeyError):
        findings = []
    names += [f"rank {r} on {h}" for f in findings for r, h in zip(f["ranks"], f["hosts"])]
    try:
        epochs = json.loads((run / "metrics.json").read_text())["epochs"]
    except (OSError, ValueError, KeyError):
        epochs = []
    names += [line.split(":")[1].strip() for e in epochs for line in e.get("stragglers") or []]
    return "; ".join(dict.fromkeys(names))


def table(rows: list[Row]) -> str:
    head = ["fault", "exit", "detected after", "named", "steps lost", "auto-resume would", "final numbers equal"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        equal = {True: "yes", False: "no", None: "-"}[r.equal]
        seen = f"{r.detected_s:.0f} s" if r.detected_s is not None else "-"
        lost = "-" if r.steps_lost is None else str(r.steps_lost)
        cells = [r.fault, str(r.exit_code), seen, r.named or "-", lost, r.auto_resume, equal]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
