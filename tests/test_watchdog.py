"""The stall watchdog (payloads/common/watchdog.py, issue 30 items 1-3): a job whose training stops making progress
ends within the stall limit plus a margin, non-zero, with the stuck rank and its host named and every running
rank's stacks written; with both PyTorch backends (two real processes: one stopped with SIGSTOP, one whose decode
worker stopped, after which no process of the job is left), and wired into the TensorFlow, Keras and land-cover
payloads (one process asleep in its input).

The stuck rank comes from tests/stall (a sitecustomize on PYTHONPATH: one rank's Nth batch sleeps for an hour, or
its decode worker stops itself), or from a SIGSTOP sent here once its heartbeat shows steps done. Every launch is
killed in a finally, process tree and stopped rank included, so nothing is left running."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import time

import psutil
import pytest
from helpers import ROOT, TINY, alive, ending_of, hook_env, horovodrun, python_m, torchrun, train

from launcher import autoresume, endings
from payloads.common import config, options, stragglers, watchdog
from payloads.common.errors import ConfigError

pytestmark = pytest.mark.launches  # starts training processes: serially with the others (conftest.py)

STALL = 4.0  # --stall-timeout in these runs: seconds without a step
HOST = socket.gethostname()


def _set(args: list[str], **values: str) -> list[str]:
    """`args` with the value after each --flag (written flag_name) replaced."""
    args = list(args)
    for name, value in values.items():
        args[args.index("--" + name.replace("_", "-")) + 1] = value
    return args


# A run far longer than any test (50 epochs of 128 steps per rank), ended by the watchdog.
LONG = _set(TINY, synthetic_samples="2048") + ["--batch-size", "8", "--epochs", "50"]
# What a launcher adds after the stall exit: horovodrun ends the other ranks with SIGTERM, then SIGKILL after
# 5 s (safe_shell_exec.GRACEFUL_TERMINATION_TIME_S); torchrun after 30 s (LocalElasticAgent._stop_workers calls
# _shutdown() with its default, whatever --shutdown-timeout says, torch 2.14). A stopped process ignores SIGTERM.
MARGIN = {"horovod": 25.0, "ddp": 50.0}


def _stall_hook(rank: int, at: int) -> dict:
    return hook_env("stall", STALL_RANK=str(rank), STALL_AT=str(at))


def _launch(cmd: list[str], environ: dict, log: pathlib.Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=environ, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _kill_tree(proc: subprocess.Popen, extra: list[int] = ()) -> None:
    """SIGKILL works on a stopped process too: the launcher, its children at any depth, and `extra`."""
    pids = list(extra)
    try:
        pids += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    for pid in [*pids, proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _beat(out: pathlib.Path, rank: int) -> dict | None:
    return watchdog.read_json(watchdog.heartbeat_path(out, rank))


def _report(out: pathlib.Path) -> dict:
    path = watchdog.stalls_dir(out) / "report.json"
    assert path.is_file(), f"no {path}"
    return json.loads(path.read_text())


def _command(backend: str, args: list[str], payload: str = "pytorch") -> list[str]:
    return horovodrun(2, args, payload) if backend == "horovod" else torchrun(2, args, payload)


# ---------------------------------------------------------------------------------------------- two ranks


@pytest.mark.one_core
@pytest.mark.parametrize("backend", ["horovod", "ddp"])
def test_a_stopped_rank_is_named_and_the_job_ends(backend, tmp_path):
    """Rank 1 frozen by SIGSTOP in a batch it reads 2 s into training (tests/stall, STALL_STOP: sent by itself, so
    inside a step however fast the machine; one sent from here once a heartbeat showed 10 steps came during the
    epoch's end checkpoint on a fast one): its watchdog cannot run, so rank 0's names it from the heartbeat that
    stopped, writes its own stacks (it waits in the gradient exchange: the collective library released the GIL, or
    rank 0's thread could not have run) and ends the job."""
    out = tmp_path / "out"
    log = tmp_path / "log"
    cmd = _command(backend, LONG + ["--stall-timeout", str(STALL), "--output-dir", str(out)])
    proc = _launch(cmd, {**_stall_hook(rank=1, at=10), "STALL_STOP": "2"}, log)
    stopped = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            beat = _beat(out, 1)
            with contextlib.suppress(psutil.NoSuchProcess):
                if beat and psutil.Process(beat["pid"]).status() == psutil.STATUS_STOPPED:
                    stopped = beat["pid"]
                    break
            time.sleep(0.05)
        assert stopped, f"rank 1 never stopped:\n{log.read_text()[-3000:]}"
        at = time.monotonic()
        rc = proc.wait(timeout=STALL + MARGIN[backend] + 30)
        took = time.monotonic() - at
    finally:
        _kill_tree(proc, [stopped] if stopped else [])
    text = log.read_text()
    print(f"{backend}: the job ended {took:.1f} s after rank 1 stopped, exit {rc}")
    assert rc != 0, text[-3000:]
    assert took < STALL + MARGIN[backend], f"ended {took:.0f} s after the stop\n{text[-3000:]}"
    report = _report(out)
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert ranks[1]["why"] == "stopped" and ranks[1]["host"] == HOST and ranks[1]["steps"] >= 10, report
    assert ranks[0]["why"] == "waiting" and ranks[0]["doing"] == "exchange", report
    line = next(ln for ln in text.splitlines() if "stalled: no training step" in ln)
    assert f"rank 1 on {HOST} stopped at step" in line and "heartbeat" in line, line
    stacks = (watchdog.stalls_dir(out) / "rank0-stacks.txt").read_text()
    # rank 0 waits in a collective of its training loop: the step's exchange (Horovod's in the optimizer's
    # synchronize, DDP's in backward) or, every 50 steps, the comparison of the step's parts
    waits = ("optimizer_step" if backend == "horovod" else "backward", "compare")
    assert "train_epoch" in stacks and any(w in stacks for w in waits), stacks
    assert not (watchdog.stalls_dir(out) / "rank1-stacks.txt").exists()  # a stopped process writes nothing
    ending, decision = ending_of(out, rc)  # the launcher's auto-resume: a hang on the named host, checked first
    assert (ending.kind, ending.exit_code, ending.hosts) == (endings.HANG, 124, (HOST,)), ending
    assert ending.at is not None and decision.action == autoresume.CHECK_THEN_RESUME, (ending, decision)


def _shards(root: pathlib.Path) -> pathlib.Path:
    """48 small JPEGs of 4 classes in 2 WebDataset shards: 6 steps of 4 per rank and epoch over 2 ranks."""
    import numpy as np
    from PIL import Image

    from datatools import prepare

    rng = np.random.default_rng(0)
    for c in range(4):
        (root / "img" / f"class{c}").mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "img" / f"class{c}" / f"{i}.jpg")
    prepare.run(root / "img", root / "shards", shards=2, formats=["webdataset"], progress=False)
    return root / "shards" / "webdataset"


def _described(pid: int) -> str:
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        return f"pid {pid} ({p.status()}, parent {p.ppid()}): {' '.join(p.cmdline())[:300]}"
    return f"pid {pid} (gone)"


@pytest.mark.one_core
@pytest.mark.parametrize("backend", ["horovod", "ddp"])
def test_a_rank_whose_decode_worker_stopped_is_named_and_the_job_ends_with_nothing_left(backend, tmp_path):
    """Rank 1's shard-decode worker stops itself (SIGSTOP, tests/stall STALL_WORKER) in its 10th step, mid-epoch:
    what a read stuck on a blob mount looks like (issue 54, item 10). Both ranks' watchdogs run (rank 1 waits for
    that batch, rank 0 in the exchange), both write their stacks (rank 1's shows the wait on its worker), rank 0
    names rank 1 as behind, waiting for input, and each ends its own decode workers before it exits: the stopped
    worker, which ignores SIGTERM and held the rank's stdout, left horovodrun waiting for that pipe for ever (the
    job held its nodes). The job ends within the limit plus the launcher's margin, and no process of it is left."""
    out = tmp_path / "out"
    log = tmp_path / "log"
    args = [a for a in _set(LONG, workers="1") if a not in ("--synthetic-samples", "2048")]
    args += ["--data", "shards", "--data-dir", str(_shards(tmp_path)), "--batch-size", "4"]
    cmd = _command(backend, args + ["--stall-timeout", str(STALL), "--output-dir", str(out)])
    proc = _launch(cmd, {**_stall_hook(rank=1, at=10), "STALL_WORKER": "1"}, log)
    seen: set[int] = set()  # every process of the job, taken while it runs (orphans leave the tree)
    worker = stopped_at = None
    try:
        deadline = time.monotonic() + 150
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(proc.pid).children(recursive=True):
                    seen.add(child.pid)
                    with contextlib.suppress(psutil.NoSuchProcess):
                        if worker is None and child.status() == psutil.STATUS_STOPPED:
                            worker, stopped_at = child.pid, time.monotonic()
            time.sleep(0.1)
        rc = proc.wait(timeout=5)
        took = time.monotonic() - stopped_at if stopped_at else None
        # A SIGKILLed process still takes its exit (its mappings freed, then its resource tracker's pipe closed):
        # on a loaded 2-core CI machine that outlasted a fixed second. Gone within 10 s is gone; a stopped orphan
        # never goes.
        settle = time.monotonic() + 10
        while (left := alive(seen)) and time.monotonic() < settle:
            time.sleep(0.2)
        said = [_described(p) for p in left]  # before the kill below, which leaves them zombies
    finally:
        _kill_tree(proc, alive(seen))
    text = log.read_text()
    assert worker is not None, f"no decode worker stopped:\n{text[-3000:]}"
    print(f"{backend}: the job ended {took:.1f} s after rank 1's decode worker stopped, exit {rc}")
    assert rc != 0 and took < STALL + MARGIN[backend], f"ended {took:.0f} s after the stop\n{text[-3000:]}"
    assert worker not in left and left == [], said
    report = _report(out)
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert ranks[1]["why"] == "behind" and ranks[1]["doing"] == "input" and ranks[1]["host"] == HOST, report
    assert ranks[0]["why"] == "waiting" and ranks[0]["doing"] == "exchange", report
    line = next(ln for ln in text.splitlines() if "stalled: no training step" in ln)
    assert f"rank 1 on {HOST} at step" in line and "waiting for input" in line, line
    assert f"rank 0 on {HOST} waiting at step" in line, line
    stuck = (watchdog.stalls_dir(out) / "rank1-stacks.txt").read_text()
    assert "ring.py" in stuck and "train_epoch" in stuck, stuck  # waiting on its worker
    assert f"pid {worker} (" in stuck.splitlines()[0] and "stopped" in stuck.splitlines()[0], stuck.splitlines()[0]
    assert (watchdog.stalls_dir(out) / "rank0-stacks.txt").is_file()
    assert f"exit with status code {watchdog.EXIT_CODE}" in text or f"exitcode  : {watchdog.EXIT_CODE}" in text


def test_a_healthy_run_with_a_short_limit_trains_to_the_end(tmp_path):
    """The control: the same short limit on a run that never stops ends 0, with no stall written."""
    out = tmp_path / "out"
    train(2, TINY + ["--epochs", "2", "--stall-timeout", "3", "--output-dir", str(out)])
    assert not watchdog.stalls_dir(out).exists()
    beats = [_beat(out, r) for r in (0, 1)]
    assert [b["doing"] for b in beats] == ["finished", "finished"] and beats[0]["run"] == beats[1]["run"]
    assert beats[0]["steps"] == beats[1]["steps"] == 4  # 128 samples / (2 x 32) x 2 epochs


# ---------------------------------------------------------------------------------------------- stragglers

# 60 steps per rank, compared every 10 (6 windows; a straggler is named after 3 in a row). Steps of about 20 ms
# (32 px, batch 16): windows of 5 steps of a 16 px model were short enough for this shared machine's scheduler
# to make a healthy rank look slow for three of them.
WINDOWS = _set(TINY, synthetic_samples="4096", image_size="32") + ["--batch-size", "16", "--epochs", "1"]
WINDOWS += ["--max-steps-per-epoch", "60", "--straggler-every", "10"]


@pytest.mark.one_core
@pytest.mark.parametrize("backend", ["horovod", "ddp"])
def test_a_rank_slow_in_its_input_is_named_while_training(backend, tmp_path):
    """Rank 1 sleeps 50 ms in every batch it reads (tests/stall, STALL_EVERY): rank 0 names it with its host and
    the part of the step, and metrics.json keeps every rank's seconds per part (rank 0's wait shows as exchange)."""
    out = tmp_path / "out"
    e = _stall_hook(rank=1, at=1)
    e.update(STALL_EVERY="1", STALL_SECONDS="0.05")
    proc = subprocess.run(
        _command(backend, WINDOWS + ["--output-dir", str(out)]),
        cwd=ROOT,
        env=e,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    named = [ln for ln in proc.stdout.splitlines() if "straggler:" in ln]
    assert named, proc.stdout[-3000:]
    assert f"straggler: rank 1 on {HOST}: waiting for input" in named[0] and "others" in named[0], named
    assert not [ln for ln in named if "rank 0" in ln], named
    (epoch,) = json.loads((out / "metrics.json").read_text())["epochs"]
    parts = {p["rank"]: p for p in epoch["phase_seconds"]}
    assert parts[1]["host"] == HOST and parts[1]["input"] > 60 * 0.05 * 0.9, parts  # 60 sleeps of 50 ms
    assert parts[0]["input"] < parts[1]["input"] / 4 and parts[0]["exchange"] > parts[1]["exchange"], parts
    assert epoch["stragglers"] == [ln.split("payloads.pytorch: ")[-1] for ln in named], (epoch["stragglers"], named)


# ------------------------------------------------------------------------ the other payloads: one process


def _one_process(payload: str, args: list[str], tmp_path: pathlib.Path) -> tuple[int, str, pathlib.Path]:
    out = tmp_path / "out"
    cmd = [*python_m(f"payloads.{payload}.train"), *args, "--stall-timeout", "3", "--output-dir", str(out)]
    proc = _launch(cmd, _stall_hook(rank=0, at=6), tmp_path / "log")
    try:
        rc = proc.wait(timeout=90)
    finally:
        _kill_tree(proc)
    return rc, (tmp_path / "log").read_text(), out


TF_ARGS = _set(TINY, synthetic_samples="4096") + ["--batch-size", "8", "--epochs", "1"]


@pytest.mark.one_core
@pytest.mark.parametrize(
    "payload, doing",
    [("tensorflow", "waiting for input"), ("keras", "in a training step")],
    ids=["tensorflow", "keras"],
)
def test_tensorflow_and_keras_runs_end_on_a_stalled_input(payload, doing, tmp_path):
    rc, text, out = _one_process(payload, TF_ARGS, tmp_path)
    assert rc == watchdog.EXIT_CODE, text[-3000:]
    line = next(ln for ln in text.splitlines() if "stalled: no training step" in ln)
    assert f"stuck: rank 0 on {HOST} at step 5, {doing}" in line, line
    assert "tests/stall/sitecustomize.py" in (watchdog.stalls_dir(out) / "rank0-stacks.txt").read_text()


@pytest.mark.one_core
def test_land_cover_run_ends_on_a_stalled_input(tmp_path):
    from datatools.landcover import prepare, synthetic

    pairs = synthetic.write_tiles(tmp_path / "raw", 2, 128, 128, 6)
    prepare.prepare(tmp_path / "tiles", pairs, [], block_size=64)
    args = ["--model", "unet_tiny", "--image-size", "32", "--batch-size", "2", "--threads", "1", "--no-progress"]
    args += ["--data-dir", str(tmp_path / "tiles"), "--epochs", "1", "--patches-per-epoch", "400"]
    rc, text, out = _one_process("segmentation", args, tmp_path)
    assert rc == watchdog.EXIT_CODE, text[-3000:]
    line = next(ln for ln in text.splitlines() if "stalled: no training step" in ln)
    assert f"stuck: rank 0 on {HOST} at step 5, waiting for input" in line, line
    stacks = (watchdog.stalls_dir(out) / "rank0-stacks.txt").read_text()
    assert "tests/stall/sitecustomize.py" in stacks and "train_epoch" in stacks, stacks


# ------------------------------------------------------------------------------------ the rules, in process


def test_the_limit_follows_the_step_time_above_a_floor_and_waits_longer_for_start_up():
    auto = watchdog.AUTO
    assert watchdog.limit(auto, steps=0, step_seconds=None, first_pass=False) == watchdog.STARTUP_SECONDS
    assert watchdog.limit(auto, steps=50, step_seconds=0.3, first_pass=False) == watchdog.FLOOR_SECONDS
    assert watchdog.limit(auto, steps=50, step_seconds=40.0, first_pass=False) == 800.0  # 20 x 40 s
    assert watchdog.limit(auto, steps=50, step_seconds=0.3, first_pass=True) == watchdog.STARTUP_SECONDS
    assert watchdog.limit(60.0, steps=50, step_seconds=0.3, first_pass=False) == 60.0
    assert watchdog.limit(60.0, steps=1, step_seconds=None, first_pass=False) == watchdog.STARTUP_SECONDS
    assert watchdog.limit(3600.0, steps=1, step_seconds=None, first_pass=False) == 3600.0
    assert watchdog.limit(0.0, steps=50, step_seconds=0.3, first_pass=False) is None


def test_the_judge_names_who_is_behind_who_stopped_and_who_is_missing():
    now = 1000.0
    beat = lambda steps, doing, age, **kw: {
        "host": f"h{steps}",
        "steps": steps,
        "doing": doing,
        "doing_since": now - 300,
        "written_at": now - age,
        **kw,
    }
    beats = {
        0: beat(41, "exchange", 1, stalled=True),
        1: beat(41, "input", 1, stalled=True),  # same step, earlier in it: behind
        2: beat(40, "exchange", 290),  # stopped: no heartbeat for most of the stall
        3: None,
    }
    judged = {j.rank: j.why for j in watchdog.judge(beats, 4, now, stalled_for=300, every=10)}
    assert judged == {0: "waiting", 1: "behind", 2: "stopped", 3: "no heartbeat"}
    line = watchdog.report_line(watchdog.judge(beats, 4, now, 300, 10), 300, 300)
    assert "rank 1 on h41 at step 41, waiting for input for 300 s" in line
    assert "rank 2 on h40 stopped at step 40" in line and "rank 3: no heartbeat" in line
    assert line.endswith("rank 0 on h41 waiting at step 41, in the gradient exchange"), line
    # every rank in the same exchange: all named, with what that suggests
    same = {r: beat(41, "exchange", 1, stalled=True) for r in range(2)}
    line = watchdog.report_line(watchdog.judge(same, 2, now, 300, 10), 300, 300)
    assert "every rank (2) is stuck" in line and "interconnect or NCCL" in line, line


def test_a_straggler_is_named_after_three_windows_in_a_row_and_the_waiting_ranks_never():
    """The ranks' rows (input, compute, exchange seconds): rank 2 waits for input; the others wait for it in the
    exchange, which is never what names a rank. Once named, the name repeats only every RENAME_EVERY windows."""
    watch = watchdog.Watchdog(pathlib.Path("/nonexistent"), 0, 3, "r", timeout=0)
    phases = stragglers.Phases(watch, ["a", "b", "c"], every=5)
    slow = [[0.1, 1.0, 4.0], [0.1, 1.0, 4.1], [4.0, 1.0, 0.2]]
    even = [[0.1, 1.0, 0.5], [0.1, 1.1, 0.5], [0.1, 1.0, 0.6]]
    said = []
    for rows in (slow, slow, even, slow, slow, slow, slow):  # broken once, then 4 in a row
        watch.steps += 5
        phases.row()
        said.append(phases.add(rows))
    assert said[:5] == [[], [], [], [], []] and said[6] == [], said
    assert said[5] == [
        "straggler: rank 2 on c: waiting for input 77% of its step, others 2% (3 windows of 5 steps in a row)"
    ]
    record = phases.epoch_record()
    assert record["stragglers"] == said[5] and record["phase_seconds"][2] == {
        "rank": 2,
        "host": "c",
        "input": 24.1,
        "compute": 7.0,
        "exchange": 1.8,
    }
    assert phases.epoch_record()["stragglers"] == []  # reset for the next epoch
    # a short window (an epoch's last steps) counts in the totals, not in the judging
    watch.steps += 2
    phases.row()
    assert phases.add(slow) == [] and phases.epoch_record()["phase_seconds"][2]["input"] == 4.0


def test_a_bad_stall_timeout_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SystemExit):
        options.parse(["--stall-timeout", "soon"], "prog", "d", ["tiny_cnn"])
    cfg = config.TrainConfig(model="tiny_cnn", stall_timeout="-5")
    with pytest.raises(ConfigError, match="--stall-timeout: expected seconds .0 = off. or auto.*or 0 to turn"):
        cfg.validate(["tiny_cnn"])
    assert (
        options.parse(["--stall-timeout", "0", "--output-dir", str(tmp_path)], "p", "d", ["resnet50"]).stall_timeout
        == 0
    )


def test_the_watchdog_thread_stalls_writes_stacks_and_reports_in_process(tmp_path):
    """The thread on its own, with the process exit replaced: steps stop, the limit passes, it exits 124."""
    exits = []
    watch = watchdog.Watchdog(tmp_path, 0, 1, "run-a", timeout=0.8, exit=exits.append)
    try:
        watch.start()
        for _ in range(watchdog.WARM_STEPS + 2):
            watch.doing("compute")
            watch.step_done()
        watch.doing("input")
        deadline = time.monotonic() + 20
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    assert exits == [watchdog.EXIT_CODE]
    report = _report(tmp_path)
    assert report["run"] == "run-a" and report["ranks"][0]["steps"] == watchdog.WARM_STEPS + 2
    stacks = (watchdog.stalls_dir(tmp_path) / "rank0-stacks.txt").read_text()
    assert "test_the_watchdog_thread_stalls_writes_stacks_and_reports_in_process" in stacks  # the main thread's


KEEPER = """
import os, signal, subprocess, sys, time
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
frozen = subprocess.Popen([sys.executable, "-c", "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.kill(os.getpid(), signal.SIGSTOP); time.sleep(120)"])
print(sleeper.pid, frozen.pid, flush=True)
time.sleep(120)
"""


def test_the_watchdogs_end_kills_every_process_under_the_rank_a_stopped_one_too():
    """What end_process does before os._exit, on a process of its own (never this test's): every process under
    it, at any depth, gets SIGKILL, a stopped one that ignores SIGTERM included, and the report names each with its
    state first."""
    import sys

    keeper = subprocess.Popen([sys.executable, "-c", KEEPER], stdout=subprocess.PIPE, text=True)
    try:
        sleeper, frozen = map(int, keeper.stdout.readline().split())
        deadline = time.monotonic() + 30
        while psutil.Process(frozen).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(watchdog.descendants(keeper.pid)) == {sleeper, frozen}
        said = watchdog.children_line(watchdog.descendants(keeper.pid))
        assert f"pid {frozen} (python" in said and said.count("stopped") == 1 and "sleeping" in said, said
        assert set(watchdog.kill_descendants(keeper.pid)) == {sleeper, frozen}
        deadline = time.monotonic() + 10
        while alive([sleeper, frozen]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive([sleeper, frozen]) == [] and keeper.poll() is None  # the children only
    finally:
        keeper.kill()
        keeper.wait()


def test_heartbeats_of_an_earlier_run_in_the_same_folder_are_not_read_as_this_runs(tmp_path):
    watchdog.progress_dir(tmp_path).mkdir(parents=True)
    watchdog.write_json(watchdog.heartbeat_path(tmp_path, 1), {"run": "earlier", "steps": 900, "written_at": 9})
    watch = watchdog.Watchdog(tmp_path, 0, 2, "now", timeout=5)
    assert watch._read(1) is None
    watchdog.write_json(watchdog.heartbeat_path(tmp_path, 1), {"run": "now", "steps": 3, "written_at": 10})
    assert watch._read(1)["steps"] == 3


def test_a_rank_frozen_while_writing_its_heartbeat_is_read_from_the_spare(tmp_path):
    """The main copy left empty (the writer stopped between truncating and writing it): the spare is read."""
    watchdog.progress_dir(tmp_path).mkdir(parents=True)
    watchdog.write_json(watchdog.spare_path(tmp_path, 1), {"run": "now", "steps": 40, "written_at": 10})
    watchdog.heartbeat_path(tmp_path, 1).write_text("")
    assert watchdog.Watchdog(tmp_path, 0, 2, "now", timeout=5)._read(1)["steps"] == 40
