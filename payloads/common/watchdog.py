"""A watchdog per rank: a job whose training stops making progress ends in minutes, naming the rank and host.

Framework-free: every payload (PyTorch on Horovod or DDP, TensorFlow, Keras, land cover) starts one after its
collective library, and its loop tells it what it is doing with attribute stores only (no lock, no collective,
no device sync):

    watch.doing("input")   ...   watch.doing("compute")   ...   watch.doing("exchange")   ...   watch.step_done()

A thread of its own, which depends on no collective, writes this rank's heartbeat every few seconds to
`<output>/progress/rank<r>.json` (rank, host, pid, steps done, what it is doing and since when). When no step
(nor validation batch) has completed for the stall limit, every rank that can still run:

    1. writes its Python stacks, all threads, to `<output>/stalls/rank<r>-stacks.txt` and to stderr, and marks
       its heartbeat stalled;
    2. waits a few heartbeats so the others' marks are visible, then the lowest rank still running reads every
       rank's heartbeat and logs one line naming the ranks that are behind (fewer steps, or an earlier part of
       the same step) or whose heartbeat stopped, with their hosts; it writes `<output>/stalls/report.json`;
    3. ends with os._exit(EXIT_CODE): a normal exit would wait forever in the collective that is stuck. Its
       child processes at any depth (decode workers, their forkserver, DataLoader workers) are killed first
       (end_process): a worker that is itself the stuck part (stopped, or blocked in a read on a dead mount)
       ignores SIGTERM or cannot act on it, and left behind it holds the rank's stdout, so that horovodrun and
       mpirun, which wait for that pipe to close, would hold the job's nodes until its limits.timeout.

The output folder is shared by every node on Azure ML (the job's output mount) and a local folder locally,
so heartbeats are files there, written in place (no rename: durable.py says why).

The limit (`--stall-timeout`): `auto` is max(FLOOR_SECONDS, STEP_MULTIPLE x the median step time measured so
far); before WARM_STEPS steps have completed, and in the first validation pass until its first batch, it is
STARTUP_SECONDS (data listing, compilation, cuDNN autotuning, first reads from a cold mount). A number N is N
seconds between steps, and max(N, STARTUP_SECONDS) during start-up. 0 turns the watchdog off.

A thread cannot run while another holds Python's GIL in a call that never returns. The calls a rank waits in
release it: Horovod's synchronize (horovod_torch_wait_and_clear, measured with Horovod 0.28.1 as built here:
another thread ran 100 times a second while a rank waited 3 s), Gloo's and NCCL's waits and the autograd
engine (torch's bindings release it), TensorFlow's ops; tests/test_watchdog.py has a rank's watchdog report
while it waits in each PyTorch backend's exchange. For a call that does not, the thread keeps faulthandler's
C-level timer (dump_traceback_later, which needs no GIL) armed a little beyond the limit: if the thread stops
re-arming it, the timer writes every thread's stack to stderr and exits the process with code 1, and the other
ranks' reports name this rank as stopped (its heartbeat stopped too).

Beside it, Phases compares the ranks' step parts (input, compute, exchange) every few steps, to name a rank that
is slow rather than stuck (a straggler).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import pathlib
import signal
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("payloads.watchdog")

STARTUP_SECONDS = 1800.0  # before the first steps: an ImageNet listing on a mount, torch.compile, XLA, cuDNN
FLOOR_SECONDS = 300.0  # never less between steps: a checkpoint written to blob storage, an epoch's last sums
STEP_MULTIPLE = 20  # x the median step time: a step 20 times slower than usual is not a slow step
WARM_STEPS = 3  # steps done before the steady limit applies (the first ones compile and autotune)
HEARTBEAT_MAX_SECONDS = 10.0  # between heartbeats (less for a short limit: a quarter of it)
EXIT_CODE = 124  # as timeout(1): the launcher's "exit with status code 124" means this
AUTO = "auto"

# What a rank can be doing, in the order a rank passes through them after completing step N: the epoch's
# sums, validation and checkpoint, then step N+1's input, compute and gradient exchange. A rank earlier in this
# order at the same step is behind the others. "step" is Keras' fit, where input, compute and exchange are one
# call; "finishing" is after the last step.
ORDER = {
    "start-up": 0,
    "epoch end": 1,
    "validation": 2,
    "checkpoint": 3,
    "input": 4,
    "compute": 5,
    "step": 5,
    "exchange": 6,
    "finishing": 7,
}
# Activities whose first pass compiles (a validation step, a new shape): the start-up limit until one completes.
SLOW_FIRST = frozenset({"validation"})
# How the report says each.
SAYS = {
    "start-up": "starting up",
    "epoch end": "summing the epoch's metrics",
    "validation": "validating",
    "checkpoint": "writing the checkpoint",
    "input": "waiting for input",
    "compute": "computing",
    "step": "in a training step",
    "exchange": "in the gradient exchange",
    "finishing": "finishing",
}


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, at any depth, from /proc (no process of its own started to find them)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])  # after "pid (comm) state": the parent's pid
        children.setdefault(parent, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


# A process's state letter in /proc/<pid>/stat, as the report says it: a decode worker stopped (T), or in an
# uninterruptible wait (D: a read on a mount that does not answer), is the likely cause of a wait for input.
STATES = {"R": "running", "S": "sleeping", "D": "in an uninterruptible wait (I/O)", "T": "stopped", "t": "stopped"}


def children_line(pids: list[int]) -> str:
    """One line naming each process under this one with its state: the stalled rank's report says what its
    workers were doing when it ended them."""
    said = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name, state = stat[stat.find("(") + 1 : stat.rfind(")")], stat[stat.rfind(")") + 2]
        said.append(f"pid {pid} ({name}) {STATES.get(state, state)}")
    return "; ".join(said)


def kill_descendants(pid: int | None = None) -> list[int]:
    """SIGKILL to every process under `pid` (this one by default): the only signal a stopped process, or one that
    ignores SIGTERM, cannot refuse. Returns their pids."""
    found = descendants(os.getpid() if pid is None else pid)
    for child in found:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:  # ended meanwhile
            pass
    return found


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Called first in a rank's input worker (forkserver's child): SIGKILL for it when its parent, the forkserver,
    ends, however it ends (prctl(2)). A worker stopped or blocked in a read answers nothing, and its rank's exit
    cannot always reach it: torchrun's SIGTERM to the rank's process group ends the forkserver first, and the worker,
    orphaned, no longer reads as alive to the rank (ring.Workers, multiprocessing.active_children). Left behind, it
    holds the job's pipes and its resource tracker open for ever."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0):
        raise OSError(ctypes.get_errno(), f"prctl(PR_SET_PDEATHSIG): {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent:  # it ended before the call
        os._exit(1)


def end_process(code: int) -> None:
    """The watchdog's end of this process: its children at any depth killed, then os._exit(code)."""
    kill_descendants()
    os._exit(code)


def parse_timeout(text: str) -> float | str:
    """--stall-timeout: "auto", or seconds (0 = off). Raises ValueError naming the accepted forms."""
    if str(text).strip().lower() == AUTO:
        return AUTO
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected seconds (0 = off) or auto, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"expected seconds (0 = off) or auto, got {text!r}")
    return value


def limit(timeout: float | str, steps: int, step_seconds: float | None, first_pass: bool) -> float | None:
    """Seconds without progress that count as a stall now; None when the watchdog is off."""
    if timeout == 0:
        return None
    steady = (
        float(timeout) if timeout != AUTO else max(FLOOR_SECONDS, STEP_MULTIPLE * step_seconds if step_seconds else 0)
    )
    if steps < WARM_STEPS or first_pass:
        return max(STARTUP_SECONDS, steady)
    return steady


def heartbeat_every(timeout: float | str) -> float:
    """Seconds between heartbeats: a quarter of a short explicit limit, at most HEARTBEAT_MAX_SECONDS."""
    base = FLOOR_SECONDS if timeout == AUTO else float(timeout)
    return max(0.2, min(HEARTBEAT_MAX_SECONDS, base / 4))


def progress_dir(output: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(output) / "progress"


def stalls_dir(output: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(output) / "stalls"


def heartbeat_path(output: pathlib.Path, rank: int) -> pathlib.Path:
    return progress_dir(output) / f"rank{rank}.json"


def spare_path(output: pathlib.Path, rank: int) -> pathlib.Path:
    """The heartbeat's second copy, written after it: a rank frozen in the middle of one write (the file empty
    for ever) leaves the other whole, as metrics.json's spare does."""
    return progress_dir(output) / f".rank{rank}.json.spare"


def read_json(path: pathlib.Path, tries: int = 3) -> dict | None:
    """A JSON file another rank writes in place: a read between its truncation and its write sees it empty, so a
    torn read is retried."""
    for i in range(tries):
        try:
            data = json.loads(path.read_text())
            return data if isinstance(data, dict) else None
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            if i + 1 < tries:
                time.sleep(0.05)
    return None


def write_json(path: pathlib.Path, data: dict) -> None:
    """In place, one write: no rename on a blob mount (durable.py)."""
    with open(path, "w") as f:
        f.write(json.dumps(data, sort_keys=True) + "\n")


@dataclass
class Judged:
    rank: int
    host: str
    steps: int | None
    doing: str | None
    doing_for: float | None  # seconds
    heartbeat_age: float | None  # seconds; None: no heartbeat from this run
    why: str  # "behind", "stopped", "no heartbeat", "waiting"


def judge(beats: dict[int, dict | None], size: int, now: float, stalled_for: float, every: float) -> list[Judged]:
    """Each rank's part in a stall, from its heartbeat (`now`: wall-clock seconds). Stopped: its heartbeat is older
    than half the time the job has been stalled (and not marked stalled: a rank that reported is running), so it
    stopped with the job or soon after, a frozen process or one whose Python cannot run. Behind: fewer steps done
    than the most any rank has done, or at the same step earlier in it (ORDER; validation batches done as the
    tie-break). Everyone else waits for them, in a collective."""
    out = []
    stale_after = max(3 * every, stalled_for / 2)
    positions = {}
    for r in range(size):
        b = beats.get(r)
        if b is None:
            out.append(Judged(r, "?", None, None, None, None, "no heartbeat"))
            continue
        age = max(0.0, now - b["written_at"])
        doing_for = max(0.0, now - b["doing_since"]) if b.get("doing_since") else None
        stopped = age > stale_after and not b.get("stalled")
        out.append(Judged(r, b["host"], b["steps"], b["doing"], doing_for, age, "stopped" if stopped else "waiting"))
        positions[r] = (b["steps"], ORDER.get(b["doing"], 0), b.get("ticks", 0))
    if positions:
        ahead = max(positions.values())
        for j in out:
            if j.why == "waiting" and positions[j.rank] < ahead:
                j.why = "behind"
    return out


def describe(j: Judged) -> str:
    if j.why == "no heartbeat":
        return (
            f"rank {j.rank}: no heartbeat from this run (it never started its watchdog, or its files are not visible)"
        )
    at = f"rank {j.rank} on {j.host}"
    if j.why == "stopped":
        return f"{at} stopped at step {j.steps} ({says(j.doing)}; heartbeat {j.heartbeat_age:.0f} s old)"
    return f"{at} at step {j.steps}, {says(j.doing)} for {j.doing_for:.0f} s"


def says(doing: str | None) -> str:
    return SAYS.get(doing, str(doing))


# What a stall in which every rank is at the same place suggests, by what they are doing.
TOGETHER = {
    "exchange": "a collective that every rank entered never completed: the interconnect or NCCL (see the stacks)",
    "step": "a collective that every rank entered never completed, or the input: see the stacks",
    "input": "the input stopped for every rank: the data mount or the loader (see the stacks)",
}


def report_line(judged: list[Judged], stalled_for: float, limit_s: float, most: int = 8) -> str:
    """One line: the stuck ranks by name and host, the waiting ones counted (a 64-rank job would fill a screen).
    When every rank is at the same place, they are all named (up to `most`), with what that place suggests."""
    head = f"stalled: no training step for {stalled_for:.0f} s (limit {limit_s:.0f} s); "
    stuck = [j for j in judged if j.why != "waiting"]
    waiting = [j for j in judged if j.why == "waiting"]
    together = not stuck
    if together:
        stuck, waiting = waiting, []
    named = "; ".join(describe(j) for j in stuck[:most])
    if len(stuck) > most:
        named += f"; and {len(stuck) - most} more (stalls/report.json)"
    if together:
        hint = TOGETHER.get(stuck[0].doing) if len(stuck) > 1 and len({j.doing for j in stuck}) == 1 else None
        return (
            head
            + (f"every rank ({len(stuck)}) is stuck: " if len(stuck) > 1 else "stuck: ")
            + named
            + (f" ({hint})" if hint else "")
        )
    if not waiting:
        return head + f"stuck: {named}"
    hosts = sorted({j.host for j in waiting})
    where = f"on {hosts[0]}" if len(hosts) == 1 else f"on {len(hosts)} hosts"
    first = waiting[0]
    if len(waiting) == 1:
        wait = f"rank {first.rank} {where} waiting at step {first.steps}, {says(first.doing)}"
    else:
        wait = f"{len(waiting)} ranks {where} waiting (rank {first.rank} at step {first.steps}, {says(first.doing)})"
    return head + f"stuck: {named}; {wait}"


class Watchdog:
    """One per process. The training loop calls doing(), step_done() and tick() (attribute stores); start() and
    stop() (or `with`) bracket the run. With timeout 0 the calls stay valid and nothing runs."""

    def __init__(
        self,
        output: pathlib.Path,
        rank: int,
        size: int,
        run: str,
        timeout: float | str = AUTO,
        host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        exit: Callable[[int], None] = end_process,
    ):
        self.output, self.rank, self.size, self.run = pathlib.Path(output), rank, size, run
        self.timeout = timeout
        self.host = host or socket.gethostname()
        self.pid = os.getpid()
        self.clock, self.wall, self._exit = clock, wall, exit
        self.every = heartbeat_every(timeout)
        # Written by the training thread only, read by the watchdog thread: single writer, no lock needed.
        self.steps = 0
        self.at: tuple[int, int] | None = None  # (epoch, steps done in it) of the run: the same after a resume
        self.ticks = 0  # validation batches since the last step
        self.last = clock()  # when the last step or batch completed (or the watch started)
        self.what, self.since = "start-up", clock()
        self.spent = dict.fromkeys(ORDER, 0.0)  # seconds in each activity, summed (Phases reads it per window)
        self.passed: set[str] = set()  # activities that have completed a batch (SLOW_FIRST)
        self._samples: deque[float] = deque(maxlen=200)
        self._seen = (0, self.last)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_failed = False

    # ---- the training thread's side: attribute stores only
    def doing(self, what: str) -> None:
        now = self.clock()
        self.spent[self.what] += now - self.since
        self.what, self.since = what, now

    def step_done(self) -> None:
        self.last = self.clock()
        self.ticks = 0
        self.steps += 1

    def tick(self) -> None:
        """A unit of progress that is not a training step (a validation batch)."""
        self.last = self.clock()
        self.ticks += 1
        if self.what in SLOW_FIRST:
            self.passed.add(self.what)

    # ---- life cycle
    @property
    def on(self) -> bool:
        return self.timeout != 0

    def start(self) -> Watchdog:
        if not self.on:
            return self
        progress_dir(self.output).mkdir(parents=True, exist_ok=True)
        self._beat()
        self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self, final: str = "finished") -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5 * self.every)
        self._thread = None
        faulthandler.cancel_dump_traceback_later()
        self.what = final
        self._beat()

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, kind, error, tb) -> None:
        self.stop("finished" if kind is None else f"failed: {kind.__name__}")

    # ---- the watchdog thread
    def step_seconds(self) -> float | None:
        return statistics.median(self._samples) if self._samples else None

    def limit(self) -> float | None:
        first_pass = self.what in SLOW_FIRST and self.what not in self.passed
        return limit(self.timeout, self.steps, self.step_seconds(), first_pass)

    def _observe(self) -> None:
        """Mean step time since the last observation that saw new steps, once the first steps are done."""
        steps, last = self.steps, self.last
        seen_steps, seen_last = self._seen
        if steps > seen_steps:
            if seen_steps >= WARM_STEPS:
                self._samples.append((last - seen_last) / (steps - seen_steps))
            self._seen = (steps, last)

    def state(self, **extra) -> dict:
        now_c, now_w = self.clock(), self.wall()
        to_wall = lambda t: now_w - (now_c - t)  # a monotonic stamp in wall-clock seconds
        return {
            "run": self.run,
            "rank": self.rank,
            "size": self.size,
            "host": self.host,
            "pid": self.pid,
            "steps": self.steps,
            "at": list(self.at) if self.at else None,
            "ticks": self.ticks,
            "doing": self.what,
            "doing_since": to_wall(self.since),
            "last_progress_at": to_wall(self.last),
            "written_at": now_w,
            "limit_seconds": self.limit(),
            "every": self.every,
            "step_seconds": self.step_seconds(),
            "stalled": False,
            **extra,
        }

    def _beat(self, **extra) -> None:
        try:
            state = self.state(**extra)
            write_json(heartbeat_path(self.output, self.rank), state)
            write_json(spare_path(self.output, self.rank), state)
        except OSError as e:
            if not self._write_failed:  # once: a full or broken mount would otherwise fill the log
                log.warning("rank %d: cannot write its heartbeat to %s: %s", self.rank, progress_dir(self.output), e)
            self._write_failed = True

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            self._observe()
            bound = self.limit()
            quiet = self.clock() - self.last
            if bound is not None and quiet > bound:
                self._stalled(quiet, bound)
                return
            # The C-level timer, beyond the limit: it fires only if this thread stops running (see the top).
            if bound is not None:
                faulthandler.dump_traceback_later(bound - quiet + self._grace(), exit=True)
            self._beat()

    def _grace(self) -> float:
        return 4 * self._gather() + 30

    def _gather(self) -> float:
        """How long a stalled rank waits for the others' stalled marks (and the report) to become visible."""
        return 2 * self.every + 0.5

    def _stalled(self, quiet: float, bound: float) -> None:
        faulthandler.dump_traceback_later(self._grace(), exit=True)  # the report itself must not hang the rank
        detected = self.wall()
        mine = (
            f"rank {self.rank} on {self.host} (pid {self.pid}): no training step for {quiet:.0f} s (limit "
            f"{bound:.0f} s); {self.steps} steps done, {self.what} for {self.clock() - self.since:.0f} s"
        )
        children = children_line(descendants(self.pid))
        if children:
            mine += f"; its child processes (ended with it): {children}"
        log.error("%s; stacks in %s", mine, stalls_dir(self.output))
        self._stacks(mine)
        self._beat(stalled=True, stalled_at=detected)
        beats = self._gathered(detected)
        running_below = [r for r in range(self.rank) if beats[r] and beats[r].get("stalled")]
        report = stalls_dir(self.output) / "report.json"
        if not running_below:
            judged = judge(beats, self.size, self.wall(), quiet + self._gather(), self.every)
            line = report_line(judged, quiet, bound)
            log.error("%s", line)
            try:
                write_json(
                    report,
                    {
                        "run": self.run,
                        "reporter": self.rank,
                        "detected_at": detected,
                        "limit_seconds": bound,
                        "stalled_seconds": quiet,
                        "line": line,
                        "ranks": [j.__dict__ for j in judged],
                    },
                )
            except OSError as e:
                log.warning("cannot write %s: %s", report, e)
        else:
            # The reporter is running: give it the time to write before this exit makes the launcher end the job.
            deadline = self.clock() + self._gather()
            while self.clock() < deadline and (read_json(report) or {}).get("run") != self.run:
                time.sleep(0.2)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self._exit(EXIT_CODE)
        faulthandler.cancel_dump_traceback_later()  # reached only where exit was replaced (tests)

    def _gathered(self, detected: float) -> dict[int, dict | None]:
        """Every rank's heartbeat once each rank still running has marked itself stalled (its stacks are written:
        the launcher ends them all when the first one exits), or after _gather() seconds."""
        deadline = self.clock() + self._gather()
        while True:
            beats = {r: self._read(r) for r in range(self.size)}
            beats[self.rank] = self.state(stalled=True, stalled_at=detected)
            running = [b for b in beats.values() if b is not None and self.wall() - b["written_at"] < 2 * self.every]
            if self.clock() >= deadline or all(b.get("stalled") for b in running):
                return beats
            time.sleep(min(0.2, self.every / 2))

    def _read(self, rank: int) -> dict | None:
        """The newer whole copy of a rank's heartbeat from this run."""
        beats = [read_json(f(self.output, rank)) for f in (heartbeat_path, spare_path)]
        beats = [b for b in beats if b is not None and b.get("run") == self.run and "written_at" in b]
        return max(beats, key=lambda b: b["written_at"], default=None)

    def _stacks(self, header: str) -> None:
        """Every thread's Python stack, to stderr (the job's log) and to stalls/rank<r>-stacks.txt."""
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            stalls_dir(self.output).mkdir(parents=True, exist_ok=True)
            with open(stalls_dir(self.output) / f"rank{self.rank}-stacks.txt", "w") as f:
                f.write(header + "\n\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError as e:
            log.warning("cannot write the stacks to %s: %s", stalls_dir(self.output), e)


_started: list[Watchdog] = []  # this process's watchdog, for ended()


def started(
    output: pathlib.Path, rank: int, size: int, timeout: float | str, broadcast: Callable[[str | None], str]
) -> Watchdog:
    """This rank's watchdog, started. `broadcast` sends rank 0's value to every rank (the payload's collective
    library, called once here): every rank's heartbeat then carries rank 0's name for the run."""
    watch = Watchdog(output, rank, size, broadcast(run_token() if rank == 0 else None), timeout).start()
    _started[:] = [watch]
    return watch


def ended(code: int) -> None:
    """The last heartbeat says how this process ended (its exit code): what the launcher's auto-resume reads where
    horovodrun or mpirun report only that some rank failed (launcher/endings.py)."""
    for watch in _started:
        if watch.on:
            watch._beat(exit_code=int(code))


def run_token(host: str | None = None) -> str:
    """Rank 0's name for this run, broadcast to every rank: heartbeats from an earlier run into the same output
    folder (a resume) are told apart by it."""
    return f"{host or socket.gethostname()}-{os.getpid()}-{time.time():.0f}"
