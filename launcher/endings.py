"""How a job ended, read from what it wrote: the one place that answers; launcher/autoresume.py acts on it.

The payloads leave in their `run` output folder (the same layout here and on Azure ML):
- progress/rank<r>.json, each rank's last heartbeat (payloads/common/watchdog.py): its run token, its position in
  the run (`at`: epoch, steps done in it), host, what it was doing ("stopped" after a SIGTERM's checkpoint), and
  the exit code it ended with;
- stalls/report.json, the watchdog's report of a hang (its run token, the stalled ranks and their hosts);
- replicas.json, the replica sentinel's findings, with `stopped` set when the run ended on them.

With the exit code the launcher saw (Azure ML's "exited with status code N", or horovodrun's own), they give one
of the classes below. The class, the exit code and the position reached are the ending's signature: the same
signature twice in one chain is a deterministic failure (autoresume.py).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Callable
from math import inf

from azureaccess.errors import first_line

COMPLETED = "completed"  # exit 0
STOPPED = "stopped"  # every rank stopped with a checkpoint (exit 75): resume
HANG = "hang"  # the watchdog ended a stalled job (exit 124), naming hosts: health check, then resume
NODE_FAULT = "node fault"  # replicas went wrong and stayed wrong (exit 70), a GPU missing: health check, then resume
PERMANENT = "permanent"  # a refused configuration, bad data or a full disk (exit 2): a rerun fails the same way
CANCELED = "canceled"  # a person (or a policy) canceled the job: not resumed
PREEMPTED = "preempted"  # Azure ML took the low-priority nodes and does not restart the job: resume
INPUT_FAULT = "input fault"  # a rank's decode worker died (exit 74: killed for memory, a decoder's crash): resume
UNKNOWN = "unknown"  # anything else (a rank killed, a node lost): resume from a checkpoint

EXIT_CLASSES = {0: COMPLETED, 75: STOPPED, 124: HANG, 70: NODE_FAULT, 2: PERMANENT, 74: INPUT_FAULT}
# Azure ML's error for a failed user process ("Execution failed. User process 'python' exited with status code 2.")
EXIT_IN_MESSAGE = re.compile(r"exit(?:ed)? with (?:status|exit) code:? *(-?\d+)", re.IGNORECASE)
# Azure ML's message when a node has fewer GPUs than the job asks for (a GPU fell off the bus)
NODE_MESSAGES = re.compile(r"(?:number of GPUs|GPU count|gpus? (?:are|is) (?:not )?available|nvidia-smi)", re.I)
# Open MPI 4.1's mpirun when a node's daemon is gone (the node lost, its link down: seen on simulated nodes,
# docs/rehearse.md), and the host it names: the daemon's, or the peer a rank lost.
LOST_NODE = re.compile(
    r"ORTE (?:has lost communication with a remote daemon|was unable to reliably start one or more daemons)"
    r"|An ORTE daemon has unexpectedly failed"
)
LOST_HOST = re.compile(r"(?:Remote daemon: *\S+ on node|Peer host:) *(\S+)")
# mpirun's word of a rank ended by a signal (killed, a segfault), and its host: the others then wait on it
RANK_SIGNALLED = re.compile(r"mpirun noticed that process rank (\d+) with PID \d+ on node (\S+) exited on signal .*")
# Azure ML's error for a preempted job ("PreemptionError", "Received pre-emption warning signal"): "You have to
# restart a preempted job" (how-to-create-attach-compute-cluster), so the chain resumes it
PREEMPTION_MESSAGES = re.compile(r"pre-?emption|preempted", re.I)


@dataclasses.dataclass(frozen=True)
class Ending:
    kind: str
    exit_code: int | None
    at: tuple[int, int] | None  # (epoch, steps done in it): the furthest any rank's last heartbeat reached
    hosts: tuple[str, ...] = ()  # named by the watchdog or the sentinel
    why: str = ""

    @property
    def signature(self) -> str:
        where = f"{self.at[0]}.{self.at[1]}" if self.at else "-"
        return f"{self.kind}|{'-' if self.exit_code is None else self.exit_code}|{where}"

    def line(self) -> str:
        at = f"epoch {self.at[0] + 1}, step {self.at[1]}" if self.at else "before the first step"
        code = "" if self.exit_code is None else f", exit {self.exit_code}"
        hosts = f" on {', '.join(self.hosts)}" if self.hosts else ""
        return f"{self.kind}{code} at {at}{hosts}" + (f": {self.why}" if self.why else "")


Read = Callable[[str], "dict | None"]  # a file of the run folder, by its relative name, as JSON (None: absent)


def local_reader(folder: pathlib.Path) -> Read:
    def read(name: str) -> dict | None:
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    return read


def exit_in(message: str | None) -> int | None:
    m = EXIT_IN_MESSAGE.search(message or "")
    return int(m.group(1)) if m else None


def heartbeats(read: Read, size: int, since: float = 0.0) -> list[dict]:
    """The ranks' last heartbeats of the newest run in the folder written after `since` (wall-clock seconds: the
    attempt's start); an earlier attempt's are told apart by the run token, which rank 0 gave every rank of its run."""
    beats = [b for b in (read(f"progress/rank{r}.json") for r in range(size)) if b and b.get("written_at", 0) >= since]
    if not beats:
        return []
    newest = max(beats, key=lambda b: b.get("written_at", 0)).get("run")
    return [b for b in beats if b.get("run") == newest]


def every_rank_stopped(beats: list[dict]) -> bool:
    """Whether these last heartbeats are every rank's (their count is the run's size) and each says "stopped": the
    SIGTERM stop's checkpoint written (exit 75)."""
    return bool(beats) and len(beats) == beats[0].get("size") and all(b.get("doing") == "stopped" for b in beats)


def silent_hosts(beats: list[dict]) -> tuple[str, ...]:
    """The hosts whose ranks all fell silent a heartbeat period or more before every other host's last beat, none
    with an exit code: a lost node, where mpirun's word names no host ("ORTE was unable to reliably start one or more
    daemons", when it hears of the daemon's end through its launch agent first). The period is the heartbeats' own
    (`every`); an older payload's, without it, counts as the longest, 10 s (watchdog.HEARTBEAT_MAX_SECONDS)."""
    newest: dict[str, float] = {}
    for b in beats:
        if b.get("host") and "written_at" in b:
            newest[b["host"]] = max(newest.get(b["host"], 0.0), b["written_at"] if b.get("exit_code") is None else inf)
    if len(newest) < 2:
        return ()
    every = max(b.get("every", 10.0) for b in beats)
    return tuple(sorted(h for h, t in newest.items() if all(t + every <= u for g, u in newest.items() if g != h)))


def classify(
    status: str, exit_code: int | None, read: Read, size: int, message: str = "", since: float = 0.0
) -> Ending:
    """The ending of an attempt that started at `since` and ended in `status` (Azure ML's, or "Completed"/"Failed"
    for a local run) with the exit code the launcher saw, from the run folder that `read` reads."""
    beats = heartbeats(read, size, since)
    reached = [tuple(b["at"]) for b in beats if b.get("at")]
    at = max(reached) if reached else None
    run = beats[0].get("run") if beats else None
    codes = {b["exit_code"] for b in beats if isinstance(b.get("exit_code"), int)}
    stall = read("stalls/report.json")
    replicas = read("replicas.json")
    if status == "Completed" or (exit_code == 0 and status != "Canceled"):
        return Ending(COMPLETED, 0, at)
    if PREEMPTION_MESSAGES.search(message or ""):
        return Ending(PREEMPTED, exit_code, at, why=first_line(message, 200))
    if status == "Canceled":  # before the ranks' stop: a cancel stops every rank with a checkpoint too
        return Ending(CANCELED, exit_code, at, why="canceled on Azure ML (a person or a policy): not resumed")
    if every_rank_stopped(beats):
        return Ending(STOPPED, 75, at, why="every rank stopped with a checkpoint")
    if LOST_NODE.search(message or ""):  # before the stall: the other ranks waited on the lost node's
        named = tuple(sorted(set(LOST_HOST.findall(message)))) or silent_hosts(beats)
        return Ending(NODE_FAULT, exit_code, at, named, "mpirun lost a node's daemon: " + LOST_NODE.search(message)[0])
    signalled = RANK_SIGNALLED.search(message or "")
    if signalled:  # before the stall: the watchdog names the ranks that waited on it
        return Ending(UNKNOWN, exit_code, at, (signalled[2],), signalled[0])
    if stall and run and stall.get("run") == run:
        ranks = [r for r in stall.get("ranks", []) if r.get("host") not in (None, "?")]
        stuck = [r for r in ranks if r.get("why") != "waiting"] or ranks  # all waiting: a collective, every host
        named = tuple(sorted({r["host"] for r in stuck}))
        return Ending(HANG, 124, at, named, stall.get("line", "the watchdog ended a stalled job"))
    if replicas and replicas.get("stopped") and 70 in {*codes, exit_code}:  # an earlier attempt's report stays
        named = tuple(sorted({h for f in replicas.get("findings", []) for h in f.get("hosts", [])}))
        return Ending(NODE_FAULT, 70, at, named, replicas["stopped"])
    # horovodrun's and torchrun's 1 hides the ranks' own codes: their heartbeats keep them, and a rank's 1 (a survivor's
    # traceback after another rank failed) says less than the other's code
    own = sorted(codes - {0, 1}) or sorted(codes - {0})
    code = exit_code if exit_code not in (None, 1) or not own else own[0]
    kind = EXIT_CLASSES.get(code, UNKNOWN) if code else UNKNOWN
    if kind == UNKNOWN and NODE_MESSAGES.search(message or ""):
        kind = NODE_FAULT
    if kind in (HANG, STOPPED):  # the code without the files that make it so (an older payload): take it as said
        return Ending(kind, code, at, why=first_line(message or "", 200))
    if kind == INPUT_FAULT:  # the ranks that said it ended so in their last heartbeat, with their hosts
        named = tuple(sorted({b["host"] for b in beats if b.get("exit_code") == code and b.get("host")}))
        why = "a decode worker died (killed for memory, or a decoder's crash: the rank's line above)"
        return Ending(kind, code, at, named, why)
    why = {
        PERMANENT: "the job refused its configuration, its data or a full disk: a rerun fails the same way",
        NODE_FAULT: first_line(message or "", 200) or "a node's hardware",
        UNKNOWN: first_line(message or "", 200)
        or ("no rank reported a step" if at is None else "no rank said why (killed, or a crash: the log above)"),
    }.get(kind, "")
    return Ending(kind, code, at, why=why)
