"""The scaling planner's model (arithmetic, no timing)."""

import re
import subprocess
import sys

import pytest
from helpers import ROOT

from benchmarks import planner


def test_planner_reproduces_the_seed_figures_it_was_not_fitted_on():
    t = planner.calibrate()
    for gpu in planner.CHECK_ON:
        _, r1, r32 = planner.SEED[gpu]
        predicted = planner.efficiency(32, 4, 64, r1, planner.RESNET50_BYTES, t, False) * 32 * r1
        assert abs(predicted - r32) / r32 < 0.05, (gpu, predicted, r32)


def test_model_basics():
    h100 = planner.nccl_transport(planner.vm_sizes.CATALOG["Standard_ND96isr_H100_v5"])
    eff = [planner.efficiency(n, 8, 64, 3000, planner.RESNET50_BYTES, h100, False) for n in (1, 8, 64, 512)]
    assert eff[0] == 1.0 and all(a >= b for a, b in zip(eff, eff[1:])), eff
    slow = planner.host_mpi(0.8, 0.0)
    ring = planner.efficiency(64, 8, 64, 3000, planner.RESNET50_BYTES, h100, False)
    assert planner.efficiency(64, 8, 64, 3000, planner.RESNET50_BYTES, slow, False) < ring


@pytest.mark.launches
def test_planner_command_rejects_a_cpu_size():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.planner", "--vm-size", "Standard_D4s_v5", "--gpu-images-per-sec", "100"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "not a GPU size" in proc.stderr


# NVIDIA/DeepLearningExamples PyTorch ResNet-50 v1.5 README, "Training performance" tables (img/s on 1 GPU, on 8
# GPUs), typed here from the README, not imported from the planner. The planner's overhead term is fitted on the
# A100 80GB AMP row (2470, 16621: "Mixed Precision Strong Scaling 6.72 x"), so that row cannot test it; the
# others can.
PUBLISHED = {
    "A100 80GB TF32": (938, 7248),
    "V100 16GB AMP": (1200, 8322),
    "V100 16GB FP32": (367, 2855),
    "V100 32GB AMP": (1156, 8056),
    "V100 32GB FP32": (356, 2766),
}
FITTED = {"A100 80GB AMP": (2470, 16621)}


def test_the_planners_copy_of_the_published_rows_is_the_readmes():
    assert {k: v[1:] for k, v in planner.DLE_8GPU.items()} == {**PUBLISHED, **FITTED}
    assert planner.OVERHEAD_FIT_ON in FITTED


def test_the_overhead_term_holds_on_the_published_rows_it_was_not_fitted_on():
    """V100 16/32 GB (AMP and FP32) and A100 TF32 from the same README: within 6% (the fit misses AMP on V100
    by +5.7%, FP32 by -3.4%); without the term the AMP rows were 15-19% too optimistic."""
    for name, (r1, r8) in PUBLISHED.items():
        measured = r8 / r1
        assert abs(planner.speedup_8(name) - measured) / measured < 0.06, name
        if "AMP" in name:
            assert abs(planner.speedup_8(name) - measured) < abs(planner.speedup_8(name, 0.0) - measured) / 2, name


@pytest.mark.launches
def test_overhead_command_prints_the_check_against_the_unfitted_rows():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.planner", "--check-overhead"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"(\S+ \S+ \S+)\s+\d+\s+([\d.]+)x\s+([\d.]+)x\s+\S+\s+\S+ \(\S+\)\s+(fit|check)$", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)), m.group(4))
    assert {k for k, v in rows.items() if v[2] == "fit"} == set(FITTED)
    assert {k for k, v in rows.items() if v[2] == "check"} == set(PUBLISHED)
    for name, (r1, r8) in PUBLISHED.items():
        shown, predicted, _ = rows[name]
        assert abs(shown - r8 / r1) < 0.01, name  # the measured column is the README's
        assert abs(predicted - r8 / r1) / (r8 / r1) < 0.06, name


def test_efficiency_now_falls_below_100_percent_from_8_to_64_gpus():
    h100 = planner.nccl_transport(planner.vm_sizes.CATALOG["Standard_ND96isr_H100_v5"])
    flat = planner.replace(h100, sync=0.0)
    for n in (8, 16, 32, 64):
        for hierarchical in (False, True):
            with_term = planner.efficiency(n, 8, 256, 3000, planner.RESNET50_BYTES, h100, hierarchical)
            assert planner.efficiency(n, 8, 256, 3000, planner.RESNET50_BYTES, flat, hierarchical) == 1.0
            assert 0.5 < with_term < 0.95, (n, hierarchical, with_term)
    effs = [planner.efficiency(n, 8, 256, 3000, planner.RESNET50_BYTES, h100, True) for n in (8, 16, 32, 64)]
    assert effs == sorted(effs, reverse=True)
