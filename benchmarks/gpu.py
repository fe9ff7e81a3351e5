"""The GPU benchmark: one command, one GPU, under 10 minutes; prints a table and writes JSON.

    .venv/bin/python -m benchmarks.gpu [--json gpu.json] [--workers 12] [--quick]

1. Synthetic ceiling: ResNet-50 training steps on one fixed batch made on the GPU (Horovod's synthetic benchmark
   pattern), channels_last, fused SGD, at batch 64 and 256, fp16 (with GradScaler) and bf16, eager and
   torch.compile'd. Steady state: the first steps (cuDNN autotuning, compilation) are not timed.
2. The payload: `payloads.pytorch.train` on synthetic data, one process, its defaults for the GPU, batch 256;
   its steady-state "Total images/sec" (start-up excluded, see --startup-steps).
3. The input pipeline alone: images/sec of the shard reader per decoder, from pre-resized JPEG shards the
   benchmark writes, with `--workers` decode processes (12 = the vCPUs per GPU of ND H100 v5).
4. Real data: the payload on those shards with `--workers`, and its ratio to (2).
`--quick` (any device) runs small sizes for a smoke check; `--device cpu` runs on the CPU (CI does, with --quick).
Reference: NVIDIA's published ResNet-50 (PyTorch, AMP, A100 80 GB, batch 256): 2,470 img/s per GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent


def ceiling(
    device: str, model_name: str, batch: int, image_size: int, dtype: str, compiled: bool, warmup: int, steps: int
) -> float:
    """Images/sec of a training step on a fixed batch on the device (no input pipeline, no Horovod)."""
    import torch
    import torch.nn.functional as F
    import torchvision

    from payloads.pytorch.precision import Precision

    torch.manual_seed(0)
    dev = torch.device(device)
    model = getattr(torchvision.models, model_name)(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    prec = Precision(dtype, dev.type)
    scaler = prec.grad_scaler()
    step_model = torch.compile(model) if compiled else model
    x = torch.randn(batch, 3, image_size, image_size, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with prec.autocast():
            loss = F.cross_entropy(step_model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return batch * steps / (time.perf_counter() - start)


def payload(args: list[str], env_extra: dict | None = None) -> dict:
    """One process of the PyTorch payload (horovodrun -np 1, Gloo); returns its metrics.json summary."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            str(BIN / "horovodrun"),
            "-np",
            "1",
            "-H",
            "localhost:1",
            "--gloo",
            sys.executable,
            "-m",
            "payloads.pytorch.train",
            "--no-progress",
            "--no-resume",
            "--no-mlflow",
            *args,
            "--output-dir",
            out,
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode:
            raise RuntimeError(
                f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        return json.loads((pathlib.Path(out) / "metrics.json").read_text())["summary"]


def shards(work: pathlib.Path, images: int, size: int) -> pathlib.Path:
    """Pre-resized JPEG shards (datatools.prepare) from generated photos-like images."""
    from benchmarks.input_pipeline import generate
    from datatools import prepare

    tree = generate(work / "tree", images, classes=100)
    out = work / "shards"
    prepare.main(
        [
            "--image-dir",
            str(tree),
            "--output-dir",
            str(out),
            "--shards",
            "16",
            "--resize",
            str(size),
            "--formats",
            "webdataset",
        ]
    )
    return out / "webdataset"


def pipeline(shard_dir: pathlib.Path, image_size: int, batch: int, workers: int, decoder: str, epochs: int) -> float:
    """Images/sec of the shard reader alone (decode, augment, batch as uint8), best epoch after the first."""
    from benchmarks.input_pipeline import shard_rate

    return shard_rate(shard_dir, image_size, batch, workers, decoder, epochs)


def table(rows: list[dict]) -> str:
    width = max(len(r["what"]) for r in rows)
    lines = [f"{'what':<{width}}  images/sec", f"{'-' * width}  ----------"]
    lines += [
        f"{r['what']:<{width}}  {r['images_per_sec']:>10.1f}" + (f"  ({r['note']})" if r.get("note") else "")
        for r in rows
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default when a GPU is visible) or cpu")
    ap.add_argument("--workers", type=int, default=12, help="decode processes (ND H100 v5: 12 vCPUs per GPU)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke check of the whole benchmark")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print(
            "error: --device cuda but torch sees no GPU (run the health check for the driver and CUDA versions)",
            file=sys.stderr,
        )
        return 2
    if args.quick:
        model, size, batches, warmup, steps, images, real_size = "resnet18", 32, (8,), 2, 3, 128, 40
    else:
        model, size, batches, warmup, steps, images, real_size = "resnet50", 224, (64, 256), 15, 40, 12800, 160
    dtypes = ("fp16", "bf16")
    rows: list[dict] = []
    facts = {
        "device": device,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "workers": args.workers,
        "quick": args.quick,
    }
    started = time.perf_counter()

    for batch in batches:
        for dtype in dtypes:
            # --quick compiles one case only: inductor's compile alone takes minutes on a CPU.
            for compiled in (False, True) if not args.quick or dtype == "bf16" else (False,):
                rate = ceiling(device, model, batch, size, dtype, compiled, warmup, steps)
                rows.append(
                    {
                        "what": f"ceiling {model} batch {batch} {dtype}{' compiled' if compiled else ''}",
                        "images_per_sec": rate,
                        "kind": "ceiling",
                        "batch": batch,
                        "dtype": dtype,
                        "compiled": compiled,
                    }
                )
                print(table(rows[-1:]).splitlines()[-1], flush=True)

    big = batches[-1]
    common = [
        "--model",
        model,
        "--image-size",
        str(size),
        "--batch-size",
        str(big),
        "--epochs",
        "1",
        "--warmup-epochs",
        "0",
        "--startup-steps",
        str(warmup),
    ]
    if device == "cpu":
        common += ["--amp", "--threads", str(os.cpu_count() or 1)]
    synthetic = payload(common + ["--data", "synthetic", "--synthetic-samples", str(big * (warmup + steps))])
    rows.append(
        {
            "what": f"payload synthetic batch {big}",
            "images_per_sec": synthetic["total_images_per_sec"],
            "kind": "payload",
            "startup_seconds": synthetic.get("startup_seconds"),
        }
    )
    print(table(rows[-1:]).splitlines()[-1], flush=True)

    with tempfile.TemporaryDirectory() as work:
        shard_dir = shards(pathlib.Path(work), images, real_size)
        from payloads.pytorch.decoders import available

        for decoder in available():
            rate = pipeline(shard_dir, size, big, args.workers, decoder, epochs=2)
            rows.append(
                {
                    "what": f"input pipeline {decoder}, {args.workers} workers, {real_size} px shards",
                    "images_per_sec": rate,
                    "kind": "pipeline",
                    "decoder": decoder,
                }
            )
            print(table(rows[-1:]).splitlines()[-1], flush=True)
        real = payload(
            common + ["--data", "shards", "--data-dir", str(shard_dir), "--workers", str(args.workers), "--epochs", "3"]
        )
        ratio = real["total_images_per_sec"] / synthetic["total_images_per_sec"]
        rows.append(
            {
                "what": f"payload real data ({real_size} px shards, {args.workers} workers)",
                "images_per_sec": real["total_images_per_sec"],
                "kind": "real",
                "note": f"{ratio:.0%} of synthetic",
                "ratio_to_synthetic": ratio,
            }
        )

    facts["seconds"] = time.perf_counter() - started
    print()
    print(f"{facts['gpu'] or 'CPU'}, torch {facts['torch']}, CUDA {facts['cuda']}, {facts['seconds']:.0f} s")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"machine": facts, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
