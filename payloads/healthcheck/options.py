"""The health check's options, with what each node should deliver read from HEALTHCHECK_EXPECTED and --expect
(expected.py, the format's one home).
"""

from __future__ import annotations

import argparse
import os
import pathlib

from ..common.errors import ConfigError
from . import expected
from .expected import EXPECTED, IB_WRITE, IN_NODE, MIN_BUSBW, NODE_CHECKS, OVER_IB

TITLES = {
    IN_NODE: "all-reduce in the node",
    OVER_IB: "all-reduce across nodes over InfiniBand",
    IB_WRITE: "ib_write_bw per InfiniBand card",
}


PASS, FAIL, NOT_JUDGED, SKIPPED = "PASS", "FAIL", "NOT JUDGED", "SKIPPED"


# Conv models of payloads/pytorch/models.py (channels_last only changes conv layers); the torchvision ones
# are built the way the payload builds them, so torchvision's import is checked too.
MODELS = ("resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "mobilenet_v3_large", "tiny_cnn")


NUM_CLASSES = 10


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes-mb",
        default=None,
        help="comma-separated tensor sizes in MB (default: 8 MiB up to the message size Azure judges the VM "
        "size at, x4 apart; 8,32,128,256 where the catalog has none)",
    )
    ap.add_argument("--iterations", type=int, default=10, help="timed runs per size; figures are their median")
    ap.add_argument(
        "--min-busbw",
        default=None,
        metavar="GB_PER_SEC",
        help=f"fail below this bus bandwidth at the largest size (default: ${MIN_BUSBW}, set by "
        "the launcher from the VM-size catalog; `none`, or no floor at all: reported, not judged)",
    )
    ap.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="CHECK=VALUE",
        help=f"a node check's expected figure ({', '.join(NODE_CHECKS)}; GB/s, Gb/s for ib_write_bw), over "
        f"${EXPECTED}, which the launcher sets from the VM-size catalog",
    )
    ap.add_argument(
        "--ib-repeats", type=int, default=3, help="ib_write_bw runs per InfiniBand card; the median is judged"
    )
    ap.add_argument("--output", type=pathlib.Path, default=None, help="rank 0 writes the JSON report here")
    t = ap.add_argument_group("training steps")
    t.add_argument("--train-steps", type=int, default=5, help="optimizer steps each rank takes")
    t.add_argument("--model", default="resnet18", help=f"one of {', '.join(MODELS)}")
    t.add_argument("--image-size", type=int, default=64)
    t.add_argument("--batch-size", type=int, default=8, help="per process")
    t.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mixed precision (default: on with a GPU, as the PyTorch payload; --amp on a CPU runs bf16)",
    )
    t.add_argument(
        "--amp-dtype",
        default="auto",
        choices=("auto", "bf16", "fp16"),
        help="auto: fp16 with a loss scaler on GPUs, bf16 on CPUs (the training payload's choice)",
    )
    t.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="channels_last model and images (default: on with a GPU, as the PyTorch payload)",
    )
    args = ap.parse_args(argv)
    if args.sizes_mb is not None:
        try:
            args.sizes = [float(s) for s in args.sizes_mb.split(",")]
        except ValueError:
            raise ConfigError(f"--sizes-mb takes numbers like 8,32,128, got {args.sizes_mb!r}") from None
        if not args.sizes or min(args.sizes) <= 0:
            raise ConfigError(f"--sizes-mb takes positive sizes like 8,32,128, got {args.sizes_mb!r}")
    if args.iterations < 1:
        raise ConfigError(f"--iterations {args.iterations}: at least 1")
    if args.ib_repeats < 1:
        raise ConfigError(f"--ib-repeats {args.ib_repeats}: at least 1")
    vm = os.environ.get("TRAINING_VM_SIZE") or "this VM size"
    args.expected = expected.parse(os.environ.get(EXPECTED, ""), f"{EXPECTED} (the VM-size catalog's figures for {vm})")
    for item in args.expect:
        args.expected.update(expected.parse(item, "--expect"))
    args.sizes_bytes = message_sizes(args.sizes if args.sizes_mb is not None else None, args.expected)
    if args.train_steps < 1:
        raise ConfigError(f"--train-steps {args.train_steps}: at least 1 (the optimizer step is what is checked)")
    if args.model not in MODELS:
        raise ConfigError(f"--model {args.model!r}: choose one of {', '.join(MODELS)}")
    if args.image_size < 16:
        raise ConfigError(f"--image-size {args.image_size}: at least 16 pixels")
    if args.batch_size < 2:
        # batch norm in training mode needs 2 values per channel once a ResNet has pooled the image to 1x1
        raise ConfigError(f"--batch-size {args.batch_size}: at least 2 per process (batch norm needs 2 samples)")
    if args.min_busbw is not None:
        args.floor = expected.floor(args.min_busbw, "--min-busbw")
    else:
        args.floor = expected.floor(os.environ.get(MIN_BUSBW), MIN_BUSBW)
    return args


def message_sizes(sizes_mb: list[float] | None, expected: dict) -> list[int]:
    """Message sizes in bytes: --sizes-mb as given; else 8 MiB, x4, up to the largest size Azure judges this VM
    size's all-reduces at (where NCCL reaches full speed); else 8, 32, 128 and 256 MB."""
    if sizes_mb is not None:
        return [int(mb * 1e6) for mb in sizes_mb]
    top = max((e["message_bytes"] or 0 for c, e in expected.items() if c != IB_WRITE), default=0)
    if not top:
        return [int(mb * 1e6) for mb in (8, 32, 128, 256)]
    sizes, size = [], 8 * 2**20
    while size < top:
        sizes.append(size)
        size *= 4
    return sizes + [top]


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes / 1e6:g} MB"
