"""The benchmarks that print figures run end to end (their figures are not judged here: see benchmarks/)."""

import json
import subprocess
import sys

import pytest
from helpers import ROOT, env

# starts training processes, one at a time: serial under xdist beside the launches (tests/conftest.py)
pytestmark = [pytest.mark.launches, pytest.mark.one_core]


def test_gpu_benchmark_runs_on_a_cpu_and_writes_every_row(tmp_path):
    """`python -m benchmarks.gpu` is meant for a GPU; --quick --device cpu runs the same code at toy sizes, so a
    GPU user never finds it broken."""
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--quick", "--device", "cpu", "--workers", "1", "--json", str(out)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    kinds = [r["kind"] for r in rows]
    assert kinds.count("ceiling") == 3 and {"payload", "pipeline", "real"} <= set(kinds), kinds
    assert {r["dtype"] for r in rows if r["kind"] == "ceiling"} == {"fp16", "bf16"}
    assert all(r["images_per_sec"] > 0 for r in rows)
    real = next(r for r in rows if r["kind"] == "real")
    assert real["ratio_to_synthetic"] > 0 and "of synthetic" in proc.stdout
    # How long each epoch's steps waited for input, beside the epoch's seconds (issue 29: where real data loses).
    epochs = len(real["epoch_images_per_sec"])
    assert len(real["epoch_seconds"]) == len(real["epoch_input_seconds"]) == epochs, real
    assert all(0 <= w < s for w, s in zip(real["epoch_input_seconds"], real["epoch_seconds"])), real
    assert "waits for input" in real["note"]
