"""Data-parallel training of ResNet-50 (and smaller models) with Horovod and a TensorFlow 2 custom loop.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.tensorflow.train --model tiny_cnn ...

Follows Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark.py: hvd.DistributedGradientTape
averages the gradients; the options, outputs and metrics are the PyTorch payload's (payloads/common). SIGTERM and
--checkpoint-every-minutes: a mid-epoch checkpoint at a step the ranks agree on (payloads/common/preemption.py);
on SIGTERM every rank then exits 75, and the same command resumes at that step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from ..common import concerns, config, options, schedule
from ..common.errors import ConfigError
from ..common.metrics import MetricsFile, finish
from . import launch

log = logging.getLogger("payloads.tensorflow")
# The options this payload declares (payloads/common/options.py).
GROUPS = (*options.COMMON, options.CLASSIFICATION_INPUT, options.HOROVOD, options.ADASUM, options.TENSORFLOW)


def make_step(cfg, hvd, tf, model, optimizer, prepare):
    """The training and evaluation steps; `prepare` turns a batch's x into images on the step's device."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    op = hvd.Adasum if cfg.adasum else hvd.Average
    from . import runtime

    scaling = runtime.loss_scaling()

    # autograph=False: AutoGraph would rewrite every Python function the step calls (the model's layers, the loss,
    # Horovod's tape) from its source when the step is traced, seconds of CPU per process
    # (docs/benchmarks.md#tracing-without-autograph); nothing here branches on a tensor value (`scaling` is a
    # Python bool; Horovod's own conditions are tf.cond inside its tf.functions, which keep their AutoGraph).
    @tf.function(reduce_retracing=True, autograph=False)
    def step(x, labels):
        with tf.GradientTape() as tape:
            logits = model(prepare(x), training=True)
            loss = loss_fn(labels, tf.cast(logits, tf.float32))
            total = loss + runtime.weight_decay_loss(cfg, model)
            scaled = optimizer.get_scaled_loss(total) if scaling else total
        tape = hvd.DistributedGradientTape(tape, compression=compression, op=op)
        grads = tape.gradient(scaled, model.trainable_variables)
        if scaling:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float64))
        return loss, correct

    @tf.function(reduce_retracing=True, autograph=False)
    def predict(x, labels):
        logits = tf.cast(model(prepare(x), training=False), tf.float32)
        loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float64))
        return loss, correct

    return step, predict


def global_sums(hvd, tf, name: str, *values: float) -> list[float]:
    """Sum over ranks: losses and counts are summed, then divided, so means are exact."""
    return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Sum, name=name).numpy().tolist()


def run(cfg: config.TrainConfig) -> dict:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from . import data, models, runtime

    root, device, batch, model, scale, threads, settings = runtime.start(cfg, hvd)
    # The watchdog, stragglers and checkpoints (payloads/common/concerns.py).
    state = runtime.Run(cfg, hvd, settings, model)
    optimizer = tf.keras.optimizers.SGD(learning_rate=settings.base_lr * scale, momentum=cfg.momentum)
    if runtime.loss_scaling():
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    position = runtime.restore(cfg, hvd, model, optimizer)
    start_epoch = position.epoch
    inputs = data.build(
        cfg, hvd.rank(), hvd.size(), batch, start_epoch, threads.data, position.step, position.steps_per_epoch
    )
    start_step = inputs.skip  # the checkpoint's step, or 0 where this run's epoch has another step count
    step, predict = make_step(cfg, hvd, tf, model, optimizer, inputs.prepare)
    state.optimizer, state.steps = optimizer, inputs.steps

    metrics = writer = None
    if root:
        world = runtime.world(cfg, hvd, settings, model, inputs)
        record = {"config": settings.config_record(cfg), "world": world, "resolved": settings.to_json()}
        metrics = MetricsFile(cfg.metrics_path, record)
        writer = tf.summary.create_file_writer(str(cfg.tensorboard_dir))
        runtime.say_start(log, cfg, hvd, batch, device, settings)

    batches = iter(inputs.train)  # from step `start_step` of the first epoch on
    total_images, total_seconds = 0, 0.0
    with concerns.ending(state):
        state.fire("run_start")
        for epoch in range(start_epoch, cfg.epochs):
            skip = start_step if epoch == start_epoch else 0
            record = train_epoch(state, tf, epoch, skip, inputs, batches, step, scale)
            if inputs.validation is not None:
                record.update(evaluate(state, tf, epoch, inputs, predict))
            total_images += record["images"]
            total_seconds += record["epoch_seconds"]
            state.fire("checkpoint")
            if root:
                metrics.add_epoch(record)
                with writer.as_default(step=epoch + 1):
                    for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "images_per_sec", "lr"):
                        if key in record:
                            tf.summary.scalar(key, record[key])
                writer.flush()
                log.info(
                    "epoch %d/%d: loss %.4f, accuracy %.3f%s, %.1f images/sec",
                    epoch + 1,
                    cfg.epochs,
                    record["train_loss"],
                    record["train_accuracy"],
                    f", val accuracy {record['val_accuracy']:.3f}" if "val_accuracy" in record else "",
                    record["images_per_sec"],
                )
            state.fire("after_epoch")
    state.doing("finishing")
    summary = finish(
        cfg, hvd, metrics, models.parameters_digest(model), cfg.epochs - start_epoch, total_images, total_seconds
    )
    state.fire("finished")
    return summary


def train_epoch(state, tf, epoch: int, skip: int, inputs, batches, step, scale: float) -> dict:
    """One epoch, or its rest from step `skip` (resumed mid-epoch: `batches` starts there), firing the shared
    concerns' events (payloads/common/concerns.py: the watchdog's marks, stragglers, the SIGTERM stop and the
    checkpoint clock). Returns the epoch's metrics record (training part)."""
    from tqdm import tqdm

    from . import data

    cfg, hvd, base_lr = state.cfg, state.hvd, state.settings.base_lr
    state.epoch = epoch
    # Sums stay on the device until the epoch ends: reading a GPU value every step would wait for it.
    loss_sum, correct, seen = tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64), 0
    bar = tqdm(
        total=inputs.steps,
        initial=skip,
        desc=f"epoch {epoch + 1}/{cfg.epochs}",
        disable=not (state.root and cfg.progress),
    )
    start = time.perf_counter()
    lr = base_lr * scale
    for i in range(skip, inputs.steps):
        lr = schedule.learning_rate(base_lr, scale, epoch, i, inputs.steps, cfg.warmup_epochs, cfg.lr_decay_epochs)
        state.optimizer.learning_rate.assign(lr)
        state.doing("input")
        try:
            x, labels = next(batches)
        except tf.errors.InvalidArgumentError as e:
            raise ConfigError(data.input_error(e)) from None
        state.doing("compute")  # forward, backward and Horovod's allreduce: one tf.function
        loss, n_correct = step(x, labels)
        state.step = i
        state.fire("step_end")
        n = int(labels.shape[0])
        loss_sum += tf.cast(loss, tf.float64) * n
        correct += n_correct
        seen += n
        bar.update(1)
        if not bar.disable:
            bar.set_postfix(loss=f"{float(loss):.3f}", lr=f"{lr:.4f}")
    state.fire("epoch_end")
    loss_sum, correct = float(loss_sum), float(correct)  # waits for the epoch's last step
    seconds = time.perf_counter() - start
    bar.close()
    loss_sum, correct, seen, skipped = global_sums(
        hvd, tf, f"train_{epoch}", loss_sum, correct, seen, inputs.epoch_skipped()
    )
    record = {
        "epoch": epoch + 1,
        "train_loss": loss_sum / seen,
        "train_accuracy": correct / seen,
        "images": int(seen),
        "skipped_images": int(skipped),
        "epoch_seconds": seconds,
        "images_per_sec": seen / seconds,
        "lr": lr,
        **({"resumed_at_step": skip} if skip else {}),
    }
    state.fire("epoch_record", record)
    return record


def evaluate(state, tf, epoch, inputs, predict) -> dict:
    from . import data

    v_loss = v_correct = v_seen = 0.0
    state.fire("validation_start")
    try:
        for x, labels in inputs.validation:
            loss, c = predict(x, labels)
            v_loss, v_correct, v_seen = v_loss + float(loss), v_correct + float(c), v_seen + int(labels.shape[0])
            state.validation_step()
    except tf.errors.InvalidArgumentError as e:  # a validation record as a training one: the fix, not a traceback
        raise ConfigError(data.input_error(e)) from None
    v_loss, v_correct, v_seen, v_skipped = global_sums(
        state.hvd, tf, f"val_{epoch}", v_loss, v_correct, v_seen, inputs.validation_skipped()
    )
    return {"val_loss": v_loss / v_seen, "val_accuracy": v_correct / v_seen, "val_skipped_images": int(v_skipped)}


def main(argv: Sequence[str] | None = None) -> int:
    return launch.main(argv, "python -m payloads.tensorflow.train", __doc__.splitlines()[0], GROUPS, run)


if __name__ == "__main__":
    from payloads.common import entry

    entry.finish(main())
