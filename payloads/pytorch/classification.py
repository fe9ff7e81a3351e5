"""The image-classification task of the PyTorch loop (loop.py): its data (synthetic, class folders, shards:
inputs.py), its model (models.py), the cross-entropy step with --backward-passes-per-step micro-batches, accuracy,
validation, and its lines. payloads/pytorch/train.py is its entry point; the health check runs it too."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from . import inputs, loop, models, runtime

log = logging.getLogger("payloads.pytorch")


class Classification(loop.Task):
    """Images to classes: cross-entropy, accuracy, throughput in images/sec."""

    log = log

    def load(self, run: loop.Run) -> int:
        cfg, backend = run.cfg, run.backend
        # Each rank loads batch x backward_passes samples per step and splits them into micro-batches.
        self.data = inputs.build(
            cfg,
            backend.rank(),
            backend.size(),
            run.settings.batch,
            run.device,
            broadcast_object=lambda obj: backend.broadcast_object(obj, name="image_listing"),
            local_size=backend.local_size(),
            channels_last=run.settings.channels_last,
            decoder=None if cfg.gpu_decode else run.settings.decoder,  # the CPU decoder, as resolved
        )
        self.num_classes = self.data.num_classes
        self.has_validation = self.data.val is not None
        return len(self.data.train)

    def model(self, run: loop.Run) -> torch.nn.Module:
        return models.build(run.cfg.model, self.num_classes, run.cfg.image_size)

    def batches(self, run: loop.Run, epoch: int, skip: int):
        self.data.train.set_epoch(epoch, skip)
        return self.data.train

    def epoch_start(self, run: loop.Run) -> None:
        # Accumulated on the device and read once per epoch: no host sync inside the step.
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=run.device)
        self.correct = torch.zeros((), dtype=torch.int64, device=run.device)
        self.seen = self.skipped = 0

    def step(self, run: loop.Run, batch) -> loop.Step:
        images, labels, skipped = batch
        n = images.shape[0]
        # backward_passes_per_step: micro-batches accumulate locally; the allreduce runs once per step.
        chunks = max(1, min(run.settings.backward_passes, n))
        parts = list(zip(images.chunk(chunks), labels.chunk(chunks)))
        for i, (x, y) in enumerate(parts):
            last = i == len(parts) - 1
            with run.backend.accumulate(run.trained, last=last):
                with run.prec.autocast():
                    out = run.trained(x)
                    loss = F.cross_entropy(out, y)
                run.backward(loss * (x.shape[0] / n), last)
            self.loss_sum += loss.detach().double() * x.shape[0]
            self.correct += (out.argmax(1) == y).sum()
        self.seen += n
        self.skipped += skipped
        return loop.Step(n, loss)

    def train_record(self, run: loop.Run, epoch: int) -> dict:
        loss_sum, correct, seen, skipped = runtime.global_sums(
            run.backend, f"train_{epoch}", self.loss_sum, self.correct, self.seen, self.skipped
        )
        return {
            "train_loss": loss_sum / seen,
            "train_accuracy": correct / seen,
            "images": int(seen),
            "skipped_images": int(skipped),
        }

    def evaluate(self, run: loop.Run, epoch: int) -> dict:
        loss_sum = torch.zeros((), dtype=torch.float64, device=run.device)
        correct = torch.zeros((), dtype=torch.int64, device=run.device)
        seen = skipped = 0
        self.data.val.set_epoch(epoch)
        for images, labels, n_skipped in self.data.val:
            skipped += n_skipped
            with run.prec.autocast():
                out = run.trained(images)
            loss_sum += F.cross_entropy(out.float(), labels, reduction="sum").double()
            correct += (out.argmax(1) == labels).sum()
            seen += images.shape[0]
            run.validation_step()
        loss_sum, correct, seen, skipped = runtime.global_sums(
            run.backend, f"val_{epoch}", loss_sum, correct, seen, skipped
        )
        return {"val_loss": loss_sum / seen, "val_accuracy": correct / seen, "val_skipped_images": int(skipped)}

    def opening(self, run: loop.Run) -> str:
        cfg, s = run.cfg, run.settings
        return (
            f"training {cfg.model} on {cfg.data} data, {run.backend.size()} process(es) x batch "
            f"{s.batch // s.backward_passes} ({run.backend.name}), {run.device}, {s.precision}"
            f"{' channels_last' if s.channels_last else ''}{' compiled' if cfg.compile else ''}, "
            f"outputs in {cfg.output_dir}"
        )

    def scalars(self, record: dict) -> dict:
        keys = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "images_per_sec", "lr")
        return {k: record[k] for k in keys if k in record}

    def epoch_line(self, run: loop.Run, record: dict) -> str:
        val = f", val accuracy {record['val_accuracy']:.3f}" if "val_accuracy" in record else ""
        val += f", EMA val accuracy {record['ema_val_accuracy']:.3f}" if "ema_val_accuracy" in record else ""
        return (
            f"epoch {record['epoch']}/{run.cfg.epochs}: loss {record['train_loss']:.4f}, accuracy "
            f"{record['train_accuracy']:.3f}{val}, {record['images_per_sec']:.1f} images/sec"
        )
