"""Data-parallel training of ResNet-50 (and smaller models) with Horovod and PyTorch.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.pytorch.train --model resnet18 ...

Follows Horovod's examples/pytorch/pytorch_imagenet_resnet50.py and pytorch/examples imagenet, with
their known gaps closed: sharding by global rank with equal step counts, optimizer state broadcast on
resume, atomic rank-0 checkpoints, exactly averaged metrics.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import nullcontext
from functools import partial
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from tqdm import tqdm

from ..common import checkpoint, config, imagefolder, schedule
from ..common import devices
from ..common.errors import ConfigError
from ..common.metrics import MetricsFile, finish
from . import data, models, shards

SUFFIX = ".pt"
log = logging.getLogger("payloads.pytorch")


def _hvd():
    import horovod.torch as hvd  # imported late so that --help and config errors need no Horovod

    return hvd


def setup_runtime(cfg: config.TrainConfig, hvd) -> torch.device:
    devices.require_gpus(torch.cuda.device_count(), hvd.local_size(), "PyTorch", torch.version.cuda)
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        torch.backends.cudnn.benchmark = True
        device = torch.device("cuda", hvd.local_rank())
    else:
        device = torch.device("cpu")
    check_adasum(cfg, hvd)
    if cfg.amp is None:
        # Adasum's default is full precision: see check_adasum.
        cfg.amp = device.type == "cuda" and not cfg.adasum
        if device.type == "cuda" and cfg.adasum:
            log.info("mixed precision off: --adasum steps on unscaled gradients (README, \"The PyTorch payload\")")
    if cfg.channels_last is None:
        cfg.channels_last = device.type == "cuda"
    if cfg.xla:
        raise ConfigError("--xla is a TensorFlow/Keras option: for PyTorch, mixed precision (--amp) on a GPU "
                          "is the speed lever here")
    if cfg.amp and device.type != "cuda":
        raise ConfigError("--amp needs a GPU: this process sees none (drop --amp for a CPU run)")
    return device


def check_adasum(cfg: config.TrainConfig, hvd) -> None:
    """Refuse what Horovod 0.28.1's Adasum cannot run, before any data is read (horovod/torch/optimizer.py)."""
    if not cfg.adasum:
        return
    if cfg.amp:
        # _DistributedAdasumOptimizer applies the inner optimizer inside each gradient's backward hook, so
        # GradScaler's scaled gradients would be stepped before they could be unscaled (and it refuses
        # skip_synchronize(), which the unscale-then-step sequence needs).
        raise ConfigError("--adasum cannot be combined with mixed precision (--amp): Horovod's Adasum optimizer "
                          "steps on each gradient inside backward, before GradScaler can unscale it. Pass --no-amp "
                          "(the default with --adasum), or drop --adasum to keep --amp")
    cfg.check_adasum_world(hvd.size(), hvd.mpi_enabled())


def build_datasets(cfg: config.TrainConfig):
    """(train, val or None, number of classes); every input problem is raised here, before training."""
    if cfg.data == "synthetic":
        train = data.SyntheticImages(cfg.synthetic_samples, cfg.num_classes, cfg.image_size, cfg.seed)
        return train, None, cfg.num_classes
    if cfg.data == "shards":
        return shards.datasets(cfg.data_dir)
    train_dir, val_dir = imagefolder.split_dirs(cfg.data_dir)
    tree = imagefolder.scan(train_dir)
    val = None
    if val_dir is not None:
        val_tree = imagefolder.scan(val_dir, "validation directory")
        if val_tree.classes != tree.classes:
            raise ConfigError(f"{val_dir} has classes {val_tree.classes[:5]}... that differ from {train_dir}'s: "
                              "train and val need the same class folders")
        val = data.ImageFiles(val_tree, cfg.image_size, train=False, skip_corrupt=cfg.skip_corrupt_images)
    train = data.ImageFiles(tree, cfg.image_size, train=True, skip_corrupt=cfg.skip_corrupt_images)
    return train, val, len(tree.classes)


def loader(dataset, cfg, hvd, batch, shuffle, device) -> DataLoader:
    if isinstance(dataset, shards.ShardSplit):
        return shards.loader(dataset, cfg, hvd.rank(), hvd.size(), batch, shuffle, device)
    try:
        sampler = data.ShardedBatchSampler(len(dataset), hvd.rank(), hvd.size(), batch, cfg.seed,
                                           shuffle=shuffle, max_steps=cfg.max_steps_per_epoch if shuffle else 0)
    except ValueError as e:
        raise ConfigError(f"{e} (data set of {len(dataset)} samples)") from None
    kwargs = {}
    if cfg.workers > 0:
        # forkserver: fork after Horovod's background thread and Gloo sockets exist is unsafe.
        kwargs = dict(multiprocessing_context="forkserver", persistent_workers=True, prefetch_factor=4)
    return DataLoader(dataset, batch_sampler=sampler, num_workers=cfg.workers, collate_fn=data.collate,
                      pin_memory=device.type == "cuda", generator=torch.Generator(), **kwargs)


def seed_epoch(cfg, hvd, epoch: int, dl: DataLoader) -> None:
    # Augmentation randomness depends on (seed, epoch, rank) only, so a resumed run repeats a straight one.
    s = (cfg.seed * 1_000_003 + epoch) * 4099 + hvd.rank()
    torch.manual_seed(s)
    if isinstance(dl, shards.ShardLoader):   # seeds its augmentation per sample from (seed, epoch)
        dl.set_epoch(epoch)
        return
    dl.generator.manual_seed(s)
    dl.batch_sampler.set_epoch(epoch)


def restore(cfg, hvd, model, optimizer, scaler) -> int:
    """Rank 0 loads the newest checkpoint (if any); returns the epochs already done, agreed by all ranks."""
    start, state = 0, None
    if hvd.rank() == 0 and cfg.resume:
        found = checkpoint.latest(cfg.checkpoint_dir, SUFFIX)
        if found:
            start, path = found
            try:
                state = torch.load(path, map_location="cpu", weights_only=False)
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint gets the same advice
                start = -1
                log.error("cannot resume from %s: %s: move it away, or pass --no-resume to start over "
                          "in a new --output-dir", path, e)
            else:
                if scaler is not None and state.get("scaler"):
                    scaler.load_state_dict(state["scaler"])
                log.info("resuming from %s (%d epochs done)", path, start)
    start = hvd.broadcast_object(start, root_rank=0, name="resume_epoch")
    if start < 0:
        raise ConfigError("the newest checkpoint could not be loaded (see the message above)")
    if start > 0:
        # Fresh optimizers on the other ranks have no state; Horovod initialises it with a zero-gradient
        # step that moves the weights, so the parameters are broadcast after it.
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return start


def save(cfg, hvd, epoch_done: int, model, optimizer, scaler) -> None:
    if hvd.rank() != 0:
        return
    state = {"epoch": epoch_done, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scaler": scaler.state_dict() if scaler is not None else None, "config": cfg.to_json(),
             "world_size": hvd.size()}
    checkpoint.write_atomically(checkpoint.path_for(cfg.checkpoint_dir, epoch_done, SUFFIX),
                                lambda p: torch.save(state, p))
    checkpoint.prune(cfg.checkpoint_dir, SUFFIX, cfg.keep_checkpoints)


def global_sums(hvd, name: str, *values: float) -> list[float]:
    """Sum over ranks: losses and counts are summed, then divided, so means are exact."""
    t = hvd.allreduce(torch.tensor(values, dtype=torch.float64), op=hvd.Sum, name=name)
    return t.tolist()


def world(hvd, model, device) -> dict:
    """The run's world as metrics.json records it (shared with the segmentation payload)."""
    return {"processes": hvd.size(), "local_processes": hvd.local_size(), "device": str(device),
            "torch": torch.__version__, "horovod_controller": "mpi" if hvd.mpi_enabled() else "gloo",
            "gradient_mbytes": models.gradient_bytes(model) / 1e6, "threads_per_process": torch.get_num_threads()}


def train_epoch(cfg, hvd, epoch, model, optimizer, scaler, dl, device, lr_scale, progress):
    model.train()
    steps = len(dl)
    loss_sum = correct = seen = skipped = 0.0
    bar = progress(total=steps, desc=f"epoch {epoch + 1}/{cfg.epochs}")
    start = time.perf_counter()
    for step, (images, labels, n_skipped) in enumerate(dl):
        lr = schedule.learning_rate(cfg.base_lr, lr_scale, epoch, step, steps, cfg.warmup_epochs, cfg.lr_decay_epochs)
        for group in optimizer.param_groups:
            group["lr"] = lr
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        if cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad()  # Horovod's wrapper takes no set_to_none
        # backward_passes_per_step: micro-batches accumulate locally; the allreduce runs once per step.
        chunks = max(1, min(cfg.backward_passes_per_step, len(images)))
        for part_x, part_y in zip(images.chunk(chunks), labels.chunk(chunks)):
            with torch.autocast("cuda", dtype=torch.float16) if cfg.amp else nullcontext():
                out = model(part_x)
                loss = F.cross_entropy(out, part_y)
            weighted = loss * (len(part_x) / len(images))
            (scaler.scale(weighted) if scaler else weighted).backward()
            loss_sum += loss.item() * len(part_x)
            correct += (out.argmax(1) == part_y).sum().item()
        if scaler is not None:
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        seen += len(images)
        skipped += n_skipped
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{lr:.4f}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    bar.close()
    loss_sum, correct, seen, skipped = global_sums(hvd, f"train_{epoch}", loss_sum, correct, seen, skipped)
    return {"train_loss": loss_sum / seen, "train_accuracy": correct / seen, "images": int(seen),
            "skipped_images": int(skipped), "epoch_seconds": seconds, "images_per_sec": seen / seconds, "lr": lr}


@torch.no_grad()
def evaluate(cfg, hvd, epoch, model, dl, device):
    model.eval()
    loss_sum = correct = seen = skipped = 0.0
    for images, labels, n_skipped in dl:
        skipped += n_skipped
        images, labels = images.to(device), labels.to(device)
        if cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.float16) if cfg.amp else nullcontext():
            out = model(images)
        loss_sum += F.cross_entropy(out.float(), labels, reduction="sum").item()
        correct += (out.argmax(1) == labels).sum().item()
        seen += len(images)
    loss_sum, correct, seen, skipped = global_sums(hvd, f"val_{epoch}", loss_sum, correct, seen, skipped)
    return {"val_loss": loss_sum / seen, "val_accuracy": correct / seen, "val_skipped_images": int(skipped)}


def run(cfg: config.TrainConfig) -> dict:
    hvd = _hvd()
    hvd.init()
    root = hvd.rank() == 0
    device = setup_runtime(cfg, hvd)
    batch = cfg.per_process_batch(hvd.size())
    train_set, val_set, num_classes = build_datasets(cfg)
    # Each rank loads batch x backward_passes samples per step and splits them into micro-batches.
    train_dl = loader(train_set, cfg, hvd, batch * cfg.backward_passes_per_step, True, device)
    val_dl = loader(val_set, cfg, hvd, batch, False, device) if val_set is not None else None

    torch.manual_seed(cfg.seed)
    model = models.build(cfg.model, num_classes, cfg.image_size).to(device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)

    # Goyal et al.: LR scales with the global batch. Adasum adds gradients instead of averaging them,
    # so it needs no scaling across nodes (only across NCCL-reduced GPUs of a node).
    if cfg.adasum:
        lr_scale = (hvd.local_size() if device.type == "cuda" and hvd.nccl_built() else 1)
    else:
        lr_scale = hvd.size()
    lr_scale *= cfg.backward_passes_per_step
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.base_lr * lr_scale, momentum=cfg.momentum,
                                weight_decay=cfg.weight_decay)
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none,
        # One allreduce after the N-th backward pass of a step: Horovod's hook counts the passes and
        # asserts when there are more than this (horovod/torch/optimizer.py, _make_hook). The passes'
        # gradients add up in p.grad, so train_epoch weights each micro-batch's loss by its share of the step.
        backward_passes_per_step=cfg.backward_passes_per_step,
        op=hvd.Adasum if cfg.adasum else hvd.Average)
    scaler = torch.amp.GradScaler("cuda") if cfg.amp else None
    start_epoch = restore(cfg, hvd, model, optimizer, scaler)

    metrics = writer = None
    if root:
        from torch.utils.tensorboard import SummaryWriter

        metrics = MetricsFile(cfg.metrics_path, {"config": cfg.to_json(), "world": world(hvd, model, device)})
        writer = SummaryWriter(str(cfg.tensorboard_dir))
        log.info("training %s on %s data, %d process(es) x batch %d, %s, outputs in %s", cfg.model, cfg.data,
                 hvd.size(), batch, device, cfg.output_dir)
        if os.environ.get("HOROVOD_TIMELINE"):
            log.info("Horovod timeline: %s", os.environ["HOROVOD_TIMELINE"])
    progress = partial(tqdm, disable=not (root and cfg.progress))   # the bar is rank 0's only

    total_images, total_seconds = 0, 0.0
    for epoch in range(start_epoch, cfg.epochs):
        seed_epoch(cfg, hvd, epoch, train_dl)
        record = {"epoch": epoch + 1}
        record.update(train_epoch(cfg, hvd, epoch, model, optimizer, scaler, train_dl, device, lr_scale, progress))
        if val_dl is not None:
            record.update(evaluate(cfg, hvd, epoch, model, val_dl, device))
        total_images += record["images"]
        total_seconds += record["epoch_seconds"]
        save(cfg, hvd, epoch + 1, model, optimizer, scaler)
        if root:
            metrics.add_epoch(record)
            for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "images_per_sec", "lr"):
                if key in record:
                    writer.add_scalar(key, record[key], epoch + 1)
            writer.flush()
            log.info("epoch %d/%d: loss %.4f, accuracy %.3f%s, %.1f images/sec", epoch + 1, cfg.epochs,
                     record["train_loss"], record["train_accuracy"],
                     f", val accuracy {record['val_accuracy']:.3f}" if "val_accuracy" in record else "",
                     record["images_per_sec"])

    if root:
        writer.close()
    return finish(cfg, hvd, metrics, models.parameters_digest(model), cfg.epochs - start_epoch, total_images,
                  total_seconds)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        cfg = config.parse(argv, "python -m payloads.pytorch.train", __doc__.splitlines()[0], list(models.MODELS),
                           ("synthetic", "imagefolder", "shards"))
        run(cfg)
    except ConfigError as e:
        # Every rank says it: a data error may be met by one rank only.
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
