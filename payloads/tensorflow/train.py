"""Data-parallel training of ResNet-50 (and smaller models) with Horovod and a TensorFlow 2 custom loop.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.tensorflow.train --model tiny_cnn ...

Follows Horovod's examples/tensorflow2/tensorflow2_synthetic_benchmark.py: hvd.DistributedGradientTape
averages the gradients; the options, outputs and metrics are the PyTorch payload's (payloads/common). SIGTERM and
--checkpoint-every-minutes: a mid-epoch checkpoint at a step the ranks agree on (payloads/common/preemption.py);
on SIGTERM every rank then exits 75, and the same command resumes at that step.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence

from ..common import config, preemption, schedule
from ..common.errors import ConfigError
from ..common.metrics import MetricsFile, finish
from . import launch

log = logging.getLogger("payloads.tensorflow")
# The options this payload declares (payloads/common/config.py).
GROUPS = (*config.COMMON, config.CLASSIFICATION_INPUT, config.HOROVOD, config.ADASUM, config.TENSORFLOW)


def make_step(cfg, hvd, tf, model, optimizer, prepare):
    """The training and evaluation steps; `prepare` turns a batch's x into images on the step's device."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    op = hvd.Adasum if cfg.adasum else hvd.Average
    from . import runtime

    scaling = runtime.loss_scaling()

    # autograph=False: AutoGraph would rewrite every Python function the step calls (the model's layers, the loss,
    # Horovod's tape) from its source when the step is traced, about 4 s of CPU per process for the tests' tiny
    # model; nothing here branches on a tensor value (`scaling` is a Python bool; Horovod's own conditions are
    # tf.cond inside its tf.functions, which keep their AutoGraph).
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

    root, device, batch, model, scale, threads, cfg = runtime.start(cfg, hvd)
    # From here on a rank that stops making progress ends the job, named (docs/jobs.md#a-job-is-stuck-or-slow).
    watch, phases = runtime.watch(cfg, hvd)
    optimizer = tf.keras.optimizers.SGD(learning_rate=cfg.base_lr * scale, momentum=cfg.momentum)
    if runtime.loss_scaling():
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    position = runtime.restore(cfg, hvd, model, optimizer)
    start_epoch = position.epoch
    inputs = data.build(
        cfg, hvd.rank(), hvd.size(), batch, start_epoch, threads.data, position.step, position.steps_per_epoch
    )
    start_step = inputs.skip  # the checkpoint's step, or 0 where this run's epoch has another step count
    step, predict = make_step(cfg, hvd, tf, model, optimizer, inputs.prepare)
    stop = runtime.preemption(cfg, hvd)  # SIGTERM and the checkpoint clock (docs/jobs.md#preempted-and-resumed)
    pause = runtime.pauser(cfg, hvd, model, optimizer, stop, watch)

    metrics = writer = None
    if root:
        metrics = MetricsFile(
            cfg.metrics_path, {"config": cfg.to_json(), "world": runtime.world(cfg, hvd, device, model, inputs)}
        )
        writer = tf.summary.create_file_writer(str(cfg.tensorboard_dir))
        log.info(
            "training %s on %s data, %d process(es) x batch %d, %s, outputs in %s",
            cfg.model,
            cfg.data,
            hvd.size(),
            batch,
            device,
            cfg.output_dir,
        )

    batches = iter(inputs.train)  # from step `start_step` of the first epoch on
    total_images, total_seconds = 0, 0.0
    try:
        for epoch in range(start_epoch, cfg.epochs):
            skip = start_step if epoch == start_epoch else 0
            record = train_epoch(
                cfg, hvd, tf, epoch, skip, inputs, batches, step, scale, optimizer, watch, phases, stop, pause
            )
            if inputs.validation is not None:
                record.update(evaluate(hvd, tf, epoch, inputs, predict, watch))
            total_images += record["images"]
            total_seconds += record["epoch_seconds"]
            watch.doing("checkpoint")
            stop.saved(runtime.save(cfg, hvd, epoch + 1, model, optimizer, 0, inputs.steps))
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
            runtime.stop_at_epoch_end(cfg, hvd, stop, epoch + 1)
    except preemption.Stopped:
        watch.doing("finishing")
        watch.stop("stopped")
        raise
    finally:
        stop.uninstall()
    watch.doing("finishing")
    summary = finish(
        cfg, hvd, metrics, models.parameters_digest(model), cfg.epochs - start_epoch, total_images, total_seconds
    )
    watch.stop()
    return summary


def train_epoch(cfg, hvd, tf, epoch, skip, inputs, batches, step, scale, optimizer, watch, phases, stop, pause):
    """One epoch, or its rest from step `skip` (resumed mid-epoch: `batches` starts there). After each step `stop`
    says when the ranks agree; `pause` writes the mid-epoch checkpoint, and on a SIGTERM raises
    preemption.Stopped. Returns the epoch's metrics record (training part)."""
    from tqdm import tqdm

    from . import data, runtime

    root = hvd.rank() == 0
    # Sums stay on the device until the epoch ends: reading a GPU value every step would wait for it.
    loss_sum, correct, seen = tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64), 0
    bar = tqdm(
        total=inputs.steps, initial=skip, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not (root and cfg.progress)
    )
    start = time.perf_counter()
    lr = cfg.base_lr * scale
    for i in range(skip, inputs.steps):
        lr = schedule.learning_rate(cfg.base_lr, scale, epoch, i, inputs.steps, cfg.warmup_epochs, cfg.lr_decay_epochs)
        optimizer.learning_rate.assign(lr)
        watch.doing("input")  # the watchdog's marks (attribute stores): what a stall report says
        try:
            x, labels = next(batches)
        except tf.errors.InvalidArgumentError as e:
            raise ConfigError(data.input_error(e)) from None
        watch.doing("compute")  # forward, backward and Horovod's allreduce: one tf.function
        loss, n_correct = step(x, labels)
        watch.step_done()
        if phases.due():
            runtime.compare_phases(hvd, phases)
        # Not after the epoch's last step: the epoch's own checkpoint and agreement follow it (run()).
        if stop.due() and i + 1 < inputs.steps:
            pause(epoch, i + 1, inputs.steps, runtime.agree(hvd, stop))
        n = int(labels.shape[0])
        loss_sum += tf.cast(loss, tf.float64) * n
        correct += n_correct
        seen += n
        bar.update(1)
        if not bar.disable:
            bar.set_postfix(loss=f"{float(loss):.3f}", lr=f"{lr:.4f}")
    runtime.compare_phases(hvd, phases)  # the epoch's last steps, for its per-rank totals
    watch.doing("epoch end")
    loss_sum, correct = float(loss_sum), float(correct)  # waits for the epoch's last step
    seconds = time.perf_counter() - start
    bar.close()
    loss_sum, correct, seen, skipped = global_sums(
        hvd, tf, f"train_{epoch}", loss_sum, correct, seen, inputs.epoch_skipped()
    )
    return {
        "epoch": epoch + 1,
        "train_loss": loss_sum / seen,
        "train_accuracy": correct / seen,
        "images": int(seen),
        "skipped_images": int(skipped),
        "epoch_seconds": seconds,
        "images_per_sec": seen / seconds,
        "lr": lr,
        **({"resumed_at_step": skip} if skip else {}),
        **phases.epoch_record(),
    }


def evaluate(hvd, tf, epoch, inputs, predict, watch) -> dict:
    from . import data

    v_loss = v_correct = v_seen = 0.0
    watch.doing("validation")
    try:
        for x, labels in inputs.validation:
            loss, c = predict(x, labels)
            v_loss, v_correct, v_seen = v_loss + float(loss), v_correct + float(c), v_seen + int(labels.shape[0])
            watch.tick()
    except tf.errors.InvalidArgumentError as e:  # a validation record as a training one: the fix, not a traceback
        raise ConfigError(data.input_error(e)) from None
    v_loss, v_correct, v_seen, v_skipped = global_sums(
        hvd, tf, f"val_{epoch}", v_loss, v_correct, v_seen, inputs.validation_skipped()
    )
    return {"val_loss": v_loss / v_seen, "val_accuracy": v_correct / v_seen, "val_skipped_images": int(v_skipped)}


def main(argv: Sequence[str] | None = None) -> int:
    return launch.main(argv, "python -m payloads.tensorflow.train", __doc__.splitlines()[0], GROUPS, run)


if __name__ == "__main__":
    sys.exit(main())
