"""Land-cover segmentation (U-Net, four-band imagery) trained data-parallel with Horovod and PyTorch.

    horovodrun -np 2 -H localhost:2 python -m payloads.segmentation.train --data-dir D --model unet_tiny ...
    torchrun --standalone --nproc-per-node 2 -m payloads.segmentation.train --backend ddp --data-dir D ...

D is a folder made by `python -m datatools.landcover.prepare` (blocks + manifest.json). Shares the
PyTorch payload's runtime set-up, checkpoint resume and save, and payloads/common's configuration, LR
schedule, checkpoint files and metrics; adds the patch sampler, the per-pixel loss that ignores no data,
and pixel accuracy / IoU / mIoU / confusion matrix, summed exactly over ranks.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..common import config, preemption, schedule
from ..common.errors import ConfigError, say
from ..common.metrics import MetricsFile, finish
from ..pytorch import backends, runtime
from ..pytorch.models import parameters_digest
from . import data, metrics, models
from .labels import IGNORE, NODATA

PROG = "python -m payloads.segmentation.train"
log = logging.getLogger("payloads.segmentation")

# Common options this payload does not offer, and why (an option that is accepted must do something).
UNUSED = {
    "synthetic_samples": "it reads prepared tiles; make synthetic ones with python -m datatools.landcover.synthetic "
    "and cut them with python -m datatools.landcover.prepare",
    "skip_corrupt_images": "every block is read and checked before training, so a damaged one stops the job at once",
    "workers": "patches are cut from blocks held in memory by the training process itself",
    "adasum": "only averaging is tested for this payload",
    "fp16_allreduce": "only full-precision averaging is tested for this payload",
    "backward_passes_per_step": "only one backward pass per step is tested for this payload",
    "compile": "only the classification payload is tested compiled",
}


@dataclass
class SegmentationOptions:
    patches_per_epoch: int = 0  # 0: as many patches as the training blocks' area holds
    cache: str = "memory"  # memory: each process keeps its blocks; none: read a block per use
    norm: str = "batch"  # batch | group (models.py)
    num_classes_given: int = 0  # --num-classes, when given: must match the manifest


def parse(argv: Sequence[str] | None) -> tuple[config.TrainConfig, SegmentationOptions]:
    # The options this payload declares (payloads/common/config.py), with its own defaults. Base LR: its own
    # (0.0125 per process of 8 patches); Goyal's rule is the ImageNet payloads'.
    defaults = config.payload_defaults(
        model="unet_resnet34", data="tiles", image_size=256, batch_size=8, base_lr=0.0125
    )
    p = config.build_parser(
        PROG,
        __doc__.splitlines()[0],
        (*config.COMMON, config.PYTORCH),
        defaults,
        list(models.MODELS),
        data_kinds=("tiles",),
    )
    g = p.add_argument_group("segmentation")
    g.add_argument(
        "--num-classes",
        dest="num_classes_given",
        type=int,
        default=0,
        metavar="NUM_CLASSES",
        help="the classes of the data; 0 = the count in its manifest.json, which a given count must match",
    )
    g.add_argument(
        "--patches-per-epoch",
        type=int,
        default=0,
        help="training patches per epoch, whole job; 0 = the training blocks' area / patch area",
    )
    g.add_argument(
        "--cache",
        choices=("memory", "none"),
        default="memory",
        help="memory: each process reads its blocks once and keeps them; none: reads a block per use",
    )
    g.add_argument(
        "--norm",
        choices=models.NORMS,
        default="batch",
        help="group: GroupNorm instead of BatchNorm (independent of how the batch is split)",
    )
    refused = {
        name: f"--{name.replace('_', '-')} is not an option of the segmentation payload: {why}"
        for name, why in UNUSED.items()
    }
    values = config.parse_known(p, argv, refused)
    seg = SegmentationOptions(
        values.pop("patches_per_epoch"), values.pop("cache"), values.pop("norm"), values.pop("num_classes_given")
    )
    cfg = config.configure(values, defaults)
    cfg.validate(list(models.MODELS), data_kinds=("tiles",))
    config.check_output_dir(cfg.output_dir)
    if cfg.data_dir is None:
        raise ConfigError("--data-dir is required: a folder made by python -m datatools.landcover.prepare")
    if seg.patches_per_epoch < 0:
        raise ConfigError(f"--patches-per-epoch must not be negative, got {seg.patches_per_epoch}")
    divisor = models.DIVISOR[cfg.model]
    if cfg.image_size % divisor:
        raise ConfigError(
            f"--image-size {cfg.image_size} (the patch side): {cfg.model} needs a multiple of {divisor} "
            f"(its encoder halves the patch repeatedly), e.g. {max(divisor, cfg.image_size // divisor * divisor)}"
        )
    return cfg, seg


def pixel_loss(
    logits: torch.Tensor, target: torch.Tensor, global_valid: float, world_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's loss to back-propagate, its summed cross-entropy). The loss of a step is the mean over the
    global batch's valid pixels: each rank divides its sum by the global count of valid pixels, times the world
    size that the backend's averaging (Horovod's or DDP's) divides out again. No-data pixels (IGNORE) add nothing to either."""
    ce = F.cross_entropy(logits.float(), target, ignore_index=IGNORE, reduction="sum")
    return ce * (world_size / max(global_valid, 1.0)), ce.detach()


def _band_stats(manifest, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.as_tensor(manifest.band_mean, device=device).view(-1, 1, 1),
        torch.as_tensor(manifest.band_std, device=device).view(-1, 1, 1),
    )


def train_epoch(
    cfg,
    backend,
    epoch,
    model,
    optimizer,
    scaler,
    prec,
    store,
    sampler,
    manifest,
    device,
    lr_scale,
    progress,
    watch,
    phases,
    stop,
    pause,
    skip=0,
):
    """One epoch, or its rest from step `skip` (resumed mid-epoch: the epoch's patches are a function of
    (--seed, epoch), so its steps are rebuilt and entered at `skip`). After each optimizer step `stop` says when
    the ranks agree; `pause` writes the mid-epoch checkpoint, and on a SIGTERM raises preemption.Stopped."""
    model.train()
    classes = len(manifest.class_names)
    steps = sampler.epoch(epoch)
    conf = torch.zeros(classes, classes, dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    valid_sum = seen = 0
    mean, std = _band_stats(manifest, device)
    bar = progress(total=len(steps), initial=skip, desc=f"epoch {epoch + 1}/{cfg.epochs}")
    # A thread cuts the next batch while this one trains: the training thread waits for the GPU at every
    # step's allreduce, so cutting there would not overlap with the GPU's work.
    start = time.perf_counter()
    with ThreadPoolExecutor(1, thread_name_prefix="patches") as pool:
        upcoming = pool.submit(data.batch, store, steps[skip], cfg.image_size)
        for step, patches in enumerate(steps[skip:], start=skip):
            # The watchdog's marks (attribute stores): what this rank is doing when a stall names it.
            watch.doing("input")
            images, labels = upcoming.result()
            watch.doing("compute")
            if step + 1 < len(steps):
                upcoming = pool.submit(data.batch, store, steps[step + 1], cfg.image_size)
            lr = schedule.learning_rate(
                cfg.base_lr, lr_scale, epoch, step, len(steps), cfg.warmup_epochs, cfg.lr_decay_epochs
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            valid = int((labels != NODATA).sum())
            global_valid = backend.allreduce_sum(torch.tensor(float(valid), dtype=torch.float64), "valid_pixels").item()
            images, target = data.inputs(
                images.to(device, non_blocking=True), labels.to(device, non_blocking=True), mean, std
            )
            if cfg.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            optimizer.zero_grad()
            with prec.autocast():
                out = model(images)
            loss, ce = pixel_loss(out, target, global_valid, backend.size())
            if backend.name == "ddp":
                watch.doing("exchange")  # DDP averages the gradients during backward
            (scaler.scale(loss) if scaler is not None else loss).backward()
            watch.doing("exchange")  # Horovod waits for the averaged gradients here
            runtime.optimizer_step(optimizer, scaler, backend)
            watch.step_done()
            if phases.due():
                runtime.compare_phases(backend, phases)
            # Not after the epoch's last step: its buffers are averaged and it is validated first (run()).
            if stop.due() and step + 1 < len(steps):
                pause(epoch, step + 1, len(steps), runtime.agree(backend, stop))
                watch.doing("compute")
            loss_sum += ce
            conf += metrics.confusion(out.detach().argmax(1), target, classes)
            valid_sum += valid
            seen += len(patches)
            bar.update(1)
    runtime.compare_phases(backend, phases)  # the epoch's last steps, for its per-rank totals
    watch.doing("epoch end")
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    bar.close()
    loss_total, valid_total, seen = runtime.global_sums(backend, f"train_{epoch}", loss_sum, valid_sum, seen)
    s = metrics.scores(metrics.allreduce(backend, conf, f"train_confusion_{epoch}"), manifest.class_names)
    return {
        "train_loss": loss_total / max(valid_total, 1.0),
        "train_pixel_accuracy": s["pixel_accuracy"],
        "train_miou": s["miou"],
        "train_iou": s["iou"],
        "train_confusion_matrix": s["confusion_matrix"],
        "valid_pixels": int(valid_total),
        "images": int(seen),
        "patches": int(seen),
        "epoch_seconds": seconds,
        "images_per_sec": seen / seconds,
        "patches_per_sec": seen / seconds,
        "lr": lr,
        **({"resumed_at_step": skip} if skip else {}),
        **phases.epoch_record(),
    }


@torch.no_grad()
def evaluate(cfg, backend, epoch, model, prec, store, manifest, batch, device, watch):
    """Every validation pixel once; the confusion matrix is summed over ranks, then scored."""
    model.eval()
    watch.doing("validation")
    classes = len(manifest.class_names)
    conf = torch.zeros(classes, classes, dtype=torch.int64, device=device)
    loss_sum = 0.0
    windows = data.val_windows(store, cfg.image_size, backend.rank(), backend.size())
    mean, std = _band_stats(manifest, device)
    for i in range(0, len(windows), batch):
        images, labels = data.batch(store, windows[i : i + batch], cfg.image_size)
        images, target = data.inputs(images.to(device), labels.to(device), mean, std)
        if cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with prec.autocast():
            out = model(images)
        loss_sum += F.cross_entropy(out.float(), target, ignore_index=IGNORE, reduction="sum").item()
        conf += metrics.confusion(out.argmax(1), target, classes)
        watch.tick()
    matrix = metrics.allreduce(backend, conf, f"val_confusion_{epoch}")
    (loss_sum,) = runtime.global_sums(backend, f"val_{epoch}", loss_sum)
    s = metrics.scores(matrix, manifest.class_names)
    return {
        "val_loss": loss_sum / max(int(matrix.sum()), 1),
        "val_pixel_accuracy": s["pixel_accuracy"],
        "val_miou": s["miou"],
        "val_iou": s["iou"],
        "val_confusion_matrix": s["confusion_matrix"],
    }


def average_buffers(backend, model) -> None:
    """BatchNorm's running statistics are per rank; average them so that every rank (and the checkpoint)
    evaluates the same model."""
    if backend.size() == 1:
        return
    for name, buf in model.named_buffers():
        if buf.is_floating_point():
            buf.copy_(backend.allreduce_mean(buf.detach(), f"buffer.{name}"))


def load_data(cfg, seg, backend, batch):
    """Manifest, block stores and sampler; every rank reads (and checks) its share before training, and all
    ranks stop together if any block is damaged."""
    manifest = data.Manifest.load(cfg.data_dir)
    if seg.num_classes_given and seg.num_classes_given != manifest.num_classes:
        raise ConfigError(
            f"--num-classes {seg.num_classes_given} but {cfg.data_dir} was prepared with "
            f"{manifest.num_classes} classes: drop --num-classes (the manifest's count is used)"
        )
    cfg.num_classes = manifest.num_classes
    train = data.BlockStore(manifest, manifest.train, seg.cache == "memory")
    sampler = data.PatchSampler(
        manifest.train,
        cfg.image_size,
        backend.rank(),
        backend.size(),
        batch * backend.size(),
        cfg.seed,
        seg.patches_per_epoch,
        cfg.max_steps_per_epoch,
    )
    val = data.BlockStore(manifest, manifest.val, seg.cache == "memory") if manifest.val else None
    error, start = None, time.perf_counter()
    try:
        train.load(sampler.owned())
        if val is not None:
            val.load(range(backend.rank(), len(val), backend.size()))
    except ConfigError as e:
        error = str(e)
    errors = [e for e in backend.allgather_object(error, "data_errors") if e]
    if errors:
        raise ConfigError(errors[0])
    return manifest, train, sampler, val, time.perf_counter() - start


def run(cfg: config.TrainConfig, seg: SegmentationOptions) -> dict:
    backend = backends.create(cfg.backend, runtime.collective_timeout(cfg) if cfg.backend == "ddp" else None)
    backend.init()
    root = backend.rank() == 0
    # From here on a rank that stops making progress ends the job, named (docs/jobs.md#a-job-is-stuck-or-slow).
    watch = runtime.watch(cfg, backend)
    phases = runtime.phases(cfg, backend, watch)
    device, prec = runtime.setup(cfg, backend)
    batch = cfg.per_process_batch(backend.size())
    manifest, train_store, sampler, val_store, load_seconds = load_data(cfg, seg, backend, batch)
    if root and not sampler.shares_exactly:
        log.warning(
            "%d training blocks do not divide over %d processes: each process reads blocks beyond its "
            "share; prepare with a block count that is a multiple of the process count",
            sampler.n,
            backend.size(),
        )

    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, manifest.num_classes, seg.norm).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    lr_scale = backend.size()  # Goyal et al.: the LR grows with the global batch
    # `model` stays the plain module (checkpoints, evaluation, buffers); `trained` is what the steps run.
    trained, optimizer = backend.wrap(model, runtime.optimizer(cfg, model, cfg.base_lr * lr_scale, device), cfg, device)
    scaler = prec.grad_scaler(cfg.loss_scale_init)
    start_epoch, start_step = runtime.restore(cfg, backend, model, optimizer, scaler, sampler.steps)
    stop = runtime.preemption(cfg, backend)  # SIGTERM and the checkpoint clock (docs/jobs.md#preempted-and-resumed)
    pause = runtime.pauser(cfg, backend, model, optimizer, scaler, stop, watch)

    metrics_file = writer = None
    if root:
        world = {
            **runtime.world(backend, model, device, prec, cfg),
            "train_blocks": sampler.n,
            "val_blocks": len(val_store) if val_store else 0,
            "blocks_owned_per_process": len(sampler.owned()),
            "shares_exactly": sampler.shares_exactly,
            "block_memory_mbytes_rank0": train_store.memory_bytes() / 1e6,
            "data_load_seconds": load_seconds,
            "steps_per_epoch": sampler.steps,
            "classes": manifest.class_names,
        }
        metrics_file = MetricsFile(
            cfg.metrics_path, {"config": cfg.to_json(), "segmentation": asdict(seg), "world": world}
        )
        writer = runtime.summary_writer(cfg.tensorboard_dir)
        log.info(
            "training %s on %d blocks (%s), %d process(es) x %d patches of %d px, %s, outputs in %s",
            cfg.model,
            sampler.n,
            cfg.data_dir,
            backend.size(),
            batch,
            cfg.image_size,
            device,
            cfg.output_dir,
        )
    progress = partial(tqdm, disable=not (root and cfg.progress))

    patches, seconds = 0, 0.0
    with runtime.stopping(backend, stop, watch):
        for epoch in range(start_epoch, cfg.epochs):
            record = {"epoch": epoch + 1}
            record.update(
                train_epoch(
                    cfg,
                    backend,
                    epoch,
                    trained,
                    optimizer,
                    scaler,
                    prec,
                    train_store,
                    sampler,
                    manifest,
                    device,
                    lr_scale,
                    progress,
                    watch,
                    phases,
                    stop,
                    pause,
                    start_step if epoch == start_epoch else 0,
                )
            )
            # blocks read from storage so far, per rank: with the cache and an exact share, each rank's share once
            record["train_blocks_read_per_rank"] = backend.allgather_object(train_store.reads, f"reads_{epoch}")
            average_buffers(backend, model)
            if val_store is not None:
                record.update(evaluate(cfg, backend, epoch, model, prec, val_store, manifest, batch, device, watch))
            patches += record["patches"]
            seconds += record["epoch_seconds"]
            watch.doing("checkpoint")
            stop.saved(runtime.save(cfg, backend, epoch + 1, model, optimizer, scaler, 0, sampler.steps))
            if root:
                metrics_file.add_epoch(record)
                for key in (
                    "train_loss",
                    "train_pixel_accuracy",
                    "train_miou",
                    "val_loss",
                    "val_pixel_accuracy",
                    "val_miou",
                    "patches_per_sec",
                    "lr",
                ):
                    if key in record:
                        writer.add_scalar(key, record[key], epoch + 1)
                for name, iou in (record.get("val_iou") or {}).items():
                    if iou is not None:
                        writer.add_scalar(f"val_iou/{name}", iou, epoch + 1)
                writer.flush()
                log.info(
                    "epoch %d/%d: loss %.4f, pixel accuracy %.3f, mIoU %.3f%s, %.1f patches/sec",
                    epoch + 1,
                    cfg.epochs,
                    record["train_loss"],
                    record["train_pixel_accuracy"],
                    record["train_miou"],
                    f", val mIoU {record['val_miou']:.3f}" if "val_miou" in record else "",
                    record["patches_per_sec"],
                )
            runtime.stop_at_epoch_end(cfg, backend, stop, epoch + 1)
    watch.doing("finishing")
    if root:
        writer.close()
    # "images" are patches here: the closing "Total images/sec" line is patches/sec.
    summary = finish(cfg, backend, metrics_file, parameters_digest(model), cfg.epochs - start_epoch, patches, seconds)
    backend.shutdown()
    watch.stop()
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        cfg, seg = parse(argv)
        run(cfg, seg)
    except ConfigError as e:
        say(f"error: {e}")
        return 2
    except preemption.Stopped as e:
        say(str(e))  # every rank says it: all stopped at the same step
        return preemption.EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
