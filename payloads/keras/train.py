"""Data-parallel training of ResNet-50 (and smaller models) with Horovod and Keras' model.fit.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.keras.train --model tiny_cnn ...

Follows Horovod's examples/keras/keras_imagenet_resnet50.py: hvd.DistributedOptimizer averages the
gradients, Horovod's callbacks broadcast the initial state, average the epoch metrics and set the LR every batch
(warm-up, then steps down at --lr-decay-epochs). Models, data, checkpoints and metrics are the TensorFlow payload's.
Needs Keras 2 (TensorFlow 2.15): on Keras 3 Horovod's optimizer hooks are never called and gradients are
silently not averaged; the tests compare a 2-process run with a 1-process run to catch exactly that.

SIGTERM and --checkpoint-every-minutes (payloads/common/preemption.py): after a step the ranks agree in a
callback; the mid-epoch checkpoint is the TensorFlow payload's, and on SIGTERM the callback raises out of fit()
on every rank (exit 75). Resumed from it, fit() enters the epoch at that step (EnterAt) and the data stream starts
there (payloads/tensorflow/data.py), so the LR callback and the records see the true step numbers.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence

from ..common import concerns, config, options, schedule
from ..common.errors import ConfigError
from ..common.metrics import MetricsFile, finish
from ..tensorflow import launch

log = logging.getLogger("payloads.keras")
# The options this payload declares (payloads/common/options.py): the TensorFlow payload's less --adasum.
GROUPS = (*options.COMMON, options.CLASSIFICATION_INPUT, options.HOROVOD, options.TENSORFLOW)


def lr_callback(cfg, hvd, base_lr: float, scale: float, steps: int):
    """Horovod's per-batch LR callback driven by payloads/common/schedule.py (linear warm-up from the base LR
    to base x scale over --warmup-epochs, then 10x down at each --lr-decay-epochs), so that the Keras,
    TensorFlow and PyTorch payloads train on the same LR at every step. Horovod's stock warm-up callback
    is one step ahead of that schedule and overshoots the target LR when --warmup-epochs is fractional;
    its constant-multiplier schedule callback decays exponentially per epoch (tests/test_tensorflow.py)."""

    def multiplier(progress: float) -> float:
        epoch = int(progress)
        step = round((progress - epoch) * steps)
        return schedule.learning_rate(1.0, scale, epoch, step, steps, cfg.warmup_epochs, cfg.lr_decay_epochs)

    return hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=base_lr,
        multiplier=multiplier,
        start_epoch=0,
        staircase=False,
        steps_per_epoch=steps,
        momentum_correction=False,
    )  # Keras 2.11+ optimizers keep momentum as a float, not a variable


def run(cfg: config.TrainConfig) -> dict:
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from ..tensorflow import data, models, runtime

    root, device, batch, model, scale, threads, settings = runtime.start(cfg, hvd_tf)
    # The watchdog, stragglers and checkpoints (payloads/common/concerns.py).
    state = runtime.Run(cfg, hvd_tf, settings, model)
    scaled_lr = settings.base_lr * scale
    optimizer = hvd.DistributedOptimizer(
        tf.keras.optimizers.SGD(learning_rate=scaled_lr, momentum=cfg.momentum),
        compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
        op=hvd.Average,
    )
    if runtime.loss_scaling():
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    if cfg.weight_decay:
        model.add_loss(lambda: runtime.weight_decay_loss(cfg, model))
    position = runtime.restore(cfg, hvd_tf, model, optimizer)
    start_epoch = position.epoch
    inputs = data.build(
        cfg, hvd.rank(), hvd.size(), batch, start_epoch, threads.data, position.step, position.steps_per_epoch
    )
    start_step = inputs.skip  # the checkpoint's step, or 0 where this run's epoch has another step count
    state.optimizer, state.steps = optimizer, inputs.steps
    # fit() trains `trained`: the model itself, or (synthetic data) the model behind the step that gathers
    # each batch's images on the device; both hold the same variables, which the checkpoints save.
    trained = model if inputs.prepare is data.identity else with_input(model, inputs.prepare)
    trained.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # "ce": the loss without the weight-decay term, which Keras adds to its "loss"; metrics.json
        # reports it as train_loss, as the other payloads do.
        metrics=[
            tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            tf.keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="ce"),
        ],
    )

    recorder = Recorder(state, batch, inputs, start_epoch, start_step)
    callbacks = [
        events(state),
        # Also broadcast by runtime.restore before the first step; kept as Horovod's documented safety net.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Before our recorder: it sees the averaged epoch metrics.
        hvd.callbacks.MetricAverageCallback(),
        lr_callback(cfg, hvd, settings.base_lr, scale, inputs.steps),
        recorder,
    ]
    metrics = None
    if root:
        world = runtime.world(cfg, hvd_tf, settings, model, inputs)
        record = {"config": settings.config_record(cfg), "world": world, "resolved": settings.to_json()}
        metrics = MetricsFile(cfg.metrics_path, record)
        recorder.metrics = metrics
        callbacks.append(tf.keras.callbacks.TensorBoard(log_dir=str(cfg.tensorboard_dir), update_freq="epoch"))
        runtime.say_start(log, cfg, hvd, batch, device, settings)
    # preemption.Stopped is raised out of fit() by the callbacks, on every rank after the same step.
    with concerns.ending(state):
        state.fire("run_start")
        try:
            if start_epoch < cfg.epochs:
                with EnterAt(start_epoch, start_step).entering(trained):
                    trained.fit(
                        inputs.train,
                        steps_per_epoch=inputs.steps,
                        epochs=cfg.epochs,
                        initial_epoch=start_epoch,
                        validation_data=inputs.validation,
                        callbacks=callbacks,
                        verbose=(1 if cfg.progress else 2) if root else 0,
                    )
        except tf.errors.InvalidArgumentError as e:
            raise ConfigError(data.input_error(e)) from None
    state.doing("finishing")
    summary = finish(
        cfg,
        hvd_tf,
        metrics,
        models.parameters_digest(model),
        cfg.epochs - start_epoch,
        recorder.images,
        recorder.seconds,
    )
    state.fire("finished")
    return summary


class EnterAt:
    """fit() entering its first epoch at step `step`: Keras 2's own mid-epoch resume, the one BackupAndRestore
    (save_freq=N) uses. fit() asks model._training_state for (initial epoch, initial step)
    (Model._maybe_load_initial_counters_from_ckpt, keras/src/engine/training.py), and its DataHandler then runs
    that epoch's steps from `step` on, passing the callbacks the true step numbers (data_adapter.py, steps()).
    Only the answer is Keras' part: the checkpoint is ours. tests/test_tensorflow.py checks the hook on the
    installed Keras."""

    def __init__(self, epoch: int, step: int):
        self.epoch, self.step = epoch, step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch, initial_epoch, mode=None):
        if self.step and initial_epoch == self.epoch and self.step < steps_per_epoch:
            step, self.step = self.step, 0  # once: a later fit() starts its epochs at their first step
            return initial_epoch, step
        return initial_epoch, 0

    @contextlib.contextmanager
    def entering(self, model):
        """Around fit(): the model asks this object; nothing is set when the run starts at an epoch's start."""
        if not self.step:
            yield
            return
        if not hasattr(model, "_training_state"):
            raise RuntimeError("this Keras has no Model._training_state: a mid-epoch resume needs Keras 2.15")
        model._training_state = self
        try:
            yield
        finally:
            model._training_state = None


def events(state):
    """The Keras callback that fires the shared concerns' events from fit() (payloads/common/concerns.py: the
    watchdog's marks, the ranks' step-part comparison, the SIGTERM stop and the checkpoint clock inside an epoch).
    A step is input, compute and Horovod's allreduce in one call: "step" to the watchdog, all of it compute to the
    straggler comparison. Attribute stores only between those; _supports_tf_logs keeps Keras from reading the
    step's logs to the host for it (a sync per step). Every rank calls its callbacks at the same batch, so the
    events' collectives are safe."""
    import tensorflow as tf

    class KerasEvents(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True

        def on_epoch_begin(self, epoch, logs=None):
            state.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            state.doing("step")

        def on_train_batch_end(self, batch, logs=None):
            state.step = batch  # the step's number in its epoch (from the entry step in a resumed one)
            state.fire("step_end")

        def on_test_begin(self, logs=None):
            state.doing("validation")

        def on_test_batch_end(self, batch, logs=None):
            state.validation_step()

        def on_epoch_end(self, epoch, logs=None):
            state.fire("epoch_end")

    return KerasEvents()


def with_input(model, prepare):
    """A Keras model that runs `prepare` on its input, then `model`: fit() then takes pool positions
    (a few bytes per sample) and the images are gathered inside the compiled step, on its device."""
    import tensorflow as tf

    class WithInput(tf.keras.Model):
        def __init__(self):
            super().__init__(name=f"{model.name}_with_input")
            self.inner = model  # tracked: its variables (and weight-decay loss) are this model's

        def call(self, x, training=None):
            return self.inner(prepare(x), training=training)

    return WithInput()


def Recorder(state, batch: int, inputs, start_epoch: int, start_step: int):
    """Times each epoch, fires the epoch's checkpoint and writes the metrics record, then the ranks agree whether a
    SIGTERM came during the epoch's end (after_epoch). The run's first epoch starts at `start_step`."""
    import tensorflow as tf

    cfg, hvd_tf, optimizer = state.cfg, state.hvd, state.optimizer

    class _Recorder(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.metrics, self.images, self.seconds, self._start, self._skip = None, 0, 0.0, 0.0, 0

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()
            self._skip = start_step if epoch == start_epoch else 0

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self._start  # before the checkpoint write, as in the other payloads
            images = (inputs.steps - self._skip) * batch * hvd_tf.size()
            logs = dict(logs or {})
            validated = "val_loss" in logs
            # Every rank runs this callback, so a collective is safe here.
            skipped, val_skipped = (
                hvd_tf.allreduce(
                    tf.constant([inputs.epoch_skipped(), inputs.validation_skipped() if validated else 0], tf.float64),
                    op=hvd_tf.Sum,
                    name=f"skipped_{epoch}",
                )
                .numpy()
                .tolist()
            )
            parts = {}
            state.fire("epoch_record", parts)  # the stragglers' per-rank totals
            self.images += images
            self.seconds += seconds
            state.fire("checkpoint")
            if self.metrics is not None:
                self.record(epoch, logs, images, seconds, skipped, val_skipped, parts)
            state.fire("after_epoch")

        def record(self, epoch, logs, images, seconds, skipped, val_skipped, parts):
            validated = "val_loss" in logs
            record = {
                "epoch": epoch + 1,
                "train_loss": float(logs["ce"]),
                "train_accuracy": float(logs["accuracy"]),
                "images": images,
                "skipped_images": int(skipped),
                "epoch_seconds": seconds,
                "images_per_sec": images / seconds,
                "lr": float(tf.keras.backend.get_value(optimizer.learning_rate)),
                **({"resumed_at_step": self._skip} if self._skip else {}),
                **parts,
            }
            if validated:
                record.update(
                    val_loss=float(logs["val_ce"]),
                    val_accuracy=float(logs["val_accuracy"]),
                    val_skipped_images=int(val_skipped),
                )
            self.metrics.add_epoch(record)
            log.info(
                "epoch %d/%d: loss %.4f, accuracy %.3f, %.1f images/sec",
                epoch + 1,
                cfg.epochs,
                record["train_loss"],
                record["train_accuracy"],
                record["images_per_sec"],
            )

    return _Recorder()


# horovod/tensorflow/keras/__init__.py, DistributedOptimizer: "op currently only supports Average and Sum".
REFUSED = {
    **launch.REFUSED,
    "adasum": "--adasum is not available in the Keras payload: Horovod's Keras DistributedOptimizer reduces "
    "with Average or Sum only. Use the TensorFlow payload (python -m payloads.tensorflow.train "
    "--adasum) or the PyTorch one, or drop --adasum",
}


def main(argv: Sequence[str] | None = None) -> int:
    return launch.main(argv, "python -m payloads.keras.train", __doc__.splitlines()[0], GROUPS, run, REFUSED)


if __name__ == "__main__":
    from payloads.common import entry

    entry.finish(main())
