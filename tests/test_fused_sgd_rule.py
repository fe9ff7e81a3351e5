"""CUDA's fused SGD layout rule, applied on the CPU: the rule itself (payloads.pytorch.runtime.fused_layout_problem)
refuses what check_fast_path_restrictions refuses, and the hook in tests/gpu_rules makes a CPU process die on such
a step as a GPU process would. test_device_defaults.py runs the channels_last resume under the hook."""

import os
import pathlib
import subprocess

import pytest
import torch
from helpers import ROOT, env, python_m

from payloads.pytorch.runtime import fused_layout_problem, same_layout

HOOK = pathlib.Path(__file__).with_name("gpu_rules")


def test_the_rule_refuses_other_strides_and_ignores_size_one_dimensions():
    w = torch.randn(8, 4, 3, 3).to(memory_format=torch.channels_last)
    assert fused_layout_problem([w], [torch.zeros_like(w)], [torch.zeros_like(w)]) is None
    refused = fused_layout_problem([w], [torch.zeros(8, 4, 3, 3)], [torch.zeros_like(w)])
    assert refused and "same dtype, device, and layout" in refused and "(36, 1, 12, 4)" in refused
    # A 1x1 kernel: channels_last and contiguous strides differ only where the size is 1.
    k = torch.randn(8, 4, 1, 1)
    assert k.stride() != k.to(memory_format=torch.channels_last).stride()
    assert same_layout(k, k.to(memory_format=torch.channels_last))
    assert fused_layout_problem([k], [k.to(memory_format=torch.channels_last)]) is None
    assert fused_layout_problem([w], [w.half()]) is not None  # dtype
    assert fused_layout_problem([w], [w[:, :, :2]]) is not None  # size


# What horovod/torch/functions.py broadcast_optimizer_state did on a rank with no optimizer state: a step on
# gradients made by p.data.new(p.size()).zero_(), in the default layout.
ZERO_GRAD_STEP = """
import torch
m = torch.nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=True)
for p in m.parameters():
    p.grad = p.data.new(p.size()).zero_()
opt.step()
print("stepped")
"""


@pytest.mark.launches
@pytest.mark.parametrize("hooked", [True, False])
def test_the_hook_makes_a_cpu_process_refuse_horovods_seeding_step(tmp_path, hooked):
    e = env()
    (tmp_path / "zero_grad_step.py").write_text(ZERO_GRAD_STEP)
    e["PYTHONPATH"] = str(tmp_path) + os.pathsep + e["PYTHONPATH"]
    if hooked:
        e["PYTHONPATH"] = str(HOOK) + os.pathsep + e["PYTHONPATH"]
        e["FUSED_SGD_STRIDE_CHECK"] = "1"
    proc = subprocess.run(python_m("zero_grad_step"), cwd=ROOT, env=e, capture_output=True, text=True, timeout=120)
    if hooked:
        assert proc.returncode != 0 and "must have same dtype, device, and layout" in proc.stderr, proc.stderr
    else:  # the CPU kernel alone takes it: why the hook exists
        assert proc.returncode == 0 and "stepped" in proc.stdout, proc.stderr
