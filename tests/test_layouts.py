"""Memory layouts of optimizer state: fused SGD needs each state tensor laid out like its parameter."""

import torch

from payloads.pytorch.checkpoints import align_state_layouts


def _step(fused: bool, momentum: torch.Tensor, align: bool) -> torch.Tensor:
    torch.manual_seed(0)
    weight = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    grad = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    p = torch.nn.Parameter(weight)
    p.grad = grad
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, fused=fused, foreach=not fused)
    opt.state[p]["momentum_buffer"] = momentum.clone()  # default layout, as resume leaves it
    if align:
        align_state_layouts(opt)
        assert opt.state[p]["momentum_buffer"].is_contiguous(memory_format=torch.channels_last)
    opt.step()
    return p.detach().contiguous()


def test_fused_sgd_with_a_momentum_in_another_layout_is_wrong_until_aligned():
    momentum = torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(1))
    reference = _step(False, momentum, align=False)  # foreach: per-element indexing, layout-safe
    unaligned = (_step(True, momentum, align=False) - reference).abs().max().item()
    aligned = (_step(True, momentum, align=True) - reference).abs().max().item()
    # If torch's fused kernel ever honours strides, the first assertion fails: the alignment is then harmless.
    assert unaligned > 1e-2, f"fused SGD now handles mixed layouts ({unaligned})"
    assert aligned < 1e-6, aligned
