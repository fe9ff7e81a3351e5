"""Land-cover segmentation (U-Net, four-band imagery) trained data-parallel with Horovod and PyTorch.

    horovodrun -np 2 -H localhost:2 python -m payloads.segmentation.train --data-dir D --model unet_tiny ...
    torchrun --standalone --nproc-per-node 2 -m payloads.segmentation.train --backend ddp --data-dir D ...

D is a folder made by `python -m datatools.landcover.prepare` (blocks + manifest.json). A task of the PyTorch
loop (payloads/pytorch/loop.py: set-up, resume, checkpoints, watchdog, outputs); adds the patch sampler, the
per-pixel loss that ignores no data, and pixel accuracy / IoU / mIoU / confusion matrix, summed exactly over
ranks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..common import config, options
from ..common.entry import finish, run_main
from ..common.errors import ConfigError
from ..pytorch import loop, runtime
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
    # The options this payload declares (payloads/common/options.py), with its own defaults. Base LR: its own
    # (0.0125 per process of 8 patches); Goyal's rule is the ImageNet payloads'.
    defaults = options.payload_defaults(
        model="unet_resnet34", data="tiles", image_size=256, batch_size=8, base_lr=0.0125
    )
    p = options.build_parser(
        PROG,
        __doc__.splitlines()[0],
        (*options.COMMON, options.PYTORCH),
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
    values = options.parse_known(p, argv, refused)
    seg = SegmentationOptions(
        values.pop("patches_per_epoch"), values.pop("cache"), values.pop("norm"), values.pop("num_classes_given")
    )
    cfg = options.configure(values, defaults)
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


class LandCover(loop.Task):
    """Four-band patches to per-pixel classes: the loss over the global batch's valid pixels, pixel accuracy, IoU,
    mIoU and the confusion matrix, summed exactly over ranks; throughput in patches/sec (as "images")."""

    log = log
    steady_throughput = False  # the closing "Total images/sec" is every epoch's patches over its seconds

    def __init__(self, seg: SegmentationOptions):
        self.seg = seg

    def load(self, run: loop.Run) -> int:
        """Manifest, block stores and sampler; every rank reads (and checks) its share before training, and all
        ranks stop together if any block is damaged."""
        cfg, seg, backend = run.cfg, self.seg, run.backend
        self.manifest = manifest = data.Manifest.load(cfg.data_dir)
        if seg.num_classes_given and seg.num_classes_given != manifest.num_classes:
            raise ConfigError(
                f"--num-classes {seg.num_classes_given} but {cfg.data_dir} was prepared with "
                f"{manifest.num_classes} classes: drop --num-classes (the manifest's count is used)"
            )
        self.num_classes = manifest.num_classes
        self.train_store = data.BlockStore(manifest, manifest.train, seg.cache == "memory")
        self.sampler = data.PatchSampler(
            manifest.train,
            cfg.image_size,
            backend.rank(),
            backend.size(),
            run.settings.batch * backend.size(),
            cfg.seed,
            seg.patches_per_epoch,
            cfg.max_steps_per_epoch,
        )
        self.val_store = data.BlockStore(manifest, manifest.val, seg.cache == "memory") if manifest.val else None
        self.has_validation = self.val_store is not None
        error, start = None, time.perf_counter()
        try:
            self.train_store.load(self.sampler.owned())
            if self.val_store is not None:
                self.val_store.load(range(backend.rank(), len(self.val_store), backend.size()))
        except ConfigError as e:
            error = str(e)
        errors = [e for e in backend.allgather_object(error, "data_errors") if e]
        if errors:
            raise ConfigError(errors[0])
        self.load_seconds = time.perf_counter() - start
        self.mean, self.std = (
            torch.as_tensor(v, device=run.device).view(-1, 1, 1) for v in (manifest.band_mean, manifest.band_std)
        )
        if run.root and not self.sampler.shares_exactly:
            log.warning(
                "%d training blocks do not divide over %d processes: each process reads blocks beyond its "
                "share; prepare with a block count that is a multiple of the process count",
                self.sampler.n,
                backend.size(),
            )
        return self.sampler.steps

    def model(self, run: loop.Run) -> torch.nn.Module:
        return models.build(run.cfg.model, self.num_classes, self.seg.norm)

    def batches(self, run: loop.Run, epoch: int, skip: int):
        """The epoch's patches are a function of (--seed, epoch), so its steps are rebuilt and entered at `skip`.
        A thread cuts the next batch while this one trains: the training thread waits for the GPU at every step's
        allreduce, so cutting there would not overlap with the GPU's work."""
        steps, size = self.sampler.epoch(epoch), run.cfg.image_size
        with ThreadPoolExecutor(1, thread_name_prefix="patches") as pool:
            upcoming = pool.submit(data.batch, self.train_store, steps[skip], size)
            for step in range(skip, len(steps)):
                images, labels = upcoming.result()
                if step + 1 < len(steps):
                    upcoming = pool.submit(data.batch, self.train_store, steps[step + 1], size)
                yield images, labels, len(steps[step])

    def epoch_start(self, run: loop.Run) -> None:
        classes = self.num_classes
        self.conf = torch.zeros(classes, classes, dtype=torch.int64, device=run.device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=run.device)
        self.valid_sum = self.seen = 0

    def _inputs(self, run: loop.Run, images, labels, non_blocking: bool = False):
        images, target = data.inputs(
            images.to(run.device, non_blocking=non_blocking),
            labels.to(run.device, non_blocking=non_blocking),
            self.mean,
            self.std,
        )
        if run.settings.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, target

    def step(self, run: loop.Run, batch) -> loop.Step:
        images, labels, patches = batch
        backend = run.backend
        valid = int((labels != NODATA).sum())
        global_valid = backend.allreduce_sum(torch.tensor(float(valid), dtype=torch.float64), "valid_pixels").item()
        images, target = self._inputs(run, images, labels, non_blocking=True)
        with run.prec.autocast():
            out = run.trained(images)
        loss, ce = pixel_loss(out, target, global_valid, backend.size())
        run.backward(loss)
        self.loss_sum += ce
        self.conf += metrics.confusion(out.detach().argmax(1), target, self.num_classes)
        self.valid_sum += valid
        self.seen += patches
        return loop.Step(patches, ce / max(valid, 1))

    def train_record(self, run: loop.Run, epoch: int) -> dict:
        loss_total, valid_total, seen = runtime.global_sums(
            run.backend, f"train_{epoch}", self.loss_sum, self.valid_sum, self.seen
        )
        matrix = metrics.allreduce(run.backend, self.conf, f"train_confusion_{epoch}")
        s = metrics.scores(matrix, self.manifest.class_names)
        return {
            "train_loss": loss_total / max(valid_total, 1.0),
            "train_pixel_accuracy": s["pixel_accuracy"],
            "train_miou": s["miou"],
            "train_iou": s["iou"],
            "train_confusion_matrix": s["confusion_matrix"],
            "valid_pixels": int(valid_total),
            "images": int(seen),
            "patches": int(seen),
        }

    def epoch_end(self, run: loop.Run, epoch: int, record: dict) -> None:
        record["patches_per_sec"] = record["images_per_sec"]
        # blocks read from storage so far, per rank: with the cache and an exact share, each rank's share once
        record["train_blocks_read_per_rank"] = run.backend.allgather_object(self.train_store.reads, f"reads_{epoch}")
        average_buffers(run.backend, run.model)

    def evaluate(self, run: loop.Run, epoch: int) -> dict:
        """Every validation pixel once, on the plain model (its buffers just averaged); the confusion matrix is
        summed over ranks, then scored."""
        run.model.eval()
        classes, size, batch = self.num_classes, run.cfg.image_size, run.settings.batch
        conf = torch.zeros(classes, classes, dtype=torch.int64, device=run.device)
        loss_sum = 0.0
        windows = data.val_windows(self.val_store, size, run.backend.rank(), run.backend.size())
        for i in range(0, len(windows), batch):
            images, target = self._inputs(run, *data.batch(self.val_store, windows[i : i + batch], size))
            with run.prec.autocast():
                out = run.model(images)
            loss_sum += F.cross_entropy(out.float(), target, ignore_index=IGNORE, reduction="sum").item()
            conf += metrics.confusion(out.argmax(1), target, classes)
            run.validation_step()
        matrix = metrics.allreduce(run.backend, conf, f"val_confusion_{epoch}")
        (loss_sum,) = runtime.global_sums(run.backend, f"val_{epoch}", loss_sum)
        s = metrics.scores(matrix, self.manifest.class_names)
        return {
            "val_loss": loss_sum / max(int(matrix.sum()), 1),
            "val_pixel_accuracy": s["pixel_accuracy"],
            "val_miou": s["miou"],
            "val_iou": s["iou"],
            "val_confusion_matrix": s["confusion_matrix"],
        }

    def run_record(self, run: loop.Run) -> dict:
        return {"segmentation": asdict(self.seg)}

    def world(self, run: loop.Run) -> dict:
        return {
            "train_blocks": self.sampler.n,
            "val_blocks": len(self.val_store) if self.val_store else 0,
            "blocks_owned_per_process": len(self.sampler.owned()),
            "shares_exactly": self.sampler.shares_exactly,
            "block_memory_mbytes_rank0": self.train_store.memory_bytes() / 1e6,
            "data_load_seconds": self.load_seconds,
            "steps_per_epoch": self.sampler.steps,
            "classes": self.manifest.class_names,
        }

    def opening(self, run: loop.Run) -> str:
        cfg = run.cfg
        return (
            f"training {cfg.model} on {self.sampler.n} blocks ({cfg.data_dir}), {run.backend.size()} process(es) x "
            f"{run.settings.batch} patches of {cfg.image_size} px, {run.device}, outputs in {cfg.output_dir}"
        )

    def scalars(self, record: dict) -> dict:
        keys = (
            "train_loss",
            "train_pixel_accuracy",
            "train_miou",
            "val_loss",
            "val_pixel_accuracy",
            "val_miou",
            "patches_per_sec",
            "lr",
        )
        out = {k: record[k] for k in keys if k in record}
        for name, iou in (record.get("val_iou") or {}).items():
            if iou is not None:
                out[f"val_iou/{name}"] = iou
        return out

    def epoch_line(self, run: loop.Run, record: dict) -> str:
        val = f", val mIoU {record['val_miou']:.3f}" if "val_miou" in record else ""
        return (
            f"epoch {record['epoch']}/{run.cfg.epochs}: loss {record['train_loss']:.4f}, pixel accuracy "
            f"{record['train_pixel_accuracy']:.3f}, mIoU {record['train_miou']:.3f}{val}, "
            f"{record['patches_per_sec']:.1f} patches/sec"
        )


def average_buffers(backend, model) -> None:
    """BatchNorm's running statistics are per rank; average them so that every rank (and the checkpoint)
    evaluates the same model."""
    if backend.size() == 1:
        return
    for name, buf in model.named_buffers():
        if buf.is_floating_point():
            buf.copy_(backend.allreduce_mean(buf.detach(), f"buffer.{name}"))


def run(cfg: config.TrainConfig, seg: SegmentationOptions) -> dict:
    return loop.train(LandCover(seg), cfg)


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> None:
        cfg, seg = parse(argv)
        run(cfg, seg)

    return run_main(body)


if __name__ == "__main__":
    finish(main())
