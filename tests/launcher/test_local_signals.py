"""SIGTERM to `python -m launcher ... --target local` reaches the job's rank processes: none is left training."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The payload of this job, as its processes' command lines show it.
PAYLOAD = "payloads.pytorch.train"


def _job_processes(launcher: psutil.Process, out: pathlib.Path) -> list[psutil.Process]:
    """Every process on this machine that runs this job's payload (by its output folder, so that no other test's
    job counts), whoever its parent is now: an orphan is reparented, and still counts."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if PAYLOAD in cmd and str(out) in cmd and p.pid != launcher.pid:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.NoSuchProcess:
                pass
    return found


@pytest.mark.launches
def test_sigterm_to_the_local_launcher_ends_every_rank(tmp_path):
    out = tmp_path / "out"
    args = ["jobs/pytorch-resnet50-synthetic.yaml", "--target", "local", "--np", "2", "--controller", "gloo"]
    args += ["--output-dir", str(out), "--"]
    # Long enough to be training when the signal comes (many epochs of a tiny model), checkpoints every epoch.
    args += ["--model", "tiny_cnn", "--image-size", "16", "--num-classes", "4", "--synthetic-samples", "64"]
    args += ["--batch-size", "8", "--epochs", "100000", "--workers", "0", "--threads", "1"]
    log = (tmp_path / "launcher.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True
    )
    launcher = psutil.Process(proc.pid)
    try:
        deadline = time.monotonic() + 180
        checkpoints = out / "run" / "checkpoints"
        while not (checkpoints.is_dir() and any(checkpoints.glob("checkpoint-epoch-*"))):
            assert proc.poll() is None, pathlib.Path(log.name).read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 180 s: " + pathlib.Path(log.name).read_text()
            time.sleep(0.5)
        ranks = _job_processes(launcher, out)
        assert len(ranks) >= 2, [p.cmdline() for p in ranks]  # both ranks are training

        started = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=60)
        # The launcher returned only after its job's processes ended; allow the OS a moment to reap them.
        gone, alive = psutil.wait_procs(ranks, timeout=5)
        left = _job_processes(launcher, out)
        took = time.monotonic() - started
        survivors = [
            f"{p.pid}: {' '.join(p.cmdline())[:200]}"
            for p in {q.pid: q for q in alive + left}.values()
            if p.is_running()
        ]
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in _job_processes(launcher, out):
            p.kill()
    text = pathlib.Path(log.name).read_text()
    assert not survivors, "left training after SIGTERM:\n" + "\n".join(survivors) + "\n" + text[-3000:]
    assert code == 128 + signal.SIGTERM, text[-3000:]
    assert "local job stopped by SIGTERM" in text and "no process of it is left" in text, text[-3000:]
    assert took < 45, took  # the grace (30 s) bounds it; the ranks end on SIGTERM at once
