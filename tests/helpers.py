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


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "60")
    e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return e


def horovodrun(np: int, args: list[str], payload: str = "pytorch") -> list[str]:
    return [
        str(pathlib.Path(sys.executable).with_name("horovodrun")),
        "-np",
        str(np),
        "-H",
        f"localhost:{np}",
        "--gloo",
        sys.executable,
        "-m",
        f"payloads.{payload}.train",
        *args,
    ]


def torchrun(np: int, args: list[str], payload: str = "pytorch") -> list[str]:
    """The payload under PyTorch DDP: torchrun starts np processes here (--standalone: its own rendezvous on a free
    port), each with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; Gloo on this CPU."""
    return [
        str(pathlib.Path(sys.executable).with_name("torchrun")),
        "--standalone",
        "--nproc-per-node",
        str(np),
        "-m",
        f"payloads.{payload}.train",
        "--backend",
        "ddp",
        *args,
    ]


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
    cmd = [*prefix, *(horovodrun(np, args, payload) if backend == "horovod" else torchrun(np, args, payload))]
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
