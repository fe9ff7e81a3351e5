"""Data-parallel training of ResNet-50 (and smaller models) with Horovod and PyTorch.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.pytorch.train --model resnet18 ...
    torchrun --standalone --nproc-per-node 2 -m payloads.pytorch.train --backend ddp --model resnet18 ...

Follows Horovod's examples/pytorch/pytorch_imagenet_resnet50.py and pytorch/examples imagenet, with
their known gaps closed: sharding by global rank with equal step counts, optimizer and loss-scaler state on
every rank after a resume, complete rank-0 checkpoints, exactly averaged metrics; and NVIDIA's
DeepLearningExamples ResNet-50 for the GPU path (bf16/fp16 by GPU, channels_last, uint8 input normalised on
the device, no host sync in the step, steady-state throughput). The loop and everything around the step are
loop.py's, the classification task is classification.py's; this module is the entry point.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..common import config, options
from ..common.entry import finish, run_main
from . import loop, models
from .classification import Classification


def parse(argv: Sequence[str] | None) -> config.TrainConfig:
    return options.parse(
        argv,
        "python -m payloads.pytorch.train",
        __doc__.splitlines()[0],
        list(models.MODELS),
        ("synthetic", "imagefolder", "shards"),
    )


def run(cfg: config.TrainConfig) -> dict:
    return loop.train(Classification(), cfg)


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(lambda: run(parse(argv)))


if __name__ == "__main__":
    finish(main())
