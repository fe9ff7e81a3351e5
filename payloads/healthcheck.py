"""Cluster health check: Horovod's allreduce (correctness and bandwidth), then a few real training steps.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.healthcheck --sizes-mb 1,8

Allreduce: each rank fills a tensor with its rank + 1 and sums it; every element must equal size(size+1)/2,
so a broken link or a misconfigured transport fails loudly instead of training slowly or wrongly. Bus
bandwidth uses NCCL-tests' definition for allreduce: bytes x 2(n-1)/n / time. The largest size's bus
bandwidth is judged against the floor of the cluster's VM size (the launcher sets it from the catalog,
HEALTHCHECK_MIN_BUSBW_GBYTES_PER_SEC) or --min-busbw. Every node's driver, CUDA, NCCL versions and
InfiniBand devices are printed and written to the report.

Training: every rank builds a conv model, takes --train-steps optimizer steps through hvd.DistributedOptimizer
on its own synthetic batch, with the mixed precision and memory format the PyTorch payload uses on this device
(on a GPU: precision.choose's autocast, channels_last), then the ranks compare their parameters bitwise. A
stack that fails a training job (an image whose Python breaks torch._dynamo, which the optimizer imports; a
Horovod that refuses channels_last tensors) fails here, in the part named: import, step or agreement.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pathlib
import socket
import sys
import time
import traceback

from .common import devices
from .common.errors import ConfigError
from .common.metrics import say

MIN_BUSBW = "HEALTHCHECK_MIN_BUSBW_GBYTES_PER_SEC"
# Conv models of payloads/pytorch/models.py (channels_last only changes conv layers); the torchvision ones
# are built the way the payload builds them, so torchvision's import is checked too.
MODELS = ("resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "mobilenet_v3_large", "tiny_cnn")
NUM_CLASSES = 10
PARTS = ("import", "step", "agreement")


def _floor(text: str | None, source: str) -> float | None:
    if text in (None, ""):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{source} {text!r}: a bus bandwidth floor in GB/s, a positive number like 20")
    return value


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="8,32,128,256", help="comma-separated tensor sizes in MB")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument(
        "--min-busbw",
        default=None,
        metavar="GB_PER_SEC",
        help=f"fail below this bus bandwidth at the largest size (default: ${MIN_BUSBW}, set by "
        "the launcher from the VM-size catalog; none: reported, not judged)",
    )
    ap.add_argument("--output", type=pathlib.Path, default=None, help="rank 0 writes the JSON report here")
    t = ap.add_argument_group("training steps")
    t.add_argument("--train-steps", type=int, default=5, help="optimizer steps each rank takes")
    t.add_argument("--model", default="resnet18", help=f"one of {', '.join(MODELS)}")
    t.add_argument("--image-size", type=int, default=64)
    t.add_argument("--batch-size", type=int, default=8, help="per process")
    t.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mixed precision (default: on with a GPU, as the PyTorch payload; --amp on a CPU runs bf16)",
    )
    t.add_argument(
        "--amp-dtype",
        default="auto",
        choices=("auto", "bf16", "fp16"),
        help="auto: bf16 on compute capability 8.0+ GPUs and CPUs, fp16 with a loss scaler on older GPUs",
    )
    t.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="channels_last model and images (default: on with a GPU, as the PyTorch payload)",
    )
    args = ap.parse_args(argv)
    try:
        args.sizes = [float(s) for s in args.sizes_mb.split(",")]
    except ValueError:
        raise ConfigError(f"--sizes-mb takes numbers like 8,32,128, got {args.sizes_mb!r}") from None
    if not args.sizes or min(args.sizes) <= 0:
        raise ConfigError(f"--sizes-mb takes positive sizes like 8,32,128, got {args.sizes_mb!r}")
    if args.iterations < 1:
        raise ConfigError(f"--iterations {args.iterations}: at least 1")
    if args.train_steps < 1:
        raise ConfigError(f"--train-steps {args.train_steps}: at least 1 (the optimizer step is what is checked)")
    if args.model not in MODELS:
        raise ConfigError(f"--model {args.model!r}: choose one of {', '.join(MODELS)}")
    if args.image_size < 16:
        raise ConfigError(f"--image-size {args.image_size}: at least 16 pixels")
    if args.batch_size < 2:
        # batch norm in training mode needs 2 values per channel once a ResNet has pooled the image to 1x1
        raise ConfigError(f"--batch-size {args.batch_size}: at least 2 per process (batch norm needs 2 samples)")
    if args.min_busbw is not None:
        args.floor = _floor(args.min_busbw, "--min-busbw")
    else:
        args.floor = _floor(os.environ.get(MIN_BUSBW), MIN_BUSBW)
    return args


def node_facts(torch) -> dict:
    """What this process sees of its node: versions ('none' where absent) and InfiniBand devices."""
    gpu = torch.cuda.is_available()
    nccl = "none"
    if gpu:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    ib = pathlib.Path("/sys/class/infiniband")
    # The CUDA torch was built for, against the host's driver (whether or not torch sees a GPU with it).
    driver = devices.driver_version()
    problem = devices.mismatch(driver, torch.version.cuda, os.environ.get(devices.FORWARD_COMPAT) or None)
    return {
        "host": socket.gethostname(),
        "driver": driver or "none",
        "driver_mismatch": problem,
        "cuda": (torch.version.cuda or "none") if gpu else "none",
        "nccl": nccl,
        "gpus_visible": torch.cuda.device_count() if gpu else 0,
        "infiniband_devices": sorted(p.name for p in ib.iterdir()) if ib.is_dir() else [],
    }


def measure(hvd, torch, device, sizes: list[float], iterations: int) -> list[dict]:
    n = hvd.size()
    expected = n * (n + 1) / 2
    results = []
    for mb in sizes:
        numel = int(mb * 1e6 / 4)
        t = torch.full((numel,), float(hvd.rank() + 1), device=device)
        out = hvd.allreduce(t, op=hvd.Sum, name=f"warmup{mb}")  # first call negotiates and allocates
        times = []
        for _ in range(iterations):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = hvd.allreduce(t, op=hvd.Sum, name=f"size{mb}")
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        best = min(times)
        bus = numel * 4 * 2 * (n - 1) / n / best / 1e9 if n > 1 else 0.0
        results.append(
            {
                "mbytes": mb,
                "best_seconds": best,
                "median_seconds": sorted(times)[len(times) // 2],
                "bus_gbytes_per_sec": bus,
                "correct": bool(torch.all(out == expected).item()),
            }
        )
    return results


def judge(results: list[dict], processes: int, floor: float | None) -> tuple[dict, list[str]]:
    """(bandwidth verdict, failures). The largest size is judged: it is the closest to the link's peak."""
    failures = [f"wrong sum at {r['mbytes']:g} MB on some rank" for r in results if not r["correct"]]
    largest = max(results, key=lambda r: r["mbytes"])
    verdict = {
        "min_busbw_gbytes_per_sec": floor,
        "judged_mbytes": largest["mbytes"],
        "busbw_gbytes_per_sec": largest["bus_gbytes_per_sec"],
        "judged": False,
        "ok": None,
    }
    if floor is None or processes < 2:
        return verdict, failures
    verdict.update(judged=True, ok=largest["bus_gbytes_per_sec"] >= floor)
    if not verdict["ok"]:
        failures.append(
            f"bus bandwidth {largest['bus_gbytes_per_sec']:.2f} GB/s at {largest['mbytes']:g} MB is below the "
            f"floor of {floor:g} GB/s: the fabric is slower than this VM size delivers healthy. Likely: NCCL "
            "is not using InfiniBand (run with NCCL_DEBUG=INFO and look for 'NET/IB'), a degraded link or GPU "
            "on one node (see the per-node lines above; replace the node by scaling the cluster to 0), or "
            "too small a --sizes-mb to reach the link's speed"
        )
    return verdict, failures


def parameters_digest(model) -> str:
    """Hash of every parameter's exact bytes (in logical order, whatever the memory format). Parameters only:
    batch-norm running statistics follow each rank's own batches, so they legitimately differ across ranks."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _error(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def train_steps(hvd, torch, device, args, prec, channels_last: bool) -> dict:
    """This rank's attempt at what a training job does; never raises: the failed part and its error are returned
    (the traceback goes to stderr), so every rank reaches the exchange of results."""
    status = {"rank": hvd.rank(), "failed": None, "error": None, "losses": [], "seconds": None, "digest": None}
    try:
        # The payload imports torchvision to build these models; an image where that import breaks fails here.
        from .pytorch import models

        if args.model != "tiny_cnn":
            import torchvision.models  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure is the finding: reported by part and rank, not raised
        traceback.print_exc()
        status.update(failed="import", error=_error(e))
        return status
    try:
        import torch.nn.functional as F

        from .pytorch import backends, runtime

        backend = backends.Horovod(hvd)  # the payload's optimizer step, with Horovod's synchronisation
        torch.manual_seed(0)
        model = models.build(args.model, NUM_CLASSES, args.image_size).to(device)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        model = model.to(memory_format=fmt)
        model.train()
        # What pytorch/train.py does: start from rank 0's weights, average gradients in DistributedOptimizer.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        scaler = prec.grad_scaler()
        # Each rank its own batch: identical batches would give identical weights even with no averaging at all.
        gen = torch.Generator(device=device)
        gen.manual_seed(1000 + hvd.rank())
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.train_steps):
            images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=gen, device=device)
            images = images.contiguous(memory_format=fmt)
            labels = torch.randint(0, NUM_CLASSES, (args.batch_size,), generator=gen, device=device)
            optimizer.zero_grad()
            with prec.autocast():
                loss = F.cross_entropy(model(images), labels)
            # fp16 (older GPUs): the averaged gradients unscaled, as the payload does
            (scaler.scale(loss) if scaler is not None else loss).backward()
            runtime.optimizer_step(optimizer, scaler, backend)
            status["losses"].append(loss.item())
        if device.type == "cuda":
            torch.cuda.synchronize()
        status["seconds"] = time.perf_counter() - start
        status["digest"] = parameters_digest(model)
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
    """(training verdict, failures) from every rank's status, in rank order."""
    failures = []
    failed = [s for s in statuses if s["failed"]]
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
    differ = [s["rank"] for s in statuses if s["digest"] != statuses[0]["digest"]]
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


def main(argv=None) -> int:
    try:
        args = parse(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import horovod.torch as hvd
    import torch

    from .pytorch import precision

    hvd.init()
    try:
        devices.require_gpus(torch.cuda.device_count(), hvd.local_size(), "PyTorch", torch.version.cuda)
        device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
        # The PyTorch payload's defaults on this device (pytorch/train.py): mixed precision and channels_last on GPUs.
        prec = precision.choose(device, args.amp, args.amp_dtype)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    channels_last = device.type == "cuda" if args.channels_last is None else args.channels_last
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # as the payload: the node's cores shared by its processes, not each process taking them all
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    n = hvd.size()
    facts = hvd.allgather_object(node_facts(torch), name="node_facts")
    results = measure(hvd, torch, device, args.sizes, args.iterations)
    bandwidth, failures = judge(results, n, args.floor)

    status = train_steps(hvd, torch, device, args, prec, channels_last)
    # A rank that failed part-way joins: the others' pending gradient allreduces then complete instead of
    # waiting for it forever (Horovod's join; a broadcast with a joined rank fails, and is reported, instead).
    hvd.join(device.index if device.type == "cuda" else -1)
    statuses = hvd.allgather_object(status, name="train_status")
    training, train_failures = judge_training(statuses, args.train_steps)
    training = {
        "model": args.model,
        "image_size": args.image_size,
        "batch_per_process": args.batch_size,
        "steps": args.train_steps,
        "precision": prec.name,
        "memory_format": "channels_last" if channels_last else "contiguous",
        **training,
    }
    failures += train_failures

    all_ok = bool(hvd.allreduce(torch.tensor(0.0 if failures else 1.0), op=hvd.Min, name="verdict").item())
    if hvd.rank() == 0:
        nodes = {}
        for f in facts:  # one entry per host: what its first process saw
            nodes.setdefault(f["host"], f)
        for f in nodes.values():
            say(
                f"node {f['host']}: driver {f['driver']}, CUDA {f['cuda']}, NCCL {f['nccl']}, "
                f"{f['gpus_visible']} GPUs, InfiniBand devices: {', '.join(f['infiniband_devices']) or 'none'}"
                + (f"; MISMATCH: {f['driver_mismatch']}" if f.get("driver_mismatch") else "")
            )
        for r in results:
            say(
                f"allreduce {r['mbytes']:>7.1f} MB: {r['best_seconds'] * 1e3:8.2f} ms, "
                f"bus bandwidth {r['bus_gbytes_per_sec']:.2f} GB/s, {'ok' if r['correct'] else 'WRONG SUM'}"
            )
        if bandwidth["judged"]:
            say(
                f"bus bandwidth {bandwidth['busbw_gbytes_per_sec']:.2f} GB/s at {bandwidth['judged_mbytes']:g} MB, "
                f"floor {bandwidth['min_busbw_gbytes_per_sec']:g} GB/s: {'ok' if bandwidth['ok'] else 'TOO LOW'}"
            )
        else:
            say(
                "bus bandwidth not judged: "
                + ("one process has no bus" if n < 2 else f"no floor for this VM size (set --min-busbw or {MIN_BUSBW})")
            )
        say(training_line(training, n))
        report = {
            "processes": n,
            "nodes": len(nodes),
            "device": device.type,
            "vm_size": os.environ.get("TRAINING_VM_SIZE"),
            "node_facts": list(nodes.values()),
            "results": results,
            "bandwidth": bandwidth,
            "training": training,
            "failures": failures,
            "passed": all_ok,
        }
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=2) + "\n")
        if all_ok:
            say("healthcheck passed")
        else:
            say("healthcheck FAILED: " + ("; ".join(failures) or "another rank failed (see its output)"))
    return 0 if all_ok else 1


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


if __name__ == "__main__":
    sys.exit(main())
