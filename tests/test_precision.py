"""What `--amp-dtype auto` picks on each device, with CUDA's capability faked on this CPU. Why the GPU's pick is
what it is: the recorded GPU figures (docs/benchmarks.md#one-gpu)."""

import pytest
import torch

from payloads.common.errors import ConfigError
from payloads.pytorch import precision

CUDA = torch.device("cuda")


@pytest.fixture
def gpu(monkeypatch):
    """A GPU of a given compute capability, as far as precision.choose asks."""

    def make(major: int, minor: int = 0) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: major >= 8)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"GPU {major}.{minor}")

    return make


@pytest.mark.parametrize("capability", [(7, 0), (7, 5), (8, 0), (9, 0), (10, 0)])
def test_auto_on_every_gpu_is_fp16_with_the_loss_scaler(gpu, capability):
    gpu(*capability)
    chosen = precision.choose(CUDA, amp=None)
    assert (chosen.name, chosen.needs_scaler, chosen.device_type) == ("fp16", True, "cuda")


def test_auto_with_adasum_takes_bf16_where_the_gpu_has_it_and_no_autocast_below(gpu):
    gpu(9, 0)
    chosen = precision.choose(CUDA, amp=None, adasum=True)
    assert (chosen.name, chosen.needs_scaler) == ("bf16", False)
    gpu(7, 0)
    assert precision.choose(CUDA, amp=None, adasum=True).name == "fp32"
    with pytest.raises(ConfigError, match="--adasum cannot be combined with fp16"):
        precision.choose(CUDA, amp=True, adasum=True)


def test_bf16_asked_for_on_a_gpu_without_it_is_refused_with_the_fix(gpu):
    gpu(7, 5)
    with pytest.raises(ConfigError, match="no bfloat16 support.*--amp-dtype fp16 or auto"):
        precision.choose(CUDA, amp=True, amp_dtype="bf16")


def test_the_cpu_runs_fp32_unless_asked_and_then_bf16():
    cpu = torch.device("cpu")
    assert precision.choose(cpu, amp=None).name == "fp32"
    assert precision.choose(cpu, amp=True).name == "bf16"
    assert precision.choose(cpu, amp=True, amp_dtype="fp16").needs_scaler
