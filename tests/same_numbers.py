"""The same seeds give the same numbers (issue 40, item 7): a run's per-epoch figures and every tensor of its last
checkpoint, compared bitwise with what the code before the one-loop change produced for the same run.

`check(key, out)` is called at the end of the tests that already make these runs (no extra launch): it
fingerprints the run in `out` and compares the fingerprint with tests/same_numbers/<key>.json. The records were
written by the same tests on the code before the change (`TEST_RECORD_NUMBERS=1 scripts/test -k ...` on
that commit, named in each record). Bitwise equality holds on one CPU kind and one torch: another instruction set
picks other kernels (oneDNN, ATen's vectorised loops), so where the record's torch or CPU capability differs from
this machine's the comparison cannot be made, and the test says so (pytest.skip) after its own assertions.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent / "same_numbers"
RECORD = "TEST_RECORD_NUMBERS"
# The training figures of an epoch's record; timings (seconds, images/sec, phase times) vary by run.
FIGURES = (
    "train_loss",
    "train_accuracy",
    "val_loss",
    "val_accuracy",
    "images",
    "skipped_images",
    "val_skipped_images",
    "lr",
    "resumed_at_step",
    "train_pixel_accuracy",
    "train_miou",
    "train_iou",
    "train_confusion_matrix",
    "valid_pixels",
    "patches",
    "val_pixel_accuracy",
    "val_miou",
    "val_iou",
    "val_confusion_matrix",
)
# What a checkpoint holds that training computes (the config and backend name are not numbers).
STATE = ("epoch", "step", "steps_per_epoch", "model", "optimizer", "scaler", "rng", "rank_buffers")


def _digest(value, h) -> None:
    """Feed `value` into `h`: tensors and arrays by dtype, shape and bytes (logical order), containers in order."""
    import numpy as np
    import torch

    if torch.is_tensor(value):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        h.update(f"A{value.dtype}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        h.update(b"{")
        for k, v in value.items():
            h.update(repr(k).encode())
            _digest(v, h)
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for v in value:
            _digest(v, h)
        h.update(b"]")
    else:
        h.update(repr(value).encode())


def fingerprint(out: pathlib.Path) -> dict:
    import torch

    from payloads.common import checkpoint

    m = json.loads((out / "metrics.json").read_text())
    _, path = checkpoint.latest(out / "checkpoints", ".pt")
    state = torch.load(path, map_location="cpu", weights_only=False)
    parts = {}
    for key in STATE:
        h = hashlib.sha256()
        value = state.get(key)
        if key == "rng":  # torch's generators; NumPy's and Python's global ones start from the OS's entropy
            value = [{k: r[k] for k in ("torch", "cuda")} for r in value]
        _digest(value, h)
        parts[key] = h.hexdigest()
    return {
        "epochs": [{k: e[k] for k in FIGURES if k in e} for e in m["epochs"]],
        "parameters_sha256": m["summary"]["parameters_sha256"],
        "checkpoint": path.name,
        "checkpoint_sha256": parts,
    }


def machine() -> dict:
    import platform

    import torch

    # The instruction-set flags too: two CPUs of one capability (AVX512) pick other oneDNN kernels where one has
    # AMX, VNNI or FP16 and the other not (records of one such machine differed here in the 8th digit).
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    isa = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c")))
    return {
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "arch": platform.machine(),
        "isa": " ".join(isa),
    }


def check(key: str, out: pathlib.Path) -> None:
    """Compare the run in `out` with the record `key` (or write the record under TEST_RECORD_NUMBERS=1)."""
    path = HERE / f"{key.replace('/', '--')}.json"
    now = fingerprint(out)
    if os.environ.get(RECORD) == "1":
        HERE.mkdir(exist_ok=True)
        commit = os.popen(f"git -C {HERE.parent.parent} rev-parse --short HEAD").read().strip()
        path.write_text(json.dumps({"key": key, "commit": commit, "machine": machine(), **now}, indent=1) + "\n")
        return
    assert path.exists(), f"no record {path.name}: write it on the code before the change with {RECORD}=1"
    record = json.loads(path.read_text())
    if record["machine"] != machine():
        pytest.skip(f"numbers recorded on {record['machine']}, this machine is {machine()}: not comparable bitwise")
    assert now["epochs"] == record["epochs"], (key, now["epochs"], record["epochs"])
    assert now["checkpoint"] == record["checkpoint"], key
    differ = [k for k in STATE if now["checkpoint_sha256"][k] != record["checkpoint_sha256"][k]]
    assert not differ, f"{key}: the last checkpoint's {differ} differ from the code before the change"
    assert now["parameters_sha256"] == record["parameters_sha256"], key
