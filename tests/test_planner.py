"""The scaling planner's model (arithmetic, no timing)."""
import subprocess
import sys

from benchmarks import planner
from helpers import ROOT


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


def test_planner_command_rejects_a_cpu_size():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.planner", "--vm-size", "Standard_D4s_v5",
                           "--gpu-images-per-sec", "100"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "not a GPU size" in proc.stderr
