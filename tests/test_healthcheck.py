"""The health check judges what it measures, and every payload refuses a GPU node whose GPUs it cannot see.

All with 2 real processes (horovodrun), on this CPU-only machine: no driver, no CUDA, no NCCL, no
InfiniBand, which the health check must report as such.
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

import helpers
from helpers import ROOT, TINY, train
from payloads import healthcheck
from payloads.common import devices


def healthcheck_run(tmp_path, *args: str, env: dict | None = None, np: int = 2) -> subprocess.CompletedProcess:
    cmd = [str(pathlib.Path(sys.executable).with_name("horovodrun")), "-np", str(np),
           "-H", f"localhost:{np}", "--gloo", sys.executable, "-m", "payloads.healthcheck", "--sizes-mb", "1,2",
           "--iterations", "2", "--output", str(tmp_path / "allreduce.json"), *args]
    e = helpers.env()
    e.pop(healthcheck.MIN_BUSBW, None)
    e.pop(devices.GPUS_PER_NODE, None)
    e.update(env or {})
    return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=180)


def test_passes_above_the_floor_and_reports_what_it_saw(tmp_path):
    proc = healthcheck_run(tmp_path, env={healthcheck.MIN_BUSBW: "0.0001"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    assert report["passed"] is True and report["processes"] == 2 and report["failures"] == []
    bw = report["bandwidth"]
    assert bw["judged"] is True and bw["ok"] is True and bw["min_busbw_gbytes_per_sec"] == 0.0001
    assert bw["judged_mbytes"] == 2 and bw["busbw_gbytes_per_sec"] == report["results"][-1]["bus_gbytes_per_sec"] > 0
    # no GPU, no driver, no InfiniBand here: said so, in the report and in the log
    (node,) = report["node_facts"]
    assert (node["driver"], node["cuda"], node["nccl"], node["gpus_visible"]) == ("none", "none", "none", 0)
    assert node["infiniband_devices"] == []
    assert "driver none, CUDA none, NCCL none, 0 GPUs, InfiniBand devices: none" in proc.stdout
    assert "healthcheck passed" in proc.stdout


def test_fails_below_the_floor_naming_the_measurement_and_the_floor(tmp_path):
    """A floor no CPU pair can reach (1000 GB/s): the job fails, and says by how much and why it may be."""
    proc = healthcheck_run(tmp_path, "--min-busbw", "1000")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    assert report["passed"] is False and report["bandwidth"]["ok"] is False
    assert all(r["correct"] for r in report["results"]), "the sums were right: only the bandwidth failed"
    assert "healthcheck FAILED: bus bandwidth" in proc.stdout and "below the floor of 1000 GB/s" in proc.stdout
    assert "NET/IB" in proc.stdout, "the message says where to look"


def test_without_a_floor_bandwidth_is_reported_not_judged(tmp_path):
    proc = healthcheck_run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    assert report["bandwidth"]["judged"] is False and report["bandwidth"]["ok"] is None
    assert "bus bandwidth not judged: no floor for this VM size" in proc.stdout


def test_one_process_is_never_judged_on_bandwidth():
    results = [{"mbytes": 8.0, "bus_gbytes_per_sec": 0.0, "correct": True}]
    verdict, failures = healthcheck.judge(results, 1, 20.0)
    assert verdict["judged"] is False and failures == []


@pytest.mark.parametrize("value", ["fast", "-3", "0"])
def test_a_bad_floor_is_refused_before_anything_runs(value, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "payloads.healthcheck", "--output", str(tmp_path / "r.json")],
                          cwd=ROOT, env={**helpers.env(), healthcheck.MIN_BUSBW: value}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert f"{healthcheck.MIN_BUSBW} {value!r}: a bus bandwidth floor in GB/s" in proc.stderr
    assert not (tmp_path / "r.json").exists()


# ---- a GPU cluster's process that sees no GPU --------------------------------------------------------------

def _says_the_cause(text: str, framework: str) -> None:
    assert f"this node should have 1 GPUs ({devices.GPUS_PER_NODE}" in text
    assert f"but {framework} sees 0" in text
    assert "NVIDIA driver" in text and "Nothing was trained" in text


def test_health_check_refuses_a_gpu_node_without_visible_gpus(tmp_path):
    proc = healthcheck_run(tmp_path, env={devices.GPUS_PER_NODE: "1"})
    assert proc.returncode != 0
    _says_the_cause(proc.stderr, "PyTorch")
    assert not (tmp_path / "allreduce.json").exists(), "nothing measured"


@pytest.mark.parametrize("payload,framework", [("pytorch", "PyTorch"), ("tensorflow", "TensorFlow"),
                                               ("keras", "TensorFlow")])
def test_payloads_refuse_a_gpu_node_without_visible_gpus(tmp_path, monkeypatch, payload, framework):
    """Two real processes: each fails at start-up (before data or model) instead of training on the CPU."""
    monkeypatch.setenv(devices.GPUS_PER_NODE, "1")
    out = tmp_path / "run"
    proc = train(2, TINY + ["--epochs", "1", "--output-dir", str(out)], check=False, payload=payload)
    assert proc.returncode != 0
    _says_the_cause(proc.stderr, framework)
    assert not (out / "metrics.json").exists() and not list(out.glob("checkpoints/*")), "nothing was trained"


def test_the_message_names_the_driver_cuda_needs(monkeypatch):
    monkeypatch.setattr(devices, "driver_version", lambda: "550.54.15")
    with pytest.raises(devices.GpuError) as e:
        devices.require_gpus(0, 2, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "8"})
    msg = str(e.value)
    assert "driver (550.54.15) is older than CUDA 13.0 in the image needs (driver >= 580.65.06)" in msg
    assert "for 2 processes, one GPU each, but PyTorch sees 0" in msg


def test_enough_gpus_or_a_cpu_cluster_pass():
    devices.require_gpus(8, 8, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "8"})
    devices.require_gpus(2, 2, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "8"})   # 2 of 8 used
    devices.require_gpus(0, 2, "PyTorch", None, environ={devices.GPUS_PER_NODE: "0"})
    devices.require_gpus(0, 2, "PyTorch", None, environ={})
    with pytest.raises(devices.GpuError):
        devices.require_gpus(1, 2, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "2"})   # one short


def test_a_bad_gpu_count_names_the_variable():
    with pytest.raises(devices.ConfigError, match=f"{devices.GPUS_PER_NODE}='eight' is not a GPU count"):
        devices.expected_gpus({devices.GPUS_PER_NODE: "eight"})
