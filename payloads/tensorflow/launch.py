"""What the TensorFlow and Keras payloads do before TensorFlow is imported: declare their options (so that
--help and configuration errors need no TensorFlow), set XLA's CPU flag, and turn a configuration error into
exit code 2 and a SIGTERM's stop into its line and exit code 75 (payloads/common/entry.py). Each payload's
entry point (payloads/tensorflow/train.py, payloads/keras/train.py) calls main() with its option groups and its
training function."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from ..common import config, devices, options
from ..common.entry import run_main

# Static (payloads/tensorflow/models.py builds them) so that parsing needs no TensorFlow import.
MODEL_NAMES = ("resnet50", "resnet101", "resnet152", "mobilenet_v2", "tiny_cnn", "mlp")
DATA_KINDS = ("synthetic", "tfrecord")
# What both payloads say about the PyTorch options users most often carry over from a PyTorch job.
REFUSED = {
    "backward_passes_per_step": "--backward-passes-per-step is a PyTorch payload option: for a larger batch than "
    "fits, use more processes or the PyTorch payload",
    "channels_last": "--channels-last/--no-channels-last are PyTorch options: TensorFlow always trains NHWC",
}
XLA_CPU_FLAG = "--tf_xla_cpu_global_jit"


def xla_on_cpu(cfg, environ=None) -> None:
    """--xla on a node without an NVIDIA driver: TensorFlow's XLA guide (auto-clustering) compiles CPU ops
    only with --tf_xla_cpu_global_jit in TF_XLA_FLAGS; without it --xla ran uncompiled. TensorFlow reads
    the variable once, and loading Horovod's TensorFlow ops already does: call before importing either."""
    environ = os.environ if environ is None else environ
    if not cfg.xla or devices.driver_version() is not None or devices.expected_gpus(environ):
        return
    flags = environ.get("TF_XLA_FLAGS", "")
    if XLA_CPU_FLAG not in flags.split():
        environ["TF_XLA_FLAGS"] = f"{flags} {XLA_CPU_FLAG}".strip()


def parse(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    groups: Sequence[options.Group],
    refused: Mapping[str, str] = REFUSED,
) -> config.TrainConfig:
    return options.parse(argv, prog, description, MODEL_NAMES, DATA_KINDS, groups=groups, refused=refused)


def main(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    groups: Sequence[options.Group],
    runner: Callable[[config.TrainConfig], object],
    refused: Mapping[str, str] = REFUSED,
) -> int:

    def body() -> None:
        cfg = parse(argv, prog, description, groups, refused)
        xla_on_cpu(cfg)
        runner(cfg)

    return run_main(body)
