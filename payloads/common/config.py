"""Training configuration: one typed, validated object built from the command line.

Shared by every framework's payload so that a job definition's arguments mean the same thing in
PyTorch, TensorFlow and Keras. Checks that need the world size run after Horovod starts, still before
any data is read or any step is trained.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from . import preemption, watchdog
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
    ema_decay: float = 0.0  # PyTorch: an exponential moving average of the weights (payloads/pytorch/ema.py); 0 = off

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
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"--ema-decay must be at least 0 and below 1 (0 = off), got {self.ema_decay}")
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
