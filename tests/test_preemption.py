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

    def agree(write_failed=False):
        proposals = [p.proposal(write_failed) for p in ranks]
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
    # Rank 0's background checkpoint write failed (a full folder): every rank ends with its line, a signal or not;
    # the other ranks' own writers never fail (rank 0 alone writes), so only rank 0's word counts
    ranks[1]._handler(signal.SIGTERM, None)
    assert agree(write_failed=True) == [preemption.WRITE_FAILED] * 2
    assert sum(ranks[1].proposal(write_failed=True)[3:]) == 0


def test_the_stop_line_names_what_started_the_stop_not_the_signal_that_followed():
    """Under mpirun the SIGTERM follows the SIGCONT by odls_base_sigkill_timeout, often during the stop's checkpoint
    write (measured with the head node's sequence on one rank: issue 54, item 6); a notice keeps its name too."""
    stop = preemption.Preemption(0, 0)
    stop._mpirun_stopping(signal.SIGCONT, None)
    stop._handler(signal.SIGTERM, None)
    assert stop.stop_line("x.pt", 1.0).startswith(f"stopped by {preemption.MPIRUN_STOP}: wrote x.pt")
    noticed = preemption.Preemption(0, 0)
    noticed.notice("Scheduled Event Preempt")
    noticed._handler(signal.SIGTERM, None)
    assert noticed.signalled == "Scheduled Event Preempt"


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
    """A stand-in for Azure's instance metadata service on 127.0.0.1: Scheduled Events as the documentation shows
    them. `first_delay`: seconds before the first answer (a fresh node's endpoint, slow to answer its first call);
    `fail`: that many calls answered 503 first. It records each call's Metadata header and the process that made it
    (its pid, from the connection's other end)."""

    def __init__(self, first_delay: float = 0.0, fail: int = 0):
        import http.server
        import threading

        self.events, self.headers, self.callers, self.calls = [], [], [], 0
        self.first_delay, self.fail = first_delay, fail
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                import time

                outer.calls += 1
                outer.headers.append(self.headers.get("Metadata"))
                outer.callers.append(_pid_of(self.client_address[1], outer.server.server_port))
                if outer.calls == 1 and outer.first_delay:
                    time.sleep(outer.first_delay)
                if outer.calls <= outer.fail:
                    self.send_error(503)
                    return
                body = json.dumps({"DocumentIncarnation": len(outer.events), "Events": outer.events}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/metadata/scheduledevents?api-version=2020-07-01"


def _pid_of(port: int, server: int) -> int | None:
    """The process whose open TCP connection to the fake endpoint (port `server`) comes from `port`. Matched by both
    ends and its state: a local port names a connection only with its destination (another test's, or one in
    TIME_WAIT, owned by no process, had matched first in the suite: a caller None)."""
    import psutil

    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port and c.raddr and c.raddr.port == server:
            return c.pid
    return None


class _Proxy:
    """A proxy that must never be asked: it counts the connections it is offered and answers none of them."""

    def __init__(self):
        import socket
        import threading

        self.offered = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

        def accept():
            while True:
                try:
                    conn, _ = self.sock.accept()
                except OSError:
                    return
                self.offered += 1
                conn.close()  # the request fails: what a proxy that cannot reach IMDS would do

        threading.Thread(target=accept, daemon=True).start()

    def env(self) -> dict:
        return {"HTTP_PROXY": self.url, "http_proxy": self.url, "HTTPS_PROXY": self.url, "https_proxy": self.url}


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
    """Azure announces a Spot eviction at least 30 s ahead (Scheduled Events' Preempt): the node's first process
    (local rank 0) polls the endpoint the launcher names (TRAINING_SCHEDULED_EVENTS), and the event stops the run
    as a SIGTERM would, at a step every rank agrees on, with the mid-epoch checkpoint and exit 75: rank 1, which never
    polls (IMDS allows 5 requests a second per VM), learns it in the agreement. No signal is sent: tests/stop_at
    holds rank 0 after step 1 until the event's notice reaches it (the payload's own poll, every POLL_SECONDS), so
    the first agreement is the stop's. HTTP_PROXY and HTTPS_PROXY name a proxy that answers nothing: the poll
    bypasses it, as IMDS requires."""
    import subprocess

    from helpers import ROOT, horovodrun, stop_at_env, wait_until

    events, proxy = _Events(), _Proxy()
    out = tmp_path / "out"
    env = {**stop_at_env(1, [0], hold=True), preemption.SCHEDULED_EVENTS: events.url, **proxy.env()}
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    cmd = horovodrun(2, ARGS + ["--output-dir", str(out)])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(proc, lambda: events.calls >= 1, "rank 0 polled before the event")  # from the start of training
        events.events.append(_preempt([]))
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        events.server.shutdown()
    text = stdout + stderr
    lines = [ln for ln in text.splitlines() if "checkpoint-epoch-0000-step-000001.pt" in ln and "(exit 75)" in ln]
    assert proc.returncode != 0 and len(lines) == 2, text[-3000:]
    assert sum("stopped by Scheduled Event Preempt: wrote" in ln for ln in lines) == 1, lines  # rank 0's
    assert sum("stopped by a signal on another rank: wrote" in ln for ln in lines) == 1, lines  # rank 1's
    assert set(events.headers) == {"true"}  # the header the metadata service requires
    rank0 = json.loads((out / "progress" / "rank0.json").read_text())["pid"]
    assert set(events.callers) == {rank0}, (events.callers, rank0)  # one poller on the node: rank 0
    assert proxy.offered == 0


def test_a_fresh_nodes_first_answer_after_most_of_two_minutes_is_waited_for_and_no_proxy_is_asked(monkeypatch):
    """Scheduled Events' first call on a fresh node can take up to two minutes (the feature is switched on by it):
    the endpoint answers its first call after 90 s and the poller waits for it (FIRST_TIMEOUT 120 s), then polls
    with the short timeout and meets the event. The times are scaled down 20 times through the poller's own
    parameters. HTTP_PROXY names a proxy that answers nothing, and Python's default opener would go through it
    (the control): the poller's does not. The old poller (5 s per call, given up after three) never saw an answer
    from such a node."""
    import time
    import urllib.request

    scale = 20.0
    proxy = _Proxy()
    for key, value in proxy.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    events = _Events(first_delay=90 / scale)
    with pytest.raises(OSError):  # the control: honoured, the proxy variable breaks the call
        urllib.request.urlopen(urllib.request.Request(events.url, headers={"Metadata": "true"}), timeout=5)
    assert proxy.offered == 1 and events.calls == 0
    stop = preemption.Preemption(0, 0)
    poller = preemption.ScheduledEvents(
        events.url, stop, poll=5 / scale, first_timeout=preemption.FIRST_TIMEOUT / scale,
        timeout=preemption.TIMEOUT / scale,
    )  # fmt: skip
    started = time.monotonic()
    poller.start()
    try:
        deadline = started + 30
        while not poller.answered and time.monotonic() < deadline:
            time.sleep(0.05)
        answered = time.monotonic() - started
        assert poller.answered and events.calls == 1, events.calls  # the first call, waited for
        assert answered >= 90 / scale - 0.1, answered
        events.events.append(_preempt([]))
        while stop.signalled is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        poller.close()
        events.server.shutdown()
    assert stop.signalled == "Scheduled Event Preempt" and events.calls >= 2
    assert proxy.offered == 1  # the control's connection only


def test_an_endpoint_that_fails_is_asked_again_with_backoff_never_given_up():
    """Five failed calls in a row (the old poller quit after three) and then an answer with the event: the notice
    comes, each wait twice the one before (capped at backoff_max)."""
    import time

    events = _Events(fail=5)
    events.events.append(_preempt([]))
    stop = preemption.Preemption(0, 0)
    poller = preemption.ScheduledEvents(events.url, stop, poll=0.02, first_timeout=5, timeout=5, backoff_max=0.2)
    assert [poller.backoff(n) for n in (1, 2, 3, 4, 10)] == [0.04, 0.08, 0.16, 0.2, 0.2]
    poller.start()
    try:
        deadline = time.monotonic() + 30
        while stop.signalled is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        poller.close()
        events.server.shutdown()
    assert stop.signalled == "Scheduled Event Preempt" and events.calls == 6, events.calls


def test_one_poller_per_node_the_first_process_of_each_launcher():
    stop = preemption.Preemption(0, 0)
    url = {preemption.SCHEDULED_EVENTS: "http://127.0.0.1:9/unused"}
    for local in ({}, {"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, {"HOROVOD_LOCAL_RANK": "0"}, {"LOCAL_RANK": "0"}):
        poller = preemption.ScheduledEvents.from_env(stop, {**url, **local})
        assert poller is not None, local
        poller.close()
    for local in ({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}, {"HOROVOD_LOCAL_RANK": "3"}, {"LOCAL_RANK": "7"}):
        assert preemption.ScheduledEvents.from_env(stop, {**url, **local}) is None, local
    assert preemption.ScheduledEvents.from_env(stop, {"LOCAL_RANK": "0"}) is None  # no endpoint named


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
