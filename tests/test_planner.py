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


# ---- the planner's parameter-server model ------------------------------------------------------------------
S, B = 100e6, 3.125  # 100 MB of gradients, 25 Gbit/s


def test_ps_bandwidth_term_by_hand():
    # PS side 2 * 128 * 1e8 / (16 * 3.125e9) = 0.512 s beats the worker side 2 * 4 * 1e8 / 3.125e9 = 0.256 s
    assert planner.ps_bandwidth_seconds(128, 4, S, 16, B) == pytest.approx(0.512)
    # at 8 GPUs the PS side is 0.032 s: the node's 4 workers sharing its NIC are the bottleneck
    assert planner.ps_bandwidth_seconds(8, 4, S, 16, B) == pytest.approx(0.256)


def test_ps_step_time_by_hand():
    t = planner.Transport("test", B, 10.0, 50e-6, 0.75, 0.005)
    # compute 64 / 200 = 0.32 s; comm 0.512 + 2 * 50e-6 = 0.5121 s; hidden 0.75 * 0.32 * 2/3 = 0.16 s;
    # overhead 0.005 * log2(128) = 0.035 s
    step = 0.32 + (0.5121 - 0.16) + 0.035
    assert planner.ps_step_time(128, 4, 64, 200.0, S, t, 16) == pytest.approx(step)
    assert planner.ps_efficiency(128, 4, 64, 200.0, S, t, 16) == pytest.approx(0.32 / step)
    with pytest.raises(ValueError, match="at least 1 PS shard"):
        planner.ps_step_time(8, 4, 64, 200.0, S, t, 0)


def test_ps_efficiency_falls_with_gpus_for_a_fixed_shard_count():
    table = planner.compare_ps()
    for p in planner.PS_SHARDS:
        row = [table[f"ps{p}"][n] for n in planner.PS_COUNTS]
        assert all(a > b for a, b in zip(row, row[1:])), (p, row)


def test_seed_point_lies_between_one_shard_and_the_allreduce():
    """The seed's 50% at 128 GPUs: below the allreduce's prediction, above one shard's; shards_for finds the
    count where the model crosses it, and None where the workers' NICs cap the model below the target."""
    table = planner.compare_ps()
    assert table["ps1"][128] < 0.5 < table["hierarchical"][128]
    p = planner.shards_for(128, 0.5)
    c, t = planner.SOURCE_SETUP, planner.SOURCE_TRANSPORT
    eff = lambda shards: planner.ps_efficiency(128, c["per_node"], c["batch"], c["rate1"], c["grad_bytes"], t, shards)
    assert eff(p - 1) < 0.5 <= eff(p)
    assert planner.shards_for(128, 0.99) is None
