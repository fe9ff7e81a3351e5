"""Learning-rate schedule of Goyal et al. (2017), as Horovod's ImageNet examples use it.

The base LR is for one process; with N processes the global batch is N times larger, so the target
LR is base * N, reached by a linear warm-up from base over the first `warmup_epochs` epochs
(fractional, per step), then divided by 10 at each decay epoch.
"""

from __future__ import annotations

from collections.abc import Sequence


def learning_rate(
    base_lr: float,
    scale: float,
    epoch: int,
    step: int,
    steps_per_epoch: int,
    warmup_epochs: float = 5,
    decay_epochs: Sequence[int] = (30, 60, 80),
    decay_factor: float = 0.1,
) -> float:
    """LR for `step` (0-based) of `epoch` (0-based)."""
    progress = epoch + step / max(steps_per_epoch, 1)
    if warmup_epochs > 0 and progress < warmup_epochs:
        return base_lr * (1.0 + (scale - 1.0) * progress / warmup_epochs)
    passed = sum(1 for d in decay_epochs if epoch >= d)
    return base_lr * scale * decay_factor**passed
