"""The preemption drill (issue 31, item 5): `python -m launcher JOB --target local --drill term|kill`."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import ROOT, TINY, record_launch, stop_at_env, wait_until

from azureaccess.errors import JobError
from launcher import __main__ as cli
from launcher import drill
from payloads.common import checkpoint

# The tests' tiny model, 2 epochs of 8 steps (2 ranks x batch 2 of 8192 samples, capped): the signal's step is
# drawn in the run's first 60%; tests/stop_at holds the drawn rank at that step of the drilled run until the
# drill's signal arrives. The agreement window is the payload's: the test takes a seed that draws step 1, whose
# agreement (the first window is one step) is the stop's, mid-epoch, whatever the machine's speed.
ARGS = TINY + ["--synthetic-samples", "8192", "--batch-size", "2", "--max-steps-per-epoch", "8", "--epochs", "2"]
ARGS += ["--checkpoint-every-minutes", "0"]
TOTAL = 16  # short enough that the draw can fall on step 1


def _seed(rank: int, low: int, high: int) -> int:
    """A --drill-seed whose draw is this rank and a step in [low, high]: a stop early in the first epoch."""
    return next(s for s in range(10_000) if (lambda r, a: r == rank and low <= a <= high)(*drill.choose(s, TOTAL, 2)))


@pytest.mark.launches
@pytest.mark.one_core  # mostly waiting (a held rank, a grace, a stall): about one core
def test_a_sigterm_drill_stops_one_rank_loses_nothing_and_resumes_bitwise_equal(tmp_path):
    """The launcher's drill, end to end under horovodrun (Gloo): uninterrupted, SIGTERM to rank 1 only (the
    agreement stops rank 0 at the same step), resumed; also the Horovod half of tests/test_preemption.py."""
    seed = _seed(1, 1, 1)
    at = drill.choose(seed, TOTAL, 2)[1]
    out = tmp_path / "drill"
    cmd = [sys.executable, "-m", "launcher", "jobs/pytorch-resnet50-synthetic.yaml", "--target", "local"]
    cmd += ["--np", "2", "--controller", "gloo", "--output-dir", str(out), "--drill", "term"]
    cmd += ["--drill-seed", str(seed), "--", *ARGS]
    paced = stop_at_env(at, [1], within=out / "drilled", hold=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=paced, capture_output=True, text=True, timeout=420)
    for _ in range(3):
        record_launch(2, ARGS, "pytorch", proc.returncode)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-5000:]
    report = json.loads((out / "drill.json").read_text())
    assert (report["rank"], report["total_steps"], report["steps_per_epoch"]) == (1, TOTAL, 8)
    assert report["stopped_exit"] == 75 and report["resumed_exit"] == 0
    assert report["stop_seconds"] < 30  # the grace assumed for Azure ML (payloads/common/preemption.py)
    assert report["signalled_at_step"] == report["at_step"]  # held there by tests/stop_at
    # Stopped at a step inside the first epoch, with nothing lost, and the result is the uninterrupted run's.
    assert checkpoint.position(pathlib.Path(report["resumed_from"]))[1], report["resumed_from"]  # mid-epoch
    assert report["resumed_from_step"] == at == report["at_step"]
    assert report["steps_reached"] == report["resumed_from_step"] and report["steps_lost"] == 0
    assert report["equal"] is True and report["different"] == []
    # Both ranks said it, each on its own line, naming the checkpoint; the resume named its position.
    lines = [line for line in text.splitlines() if "stopped by " in line and "run the same command again" in line]
    assert len(lines) == 2 and all(report["resumed_from"] in line for line in lines), lines
    assert sum("stopped by SIGTERM" in line for line in lines) == 1, lines  # rank 0: "a signal on another rank"
    assert f"(0 epochs done, {report['resumed_from_step']} steps of epoch 1)" in text
    assert "bitwise equal" in text and f"--drill-seed {seed}" in text

    # --auto-resume: rank 1 killed (SIGKILL: a node lost) at step 11, in epoch 2; the launcher reads the ending from
    # the run folder, resumes by itself from epoch 1's checkpoint, and the run ends as the uninterrupted one.
    auto = out / "auto"
    cmd = [sys.executable, "-m", "launcher", "jobs/pytorch-resnet50-synthetic.yaml", "--target", "local", "--np", "2"]
    cmd += ["--controller", "gloo", "--output-dir", str(auto), "--auto-resume", "2", "--", *ARGS]
    held = stop_at_env(11, [1], within=auto, hold=True)
    log = tmp_path / "auto.log"
    with open(log, "w") as sink:  # a file, not a pipe: nobody reads a pipe while the test waits for step 11
        proc = subprocess.Popen(cmd, cwd=ROOT, env=held, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        beat = wait_until(proc, lambda: (b := drill.heartbeat(auto / "run", 1)) and b["steps"] >= 11 and b, "step 11")
        os.kill(beat["pid"], signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    for code in (1, proc.returncode):
        record_launch(2, ARGS, "pytorch", code)
    assert proc.returncode == 0, text[-5000:]
    said = [line for line in text.splitlines() if line.startswith("auto-resume: ")]
    assert len(said) == 2 and said[0].startswith("auto-resume: attempt 1 ended: unknown, exit "), said
    assert " at epoch 2, step 3" in said[0] and said[0].endswith("; resume 1 of 2"), said
    assert said[1].startswith("auto-resume: attempt 2 ended: completed"), said
    assert "resuming from" in text and "checkpoint-epoch-0001.pt" in text
    assert drill.compare(drill.newest_checkpoint(out / "straight" / "run"), drill.newest_checkpoint(auto / "run")) == []
    state = json.loads((auto / "run" / "autoresume.json").read_text())
    assert state["attempt"] == 2 and re.fullmatch(r"unknown\|-?\d+\|1\.3", state["history"][0]), state


def _save(path: pathlib.Path, **tensors) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": tensors}, path)


def test_the_draw_is_repeatable_and_lands_in_the_runs_first_60_percent():
    draws = [drill.choose(seed, 1000, 4) for seed in range(500)]
    assert draws == [drill.choose(seed, 1000, 4) for seed in range(500)]
    assert {r for r, _ in draws} == {0, 1, 2, 3}
    steps = [a for _, a in draws]
    assert min(steps) >= 100 and max(steps) <= 600 and len(set(steps)) > 100


def test_steps_lost_are_counted_from_the_checkpoint_names():
    assert drill.position("checkpoint-epoch-0001-step-000120.pt", 600) == 720
    assert drill.position("checkpoint-epoch-0002.pt", 600) == 1200
    assert drill.position("checkpoint-epoch-0000-step-000007.npz", 50) == 7
    with pytest.raises(JobError, match="not a checkpoint name"):
        drill.position("model.pt", 600)


def test_compare_names_the_tensors_that_differ(tmp_path):
    _save(tmp_path / "a.pt", w=torch.ones(3), b=torch.zeros(2))
    _save(tmp_path / "b.pt", w=torch.ones(3), b=torch.tensor([0.0, 1e-7]))
    assert drill.compare(tmp_path / "a.pt", tmp_path / "b.pt") == ["b"]
    assert drill.compare(tmp_path / "a.pt", tmp_path / "a.pt") == []


def _fake_job(steps_per_run: dict, exits: list[int], sent: list):
    """A run_job that writes what a payload would: heartbeats, metrics.json and checkpoint names."""
    calls = []

    def run_job(argv, outputs):
        run = outputs["run"]
        calls.append(run.parent.name)
        (run / "progress").mkdir(parents=True, exist_ok=True)
        (run / "checkpoints").mkdir(exist_ok=True)
        steps = steps_per_run[len(calls) - 1]
        for r in (0, 1):
            (run / "progress" / f"rank{r}.json").write_text(json.dumps({"steps": steps, "pid": 2**22 + r}))
        (run / "metrics.json").write_text(json.dumps({"epochs": [{}, {}]}))
        for name in {1: ["checkpoint-epoch-0001.pt"], 2: ["checkpoint-epoch-0001.pt"], 3: ["checkpoint-epoch-0002.pt"]}[
            len(calls)
        ]:
            checkpoint.write(run / "checkpoints" / name, lambda p: torch.save({"model": {"w": torch.ones(2)}}, p))
        deadline = time.monotonic() + 10
        while len(calls) == 2 and not sent and time.monotonic() < deadline:  # a job runs until the signal comes
            time.sleep(0.01)
        return exits[len(calls) - 1]

    return run_job, calls


def test_a_kill_drill_counts_the_steps_since_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    """SIGKILL: the job fails; the resume starts from the epoch's checkpoint, and the steps since are lost."""
    sent = []
    run_job, calls = _fake_job({0: 200, 1: 150, 2: 200}, [0, 137, 0], sent)
    monkeypatch.setattr(drill.os, "kill", lambda pid, sig: sent.append((pid, sig)))

    def plan_for(folder):
        return ["job"], {"run": folder / "run"}

    code = drill.drill(plan_for, run_job, tmp_path, "kill", 3, 2)
    report = json.loads((tmp_path / "drill.json").read_text())
    assert calls == ["straight", "drilled", "drilled"]
    rank, at = drill.choose(3, 200, 2)
    assert sent == [(2**22 + rank, drill.signal.SIGKILL)] and report["at_step"] == at
    assert (report["resumed_from"], report["resumed_from_step"]) == ("checkpoint-epoch-0001.pt", 100)
    assert (report["steps_reached"], report["steps_lost"]) == (150, 50)
    assert code == 0 and report["equal"] is True
    assert "lost: 50" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--drill", "term"], "--drill is for --target local"),
        (["--target", "local", "--drill", "term", "--dry-run"], "drop one of them"),
        (["--target", "local", "--drill", "term", "--np", "1"], "--np 2 or more"),
    ],
)
def test_drill_refusals_name_the_fix(argv, message, tmp_path, capsys):
    code = cli.main(["jobs/pytorch-resnet50-synthetic.yaml", "--output-dir", str(tmp_path / "o"), *argv])
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_drill_refuses_a_folder_that_already_holds_a_drilled_run(tmp_path):
    (tmp_path / "drilled" / "run").mkdir(parents=True)
    (tmp_path / "drilled" / "run" / "metrics.json").write_text("{}")
    with pytest.raises(JobError, match="not empty"):
        drill.drill(lambda f: (["job"], {"run": f / "run"}), lambda a, o: 0, tmp_path, "term", 1, 2)


def test_the_local_job_ends_75_only_when_every_rank_of_this_run_stopped_with_a_checkpoint(tmp_path):
    """horovodrun and torchrun end 1 whatever their ranks' codes; the local launcher reads the ranks' last
    heartbeats to give the payloads' 75 (stopped with a checkpoint: run again to resume)."""
    from launcher import local

    def beats(*doing, at=100.0, size=2):
        (tmp_path / "progress").mkdir(exist_ok=True)
        for f in (tmp_path / "progress").glob("*.json"):
            f.unlink()
        for r, d in enumerate(doing):
            beat = {"rank": r, "size": size, "doing": d, "written_at": at}
            (tmp_path / "progress" / f"rank{r}.json").write_text(json.dumps(beat))

    beats("stopped", "stopped")
    assert local.stopped_for_resume(tmp_path, since=50.0)
    assert not local.stopped_for_resume(tmp_path, since=150.0)  # an earlier run's heartbeats
    beats("stopped", "failed: RuntimeError")
    assert not local.stopped_for_resume(tmp_path, since=50.0)
    beats("stopped", size=2)  # a rank that never wrote
    assert not local.stopped_for_resume(tmp_path, since=50.0)
    assert not local.stopped_for_resume(tmp_path / "nothing", since=0.0)
