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
