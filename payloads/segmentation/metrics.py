"""Segmentation metrics from a confusion matrix: pixel accuracy, per-class IoU, mean IoU.

Every rank counts its own pixels into a C x C matrix (rows: true class, columns: predicted class; no-data
pixels are not counted); the matrices are summed over ranks (an allreduce of integers, so exact), and the
scores are computed once from the sum. IoU of class c = intersection / union = M[c,c] / (row c + column c
- M[c,c]): averaging per-rank IoUs instead would be wrong whenever ranks hold different pixel counts.
"""

from __future__ import annotations

import math

import torch

from .labels import IGNORE


def confusion(predicted: torch.Tensor, target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """C x C int64 counts of (target, predicted) over pixels whose target is not IGNORE."""
    valid = target != IGNORE
    index = target[valid] * num_classes + predicted[valid]
    return torch.bincount(index.flatten(), minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def allreduce(backend, matrix: torch.Tensor, name: str) -> torch.Tensor:
    """The sum of every rank's matrix (int64: exact); `backend` is payloads/pytorch/backends.py's."""
    return backend.allreduce_sum(matrix.cpu().to(torch.int64), name)


def scores(matrix: torch.Tensor, class_names: list[str] | tuple[str, ...]) -> dict:
    """Pixel accuracy, IoU per class (None for a class absent from both truth and prediction) and their mean."""
    m = matrix.to(torch.float64)
    total = m.sum().item()
    inter = m.diag()
    union = m.sum(0) + m.sum(1) - inter
    iou = {name: (inter[c].item() / union[c].item() if union[c] > 0 else None) for c, name in enumerate(class_names)}
    present = [v for v in iou.values() if v is not None]
    return {
        "pixel_accuracy": inter.sum().item() / total if total else math.nan,
        "iou": iou,
        "miou": sum(present) / len(present) if present else math.nan,
        "confusion_matrix": matrix.to(torch.int64).tolist(),
    }
