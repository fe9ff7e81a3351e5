"""Training configuration: one typed, validated object built from the command line.

Shared by every framework's payload so that a job definition's arguments mean the same thing in
PyTorch, TensorFlow and Keras. Checks that need the world size run after Horovod starts, still before
any data is read or any step is trained.
"""

from __future__ import annotations

import argparse
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from . import preemption, stragglers, tracking, watchdog
from .errors import ConfigError

# Flags whose default depends on the device (a GPU switches them on, or picks their value), with the command-line
# spellings of each value. The test suite's rule (tests/README.md): each value runs in a two-process test on the
# CPU; tests/test_device_rule.py enforces it, and every option whose default is None ("decided by the device")
# must be listed here.
DEVICE_DEPENDENT: dict[str, tuple[tuple[str, ...], ...]] = {
    "amp": (("--amp",), ("--no-amp",)),
    "amp_dtype": (("--amp-dtype", "bf16"), ("--amp-dtype", "fp16")),
    "channels_last": (("--channels-last",), ("--no-channels-last",)),
    "compile": (("--compile",), ()),  # off by default on every device until a GPU figure says otherwise
    "gpu_decode": (("--gpu-decode",), ()),  # off by default; without a GPU it runs its CPU fallback
}

# The PyTorch shard loaders (payloads/pytorch/shards.py, dali.py).
LOADERS = ("workers", "dali")

# PyTorch's collective layers (payloads/pytorch/backends.py); Horovod is the default.
BACKENDS = ("horovod", "ddp")

# Goyal et al., "Accurate, Large Minibatch SGD" (2017): LR 0.1 for every 256 images of the global batch.
LR_PER_256 = 0.1


@dataclass(frozen=True)
class TrainConfig:
    """The command line, parsed and validated; frozen: what start-up decides from it (precision, memory format,
    per-process batch, base LR) is a record of its own (payloads/pytorch/runtime.Settings), never written back."""

    model: str = "resnet50"
    data: str = "synthetic"  # synthetic | imagefolder, shards (PyTorch) | tfrecord (TensorFlow, Keras)
    data_dir: pathlib.Path | None = None
    synthetic_samples: int = 1024  # per epoch, whole job
    image_size: int = 224
    num_classes: int = 1000  # synthetic only; imagefolder counts its class folders
    epochs: int = 90
    batch_size: int | None = 32  # per process (Horovod's convention)
    global_batch_size: int | None = None  # alternative: split evenly over the processes
    max_steps_per_epoch: int = 0  # 0 = the whole epoch
    startup_steps: int = 10  # first steps of a run: timed as start-up, not in the throughput
    base_lr: float | None = None  # one process at its batch; None = LR_PER_256 x batch / 256
    momentum: float = 0.9
    # Goyal et al. 2017 (the linear-scaling recipe these payloads follow) and NVIDIA's ResNet-50: 1e-4, none on
    # BatchNorm's scale and shift; NVIDIA also exempts biases. decays() says which parameters decay.
    weight_decay: float = 1e-4
    warmup_epochs: float = 5.0
    lr_decay_epochs: tuple[int, ...] = (30, 60, 80)
    fp16_allreduce: bool = False
    backward_passes_per_step: int = 1
    adasum: bool = False
    output_dir: pathlib.Path = pathlib.Path("outputs")
    keep_checkpoints: int = 3
    resume: bool = True
    seed: int = 42
    workers: int = 2
    threads: int = 0  # torch intra-op threads per process; 0 = cores / local processes
    amp: bool | None = None  # None = on when a GPU is used
    amp_dtype: str = "auto"  # PyTorch: auto = fp16 on GPUs (bf16 with Adasum on 8.0+), bf16 on CPUs
    loss_scale_init: float = 2.0**16  # PyTorch fp16: the loss scaler's first scale (GradScaler's default)
    compile: bool = False  # PyTorch: torch.compile the model
    channels_last: bool | None = None  # None = on when a GPU is used (PyTorch; TensorFlow is NHWC)
    xla: bool = False  # TensorFlow/Keras: compile the step with XLA
    skip_corrupt_images: bool = False
    shuffle_buffer: int = 5000  # shards: samples held for shuffling per process
    decoder: str = "auto"  # PyTorch: the CPU JPEG decoder (payloads/pytorch/decoders.py)
    gpu_decode: bool = False  # PyTorch shards: decode JPEGs on the GPU (nvJPEG through torchvision)
    loader: str = "workers"  # PyTorch shards: the decode worker processes, or NVIDIA DALI's pipeline
    cache_decoded: bool = False  # shards: keep the decoded images after epoch 1 (a memory-mapped file)
    cache_dir: pathlib.Path | None = None  # where that file lives; None = the temporary folder (TMPDIR, /tmp)
    progress: bool = True
    mlflow: bool = True  # log to MLflow when MLFLOW_TRACKING_URI is set (Azure ML sets it)
    # The options the payload declared (its --help); to_json() records these. Empty: every field.
    options: tuple[str, ...] = field(default=(), repr=False, compare=False)
    backend: str = "horovod"  # PyTorch: horovod | ddp (DistributedDataParallel under torchrun)
    # Seconds without a completed step that end the job, naming the stuck ranks (watchdog.py); 0 = off;
    # "auto" = from the measured step time, with a floor of minutes and a longer bound while the first steps run.
    stall_timeout: float | str = watchdog.AUTO
    straggler_every: int = 50  # steps between the ranks' comparisons of their step's parts (stragglers.Phases)
    # PyTorch: minutes between mid-epoch checkpoints; "auto" = from the measured checkpoint cost (preemption.py)
    checkpoint_every_minutes: float | str = preemption.AUTO
    # PyTorch: steps between the ranks' comparisons of their parameters (payloads/pytorch/sentinel.py); 0 = off
    replica_check_every: int = 100

    @property
    def checkpoint_dir(self) -> pathlib.Path:
        return self.output_dir / "checkpoints"

    @property
    def tensorboard_dir(self) -> pathlib.Path:
        return self.output_dir / "tensorboard"

    @property
    def metrics_path(self) -> pathlib.Path:
        return self.output_dir / "metrics.json"

    def validate(self, models: Sequence[str], data_kinds: Sequence[str] = ("synthetic", "imagefolder")) -> None:
        """Checks that need nothing but the config; `data_kinds` are what this payload reads."""
        if self.model not in models:
            raise ConfigError(f"unknown model {self.model!r}: choose one of {', '.join(sorted(models))}")
        if self.data not in data_kinds:
            hint = {
                "tfrecord": " (TFRecord shards are read by the TensorFlow and Keras payloads)",
                "shards": " (WebDataset shards are read by the PyTorch payload; here use --data tfrecord "
                "on the tfrecord folder that datatools.prepare writes beside them)",
                "imagefolder": " (convert class folders to TFRecord shards: python -m datatools.prepare "
                "--formats tfrecord, then --data-dir OUTPUT/tfrecord)",
            }.get(self.data, "")
            raise ConfigError(f"unknown --data {self.data!r}: choose {' or '.join(data_kinds)}{hint}")
        if self.data == "imagefolder" and self.data_dir is None:
            raise ConfigError("--data imagefolder needs --data-dir: a folder with one sub-folder of images per class")
        if self.data == "tfrecord" and self.data_dir is None:
            raise ConfigError(
                "--data tfrecord needs --data-dir: a folder of TFRecord shards (train-* files, optionally validation-*)"
            )
        if self.data == "shards" and self.data_dir is None:
            raise ConfigError(
                "--data shards needs --data-dir: the webdataset folder written by "
                "python -m datatools.prepare (local, downloaded or an Azure ML mount)"
            )
        if self.cache_dir is not None and not self.cache_decoded:
            raise ConfigError(
                "--cache-dir is where --cache-decoded keeps decoded images: add --cache-decoded or drop it"
            )
        if self.data == "synthetic" and self.data_dir is not None:
            raise ConfigError("--data-dir was given with --data synthetic: add --data imagefolder to train on it")
        _positive(self, "epochs", "image_size", "synthetic_samples", "num_classes", "backward_passes_per_step")
        _non_negative(
            self,
            "max_steps_per_epoch",
            "startup_steps",
            "keep_checkpoints",
            "workers",
            "threads",
            "weight_decay",
            "shuffle_buffer",
            "warmup_epochs",
            "momentum",
            "straggler_every",
            "replica_check_every",
        )
        if self.base_lr is not None and self.base_lr <= 0:
            raise ConfigError(f"--base-lr must be positive, got {self.base_lr}")
        if self.loss_scale_init <= 0:
            raise ConfigError(f"--loss-scale-init must be positive, got {self.loss_scale_init}")
        if self.amp_dtype not in ("auto", "bf16", "fp16"):
            raise ConfigError(f"--amp-dtype {self.amp_dtype!r}: choose auto, bf16 or fp16")
        if self.num_classes < 2:
            raise ConfigError(f"--num-classes must be at least 2, got {self.num_classes}")
        if self.batch_size is not None and self.global_batch_size is not None:
            raise ConfigError("give --batch-size (per process) or --global-batch-size, not both")
        if self.batch_size is None and self.global_batch_size is None:
            raise ConfigError("give --batch-size (per process) or --global-batch-size")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1, got {self.batch_size}")
        if list(self.lr_decay_epochs) != sorted(set(self.lr_decay_epochs)) or any(e < 1 for e in self.lr_decay_epochs):
            raise ConfigError(f"--lr-decay-epochs must be increasing positive epochs, got {list(self.lr_decay_epochs)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend {self.backend!r}: choose {' or '.join(BACKENDS)}")
        if self.backend == "ddp" and self.adasum:
            raise ConfigError(
                "--adasum is a Horovod option: PyTorch DDP (--backend ddp) has no Adasum reduction, "
                "only averaging: drop --adasum, or train with --backend horovod"
            )
        try:
            watchdog.parse_timeout(self.stall_timeout)
        except ValueError as e:
            raise ConfigError(
                f"--stall-timeout: {e}: e.g. --stall-timeout 900, or 0 to turn the watchdog off"
            ) from None
        if self.adasum and self.fp16_allreduce:
            raise ConfigError("--adasum and --fp16-allreduce cannot be combined: Adasum reduces in full precision")

    def __post_init__(self) -> None:
        # --stall-timeout's canonical value (seconds or "auto"); an unreadable one is left for validate() to name.
        try:
            object.__setattr__(self, "stall_timeout", watchdog.parse_timeout(self.stall_timeout))
        except ValueError:
            pass

    def lr_for(self, batch: int) -> float:
        """The base LR of one process at `batch` per step: --base-lr, or Goyal et al.'s LR_PER_256 x batch / 256
        (the payloads multiply it by the processes and backward passes, so the job's LR is LR_PER_256 x global
        batch / 256)."""
        return self.base_lr if self.base_lr is not None else LR_PER_256 * batch / 256

    def per_process_batch(self, world_size: int) -> int:
        """The batch each process trains on; checks the global batch against the world size."""
        if self.batch_size is not None:
            return self.batch_size
        g = self.global_batch_size
        if g < world_size:
            raise ConfigError(
                f"--global-batch-size {g} is below the number of processes ({world_size}): "
                f"every process needs at least one sample, use {world_size} or more"
            )
        if g % world_size:
            raise ConfigError(
                f"--global-batch-size {g} does not divide evenly over {world_size} processes: "
                f"use a multiple of {world_size}, e.g. {g - g % world_size or world_size}"
            )
        return g // world_size

    def check_adasum_world(self, world_size: int, mpi_controller: bool) -> None:
        """Horovod 0.28.1 registers its Adasum operations only with MPI (under Gloo the first step fails with
        "No Adasum operation enabled") and reduces only power-of-two worlds (adasum.h: "Running Adasum with
        non-power-of-two ranks is not supported yet"). One process never reduces."""
        if not self.adasum or world_size == 1:
            return
        if not mpi_controller:
            raise ConfigError(
                "--adasum needs Horovod's MPI controller (Adasum is implemented over MPI): start the "
                "job with mpirun (Azure ML's MPI distribution, horovodrun --mpi), or drop --adasum"
            )
        if world_size & (world_size - 1):
            low = 1 << (world_size.bit_length() - 1)
            raise ConfigError(
                f"--adasum needs a power-of-two number of processes, this job has {world_size}: "
                f"use {low} or {low * 2} processes, or drop --adasum"
            )

    def to_json(self) -> dict:
        d = asdict(self)
        del d["options"]
        if self.options:
            d = {k: v for k, v in d.items() if k in self.options}
        return {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in d.items()}


class Resolved:
    """What a payload's start-up resolved from the configuration (payloads/pytorch/runtime.Settings,
    payloads/tensorflow/runtime.Settings: frozen dataclasses with this behaviour): metrics.json's run.resolved,
    the `resolved:` line, and the configuration as metrics.json and checkpoints record it, whose None defaults and
    default LR show what they became (the fields named in RECORDED)."""

    RECORDED: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.to_json().items())

    def config_record(self, cfg: TrainConfig) -> dict:
        record = cfg.to_json()
        record.update({k: getattr(self, k) for k in self.RECORDED if k in record})
        return record


def check_output_dir(path: pathlib.Path) -> None:
    """--output-dir must be a folder this process can create and write: found before Horovod or a framework starts
    (a TensorFlow traceback after start-up otherwise). Creates it; writes and removes one probe file."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"--output-dir {path}: {existing} is a file, not a folder: pass a folder path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(
            f"--output-dir {path} is not writable ({e.strerror or e}): pass a folder you can write "
            "(on Azure ML, the job's outputs folder)"
        ) from None


def decays(shape: Sequence[int]) -> bool:
    """Whether a trainable tensor of this shape gets weight decay: kernels and dense matrices do; BatchNorm's
    scale and shift and biases, the one-dimensional tensors, do not (the same rule for every payload)."""
    return len(shape) > 1


def _positive(cfg: TrainConfig, *names: str) -> None:
    for n in names:
        if getattr(cfg, n) < 1:
            raise ConfigError(f"--{n.replace('_', '-')} must be at least 1, got {getattr(cfg, n)}")


def _non_negative(cfg: TrainConfig, *names: str) -> None:
    for n in names:
        if getattr(cfg, n) < 0:
            raise ConfigError(f"--{n.replace('_', '-')} must not be negative, got {getattr(cfg, n)}")


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
        help="auto = float16 with a loss scaler on GPUs (25%% faster than bfloat16 on Hopper: cuDNN's NHWC "
        "BatchNorm; with --adasum bfloat16 on compute capability 8.0+), bfloat16 on CPUs",
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
        "--loader",
        choices=LOADERS,
        default=d.loader,
        help="--data shards: decode in worker processes into shared batch slots (workers), or with NVIDIA DALI's "
        "pipeline (dali: C++ threads, JPEGs decoded on the GPU where there is one; pip install nvidia-dali-cuda130)",
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
