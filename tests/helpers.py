"""Shared helpers: run the payload as real processes, the way users and jobs do."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import warm_start

ROOT = pathlib.Path(__file__).resolve().parents[1]


# Small enough to train in seconds on 2 cores, learnable enough that the loss falls.
TINY = [
    "--model",
    "tiny_cnn",
    "--image-size",
    "16",
    "--num-classes",
    "4",
    "--synthetic-samples",
    "128",
    "--workers",
    "0",
    "--threads",
    "1",
    "--no-progress",
    "--warmup-epochs",
    "0",
    "--base-lr",
    "0.05",
]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "60")
    e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return e


def python(*frameworks: str) -> str:
    """The interpreter for a test whose code under test starts the payload itself (`python -m launcher ...`, the GPU
    benchmark, mpirun): its `python -m payloads...` ranks of these frameworks (default PyTorch) are warm-started
    (warm_start.interpreter); sys.executable under TEST_WARM_START=0."""
    return warm_start.interpreter(env(), frameworks or ("torch",))


def python_m(module: str, warm: bool | None = None) -> list[str]:
    """What each rank runs: `python -m MODULE`, or its warm-started form (tests/warm_start.py: forked from a
    process that imported the framework once; TEST_WARM_START=0 or warm=False: cold)."""
    if warm is None:
        warm = warm_start.enabled()
    return warm_start.command(module, env()) if warm else [sys.executable, "-m", module]


def horovodrun(np: int, args: list[str], payload: str = "pytorch", warm: bool | None = None) -> list[str]:
    if "--xla" in args:  # TensorFlow reads TF_XLA_FLAGS, which --xla sets on a CPU, at import: cold (warm_start.py)
        warm = False
    return [
        str(pathlib.Path(sys.executable).with_name("horovodrun")),
        "-np",
        str(np),
        "-H",
        f"localhost:{np}",
        "--gloo",
        *python_m(f"payloads.{payload}.train", warm),
        *args,
    ]


def torchrun(np: int, args: list[str], payload: str = "pytorch", warm: bool | None = None) -> list[str]:
    """The payload under PyTorch DDP: torchrun starts np processes here (--standalone: its own rendezvous on a free
    port), each with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; Gloo on this CPU. Warm, torchrun
    itself (torch.distributed.run, the console script's module) is a warm-started process too, and each rank it
    starts is `python -u warm_client.py ...`."""
    if warm is None:
        warm = warm_start.enabled()
    options = ["--standalone", "--nproc-per-node", str(np)]
    if not warm:
        return [str(pathlib.Path(sys.executable).with_name("torchrun")), *options, "-m", f"payloads.{payload}.train",
                "--backend", "ddp", *args]  # fmt: skip
    client = warm_start.command(f"payloads.{payload}.train", env())
    launcher = [*client[:-1], "torch.distributed.run"]  # the same server: torchrun needs PyTorch too
    return [*launcher, *options, *client[2:], "--backend", "ddp", *args]


def train(
    np: int,
    args: list[str],
    timeout: float = 300,
    check: bool = True,
    payload: str = "pytorch",
    backend: str = "horovod",
    prefix: list[str] = (),
) -> subprocess.CompletedProcess:
    """`prefix`: a command the launch runs under (a private mount namespace, say): cold, since a warm rank would be
    forked outside it (warm_start.py refuses that)."""
    warm = False if prefix else None
    launch = horovodrun(np, args, payload, warm) if backend == "horovod" else torchrun(np, args, payload, warm)
    cmd = [*prefix, *launch]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)
    record_launch(np, args, payload, proc.returncode)
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def metrics(out: pathlib.Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def final_weights(out: pathlib.Path) -> dict:
    import torch

    from payloads.common import checkpoint

    epoch, path = checkpoint.latest(out / "checkpoints", ".pt")
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


# Every payload launch of the session, for the device rule (conftest.py, pytest_sessionfinish): one JSON line each.
LAUNCH_LOG = "TEST_LAUNCH_LOG"


def record_launch(np: int, args: list[str], payload: str, returncode: int) -> None:
    path = os.environ.get(LAUNCH_LOG)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"np": np, "args": list(args), "payload": payload, "rc": returncode}) + "\n")


def uncovered_device_values(launches: list[dict], device_dependent: dict) -> list[str]:
    """The device-dependent flag values (payloads/common/config.py, DEVICE_DEPENDENT) that no successful launch of
    two or more processes passed: the rule is that each value trains distributed, not that it appears in a test
    (a refusal test or a one-process run names a flag without running its gradients through Horovod or DDP)."""

    def passes(args: list[str], value: tuple[str, ...]) -> bool:
        n = len(value)
        return any(tuple(args[i : i + n]) == value for i in range(len(args) - n + 1))

    return [
        f"{name}: {' '.join(value)}"
        for name, values in device_dependent.items()
        for value in values
        if value and not any(r["np"] >= 2 and r["rc"] == 0 and passes(r["args"], value) for r in launches)
    ]


def _beat(out: pathlib.Path, rank: int) -> dict | None:
    try:
        return json.loads((out / "progress" / f"rank{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def hook_env(folder: str, **variables: str) -> dict:
    """env() with the sitecustomize hook in tests/<folder> loaded by every process started with it, and its
    variables set."""
    e = env()
    e["PYTHONPATH"] = str(ROOT / "tests" / folder) + os.pathsep + e["PYTHONPATH"]
    e.update(variables)
    return e


def stop_at_env(after: int, ranks: list[int], within: pathlib.Path | None = None) -> dict:
    """env() with tests/stop_at: the ranks in `ranks` wait after step `after` for their signal (only in a run whose
    --output-dir contains `within`, when given), and every rank agrees after every step."""
    return hook_env("stop_at", STOP_AT=str(after), STOP_RANKS=",".join(map(str, ranks)), STOP_IN=str(within or ""))


def wait_for_steps(proc: subprocess.Popen, out: pathlib.Path, steps: int, timeout: float = 120) -> list[dict]:
    """Until both ranks' heartbeats in `out` show `steps` steps (the process still running); their heartbeats."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        beats = [_beat(out, r) for r in (0, 1)]
        if all(b and b["steps"] >= steps for b in beats):
            return beats
        assert proc.poll() is None and time.monotonic() < deadline, "no progress"
        time.sleep(0.1)


def stopped_run(
    out: pathlib.Path, args: list[str], backend: str, signalled: list[int], payload: str = "pytorch", after: int = 10
) -> tuple[subprocess.CompletedProcess, float]:
    """A two-process run, SIGTERM sent to the ranks in `signalled` (by the pids their heartbeats give) once both
    show `after` steps; returns its output and the seconds from the signal to its end. Paced by tests/stop_at: the
    signalled ranks wait after step `after` for the signal and the ranks agree after every step, so they stop at
    step `after` of the first epoch whatever the machine's speed."""
    import signal
    import time

    args = args + ["--output-dir", str(out)]
    cmd = horovodrun(2, args, payload) if backend == "horovod" else torchrun(2, args, payload)
    e = stop_at_env(after, signalled)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        beats = wait_for_steps(proc, out, after)
        for r in signalled:
            os.kill(beats[r]["pid"], signal.SIGTERM)
        sent = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        ended = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    record_launch(2, args, payload, proc.returncode)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), ended


def check_resume_is_exact(
    tmp_path: pathlib.Path,
    args: list[str],
    backend: str,
    signalled: list[int],
    payload: str = "pytorch",
    steps_per_epoch: int = 40,
    after: int = 10,
    same: str | None = None,
) -> dict:
    """Issue 31's exactness procedure, one for every payload: the run uninterrupted; the same run stopped by
    SIGTERM mid-epoch (every rank says so, exit 75, within the 30 s grace, a mid-epoch checkpoint holding the
    position, data order and every rank's random states); resumed from it, it ends bitwise equal to the
    uninterrupted run. Returns the stopped checkpoint's state. `same`: the key of the straight and resumed runs'
    records in tests/same_numbers."""
    import torch

    from payloads.common import checkpoint, preemption

    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(2, args + ["--output-dir", str(straight)], backend=backend, payload=payload)

    proc, seconds = stopped_run(stopped, args, backend, signalled, payload, after)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    # Every rank says it, with the same checkpoint, signalled or not, each on its own line.
    lines = [line for line in text.splitlines() if "stopped by " in line and "run the same command again" in line]
    assert len(lines) == 2, text[-4000:]
    assert f"(exit {preemption.EXIT_CODE})" in lines[0]
    assert seconds < 30, seconds  # the grace assumed for Azure ML (preemption.py)
    found = checkpoint.latest(stopped / "checkpoints", ".pt")
    assert found, text[-3000:]
    epochs, step = checkpoint.position(found[1])
    assert (epochs, step) == (0, after), found[1].name  # where the signal found the ranks (tests/stop_at)
    assert all(found[1].name in line for line in lines), lines
    state = torch.load(found[1], map_location="cpu", weights_only=False)
    assert (state["epoch"], state["step"], len(state["rng"]), len(state["rank_buffers"])) == (epochs, step, 2, 2)
    assert state["steps_per_epoch"] == steps_per_epoch
    assert state["data_order"] == {"seed": 42, "epoch": epochs, "skip": step}

    resumed = train(2, args + ["--output-dir", str(stopped)], backend=backend, payload=payload)
    assert f"({epochs} epochs done, {step} steps of epoch {epochs + 1})" in resumed.stdout + resumed.stderr
    a, b = final_weights(straight), final_weights(stopped)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different
    if same:  # the numbers of the code before the one-loop change (tests/same_numbers.py)
        import same_numbers

        same_numbers.check(f"{same}/straight", straight)
        same_numbers.check(f"{same}/resumed", stopped)
    return state
