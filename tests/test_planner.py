"""The scaling planner (benchmarks/planner.py): its calibration on the seed figures and its commands. The model
itself: tests/infra/test_scaling.py."""

import re
import subprocess
import sys

import pytest
from helpers import ROOT

from benchmarks import planner
from trainingplatform import scaling, vm_sizes


def test_planner_reproduces_the_seed_figures_it_was_not_fitted_on():
    t = planner.calibrate()
    for gpu in planner.CHECK_ON:
        _, r1, r32 = planner.SEED[gpu]
        predicted = scaling.efficiency(32, 4, 64, r1, scaling.RESNET50_BYTES, t, False) * 32 * r1
        assert abs(predicted - r32) / r32 < 0.05, (gpu, predicted, r32)


def test_a_cpu_staged_mpi_allreduce_scales_worse_than_nccl():
    h100 = scaling.nccl_transport(vm_sizes.CATALOG["Standard_ND96isr_H100_v5"])
    slow = planner.host_mpi(0.8, 0.0)
    ring = scaling.efficiency(64, 8, 64, 3000, scaling.RESNET50_BYTES, h100, False)
    assert scaling.efficiency(64, 8, 64, 3000, scaling.RESNET50_BYTES, slow, False) < ring


@pytest.mark.launches
def test_planner_command_rejects_a_cpu_size():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.planner", "--vm-size", "Standard_D4s_v5", "--gpu-images-per-sec", "100"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "not a GPU size" in proc.stderr


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
    assert {k for k, v in rows.items() if v[2] == "fit"} == {scaling.OVERHEAD_FIT_ON}
    assert {k for k, v in rows.items() if v[2] == "check"} == set(scaling.DLE_8GPU) - {scaling.OVERHEAD_FIT_ON}
    for name, (_, r1, r8) in scaling.DLE_8GPU.items():
        shown, predicted, _ = rows[name]
        assert abs(shown - r8 / r1) < 0.01, name  # the measured column is the README's (test_scaling.py)
        if name != scaling.OVERHEAD_FIT_ON:
            assert abs(predicted - r8 / r1) / (r8 / r1) < 0.06, name
