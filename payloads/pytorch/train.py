"""Data-parallel training of ResNet-50 (and smaller models) with Horovod and PyTorch.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.pytorch.train --model resnet18 ...
    torchrun --standalone --nproc-per-node 2 -m payloads.pytorch.train --backend ddp --model resnet18 ...

Follows Horovod's examples/pytorch/pytorch_imagenet_resnet50.py and pytorch/examples imagenet, with
their known gaps closed: sharding by global rank with equal step counts, optimizer and loss-scaler state on
every rank after a resume, complete rank-0 checkpoints, exactly averaged metrics; and NVIDIA's
DeepLearningExamples ResNet-50 for the GPU path (bf16/fp16 by GPU, channels_last, uint8 input normalised on
the device, no host sync in the step, steady-state throughput).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..common import config, preemption, schedule
from ..common.errors import ConfigError, say
from ..common.metrics import MetricsFile, finish
from . import backends, inputs, models, runtime

log = logging.getLogger("payloads.pytorch")
PROGRESS_EVERY = 25  # steps between the progress bar's loss readings (each one waits for the device)


class StepClock:
    """Steady-state timing. The first `startup_steps` steps of a run (loader workers starting, cuDNN autotuning,
    compilation) are start-up: timed apart and left out of the throughput. Reads the device clock only at the
    end of start-up and of each epoch."""

    def __init__(self, device: torch.device, startup_steps: int, started: float):
        self.device, self.startup_steps, self.started = device, startup_steps, started
        self.steps = self.images = 0
        self.steady_seconds = 0.0
        self.steady_since: float | None = None
        self.startup_seconds: float | None = None

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def step(self, images: int) -> None:
        self.steps += 1
        if self.steps == self.startup_steps:
            self.steady_since = self._now()
            self.startup_seconds = self.steady_since - self.started
        elif self.steps > self.startup_steps:
            self.images += images

    def epoch_start(self) -> None:
        if self.startup_seconds is not None:
            self.steady_since = time.perf_counter()

    def epoch_end(self) -> None:
        now = self._now()
        if self.startup_seconds is not None and self.steady_since is not None:
            self.steady_seconds += now - self.steady_since
        self.steady_since = None


def train_epoch(
    cfg,
    backend,
    epoch,
    model,
    optimizer,
    scaler,
    prec,
    batches,
    device,
    lr_scale,
    progress,
    clock,
    watch,
    phases,
    stop,
    pause,
    skip=0,
):
    """One epoch, or its rest from step `skip` (resumed mid-epoch: `batches` was set to skip as many). After each
    optimizer step `stop` says when the ranks agree (preemption.py); on a SIGTERM or the checkpoint clock, `pause`
    writes the mid-epoch checkpoint, and on a SIGTERM raises preemption.Stopped."""
    model.train()
    steps = len(batches)
    # Accumulated on the device and read once per epoch: no host sync inside the step.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    seen = skipped = 0
    bar = progress(total=steps, initial=skip, desc=f"epoch {epoch + 1}/{cfg.epochs}")
    clock.epoch_start()
    start = time.perf_counter()
    lr = cfg.base_lr * lr_scale
    # The watchdog's marks (attribute stores): what this rank is doing when a stall names it.
    watch.doing("input")
    for step, (images, labels, n_skipped) in enumerate(batches, start=skip):
        watch.doing("compute")
        lr = schedule.learning_rate(cfg.base_lr, lr_scale, epoch, step, steps, cfg.warmup_epochs, cfg.lr_decay_epochs)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad()  # Horovod's wrapper takes no set_to_none
        n = images.shape[0]
        # backward_passes_per_step: micro-batches accumulate locally; the allreduce runs once per step.
        chunks = max(1, min(cfg.backward_passes_per_step, n))
        parts = list(zip(images.chunk(chunks), labels.chunk(chunks)))
        for i, (part_x, part_y) in enumerate(parts):
            last = i == len(parts) - 1
            with backend.accumulate(model, last=last):
                with prec.autocast():
                    out = model(part_x)
                    loss = F.cross_entropy(out, part_y)
                weighted = loss * (part_x.shape[0] / n)
                if last and backend.name == "ddp":
                    watch.doing("exchange")  # DDP averages the gradients during this backward pass
                (scaler.scale(weighted) if scaler else weighted).backward()
            loss_sum += loss.detach().double() * part_x.shape[0]
            correct += (out.argmax(1) == part_y).sum()
        watch.doing("exchange")  # Horovod waits for the averaged gradients here
        runtime.optimizer_step(optimizer, scaler, backend)
        watch.step_done()
        if phases.due():
            runtime.compare_phases(backend, phases)
        if stop.due():
            pause(epoch, step + 1, steps, runtime.agree(backend, stop))
        seen += n
        skipped += n_skipped
        clock.step(n)
        bar.update(1)
        if not bar.disable and step % PROGRESS_EVERY == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.4f}")
        watch.doing("input")
    runtime.compare_phases(backend, phases)  # the epoch's last steps, for its per-rank totals
    watch.doing("epoch end")
    clock.epoch_end()
    seconds = time.perf_counter() - start
    bar.close()
    loss_sum, correct, seen, skipped = runtime.global_sums(backend, f"train_{epoch}", loss_sum, correct, seen, skipped)
    return {
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


@torch.no_grad()
def evaluate(cfg, backend, epoch, model, prec, batches, device, watch):
    model.eval()
    watch.doing("validation")
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    seen = skipped = 0
    for images, labels, n_skipped in batches:
        skipped += n_skipped
        with prec.autocast():
            out = model(images)
        loss_sum += F.cross_entropy(out.float(), labels, reduction="sum").double()
        correct += (out.argmax(1) == labels).sum()
        seen += images.shape[0]
        watch.tick()
    loss_sum, correct, seen, skipped = runtime.global_sums(backend, f"val_{epoch}", loss_sum, correct, seen, skipped)
    return {"val_loss": loss_sum / seen, "val_accuracy": correct / seen, "val_skipped_images": int(skipped)}


def lr_scale(cfg, backend, device) -> float:
    # Goyal et al.: LR scales with the global batch (processes x backward passes); Adasum has its own rule.
    scale = backend.adasum_lr_scale(device) if cfg.adasum else backend.size()
    return scale * cfg.backward_passes_per_step


def run(cfg: config.TrainConfig) -> dict:
    started = time.perf_counter()
    backend = backends.create(cfg.backend, runtime.collective_timeout(cfg) if cfg.backend == "ddp" else None)
    backend.init()
    root = backend.rank() == 0
    # From here on a rank that stops making progress ends the job, named (docs/jobs.md#a-job-is-stuck-or-slow).
    watch = runtime.watch(cfg, backend)
    phases = runtime.phases(cfg, backend, watch)
    device, prec = runtime.setup(cfg, backend)
    batch = cfg.per_process_batch(backend.size())
    # Each rank loads batch x backward_passes samples per step and splits them into micro-batches.
    data = inputs.build(
        cfg,
        backend.rank(),
        backend.size(),
        batch * cfg.backward_passes_per_step,
        device,
        broadcast_object=lambda obj: backend.broadcast_object(obj, name="image_listing"),
        local_size=backend.local_size(),
    )

    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, data.num_classes, cfg.image_size).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    scale = lr_scale(cfg, backend, device)
    # `model` stays the plain module (checkpoints, digest); `trained` is what the steps run (DDP's wrapper).
    trained, optimizer = backend.wrap(model, runtime.optimizer(cfg, model, cfg.base_lr * scale, device), cfg, device)
    scaler = prec.grad_scaler(cfg.loss_scale_init)
    start_epoch, start_step = runtime.restore(cfg, backend, model, optimizer, scaler, len(data.train))
    stop = runtime.preemption(cfg, backend)  # SIGTERM and the checkpoint clock (docs/jobs.md#preempted-and-resumed)
    pause = runtime.pauser(cfg, backend, model, optimizer, scaler, stop, watch)
    # Compiled after the weights are final: the compiled module shares them, and checkpoints keep the plain names.
    step_model = torch.compile(trained) if cfg.compile else trained

    metrics = writer = None
    if root:
        metrics = MetricsFile(
            cfg.metrics_path, {"config": cfg.to_json(), "world": runtime.world(backend, model, device, prec, cfg)}
        )
        writer = runtime.summary_writer(cfg.tensorboard_dir)
        log.info(
            "training %s on %s data, %d process(es) x batch %d (%s), %s, %s%s%s, outputs in %s",
            cfg.model,
            cfg.data,
            backend.size(),
            batch,
            backend.name,
            device,
            prec.name,
            " channels_last" if cfg.channels_last else "",
            " compiled" if cfg.compile else "",
            cfg.output_dir,
        )
        if os.environ.get("HOROVOD_TIMELINE"):
            log.info("Horovod timeline: %s", os.environ["HOROVOD_TIMELINE"])
    progress = partial(tqdm, disable=not (root and cfg.progress))  # the bar is rank 0's only
    clock = StepClock(device, cfg.startup_steps, started)

    total_images, total_seconds = 0, 0.0
    with runtime.stopping(backend, stop, watch):
        for epoch in range(start_epoch, cfg.epochs):
            skip = start_step if epoch == start_epoch else 0
            data.train.set_epoch(epoch, skip)
            record = {"epoch": epoch + 1}
            record.update(
                train_epoch(
                    cfg,
                    backend,
                    epoch,
                    step_model,
                    optimizer,
                    scaler,
                    prec,
                    data.train,
                    device,
                    scale,
                    progress,
                    clock,
                    watch,
                    phases,
                    stop,
                    pause,
                    skip,
                )
            )
            if data.val is not None:
                data.val.set_epoch(epoch)
                record.update(evaluate(cfg, backend, epoch, step_model, prec, data.val, device, watch))
            total_images += record["images"]
            total_seconds += record["epoch_seconds"]
            watch.doing("checkpoint")
            stop.saved(runtime.save(cfg, backend, epoch + 1, model, optimizer, scaler, 0, len(data.train)))
            if root:
                metrics.add_epoch(record)
                for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "images_per_sec", "lr"):
                    if key in record:
                        writer.add_scalar(key, record[key], epoch + 1)
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
            runtime.stop_at_epoch_end(cfg, backend, stop, epoch + 1)

    watch.doing("finishing")
    if root:
        writer.close()
    # The clock counted this rank's images; the throughput is the job's (ranks' batches may differ by a sample).
    (steady_images,) = runtime.global_sums(backend, "steady_images", clock.images)
    steady = clock.steady_seconds > 0 and steady_images > 0
    if not steady and root and cfg.epochs > start_epoch:
        log.warning(
            "the run had no more than %d steps (--startup-steps): Total images/sec includes start-up", cfg.startup_steps
        )
    summary = finish(
        cfg,
        backend,
        metrics,
        models.parameters_digest(model),
        cfg.epochs - start_epoch,
        int(steady_images) if steady else total_images,
        clock.steady_seconds if steady else total_seconds,
        extra={
            "startup_seconds": clock.startup_seconds,
            "steady_state": steady,
            "all_images": total_images,
            "all_train_seconds": total_seconds,
        },
    )
    backend.shutdown()
    watch.stop()
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        cfg = config.parse(
            argv,
            "python -m payloads.pytorch.train",
            __doc__.splitlines()[0],
            list(models.MODELS),
            ("synthetic", "imagefolder", "shards"),
        )
        run(cfg)
    except ConfigError as e:
        # Every rank says it: a data error may be met by one rank only.
        say(f"error: {e}")
        return 2
    except preemption.Stopped as e:
        say(str(e))  # every rank says it: all stopped at the same step
        return preemption.EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
