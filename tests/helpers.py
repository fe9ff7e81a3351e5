"""Shared helpers: run the payload as real processes, the way users and jobs do."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

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

# The float32 reference runs of the PyTorch averaging tests (conftest.fp32_references): the CPU's defaults spelled
# out, 3 epochs of tiny_cnn.
FP32_REFERENCE_ARGS = ["--epochs", "3", "--no-amp", "--no-channels-last"]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "60")
    e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return e


def python_m(module: str) -> list[str]:
    """What each rank runs: `python -m MODULE`, with the environment's interpreter, as jobs start it."""
    return [sys.executable, "-m", module]


def horovodrun(np: int, args: list[str], payload: str = "pytorch") -> list[str]:
    return [
        str(pathlib.Path(sys.executable).with_name("horovodrun")),
        "-np",
        str(np),
        "-H",
        f"localhost:{np}",
        "--gloo",
        *python_m(f"payloads.{payload}.train"),
        *args,
    ]


def torchrun(np: int, args: list[str], payload: str = "pytorch") -> list[str]:
    """The payload under PyTorch DDP: torchrun starts np processes here (--standalone: its own rendezvous on a free
    port), each with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; Gloo on this CPU."""
    return [str(pathlib.Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", str(np),
            "-m", f"payloads.{payload}.train", "--backend", "ddp", *args]  # fmt: skip


def train(
    np: int,
    args: list[str],
    timeout: float = 300,
    check: bool = True,
    payload: str = "pytorch",
    backend: str = "horovod",
    prefix: list[str] = (),
) -> subprocess.CompletedProcess:
    """`prefix`: a command the launch runs under (a private mount namespace, say)."""
    launch = horovodrun(np, args, payload) if backend == "horovod" else torchrun(np, args, payload)
    cmd = [*prefix, *launch]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)
    record_launch(np, args, payload, proc.returncode)
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def one_process_references(root: pathlib.Path, flags: list[str] = ()) -> tuple[pathlib.Path, pathlib.Path]:
    """(1 process x 32 at LR 0.1, the control: 1 process x 16 at LR 0.1, no averaging to speak of) under `root`: what
    a two-process averaging run (2 x 16 at base LR 0.05, FP32_REFERENCE_ARGS and the same flags) is held to."""
    one, control = root / "one", root / "control"
    common = TINY + FP32_REFERENCE_ARGS + list(flags)
    train(1, common + ["--batch-size", "32", "--base-lr", "0.1", "--output-dir", str(one)])
    train(1, common + ["--batch-size", "16", "--base-lr", "0.1", "--output-dir", str(control)])
    return one, control


def assert_same_final_weights(a_out: pathlib.Path, b_out: pathlib.Path) -> None:
    """The two runs' last checkpoints hold bitwise equal weights, key for key."""
    import torch

    a, b = final_weights(a_out), final_weights(b_out)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


def max_diff(a: dict, b: dict) -> float:
    """The largest absolute difference between two state dicts' tensors (the same keys), in float64."""
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


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


def stop_at_env(after: int, ranks: list[int], within: pathlib.Path | None = None, hold: bool = False) -> dict:
    """env() with tests/stop_at: the ranks in `ranks` send themselves SIGTERM after step `after` (hold: wait there
    for a signal from outside instead), only in a run whose --output-dir contains `within`, when given."""
    return hook_env(
        "stop_at", STOP_AT=str(after), STOP_RANKS=",".join(map(str, ranks)), STOP_IN=str(within or ""),
        STOP_HOLD="1" if hold else "",
    )  # fmt: skip


def alive(pids) -> list[int]:
    """Those of `pids` still running or stopped: a zombie has ended (and a test never reaps its grandchildren)."""
    import contextlib

    import psutil

    left = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
    return left


def wait_until(proc: subprocess.Popen, ready, what: str, timeout: float = 120, every: float = 0.1):
    """Polls `ready()` until it returns something true, which is returned; fails naming `what` if the process ends
    or `timeout` seconds pass first."""
    import time

    deadline = time.monotonic() + timeout
    while not (got := ready()):
        assert proc.poll() is None and time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(every)
    return got


def wait_for_steps(proc: subprocess.Popen, out: pathlib.Path, steps: int, timeout: float = 120) -> list[dict]:
    """Until both ranks' heartbeats in `out` show `steps` steps (the process still running); their heartbeats."""

    def beats():
        got = [_beat(out, r) for r in (0, 1)]
        return got if all(b and b["steps"] >= steps for b in got) else None

    return wait_until(proc, beats, f"both heartbeats at {steps} steps", timeout)


def stopped_run(
    out: pathlib.Path, args: list[str], backend: str, signalled: list[int], payload: str = "pytorch", after: int = 1
) -> subprocess.CompletedProcess:
    """A two-process run whose ranks in `signalled` send themselves SIGTERM after step `after` (tests/stop_at). The
    agreement window is the payload's: its first window is one step, so `after` 1 stops every rank at step 1, and
    a signal at an epoch's last step stops at that epoch's checkpoint."""
    args = args + ["--output-dir", str(out)]
    cmd = horovodrun(2, args, payload) if backend == "horovod" else torchrun(2, args, payload)
    proc = subprocess.run(cmd, cwd=ROOT, env=stop_at_env(after, signalled), capture_output=True, text=True, timeout=300)
    record_launch(2, args, payload, proc.returncode)
    return proc


def stop_lines(text: str) -> list[str]:
    """The lines in which each rank says it stopped and how to resume."""
    return [line for line in text.splitlines() if "stopped by " in line and "run the same command again" in line]


def check_resume_is_exact(
    tmp_path: pathlib.Path,
    args: list[str],
    backend: str,
    signalled: list[int],
    payload: str = "pytorch",
    steps_per_epoch: int = 40,
    same: str | None = None,
) -> dict:
    """Issue 31's exactness procedure, one for every payload: the run uninterrupted; the same run stopped by
    SIGTERM mid-epoch, at step 1 (every rank says so, exit 75, a mid-epoch checkpoint holding the position, data
    order and every rank's random states); resumed from it, it ends bitwise equal to the uninterrupted run. Returns the stopped checkpoint's state. `same`: the key of the straight and resumed runs'
    records in tests/same_numbers."""
    import torch

    from payloads.common import checkpoint, preemption

    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(2, args + ["--output-dir", str(straight)], backend=backend, payload=payload)

    proc = stopped_run(stopped, args, backend, signalled, payload)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    # Every rank says it, with the same checkpoint, signalled or not, each on its own line.
    lines = stop_lines(text)
    assert len(lines) == 2, text[-4000:]
    assert f"(exit {preemption.EXIT_CODE})" in lines[0]
    found = checkpoint.latest(stopped / "checkpoints", ".pt")
    assert found, text[-3000:]
    epochs, step = checkpoint.position(found[1])
    assert (epochs, step) == (0, 1), found[1].name  # the first agreement: the signal came at step 1
    assert all(found[1].name in line for line in lines), lines
    state = torch.load(found[1], map_location="cpu", weights_only=False)
    assert (state["epoch"], state["step"], len(state["rng"]), len(state["rank_buffers"])) == (epochs, step, 2, 2)
    assert state["steps_per_epoch"] == steps_per_epoch
    assert state["data_order"] == {"seed": 42, "epoch": epochs, "skip": step}

    resumed = train(2, args + ["--output-dir", str(stopped)], backend=backend, payload=payload)
    assert f"({epochs} epochs done, {step} steps of epoch {epochs + 1})" in resumed.stdout + resumed.stderr
    assert_same_final_weights(straight, stopped)
    if same:  # the numbers of the code before the one-loop change (tests/same_numbers.py)
        import same_numbers

        same_numbers.check(f"{same}/straight", straight)
        same_numbers.check(f"{same}/resumed", stopped)
    return state


def ending_of(out: pathlib.Path, returncode: int, size: int = 2):
    """(how the launcher's auto-resume reads a run that ended with `returncode`, what it decides on a fresh chain):
    the decision table held against a real run's folder (launcher/endings.py, autoresume.py)."""
    from launcher import autoresume, endings

    status = "Completed" if returncode == 0 else "Failed"
    ending = endings.classify(status, returncode, endings.local_reader(out), size)
    return ending, autoresume.decide(ending, autoresume.Chain("test", budget=3), 0.0)


def learnable_tree(root, classes=4, per_class=12, seed=0, sizes=(18, 30)):
    """Each class a colour, each image that colour plus noise, of varied sizes: the loss can fall."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    colours = rng.integers(0, 256, (classes, 3))
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            h, w = rng.integers(*sizes, 2)
            noise = rng.normal(0, 20, (h, w, 3))
            Image.fromarray(np.clip(colours[c] + noise, 0, 255).astype(np.uint8)).save(root / f"class{c}" / f"{i}.jpg")
    return root
