"""U-Net models from segmentation-models-pytorch, four input bands, never downloaded weights.

`--norm group` swaps every BatchNorm for GroupNorm: per-sample statistics, so the result does not depend on
how a global batch is split over processes (the averaging tests compare 2 processes with 1 exactly), and
it behaves with the small per-GPU batches large patches force.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

BANDS = 4  # NAIP: red, green, blue, near-infrared


def _unet(
    encoder: str, depth: int = 5, decoder: tuple[int, ...] = (256, 128, 64, 32, 16)
) -> Callable[[int], nn.Module]:
    def build(num_classes: int) -> nn.Module:
        import segmentation_models_pytorch as smp

        # encoder_weights=None: ImageNet weights would be downloaded at run time, and are for 3 bands.
        return smp.Unet(
            encoder_name=encoder,
            encoder_weights=None,
            encoder_depth=depth,
            decoder_channels=decoder,
            in_channels=BANDS,
            classes=num_classes,
        )

    return build


MODELS: dict[str, Callable[[int], nn.Module]] = {
    "unet_resnet34": _unet("resnet34"),
    "unet_resnet18": _unet("resnet18"),
    # timm's ResNet-18 cut after 3 stages (timm drops the unused stages), a narrow decoder: 0.77M
    # parameters, for CPU runs and the tests
    "unet_tiny": _unet("tu-resnet18", depth=3, decoder=(32, 16, 8)),
}
NORMS = ("batch", "group")
DIVISOR = {"unet_resnet34": 32, "unet_resnet18": 32, "unet_tiny": 8}  # patch sides must be multiples


def build(name: str, num_classes: int, norm: str = "batch") -> nn.Module:
    model = MODELS[name](num_classes)
    return to_group_norm(model) if norm == "group" else model


def to_group_norm(module: nn.Module, groups: int = 8) -> nn.Module:
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, nn.GroupNorm(math.gcd(groups, child.num_features), child.num_features))
        else:
            to_group_norm(child, groups)
    return module
