"""Models by name: torchvision's ImageNet classifiers, plus small ones for CPU runs and tests.

Weights are never downloaded: training starts from a seeded random initialisation.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

_TORCHVISION = (
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "mobilenet_v3_small",
    "mobilenet_v3_large",
)


def _tiny_cnn(num_classes: int, image_size: int) -> nn.Module:
    # No batch norm: its per-rank batch statistics would make a 2-process run differ from a
    # 1-process run on the same global batch, which the averaging tests compare exactly.
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(32 * 16, num_classes),
    )


def _mlp(num_classes: int, image_size: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * image_size * image_size, 64), nn.ReLU(), nn.Linear(64, num_classes)
    )


def _torchvision(name: str) -> Callable[[int, int], nn.Module]:
    def build(num_classes: int, image_size: int) -> nn.Module:
        import torchvision.models

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)

    return build


MODELS: dict[str, Callable[[int, int], nn.Module]] = {
    **{name: _torchvision(name) for name in _TORCHVISION},
    "tiny_cnn": _tiny_cnn,
    "mlp": _mlp,
}


def build(name: str, num_classes: int, image_size: int) -> nn.Module:
    return MODELS[name](num_classes, image_size)


def gradient_bytes(model: nn.Module) -> int:
    """Bytes one fp32 allreduce of all gradients moves (ResNet-50: about 102 MB)."""
    return sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)


def parameters_digest(model: nn.Module) -> str:
    """Hash of every parameter's exact bytes: equal across ranks iff the weights are bitwise equal. Parameters
    only: batch norm's running statistics follow each rank's own batches and differ in a healthy run."""
    import hashlib

    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
