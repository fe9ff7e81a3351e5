"""SIGTERM mid-epoch (issue 31, items 1-3): the ranks agree on a step, write a checkpoint of the exact position
inside the epoch, exit 75 with a line; the run resumed from it ends bitwise equal to the same run uninterrupted,
under DDP here and under Horovod in tests/launcher/test_drill.py, with two real processes. Plus the checkpoint names and the agreement's arithmetic."""

from __future__ import annotations

import json
import os
import signal

import pytest
from helpers import TINY, check_resume_is_exact

from launcher import autoresume, endings
from payloads.common import checkpoint, preemption

# 40 steps per epoch (2 processes x batch 2 of 8192 samples, capped): the signalled ranks signal themselves at a chosen
# step (tests/stop_at); the agreement window is the payload's.
# --checkpoint-every-minutes 0: only the signal checkpoints mid-epoch.
ARGS = TINY + [
    "--synthetic-samples",
    "8192",
    "--batch-size",
    "2",
    "--max-steps-per-epoch",
    "40",
    "--epochs",
    "2",
    "--checkpoint-every-minutes",
    "0",
]


# Under Horovod with only rank 1 signalled, through the local launcher: tests/launcher/test_drill.py.
@pytest.mark.launches
def test_ddp_sigterm_to_every_rank_stops_and_resumes_exactly(tmp_path):
    check_resume_is_exact(tmp_path, ARGS, "ddp", [0, 1], same="classification/ddp/mid-epoch")


def test_mid_epoch_names_order_between_epochs(tmp_path):
    for epoch, step in ((1, 0), (1, 120), (2, 0), (1, 7)):
        path = checkpoint.path_for(tmp_path, epoch, ".pt", step)
        checkpoint.write(path, lambda p, s=f"{epoch}/{step}": p.write_text(s))
    names = [p.name for _, p in checkpoint.list_checkpoints(tmp_path, ".pt")]
    assert names == [
        "checkpoint-epoch-0001.pt",
        "checkpoint-epoch-0001-step-000007.pt",
        "checkpoint-epoch-0001-step-000120.pt",
        "checkpoint-epoch-0002.pt",
    ]
    assert checkpoint.latest(tmp_path, ".pt")[1].name == "checkpoint-epoch-0002.pt"
    # The marker keeps the prefix launcher/cost reads the epochs from.
    assert checkpoint.marker_for(tmp_path / names[2]).name == ".checkpoint-epoch-0001-step-000120.pt.complete"
    checkpoint.prune(tmp_path, ".pt", 2)
    assert [p.name for _, p in checkpoint.list_checkpoints(tmp_path, ".pt")] == names[2:]


def test_the_agreement_stops_every_rank_when_one_is_signalled_and_follows_rank_0s_clock():
    now = [0.0]
    ranks = [preemption.Preemption(r, 1.0, clock=lambda: now[0]) for r in (0, 1)]

    def agree():
        proposals = [p.proposal() for p in ranks]
        sums = [sum(col) for col in zip(*proposals)]
        return [p.settle(sums) for p in ranks]

    for p in ranks:
        assert p.due()  # every step until rank 0 has measured one
    now[0] = 0.01
    assert agree() == [None, None]
    assert ranks[0].every == ranks[1].every == int(preemption.AGREE_SECONDS / 0.01)  # 200: ~2 s apart
    assert not any(p.due() for p in ranks)
    ranks[1]._handler(signal.SIGTERM, None)
    assert agree() == ["signal", "signal"]
    ranks[1].signalled = None
    now[0] = 61.0  # a minute since the last checkpoint by rank 0's clock
    assert agree() == ["clock", "clock"]
    ranks[0].saved(3.0)
    assert agree() == [None, None]


def test_auto_interval_costs_at_most_two_percent_with_a_floor():
    assert preemption.auto_interval(None) == 600
    assert preemption.auto_interval(6.0) == 600
    assert preemption.auto_interval(30.0) == 1500
    assert preemption.parse_minutes("auto") == "auto" and preemption.parse_minutes("0") == 0
    with pytest.raises(ValueError):
        preemption.parse_minutes("-1")


def test_a_rank_line_reaches_the_shared_pipe_in_one_write(monkeypatch):
    """Every rank writes its stop line (and its error line) to one shared pipe. print() writes the text and the
    newline in two writes, so two ranks' lines ran together on one line (seen in CI: one line holding both
    ranks' 'stopped by SIGTERM'); a pipe keeps a single write of up to PIPE_BUF bytes whole."""
    from payloads.common.errors import say

    read, write = os.pipe()
    writes: list[bytes] = []
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data)) or real(fd, data))
    line = "stopped by SIGTERM: wrote " + "x" * 300 + " (exit 75)"
    with os.fdopen(write, "w") as stream:
        say(line, stream)
        say("error: ünïcode", stream)
    with os.fdopen(read, "rb") as got:
        text = got.read().decode()
    assert writes == [(line + "\n").encode(), "error: ünïcode\n".encode()]
    assert text.splitlines() == [line, "error: ünïcode"]


@pytest.mark.launches
def test_a_sigterm_at_an_epochs_last_step_stops_at_that_epochs_checkpoint(tmp_path):
    """No agreement after an epoch's last step: the epoch ends (its record, its checkpoint), then the ranks agree
    once more and stop there, with the same line and exit code; the same command resumes at epoch 2."""
    from helpers import metrics, stop_lines, stopped_run, train

    out = tmp_path / "out"
    proc = stopped_run(out, ARGS, "horovod", [1], after=40)  # 40 steps per epoch: its last one
    text = proc.stdout + proc.stderr
    lines = stop_lines(text)
    assert proc.returncode != 0 and len(lines) == 2, text[-3000:]
    assert all("checkpoint-epoch-0001.pt" in line and f"(exit {preemption.EXIT_CODE})" in line for line in lines)
    assert [p.name for _, p in checkpoint.list_checkpoints(out / "checkpoints", ".pt")] == ["checkpoint-epoch-0001.pt"]
    assert [e["epoch"] for e in metrics(out)["epochs"]] == [1]
    resumed = train(2, ARGS + ["--output-dir", str(out)])
    assert "(1 epochs done)" in resumed.stdout + resumed.stderr
    assert [e["epoch"] for e in metrics(out)["epochs"]] == [1, 2]


class _Events:
    """A stand-in for Azure's instance metadata service: Scheduled Events as the documentation shows them."""

    def __init__(self):
        import http.server
        import threading

        self.events, self.headers = [], []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.headers.append(self.headers.get("Metadata"))
                body = json.dumps({"DocumentIncarnation": len(outer.events), "Events": outer.events}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/metadata/scheduledevents?api-version=2020-07-01"


def _preempt(resources: list[str]) -> dict:
    return {
        "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
        "EventType": "Preempt",
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


@pytest.mark.launches
def test_a_scheduled_preempt_event_stops_every_rank_with_a_checkpoint_before_any_signal(tmp_path):
    """Azure announces a Spot eviction at least 30 s ahead (Scheduled Events' Preempt): each rank polls the
    endpoint the launcher names (TRAINING_SCHEDULED_EVENTS) and the event stops the run as a SIGTERM would, at a
    step every rank agrees on, with the mid-epoch checkpoint and exit 75. No signal is sent: tests/stop_at holds
    both ranks after step 1 until the event's notice reaches them (the payload's own poll, every POLL_SECONDS), so
    the first agreement is the stop's."""
    import subprocess

    from helpers import ROOT, horovodrun, stop_at_env, wait_until

    events = _Events()
    out = tmp_path / "out"
    env = {**stop_at_env(1, [0, 1], hold=True), preemption.SCHEDULED_EVENTS: events.url}
    cmd = horovodrun(2, ARGS + ["--output-dir", str(out)])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Both ranks' first polls: they poll from the start of training.
        wait_until(proc, lambda: len(events.headers) >= 2, "both ranks polled before the event")
        events.events.append(_preempt([]))
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        events.server.shutdown()
    text = stdout + stderr
    lines = [ln for ln in text.splitlines() if "stopped by Scheduled Event Preempt: wrote" in ln]
    assert proc.returncode != 0 and len(lines) == 2, text[-3000:]
    assert all("checkpoint-epoch-0000-step-000001.pt" in ln and "(exit 75)" in ln for ln in lines), lines
    assert set(events.headers) == {"true"}  # the header the metadata service requires


def test_only_an_event_that_ends_this_vm_stops_it():
    stop = preemption.Preemption(0, 0)
    mine = preemption.ScheduledEvents("http://unused", stop, vm_name="vm-3")
    assert mine.ending({"Events": [_preempt(["vm-7"])]}) is None
    assert mine.ending({"Events": [{**_preempt(["vm-3"]), "EventType": "Reboot"}]}) is None
    assert mine.ending({"Events": [_preempt(["vm-7", "vm-3"])]}) == "Preempt"
    assert mine.ending({"Events": [{**_preempt([]), "EventType": "Terminate"}]}) == "Terminate"
    unnamed = preemption.ScheduledEvents("http://unused", stop)  # this VM's name unknown: any ending event
    assert unnamed.ending({"Events": [_preempt(["vm-7"])]}) == "Preempt"
    stop.notice("Scheduled Event Preempt")
    assert stop.stop_line("x.pt", 1.0).startswith("stopped by Scheduled Event Preempt: wrote x.pt in 1.0s")


@pytest.mark.launches
def test_a_sigterm_with_the_payloads_own_agreement_window_stops_at_one_step_and_resumes_bitwise_equal(tmp_path):
    """No hook at all (issue 42, item 5): rank 1 gets SIGTERM from outside once its heartbeat shows training under
    way, and the ranks go on to the end of the agreement window rank 0's clock chose (up to MAX_EVERY steps, about
    AGREE_SECONDS), where both stop, name the same checkpoint and exit 75 within the 30 s grace; resumed, the run
    ends bitwise equal to the uninterrupted one. Epochs of 600 steps hold a window (at most 500); where the signal lands (mid-epoch
    or an epoch's end) is the machine's speed's, and either must resume exactly. --stall-timeout 10: heartbeats
    every 2.5 s."""
    import subprocess
    import time

    from helpers import (
        ROOT,
        assert_same_final_weights,
        ending_of,
        env,
        horovodrun,
        record_launch,
        stop_lines,
        train,
        wait_for_steps,
    )

    args = TINY + ["--synthetic-samples", "8192", "--batch-size", "2", "--max-steps-per-epoch", "600"]
    args += ["--epochs", "2", "--checkpoint-every-minutes", "0", "--stall-timeout", "10"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(2, args + ["--output-dir", str(straight)])
    cmd = horovodrun(2, args + ["--output-dir", str(stopped)])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        beats = wait_for_steps(proc, stopped, 1)
        os.kill(beats[1]["pid"], signal.SIGTERM)
        sent = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    record_launch(2, args, "pytorch", proc.returncode)
    text = stdout + stderr
    lines = stop_lines(text)
    assert proc.returncode != 0 and len(lines) == 2, text[-4000:]
    assert sum("stopped by SIGTERM" in line for line in lines) == 1, lines  # rank 0: by the agreement
    assert seconds < 30, seconds  # the grace assumed for Azure ML (preemption.py)
    found = checkpoint.latest(stopped / "checkpoints", ".pt")
    assert found and all(found[1].name in line for line in lines), (found, lines)
    epochs, step = checkpoint.position(found[1])
    assert epochs * 600 + step >= beats[1]["steps"], (found[1].name, beats[1])  # at or after the signal's step
    ending, decision = ending_of(stopped, proc.returncode)  # the launcher's auto-resume: resume at that position
    assert (ending.kind, ending.exit_code, decision.action) == (endings.STOPPED, 75, autoresume.RESUME), ending
    assert ending.at in ((epochs, step), (epochs - 1, 600)), (ending, found[1].name)  # an epoch's end: either name

    resumed = train(2, args + ["--output-dir", str(stopped)])
    assert "resuming from" in resumed.stdout + resumed.stderr
    assert_same_final_weights(straight, stopped)
