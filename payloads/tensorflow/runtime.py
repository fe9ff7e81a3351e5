"""What the TensorFlow and Keras payloads share around the model: devices and threads, precision and XLA,
the LR scale, rank-0 checkpoints (one .npz per epoch, and mid-epoch ones on SIGTERM and on the checkpoint clock:
payloads/common/preemption.py), resume, and the run's world record."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import pathlib
import time
from typing import ClassVar, NamedTuple

import numpy as np
import tensorflow as tf

from ..common import checkpoint, concerns, config, devices
from ..common.errors import ConfigError

SUFFIX = ".npz"
log = logging.getLogger("payloads.tensorflow")


class Start(NamedTuple):
    root: bool  # rank 0: writes metrics, checkpoints and TensorBoard
    device: str  # "CPU" or "GPU:<local rank>"
    batch: int  # per process
    model: object  # tf.keras.Model, same initial weights on every rank
    scale: float  # LR multiplier for the global batch (lr_scale)
    threads: Threads  # what this process's thread pools were sized to
    settings: Settings  # what start-up resolved from the configuration (which stays as parsed)


@dataclasses.dataclass(frozen=True)
class Settings(config.Resolved):
    """What start-up decided for this device and batch, the loops' source for them (the TensorFlow side of
    payloads/pytorch/runtime.Settings): logged in the first lines and written to metrics.json as run.resolved."""

    device: str
    precision: str  # the Keras mixed-precision policy
    amp: bool
    batch: int  # per process
    base_lr: float  # one process at its batch (--base-lr, or Goyal et al.'s 0.1 x batch / 256)
    lr_scale: float  # the global batch's multiple of it
    threads: dict

    RECORDED = ("amp", "base_lr")  # written back into the recorded config, as always


class Threads(NamedTuple):
    intra_op: int  # threads one op (a convolution) splits over
    inter_op: int  # ops run at once; tf.data shares this pool unless it has its own
    data: int  # tf.data's private threadpool (decode, augmentation)


def available_cores(cpu_max: pathlib.Path = pathlib.Path("/sys/fs/cgroup/cpu.max")) -> int:
    """Cores this process may run on: its CPU affinity (a container's cpuset, mpirun's binding), capped by
    a cgroup v2 CPU quota (a container limited to N CPUs still sees every core in os.cpu_count())."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def thread_plan(threads: int, cores: int, local_processes: int, workers: int) -> Threads:
    """Each local process gets an equal share of the node's cores (--threads N: N instead) for its op pools,
    and tf.data a private pool of the same size, at least --workers (its parallel decode calls), so that
    decoding neither waits for the step's ops nor is capped below what --workers asks for."""
    share = threads or max(1, cores // local_processes)
    return Threads(intra_op=share, inter_op=share, data=max(share, workers))


def start(cfg, hvd) -> Start:
    """The opening both payloads share: Horovod, this process's device and threads, its share of the
    global batch, the model and the LR scale. `hvd` is horovod.tensorflow (the Keras payload's too)."""
    from . import models

    hvd.init()
    cfg.check_adasum_world(hvd.size(), hvd.mpi_enabled())
    device, threads, amp = setup(cfg, hvd)
    model = models.build(cfg.model, cfg.num_classes, cfg.image_size)
    batch, scale = cfg.per_process_batch(hvd.size()), lr_scale(cfg, hvd, device)
    policy = tf.keras.mixed_precision.global_policy().name
    settings = Settings(device, policy, amp, batch, cfg.lr_for(batch), scale, threads._asdict())
    return Start(hvd.rank() == 0, device, batch, model, scale, threads, settings)


def setup(cfg, hvd) -> tuple[str, Threads, bool]:
    """Pin this process's GPU, threads, precision and XLA; returns the device it trains on, its threads and
    whether it trains in mixed precision.
    Runs before TensorFlow's runtime starts: thread pools cannot be resized after."""
    gpus = tf.config.list_physical_devices("GPU")
    cuda = tf.sysconfig.get_build_info().get("cuda_version")
    if hvd.local_rank() == 0:  # one line per node: the driver, the CUDA TensorFlow was built for, any mismatch
        print(devices.report("TensorFlow", cuda), flush=True)
    devices.require_gpus(len(gpus), hvd.local_size(), "TensorFlow", cuda)
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    threads = thread_plan(cfg.threads, available_cores(), hvd.local_size(), cfg.workers)
    tf.config.threading.set_intra_op_parallelism_threads(threads.intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(threads.inter_op)
    amp = cfg.amp if cfg.amp is not None else bool(gpus)
    tf.keras.mixed_precision.set_global_policy(precision(amp, bool(gpus)))
    if cfg.xla:
        if not gpus and "--tf_xla_cpu_global_jit" not in os.environ.get("TF_XLA_FLAGS", "").split():
            # Set by launch.xla_on_cpu before TensorFlow starts; missing when a GPU node's TensorFlow sees no GPU.
            log.warning(
                "--xla on a CPU compiles nothing unless TF_XLA_FLAGS has --tf_xla_cpu_global_jit "
                "when the process starts"
            )
        # Auto-clustering: XLA compiles the model's ops and leaves Horovod's collectives to TensorFlow.
        tf.config.optimizer.set_jit("autoclustering")
    tf.keras.utils.set_random_seed(cfg.seed)  # same initial weights on every rank
    return (f"GPU:{hvd.local_rank()}" if gpus else "CPU"), threads, amp


def precision(amp: bool, gpu: bool) -> str:
    """The Keras mixed-precision policy: float16 compute on a GPU (tensor cores; needs loss scaling),
    bfloat16 on a CPU (float32's exponent range, so no loss scaling; TensorFlow has bfloat16 CPU kernels)."""
    if not amp:
        return "float32"
    return "mixed_float16" if gpu else "mixed_bfloat16"


def loss_scaling() -> bool:
    """float16 gradients underflow without loss scaling (Keras' mixed-precision guide); bfloat16 ones do not."""
    return tf.keras.mixed_precision.global_policy().name == "mixed_float16"


def lr_scale(cfg, hvd, device: str) -> float:
    """Goyal et al.: the LR scales with the global batch; Adasum adds rather than averages (see PyTorch)."""
    if cfg.adasum:
        return hvd.local_size() if device.startswith("GPU") and hvd.nccl_built() else 1
    return hvd.size()


def weight_decay_loss(cfg, model) -> tf.Tensor:
    """wd/2 * sum(w^2) over the variables that decay (config.decays: not BatchNorm's or biases): its gradient wd*w
    is PyTorch SGD's weight decay, so the payloads train alike."""
    decayed = [v for v in model.trainable_variables if config.decays(v.shape)]
    if not decayed:
        return tf.constant(0.0)
    return cfg.weight_decay * tf.add_n([tf.nn.l2_loss(tf.cast(v, tf.float32)) for v in decayed])


def build_optimizer_state(optimizer, model) -> None:
    """Create the optimizer's slots now, so they can be restored and broadcast before the first step."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    inner.build(model.trainable_variables)


class Position(NamedTuple):
    """Where a resumed run starts: `epoch` whole epochs done and `step` steps of the next (0: an epoch's start);
    `steps_per_epoch`: the step count of the epoch the checkpoint was written in (None: an epoch's end)."""

    epoch: int
    step: int = 0
    steps_per_epoch: int | None = None


def save(
    cfg,
    hvd,
    epochs_done: int,
    model,
    optimizer,
    step: int = 0,
    steps_per_epoch: int | None = None,
    config: dict | None = None,
) -> float:
    """Rank 0 writes the checkpoint: after `epochs_done` epochs and, mid-epoch, `step` steps of the next one. Every
    rank calls it, so that a full output folder ends every rank with rank 0's one line (checkpoint.on_root).
    Returns the seconds the job waited for it (the checkpoint clock's cost: preemption.py)."""
    started = time.perf_counter()
    checkpoint.on_root(
        hvd.rank() == 0,
        lambda: _write(cfg, hvd, epochs_done, model, optimizer, step, steps_per_epoch, config),
        lambda failure: hvd.broadcast_object(failure, root_rank=0, name="saved"),
    )
    return time.perf_counter() - started


def checkpoint_path(cfg, epochs_done: int, step: int = 0) -> pathlib.Path:
    return checkpoint.path_for(cfg.checkpoint_dir, epochs_done, SUFFIX, step)


def _write(cfg, hvd, epochs_done: int, model, optimizer, step=0, steps_per_epoch=None, config=None) -> None:
    arrays = {f"model/{i:05d}": w for i, w in enumerate(model.get_weights())}
    arrays.update({f"optimizer/{i:05d}": v.numpy() for i, v in enumerate(optimizer.variables)})
    meta = {
        "epoch": epochs_done,
        "step": step,
        "steps_per_epoch": steps_per_epoch,
        # The input is rebuilt from these on resume, not stored (data.py: the synthetic order is a function of
        # seed, epoch and rank; TFRecords are reshuffled from the epoch the run starts at).
        "data_order": {"seed": cfg.seed, "epoch": epochs_done, "skip": step},
        "config": config if config is not None else cfg.to_json(),
        "world_size": hvd.size(),
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)

    def write(path):
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        path.write_bytes(buf.getvalue())

    # A local file copied to the logs mount, then a completion marker: no rename (see common/checkpoint.py).
    checkpoint.write(checkpoint_path(cfg, epochs_done, step), write, cfg.keep_checkpoints)
    checkpoint.prune(cfg.checkpoint_dir, SUFFIX, cfg.keep_checkpoints)


def read_meta(path) -> dict:
    with np.load(path) as z:
        return json.loads(z["meta"].tobytes())


def load(path, model, optimizer) -> Position:
    """Load a checkpoint into the model (and optimizer, when given); returns the position it holds."""
    with np.load(path) as z:
        meta = json.loads(z["meta"].tobytes())
        weights = [z[k] for k in sorted(k for k in z.files if k.startswith("model/"))]
        slots = [z[k] for k in sorted(k for k in z.files if k.startswith("optimizer/"))]
    model.set_weights(weights)
    if optimizer is not None:
        variables = list(optimizer.variables)
        if len(variables) != len(slots):
            raise ValueError(f"optimizer has {len(variables)} variables, the checkpoint {len(slots)}")
        for v, value in zip(variables, slots):
            v.assign(value)
    step = int(meta.get("step", 0))  # checkpoints written before mid-epoch ones hold no step: an epoch's end
    return Position(int(meta["epoch"]), step, meta.get("steps_per_epoch") if step else None)


def restore(cfg, hvd_tf, model, optimizer) -> Position:
    """Rank 0 loads the newest checkpoint; then every weight and optimizer slot is broadcast from rank 0,
    before the first step (Horovod's broadcast callback waits until after it, which would train the
    first step of a resumed run on mismatched weights). Returns the position, agreed by all ranks: the input
    (data.build) enters the epoch at its step when this run's epoch has the step count it was written in."""
    build_optimizer_state(optimizer, model)
    position = Position(0)
    if hvd_tf.rank() == 0 and cfg.resume:
        found = checkpoint.latest(cfg.checkpoint_dir, SUFFIX)
        if found:
            _, path = found
            try:
                position = load(path, model, optimizer)
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
                position = Position(-1)
                log.error(
                    "cannot resume from %s: %s: move it away, or pass --no-resume to start over in a new --output-dir",
                    path,
                    e,
                )
            else:
                where = f", {position.step} steps of epoch {position.epoch + 1}" if position.step else ""
                log.info("resuming from %s (%d epochs done%s)", path, position.epoch, where)
    position = Position(*hvd_tf.broadcast_object(tuple(position), root_rank=0, name="resume_epoch"))
    if position.epoch < 0:
        raise ConfigError("the newest checkpoint could not be loaded (see the message above)")
    hvd_tf.broadcast_variables(list(model.variables) + list(optimizer.variables), root_rank=0)
    return position


class Collectives:
    """horovod.tensorflow with the names payloads/common/concerns.py calls (the PyTorch backends' names)."""

    def __init__(self, hvd):
        self.hvd = hvd

    def rank(self) -> int:
        return self.hvd.rank()

    def size(self) -> int:
        return self.hvd.size()

    def broadcast_object(self, obj, name: str):
        return self.hvd.broadcast_object(obj, root_rank=0, name=name)

    def allgather_object(self, obj, name: str) -> list:
        return self.hvd.allgather_object(obj, name=name)


class Saver:
    """The TensorFlow payloads' checkpoints for concerns.Checkpoints: rank 0 writes them before save() returns."""

    def save(self, run, epochs_done: int, step: int = 0, wait: bool = False) -> float:
        config = run.settings.config_record(run.cfg)
        return save(run.cfg, run.hvd, epochs_done, run.model, run.optimizer, step, run.steps, config)

    def path(self, run, epochs_done: int, step: int = 0) -> pathlib.Path:
        return checkpoint_path(run.cfg, epochs_done, step)

    def finish(self, run) -> float:
        return 0.0  # written in save()

    def settle(self) -> None:
        pass

    def failed(self) -> bool:
        return False  # written in save(), where a failure is raised


@dataclasses.dataclass
class Run(concerns.Events):
    """A TensorFlow or Keras run's state as the shared concerns read it (payloads/common/concerns.py): the loop
    (train.py) or the Keras callback (KerasEvents in payloads/keras/train.py) fires the events and keeps the
    position (`epoch`, `step` in it, `steps` per epoch)."""

    log: ClassVar[logging.Logger] = log  # the concerns' lines
    cfg: config.TrainConfig
    hvd: object
    settings: Settings
    model: object = None
    optimizer: object = None
    steps: int = 0
    epoch: int = 0
    step: int = 0
    concerns: list = dataclasses.field(default_factory=list)
    saver: Saver = dataclasses.field(default_factory=Saver)

    def __post_init__(self):
        self.backend = Collectives(self.hvd)
        # The watchdog from here on: a rank that stops making progress ends the job, named (docs/jobs.md).
        watch = concerns.Watch(self.cfg, self.backend)
        self.attach([watch, concerns.Stragglers(self.cfg, self.backend, watch.watch), concerns.Checkpoints(self)])

    @property
    def root(self) -> bool:
        return self.hvd.rank() == 0

    def sum_floats(self, values: list, name: str) -> list:
        """One allreduce of host numbers; every rank calls it at the same event."""
        return self.hvd.allreduce(tf.constant(values, tf.float64), op=self.hvd.Sum, name=name).numpy().tolist()


def world(cfg, hvd, settings: Settings, model, inputs) -> dict:
    """The run record's hardware and software half. Threads and precision are read back from TensorFlow
    and from the training dataset, so the record shows what the run got, not what was asked for."""
    from . import models

    intra = tf.config.threading.get_intra_op_parallelism_threads()
    return {
        "processes": hvd.size(),
        "local_processes": hvd.local_size(),
        "device": settings.device,
        "tensorflow": tf.__version__,
        "keras": _keras_version(),
        "horovod_controller": "mpi" if hvd.mpi_enabled() else "gloo",
        "gradient_mbytes": models.gradient_bytes(model) / 1e6,
        "threads_per_process": intra,
        "threads": {
            "intra_op": intra,
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
            "tf_data_private": inputs.private_threads(),
            "cores_available": available_cores(),
        },
        "precision": tf.keras.mixed_precision.global_policy().name,
        "mixed_precision": settings.amp,
        "xla": cfg.xla,
        "synthetic": inputs.description or None,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "0",
    }  # set by payloads/tensorflow/__init__.py


def _keras_version() -> str:
    # The Keras tf.keras runs (2.x here); Keras 3 would break Horovod's Keras layer (see docs/decisions/tf-2-15-keras-2.md).
    from importlib.metadata import version

    return version("keras")


def say_start(log, cfg, hvd, batch: int, device: str, settings) -> None:
    """Rank 0's two opening lines, the TensorFlow and Keras payloads' alike: what trains where, and what start-up
    resolved."""
    log.info(
        "training %s on %s data, %d process(es) x batch %d, %s, outputs in %s",
        cfg.model,
        cfg.data,
        hvd.size(),
        batch,
        device,
        cfg.output_dir,
    )
    log.info("resolved: %s", settings.line())
