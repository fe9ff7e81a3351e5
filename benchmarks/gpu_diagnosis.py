"""The one-call device diagnosis that wrote benchmarks/results/gpu-h200-diagnosis.json (docs/benchmarks.md#h200):
the payload in bf16 and fp16 (and fp16 --compile), each epoch's first-batch wait of the shard loader at 12 and 15
workers, real data in fp16 over 4 epochs, and the checkpoint write. Kept as run; benchmarks.gpu has carried its
rows since (but --compile on the payload). Run: python3 -m benchmarks.gpu_diagnosis (OUT=folder for the JSON;
DIAG_CPU=1: a smoke run here)."""

import json
import os
import pathlib
import subprocess
import tempfile
import time
import traceback

OUT = pathlib.Path(os.environ.get("OUT") or "/tmp/diag-out")
CPU = os.environ.get("DIAG_CPU") == "1"  # a smoke run of this script here
res = {}
T0 = time.perf_counter()


def save():
    (OUT / "diag2.json").write_text(json.dumps(res, indent=1, default=str))


def section(name, f):
    t = time.perf_counter()
    try:
        res[name] = f()
    except Exception:  # noqa: BLE001 - a failed section is recorded and the next one runs
        res[name] = {"error": traceback.format_exc()[-2500:]}
    res[name + "_s"] = round(time.perf_counter() - t, 1)
    print(name, json.dumps(res[name], default=str)[:2500], flush=True)
    save()


def main():
    OUT.mkdir(exist_ok=True, parents=True)
    from benchmarks import gpu

    model, size, batch, n = ("tiny_cnn", 32, 8, 40) if CPU else ("resnet50", 224, 256, 12800)
    dev_args = ["--amp", "--threads", "2"] if CPU else []

    def run_payload(args, timeout=240):
        out = tempfile.mkdtemp()
        cmd = gpu.payload_command(args + dev_args, out, horovod=False)
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=gpu.ROOT, env=gpu.payload_env(), capture_output=True, text=True, timeout=timeout)
        wall = round(time.perf_counter() - t, 1)
        if p.returncode:
            return {"rc": p.returncode, "tail": (p.stdout + p.stderr)[-1500:]}
        m = json.loads((pathlib.Path(out) / "metrics.json").read_text())
        ep = [{k: e.get(k) for k in ("epoch", "images_per_sec", "epoch_seconds")} for e in m["epochs"]]
        s = m["summary"]
        return {
            "ips": round(s["total_images_per_sec"], 1),
            "startup": s.get("startup_seconds"),
            "wall": wall,
            "all_images": s.get("all_images"),
            "all_train_seconds": s.get("all_train_seconds"),
            "prec": m["run"]["world"]["precision"],
            "fmt": m["run"]["world"]["memory_format"],
            "compiled": m["run"]["world"].get("compiled"),
            "epochs": ep,
        }

    base = [
        "--model",
        model,
        "--image-size",
        str(size),
        "--batch-size",
        str(batch),
        "--warmup-epochs",
        "0",
        "--startup-steps",
        "15",
    ]
    synth = base + ["--epochs", "1", "--data", "synthetic", "--synthetic-samples", str(batch * 75)]

    section("payload_bf16", lambda: run_payload(synth + ["--amp-dtype", "bf16"]))
    section("payload_fp16", lambda: run_payload(synth + ["--amp-dtype", "fp16"]))

    work = pathlib.Path(tempfile.mkdtemp())
    shard_dir = [None]

    def make():
        shard_dir[0] = gpu.shards(work, n, 256 if not CPU else 40)
        return str(shard_dir[0])

    section("shards", make)

    def refill():
        from benchmarks.input_pipeline import shard_epochs

        images = n  # every generated photo is in the train split
        out = []
        for workers in (2,) if CPU else (12, 15):
            for epoch, (rate, first) in enumerate(shard_epochs(shard_dir[0], size, batch, workers, "auto", 3)):
                after = images - batch  # the images after the epoch's first batch, which `rate` covers
                out.append(
                    {
                        "workers": workers,
                        "epoch": epoch,
                        "first_batch_s": round(first, 3),
                        "ips_after_first": round(rate, 1),
                        "ips_with_first": round(images / (after / rate + first), 1),
                    }
                )
        return out

    section("loader_refill", refill)
    real = base + [
        "--epochs",
        "4",
        "--data",
        "shards",
        "--data-dir",
        str(shard_dir[0]),
        "--workers",
        "12" if not CPU else "2",
    ]
    section("real_fp16", lambda: run_payload(real + ["--amp-dtype", "fp16"]))

    def ckpt():
        import torch

        from payloads.pytorch import models

        d = "cpu" if CPU else "cuda"
        m = models.build(model, 1000, size).to(d)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        m(torch.randn(2, 3, size, size, device=d)).sum().backward()
        opt.step()
        out = {}
        for i in range(2):
            t = time.perf_counter()
            torch.save({"model": m.state_dict(), "optimizer": opt.state_dict()}, f"/tmp/ck{i}.pt")
            os.sync()
            out[f"save{i}_s"] = round(time.perf_counter() - t, 3)
        out["mb"] = round(os.path.getsize("/tmp/ck0.pt") / 1e6, 1)
        return out

    section("checkpoint_write", ckpt)
    if time.perf_counter() - T0 < 150:
        section("payload_fp16_compiled", lambda: run_payload(synth + ["--amp-dtype", "fp16", "--compile"], timeout=110))
    if time.perf_counter() - T0 < 165:
        section("payload_bf16_compiled", lambda: run_payload(synth + ["--amp-dtype", "bf16", "--compile"], timeout=90))
    res["total_s"] = round(time.perf_counter() - T0, 1)
    save()
    print("total", res["total_s"])


if __name__ == "__main__":
    main()
