"""The payloads' command line: every option in its group (model and data, schedule, outputs, runtime, Horovod,
PyTorch, TensorFlow), each group declared once for the payloads that take it, parsed into config.TrainConfig.
The options table in docs/payload-contract.md is made from these groups (tests/test_payload_contract.py)."""

from __future__ import annotations

import argparse
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from . import preemption, stragglers, tracking, watchdog
from .config import BACKENDS, LR_PER_256, TrainConfig, check_output_dir
from .errors import ConfigError


def _stall_timeout(text: str) -> float | str:
    try:
        return watchdog.parse_timeout(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _minutes(text: str) -> float | str:
    try:
        return preemption.parse_minutes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _epochs(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated epochs like 30,60,80, got {text!r}") from None


# ------------------------------------------------------------------------------------------- options
# Each payload declares the option groups it acts on, with its own defaults: an option appears in a payload's
# --help only when that payload uses it, and the default shown is the one it trains with. An option of
# another payload is refused with the name of the payloads that take it (tests/test_options.py checks both).


class Declared(NamedTuple):
    """What a group needs to declare its options for one payload."""

    defaults: TrainConfig  # the payload's defaults (TrainConfig's, with its own overrides)
    models: Sequence[str]
    data_kinds: Sequence[str]


@dataclass(frozen=True)
class Group:
    title: str  # the --help section; groups with one title share a section
    owners: str  # the payloads that take these options (named when refused elsewhere)
    add: Callable[[Any, Declared], None]  # adds the options to an argparse argument group


DATA_DIR_HELP = {
    "imagefolder": "imagefolder: root/<class>/<image>, or root/train and root/val in that layout",
    "shards": "shards: a WebDataset folder with manifest.json (python -m datatools.prepare)",
    "tfrecord": "tfrecord: a folder of train-* (and validation-*) TFRecord shards (python -m datatools.prepare "
    "--formats tfrecord writes one: its tfrecord/ folder)",
    "tiles": "a folder made by python -m datatools.landcover.prepare (blocks and manifest.json)",
}


def _model_and_data(g, c: Declared) -> None:
    d = c.defaults
    g.add_argument("--model", default=d.model, help=f"one of {', '.join(c.models)}" if c.models else "the model")
    g.add_argument(
        "--data-dir",
        type=pathlib.Path,
        default=None,
        help="; ".join(DATA_DIR_HELP[k] for k in c.data_kinds if k in DATA_DIR_HELP),
    )
    g.add_argument("--image-size", type=int, default=d.image_size, help="side of the square images trained on, pixels")


def _classification_input(g, c: Declared) -> None:
    d = c.defaults
    g.add_argument("--data", default=d.data, help=" | ".join(c.data_kinds))
    g.add_argument(
        "--num-classes",
        type=int,
        default=d.num_classes,
        help="synthetic: the classes generated; imagefolder counts its class folders; shards and "
        "tfrecord: labels must be below it",
    )
    g.add_argument("--synthetic-samples", type=int, default=d.synthetic_samples, help="per epoch, whole job")
    g.add_argument(
        "--skip-corrupt-images",
        action="store_true",
        default=d.skip_corrupt_images,
        help="skip and count undecodable images instead of failing on the first one",
    )
    g.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        help="parallel image decodes per training process (PyTorch: data loader processes)",
    )


def _schedule(g, c: Declared) -> None:
    d = c.defaults
    g.add_argument(
        "--epochs", type=int, default=d.epochs, help="epochs of the whole run (a resumed run counts those done)"
    )
    # argparse default None so that giving both batch options is an error; parse() fills in the default.
    g.add_argument("--batch-size", type=int, default=None, help=f"per process (default: {d.batch_size})")
    g.add_argument(
        "--global-batch-size", type=int, default=None, help="instead of --batch-size: split over the processes"
    )
    g.add_argument("--max-steps-per-epoch", type=int, default=d.max_steps_per_epoch, help="0 = whole epoch")
    g.add_argument(
        "--base-lr",
        type=float,
        default=d.base_lr,
        help="LR of one process at its --batch-size; the job's LR scales with the global batch"
        + (
            ""
            if d.base_lr is not None
            else f". Default: the linear-scaling rule of Goyal et al., {LR_PER_256} per 256 images "
            f"({LR_PER_256} x batch / 256: 0.025 at batch 64, 0.1 at 256)"
        ),
    )
    g.add_argument("--momentum", type=float, default=d.momentum, help="SGD momentum")
    g.add_argument(
        "--weight-decay",
        type=float,
        default=d.weight_decay,
        help="L2 penalty on convolution and dense weights; BatchNorm's scale and shift and every bias get none "
        "(Goyal et al. 2017, whose LR rule these payloads follow: 1e-4 and no decay on BatchNorm; NVIDIA's "
        "ResNet-50 exempts BatchNorm and biases)",
    )
    g.add_argument(
        "--warmup-epochs",
        type=float,
        default=d.warmup_epochs,
        help="epochs of linear warm-up from the one-process LR to the job's LR",
    )
    g.add_argument(
        "--lr-decay-epochs",
        type=_epochs,
        default=d.lr_decay_epochs,
        help="comma-separated epochs at which the LR drops 10x, e.g. 30,60,80",
    )


def _outputs(g, c: Declared) -> None:
    d = c.defaults
    g.add_argument(
        "--output-dir",
        type=pathlib.Path,
        default=d.output_dir,
        help="checkpoints/, tensorboard/ and metrics.json go here; Azure ML's AZUREML_OUTPUT_DIR replaces the default",
    )
    g.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints, help="0 keeps all")
    g.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=d.resume,
        help="continue from the newest checkpoint in the output folder",
    )
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=d.progress,
        help="progress bar on rank 0 (--no-progress for job logs)",
    )
    g.add_argument(
        "--mlflow",
        action=argparse.BooleanOptionalAction,
        default=d.mlflow,
        help="log to MLflow when MLFLOW_TRACKING_URI is set (Azure ML sets it in every job)",
    )


def _runtime(g, c: Declared) -> None:
    d = c.defaults
    g.add_argument("--seed", type=int, default=d.seed, help="initial weights and data order")
    g.add_argument(
        "--threads", type=int, default=d.threads, help="intra-op threads per process; 0 = cores / local processes"
    )
    g.add_argument(
        "--amp", action=argparse.BooleanOptionalAction, default=d.amp, help="mixed precision (default: on with a GPU)"
    )
    g.add_argument(
        "--stall-timeout",
        type=_stall_timeout,
        default=d.stall_timeout,
        metavar="SECONDS",
        help="end the job when no training step completes for this long, naming the stuck ranks and hosts and "
        "writing every rank's stacks (docs/stuck-or-slow.md#a-job-is-stuck-or-slow); 0 = off. auto = "
        f"max({watchdog.FLOOR_SECONDS:.0f}, {watchdog.STEP_MULTIPLE} x the median step time), and "
        f"{watchdog.STARTUP_SECONDS:.0f} s until the first {watchdog.WARM_STEPS} steps are done",
    )
    g.add_argument(
        "--straggler-every",
        type=int,
        default=d.straggler_every,
        metavar="STEPS",
        help="every this many steps the ranks compare the time their steps spend waiting for input, computing and "
        "in the gradient exchange (one small collective), and a rank whose input or compute stays an outlier for "
        f"{stragglers.STRAGGLER_WINDOWS} comparisons is named in the log with its host; 0 = off",
    )
    g.add_argument(
        "--checkpoint-every-minutes",
        type=_minutes,
        default=d.checkpoint_every_minutes,
        metavar="MINUTES",
        help="also write a mid-epoch checkpoint when this many minutes have passed since the last one, so a node "
        "lost without warning loses at most that (SIGTERM always writes one: docs/preempted-and-resumed.md#preempted-and-resumed); "
        f"auto = the measured checkpoint time / {preemption.COST_FRACTION:g}, at least "
        f"{preemption.FLOOR_MINUTES:g}; 0 = off",
    )


def _horovod(g, c: Declared) -> None:
    g.add_argument(
        "--fp16-allreduce",
        action="store_true",
        default=c.defaults.fp16_allreduce,
        help="compress gradients to fp16 for the allreduce",
    )


def _adasum(g, c: Declared) -> None:
    g.add_argument(
        "--adasum",
        action="store_true",
        default=c.defaults.adasum,
        help="Adasum instead of averaging (needs Horovod's MPI controller and a power-of-two world)",
    )


def _pytorch(g, c: Declared) -> None:
    """Options of both PyTorch payloads (image classification and land cover). One line per option."""
    d = c.defaults
    g.add_argument(
        "--amp-dtype",
        default=d.amp_dtype,
        choices=("auto", "bf16", "fp16"),
        help="auto = float16 with a loss scaler on GPUs (faster than bfloat16 on Hopper: cuDNN's NHWC "
        "BatchNorm, docs/benchmarks.md#one-gpu; with --adasum bfloat16 on compute capability 8.0+), bfloat16 on CPUs",
    )
    g.add_argument(
        "--loss-scale-init",
        type=float,
        default=d.loss_scale_init,
        help="fp16: the dynamic loss scale to start from; it halves on every overflowing step and "
        "doubles after 2000 clean ones (GradScaler)",
    )
    g.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=d.channels_last,
        help="NHWC memory format (default: on with a GPU)",
    )
    g.add_argument(
        "--replica-check-every",
        type=int,
        default=d.replica_check_every,
        help="steps between the ranks' bitwise comparison of their parameters (and before every epoch's "
        "checkpoint); a rank that differs, or whose loss or gradients are not finite, is named and the run rolls "
        "back to the last agreed checkpoint; 0 = off",
    )
    g.add_argument(
        "--ema-decay",
        type=float,
        default=d.ema_decay,
        help="an exponential moving average of the weights, validated beside them (ema_ figures); 0 = off",
    )
    g.add_argument(
        "--backend",
        default=d.backend,
        choices=BACKENDS,
        help="horovod (horovodrun, mpirun) or ddp (DistributedDataParallel: torchrun, Azure ML's "
        "pytorch distribution); docs/pytorch-ddp.md",
    )


def _pytorch_classification(g, c: Declared) -> None:
    d = c.defaults
    g.add_argument(
        "--backward-passes-per-step",
        type=int,
        default=d.backward_passes_per_step,
        help="accumulate this many micro-batches of --batch-size locally per allreduce",
    )
    g.add_argument("--compile", action="store_true", default=d.compile, help="torch.compile the model")
    g.add_argument(
        "--startup-steps",
        type=int,
        default=d.startup_steps,
        help="the run's first steps (workers starting, cuDNN autotuning, compilation) are timed as "
        "start-up and left out of Total images/sec (steady state)",
    )
    g.add_argument(
        "--decoder",
        default=d.decoder,
        help="the CPU JPEG decoder: auto (the fastest installed: simplejpeg, PyTurboJPEG, "
        "torchvision, Pillow, as measured in docs/benchmarks.md#jpeg-decoders) or one of those names",
    )
    g.add_argument(
        "--gpu-decode",
        action="store_true",
        default=d.gpu_decode,
        help="--data shards: decode JPEGs on the GPU (nvJPEG through torchvision); without a GPU, "
        "torchvision's CPU decoder runs the same path",
    )
    g.add_argument(
        "--shuffle-buffer",
        type=int,
        default=d.shuffle_buffer,
        help="--data shards: samples shuffled in memory per process",
    )
    g.add_argument(
        "--cache-decoded",
        action="store_true",
        default=d.cache_decoded,
        help="--data shards: keep each process's decoded images after the first epoch in a memory-mapped file in "
        "--cache-dir (the page cache serves it from RAM where it fits); its size is checked against the folder's "
        "free space before training",
    )
    g.add_argument(
        "--cache-dir",
        type=pathlib.Path,
        default=d.cache_dir,
        help="--cache-decoded: the folder of the decoded-image file, shared by the node's processes; a local disk "
        "(default: TMPDIR or /tmp). /dev/shm also works, but its size is the job's shm_size",
    )


def _tensorflow(g, c: Declared) -> None:
    g.add_argument("--xla", action="store_true", default=c.defaults.xla, help="compile the training step with XLA")


EVERY_PAYLOAD = "every payload"
IMAGE_CLASSIFICATION = "the image-classification payloads (PyTorch, TensorFlow, Keras)"
MODEL_AND_DATA = Group("model and data", EVERY_PAYLOAD, _model_and_data)
CLASSIFICATION_INPUT = Group("model and data", IMAGE_CLASSIFICATION, _classification_input)
SCHEDULE = Group("schedule", EVERY_PAYLOAD, _schedule)
OUTPUTS = Group("outputs", EVERY_PAYLOAD, _outputs)
RUNTIME = Group("runtime", EVERY_PAYLOAD, _runtime)
HOROVOD = Group("Horovod", IMAGE_CLASSIFICATION, _horovod)
ADASUM = Group("Horovod", "the PyTorch and TensorFlow image-classification payloads", _adasum)
PYTORCH = Group("PyTorch", "the PyTorch payloads (image classification and land cover)", _pytorch)
PYTORCH_CLASSIFICATION = Group(
    "PyTorch image classification", "the PyTorch payloads (image classification only)", _pytorch_classification
)
TENSORFLOW = Group("TensorFlow", "the TensorFlow and Keras payloads", _tensorflow)

COMMON = (MODEL_AND_DATA, SCHEDULE, OUTPUTS, RUNTIME)
# Every group of every payload: an option outside a payload's groups is looked up here to name its payloads.
ALL_GROUPS = (*COMMON, CLASSIFICATION_INPUT, HOROVOD, ADASUM, PYTORCH, PYTORCH_CLASSIFICATION, TENSORFLOW)
# The PyTorch image-classification payload's groups (payloads/pytorch/train.py); parse()'s default.
PYTORCH_CLASSIFICATION_GROUPS = (*COMMON, CLASSIFICATION_INPUT, HOROVOD, ADASUM, PYTORCH, PYTORCH_CLASSIFICATION)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except None: those options say in their help what decides them."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def payload_defaults(**overrides) -> TrainConfig:
    """TrainConfig's defaults with a payload's own; AZUREML_OUTPUT_DIR (set by Azure ML) is the output folder."""
    overrides.setdefault("output_dir", pathlib.Path(os.environ.get("AZUREML_OUTPUT_DIR", TrainConfig.output_dir)))
    return TrainConfig(**overrides)


def build_parser(
    prog: str,
    description: str,
    groups: Sequence[Group] = PYTORCH_CLASSIFICATION_GROUPS,
    defaults: TrainConfig | None = None,
    models: Sequence[str] = (),
    data_kinds: Sequence[str] = ("synthetic", "imagefolder"),
) -> argparse.ArgumentParser:
    """The payload's parser: its groups' options, with its defaults. No abbreviations: --cache would otherwise be
    taken as another option's prefix."""
    declared = Declared(defaults if defaults is not None else payload_defaults(), models, data_kinds)
    p = argparse.ArgumentParser(prog=prog, description=description, formatter_class=_HelpFormatter, allow_abbrev=False)
    sections: dict[str, Any] = {}
    for group in groups:
        if group.title not in sections:
            sections[group.title] = p.add_argument_group(group.title)
        group.add(sections[group.title], declared)
    return p


class _Recording:
    """An argument group that keeps the actions added to it."""

    def __init__(self):
        self.parser, self.actions = argparse.ArgumentParser(add_help=False), []

    def add_argument(self, *args, **kwargs):
        action = self.parser.add_argument(*args, **kwargs)
        self.actions.append(action)
        return action


def owners_of_flags() -> dict[str, tuple[str, Group]]:
    """Every option spelling of every group -> (its TrainConfig field, its group)."""
    found = {}
    declared = Declared(TrainConfig(), (), ("synthetic", "imagefolder"))
    for group in ALL_GROUPS:
        section = _Recording()
        group.add(section, declared)
        for action in section.actions:
            for flag in action.option_strings:
                found[flag] = (action.dest, group)
    return found


def parse_known(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, refused: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Parse argv; an option this payload does not declare but another payload does is a ConfigError that says
    so (`refused`: the payload's own message per option dest), anything else unknown is argparse's error."""
    ns, unknown = parser.parse_known_args(argv)
    owners, refused = owners_of_flags(), refused or {}
    for token in unknown:
        flag = token.split("=", 1)[0]
        if flag in owners:
            dest, group = owners[flag]
            raise ConfigError(
                refused.get(dest) or f"{flag} is an option of {group.owners}; {parser.prog} does not take it: drop it"
            )
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return vars(ns)


def parse(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    models: Sequence[str],
    data_kinds: Sequence[str] = ("synthetic", "imagefolder"),
    groups: Sequence[Group] = PYTORCH_CLASSIFICATION_GROUPS,
    defaults: TrainConfig | None = None,
    refused: Mapping[str, str] | None = None,
) -> TrainConfig:
    """The payload's validated configuration from its command line: `groups` are the options it declares,
    `defaults` its defaults (payload_defaults()), `refused` its message for an option of other payloads."""
    defaults = defaults if defaults is not None else payload_defaults()
    parser = build_parser(prog, description, groups, defaults, models, data_kinds)
    values = parse_known(parser, argv, refused)
    cfg = configure(values, defaults)
    cfg.validate(models, data_kinds)
    check_output_dir(cfg.output_dir)
    tracking.check(cfg.mlflow)
    return cfg


def configure(values: dict[str, Any], defaults: TrainConfig) -> TrainConfig:
    """The TrainConfig of parsed options: undeclared fields keep the payload's defaults, and to_json() records
    only the declared ones (what the payload's --help lists)."""
    values = dict(values)
    if values.get("batch_size") is None and values.get("global_batch_size") is None:
        values["batch_size"] = defaults.batch_size
    fields = {k: v for k, v in asdict(defaults).items() if k != "options"}
    fields.update(values)
    return TrainConfig(**fields, options=tuple(values))
