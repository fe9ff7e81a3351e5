"""The training part: --train-steps of the PyTorch payload's own loop (payloads/pytorch/loop.py) with one mid-epoch
checkpoint written and restored, the ranks' parameters compared bitwise; a failure named by its part (import,
step, agreement).
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import tempfile
import time
import traceback

from .options import NUM_CLASSES

PARTS = ("import", "step", "agreement")


# What horovod.torch raises on a rank whose broadcast meets a rank that has joined (hvd.join after its failure).
JOINED = "is not supported with Join"


def _error(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def train_steps(hvd, torch, device, args, channels_last: bool) -> dict:
    """This rank's attempt at what a training job does; never raises: the failed part and its error are returned
    (the traceback goes to stderr), so every rank reaches the exchange of results. The steps are the PyTorch
    payload's own (payloads/pytorch/loop.py: its set-up, fused SGD, loss scaler, memory format and step, on
    synthetic batches that differ per rank), stopped halfway by a mid-epoch checkpoint that a fresh run restores
    and trains on from, as a resumed job does. The parameters are digested at the save and at the end."""
    status = {
        "rank": hvd.rank(),
        "failed": None,
        "error": None,
        "losses": [],
        "seconds": None,
        "digest": None,
        "cpus": None,
    }
    try:
        # The payload imports torchvision to build these models; an image where that import breaks fails here.
        from ..pytorch import models

        if args.model != "tiny_cnn":
            import torchvision.models  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure is the finding: reported by part and rank, not raised
        traceback.print_exc()
        status.update(failed="import", error=_error(e))
        return status
    try:
        from ..common.config import TrainConfig
        from ..pytorch import affinity, backends, checkpoints, loop, runtime
        from ..pytorch.classification import Classification

        class Losses:
            """A concern: each step's loss, read on the host (the check wants every one)."""

            def step_end(self, run) -> None:
                status["losses"].append(run.last.loss.item())

        class FirstSteps(Classification):
            """The payload's classification task, its epoch cut after `until` steps (None: to the end)."""

            def __init__(self, until: int | None):
                self.until = until

            def batches(self, run, epoch, skip):
                return itertools.islice(super().batches(run, epoch, skip), None, self.until and self.until - skip)

        backend = backends.Horovod(hvd)  # already initialised: the checks above ran on it
        half = args.train_steps // 2
        with tempfile.TemporaryDirectory(prefix="healthcheck-") as out:
            cfg = TrainConfig(
                model=args.model,
                image_size=args.image_size,
                num_classes=NUM_CLASSES,
                batch_size=args.batch_size,
                synthetic_samples=args.batch_size * hvd.size() * args.train_steps,
                epochs=1,
                base_lr=0.01 / hvd.size(),  # the payload scales it by the processes: 0.01 on any cluster
                warmup_epochs=0,
                lr_decay_epochs=(),
                seed=0,
                workers=0,
                output_dir=pathlib.Path(out),
                keep_checkpoints=1,
                amp=args.amp,
                amp_dtype=args.amp_dtype,
                channels_last=channels_last,
                progress=False,
                mlflow=False,
                stall_timeout=0,
                checkpoint_every_minutes=0,
            )
            resolved = runtime.resolve(cfg, backend)
            seconds, digests = 0.0, []
            # The first half and its save; a fresh run restores it and trains the rest (one step: no save).
            for until in (half, None) if half else (None,):
                run = loop.prepare(FirstSteps(until), cfg, backend, *resolved)
                run.concerns = [Losses()]
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                loop.train_epoch(run, 0, run.start.step)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds += time.perf_counter() - start  # the steps (and the epoch's sums), not the set-up
                digests.append(models.parameters_digest(run.model))
                if until is not None:
                    checkpoints.save(cfg, backend, 0, run.model, run.optimizer, run.scaler, half, run.steps)
                    checkpoints.finish_checkpoints(backend)
        status["seconds"] = seconds
        status["cpus"] = affinity.ranges(os.sched_getaffinity(0))  # as the payload's set-up bound this rank
        status["digest"], status["digest_at_save"] = digests[-1], digests[0]
    except Exception as e:  # noqa: BLE001 - any failure is the finding: reported by part and rank, not raised
        traceback.print_exc()
        status.update(failed="step", error=_error(e))
    return status


_HINTS = {
    "import": "the training stack does not import on this image; a training job fails the same way (traceback "
    "on the rank's stderr). Check the image's Python and torch/torchvision versions",
    "step": "a training job fails the same way (traceback on the rank's stderr). Known causes: a Python that "
    "breaks torch._dynamo, which torch's optimizer imports (a release candidate such as 3.11.0rc1); a "
    "Horovod that refuses channels_last tensors ('Tensor is required to be contiguous': build it with "
    "toolchain/patch_horovod.py); out of GPU memory (lower --batch-size)",
}


def judge_training(statuses: list[dict], steps: int) -> tuple[dict, list[str]]:
    """(training verdict, failures) from every rank's status, in rank order. A rank whose broadcast met a rank that
    had failed and joined (Horovod refuses broadcasts with a joined rank) failed because of it: only the ranks that
    failed on their own are named, when there are any."""
    failures = []
    failed = [s for s in statuses if s["failed"]]
    failed = [s for s in failed if JOINED not in (s["error"] or "")] or failed
    for part in PARTS:
        ranks = [s for s in failed if s["failed"] == part]
        if ranks:
            failures.append(
                f"training {part} failed on rank(s) {', '.join(str(s['rank']) for s in ranks)}: "
                f"{ranks[0]['error']}: {_HINTS[part]}"
            )
    verdict = {
        "failed_part": failed[0]["failed"] if failed else None,
        "loss": None,
        "seconds": None,
        "ranks_agree": None,
        "parameters_sha256": None,
        "errors": [{"rank": s["rank"], "part": s["failed"], "error": s["error"]} for s in failed],
    }
    if failed:
        return verdict, failures
    last = [s["losses"][-1] for s in statuses]
    verdict.update(
        loss=sum(last) / len(last), seconds=max(s["seconds"] for s in statuses), parameters_sha256=statuses[0]["digest"]
    )
    bad = [s for s in statuses if not all(math.isfinite(x) for x in s["losses"])]
    if bad:
        verdict["failed_part"] = "step"
        failures.append(
            f"training step failed on rank(s) {', '.join(str(s['rank']) for s in bad)}: the loss is "
            f"not finite ({bad[0]['losses']}): a training job would diverge the same way"
        )
    # At the mid-run save and at the end: the restore gives every rank rank 0's weights, so the end alone could miss
    # ranks that differed before it.
    differ = [
        s["rank"]
        for s in statuses
        if (s["digest"], s.get("digest_at_save")) != (statuses[0]["digest"], statuses[0].get("digest_at_save"))
    ]
    verdict["ranks_agree"] = not differ
    if differ:
        verdict["failed_part"] = verdict["failed_part"] or "agreement"
        failures.append(
            f"training agreement failed: after {steps} steps the parameters of rank(s) {', '.join(map(str, differ))} "
            "differ from rank 0's, so the ranks are training different models. Every rank should apply the same "
            "averaged gradients: look for a rank whose optimizer is not hvd.DistributedOptimizer, a faulty GPU "
            "(run nvidia-smi -q -d ECC,PAGE_RETIREMENT on its node), or mismatched software between nodes "
            "(the per-node versions above)"
        )
    return verdict, failures


def training_line(t: dict, processes: int) -> str:
    what = (
        f"training {t['model']} {t['image_size']}px x {t['batch_per_process']} per process, {processes} "
        f"process(es), {t['precision']}, {t['memory_format']}"
    )
    if t["seconds"] is None:  # a rank did not get through its steps
        return f"{what}: {t['failed_part'].upper()} FAILED"
    agree = "ranks agree" if t["ranks_agree"] else "RANKS DIFFER"
    finite = "" if math.isfinite(t["loss"]) else " (LOSS NOT FINITE)"
    return f"{what}: {t['steps']} steps in {t['seconds']:.2f} s, last loss {t['loss']:.4f}{finite}, {agree}"
