"""Scaling planner: predicted step time and scaling efficiency of data-parallel training at 1-512 GPUs.

    .venv/bin/python -m benchmarks.planner --vm-size Standard_ND96isr_H100_v5 --gpu-images-per-sec 3000
    .venv/bin/python -m benchmarks.planner --check-seed [--plot efficiency.png]
    .venv/bin/python -m benchmarks.planner --check-overhead
    .venv/bin/python -m benchmarks.planner --compare-ps [--plot docs/figures/backends-scaling.png]

The model is the product's (infra/trainingplatform/scaling.py: compute, ring or hierarchical allreduce, latency and
a per-step overhead fitted to NVIDIA's published 8-GPU figure, see --check-overhead); this command prints it for a VM
size. `--transport host-mpi` models a CPU-staged MPI allreduce (the seed
benchmarks' Intel MPI without NCCL) whose effective bandwidth B_host and overlap are calibrated on two GPU
types and checked on the other two (see --check-seed).
--compare-ps sets a synchronous parameter-server model beside the allreduce (see ps_step_time) and the source
documents' points (docs/backends-comparison.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from dataclasses import replace

from trainingplatform import vm_sizes
from trainingplatform.scaling import (
    DGX,
    DLE_8GPU,
    INTRA_GBPS,
    OVERHEAD_FIT_ON,
    RESNET50_BYTES,
    SYNC_SECONDS,
    Transport,
    efficiency,
    nccl_transport,
    overhead,
    speedup_8,
    step_time,
)

COUNTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]

# The seed benchmarks (TF ResNet-50, synthetic, fp32, batch 64/GPU, 8 nodes x 4 GPUs, Intel MPI over
# InfiniBand), read from the msalvaris/BatchAIHorovodBenchmark charts (+-1%): images/sec on 1 and 32 GPUs.
SEED = {
    "V100": ("Standard_NC24rs_v3", 357, 6514),
    "P100": ("Standard_NC24rs_v2", 234, 5820),
    "P40": ("Standard_ND24rs", 173, 5179),
    "K80": ("Standard_NC24r", 53, 1647),
}
CALIBRATE_ON, CHECK_ON = ("V100", "P40"), ("P100", "K80")


def host_mpi(b_host: float, overlap: float) -> Transport:
    """CPU-staged MPI allreduce: one effective bandwidth for the whole path (GPU->host, MPI, host->GPU)."""
    return Transport("host-mpi", b_host, b_host, 10e-6, overlap, SYNC_SECONDS)


# What this machine measured (benchmarks/results, `python -m benchmarks.report --run`): each configuration's
# images/sec with Horovod at 2 processes and of 2 independent processes (no allreduce), one thread each, and
# the MPI allreduce of ResNet-50's gradients submitted per tensor as the optimizer does (allreduce.json).
RESULTS = pathlib.Path(__file__).resolve().parent / "results"
LOCAL_RUNS = {  # results file: (per-process batch, fp32 gradient bytes of the model: torchvision, its head)
    "scaling-local.json": (16, 11_227_812 * 4),  # ResNet-18, 100 classes, 64 px
    "frameworks-pytorch.json": (16, 23_712_932 * 4),  # ResNet-50, 100 classes, 64 px
    "scaling-resnet50.json": (32, RESNET50_BYTES),  # ResNet-50, 1000 classes, 224 px
}


def local_residuals(results: pathlib.Path = RESULTS) -> dict[str, float]:
    """Per results file: seconds a 2-process Horovod step took beyond 2 independent processes' step and the
    measured allreduce of its gradients; what the overhead term stands for at n = 2 on this machine."""
    runs = json.loads((results / "allreduce.json").read_text())["runs"]
    per_tensor = next(r for r in runs if r["label"].startswith("horovod mpi (our default"))["results"]
    ar = next(x for x in per_tensor if x["name"] == "ResNet-50 gradients, per tensor")
    out = {}
    for name, (batch, grad_bytes) in LOCAL_RUNS.items():
        data = json.loads((results / name).read_text())
        horovod = batch / (data["horovod"]["2"] / 2)
        independent = batch / (data["independent"]["2"] / 2)
        out[name] = horovod - independent - ar["seconds"] * grad_bytes / ar["bytes"]
    return out


def check_overhead() -> int:
    print(
        f"overhead term fitted on DLE {OVERHEAD_FIT_ON} (8 GPUs): t_sync = {SYNC_SECONDS * 1e3:.2f} ms per doubling "
        f"of the processes ({overhead(8, replace(DGX, sync=SYNC_SECONDS)) * 1e3:.1f} ms a step at 8, "
        f"{overhead(64, replace(DGX, sync=SYNC_SECONDS)) * 1e3:.1f} ms at 64)"
    )
    print("DLE row            batch  measured 8-GPU  predicted  error   without the term")
    for name, (batch, r1, r8) in DLE_8GPU.items():
        pred, flat = speedup_8(name), speedup_8(name, 0.0)
        role = "fit" if name == OVERHEAD_FIT_ON else "check"
        print(
            f"{name:17} {batch:5}  {r8 / r1:13.2f}x  {pred:8.2f}x  {(pred - r8 / r1) / (r8 / r1) * 100:+5.1f}%  "
            f"{flat:5.2f}x ({(flat - r8 / r1) / (r8 / r1) * 100:+.1f}%)  {role}"
        )
    print(
        f"this machine, 2 processes (Horovod step - independent step - measured allreduce), model: "
        f"{SYNC_SECONDS * 1e3:.1f} ms"
    )
    for name, r in local_residuals().items():
        print(f"  {name:25} {r * 1e3:+7.1f} ms")
    return 0


def calibrate() -> Transport:
    """Grid-search B_host and overlap on CALIBRATE_ON's 32-GPU figures (least squares of efficiency)."""
    best = None
    for b10 in range(5, 200):
        for o10 in range(0, 101, 5):
            t = host_mpi(b10 / 10, o10 / 100)
            err = 0.0
            for gpu in CALIBRATE_ON:
                size, r1, r32 = SEED[gpu]
                err += (efficiency(32, 4, 64, r1, RESNET50_BYTES, t, False) - r32 / (32 * r1)) ** 2
            if best is None or err < best[0]:
                best = (err, t)
    return best[1]


def check_seed(plot: pathlib.Path | None) -> int:
    t = calibrate()
    print(
        f"host-staged MPI transport calibrated on {', '.join(CALIBRATE_ON)}: "
        f"B_host = {t.inter_gbps:.1f} GB/s, overlap = {t.overlap:.2f}"
    )
    print("GPU   measured 32-GPU  predicted  error   (efficiency measured / predicted)")
    worst = 0.0
    for gpu, (_size, r1, r32) in SEED.items():
        pred = efficiency(32, 4, 64, r1, RESNET50_BYTES, t, False) * 32 * r1
        err = (pred - r32) / r32
        role = "calibration" if gpu in CALIBRATE_ON else "check"
        print(
            f"{gpu:5} {r32:>8,}  {pred:>12,.0f}  {err * 100:+5.1f}%  ({r32 / (32 * r1) * 100:.0f}% / "
            f"{pred / (32 * r1) * 100:.0f}%, {role})"
        )
        if gpu in CHECK_ON:
            worst = max(worst, abs(err))
    print(f"worst error on the checked GPUs: {worst * 100:.1f}%")
    if plot:
        plot_efficiency(plot, t)
    return 0


def plot_efficiency(path: pathlib.Path, host: Transport) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    fig, ax = plt.subplots(figsize=(8, 5))
    for gpu, (_size, r1, r32) in SEED.items():
        ax.plot(
            counts,
            [efficiency(n, 4, 64, r1, RESNET50_BYTES, host, False) * 100 for n in counts],
            "--",
            label=f"{gpu}, host-staged MPI (seed setup)",
        )
        ax.plot([32], [r32 / (32 * r1) * 100], "o", color=ax.lines[-1].get_color())
    h100 = vm_sizes.CATALOG["Standard_ND96isr_H100_v5"]
    # the H100 at the batch the launcher gives it (launcher/sizing.py), where the seed ran 64
    for hier in (False, True):
        ax.plot(
            counts,
            [efficiency(n, 8, 256, 3000, RESNET50_BYTES, nccl_transport(h100), hier) * 100 for n in counts],
            label=f"H100 ND v5 (3000 img/s/GPU, batch 256), NCCL {'hierarchical' if hier else 'ring'}",
        )
    flat = replace(nccl_transport(h100), sync=0.0)
    ax.plot(
        counts,
        [efficiency(n, 8, 256, 3000, RESNET50_BYTES, flat, True) * 100 for n in counts],
        ":",
        color=ax.lines[-1].get_color(),
        label="H100 ND v5, NCCL hierarchical, without the per-step overhead term",
    )
    for name, (_batch, r1, r8) in DLE_8GPU.items():
        if "AMP" in name:
            ax.plot([8], [r8 / (8 * r1) * 100], "x", color="black")
    ax.plot([], [], "x", color="black", label="NVIDIA DLE 8-GPU AMP figures (A100 fitted, V100 checked)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_ylim(0, 105)
    ax.set_title("ResNet-50: planner (lines) vs seed measurements (dots, batch 64/GPU)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


# The land-cover seed: 148 GPUs (and near-linear speed-up to 64), here as a U-Net with a ResNet-34 encoder on
# 256 px four-band patches, batch 16 per GPU (the job jobs/pytorch-landcover-unet.yaml). No GPU has
# run it yet, so the single-GPU rate is bracketed from the model's counted FLOPs at 15% and 30% of the H100's
# dense FP16 tensor peak (989 TFLOPS, NVIDIA H100 SXM datasheet): an assumption, not a measurement.
H100_FP16_FLOPS = 989e12
LANDCOVER = {"model": "unet_resnet34", "patch": 256, "batch": 16, "gpus": (64, 148), "utilisation": (0.15, 0.30)}


def landcover_model() -> tuple[float, float]:
    """(fp32 gradient bytes, training FLOPs per patch = 3 x forward) of the seed configuration's model."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from payloads.segmentation import models

    model = models.build(LANDCOVER["model"], 6)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, models.BANDS, LANDCOVER["patch"], LANDCOVER["patch"]))
    return float(sum(p.numel() * 4 for p in model.parameters())), 3.0 * counter.get_total_flops()


def landcover_seed(vm_size: str = "Standard_ND96isr_H100_v5") -> list[dict]:
    size = vm_sizes.lookup(vm_size)
    grad, flops = landcover_model()
    t = nccl_transport(size)
    rows = []
    for u in LANDCOVER["utilisation"]:
        rate = u * H100_FP16_FLOPS / flops
        for n in LANDCOVER["gpus"]:
            for hier in (False, True):
                e = efficiency(n, size.gpus, LANDCOVER["batch"], rate, grad, t, hier)
                rows.append(
                    {
                        "utilisation": u,
                        "gpu_patches_per_sec": rate,
                        "gpus": n,
                        "hierarchical": hier,
                        "efficiency": e,
                        "patches_per_sec": e * n * rate,
                        "gradient_mbytes": grad / 1e6,
                        "gflops_per_patch": flops / 1e9,
                    }
                )
    return rows


# ---- synchronous parameter servers (issue 22) --------------------------------------------------------------
# Model: P parameter-server shards, each on its own node with one NIC of B GB/s per direction, holding 1/P of
# the parameters (perfect balance); every GPU is a worker that pushes its S gradient bytes and pulls S parameter
# bytes each step. Synchronous: the pulls start only after the PS has all N pushes and has applied the update, so
# the push phase (N*S/P bytes into each shard) and the pull phase (N*S/P out) do not overlap:
#   PS side      2 * N * S / (P * B)
#   worker side  2 * g * S / B          (a node's g workers share its NIC)
#   ps comm      max(PS side, worker side) + 2 * alpha (one round trip per step)
# and the step is the allreduce's: T_c + max(0, comm - overlap * backward) + T_o, with the same overlap and
# per-step overhead term, so the two models differ only in their communication term. The allreduce's bandwidth
# term 2(N-1)/N * S / B is flat in N; the PS side grows linearly in N for a fixed P.
# The source documents' setup: Uber's benchmark (the Horovod README: 4 Pascal GPUs per server, 25 Gbit/s RoCE,
# Inception V3 and ResNet-101), whose standard-distributed-TensorFlow figure is the seed's "at 128 GPUs ...
# only ... 50% capacity" (seed 003, Land O'Lakes). No source gives a single-GPU rate for those models, so the
# planner uses the seed benchmarks' ResNet-50 on a P100 at batch 64 (SEED["P100"]) on that network.
SOURCE_SETUP = {
    "gpu": "P100",
    "per_node": 4,
    "batch": 64,
    "rate1": SEED["P100"][1],
    "grad_bytes": RESNET50_BYTES,
    "nic_gbps": 25 / 8,
}
SOURCE_TRANSPORT = Transport("nccl", 25 / 8, INTRA_GBPS["pcie"], 50e-6, 0.8, SYNC_SECONDS)
PS_SHARDS = (1, 4, 16, 64)
PS_COUNTS = [8, 16, 32, 64, 128, 256, 512]
# Efficiency points the source documents state (GPUs, efficiency, label): seed 003 for the parameter servers;
# the allreduce's from the Horovod README's benchmark section (the figure seed 003 shows as "Figure 5" has no
# number in the seed's text), Inception V3 and ResNet-101 on 25 Gbit/s RoCE.
SOURCE_POINTS = {
    "ps": [(128, 0.50, "seed 003: standard distributed TensorFlow (parameter servers), 128 GPUs, ~50%")],
    "allreduce": [
        (128, 0.90, "Horovod README: Inception V3 / ResNet-101, 32 servers x 4 Pascal, 90%"),
        (512, 0.90, "Horovod README: Inception V3 / ResNet-101, 128 servers x 4 Pascal, 90%"),
    ],
}


def ps_bandwidth_seconds(n: int, g: int, grad_bytes: float, shards: int, gbps: float) -> float:
    """The parameter servers' bandwidth term: max(PS side 2nS/(PB), worker side 2gS/B), see the model above."""
    return max(2 * n * grad_bytes / (shards * gbps * 1e9), 2 * min(g, n) * grad_bytes / (gbps * 1e9))


def ps_step_time(n: int, g: int, batch: int, rate1: float, grad_bytes: float, t: Transport, shards: int) -> float:
    if shards < 1:
        raise ValueError(f"shards={shards}: a parameter-server model needs at least 1 PS shard")
    compute = batch / rate1
    comm = ps_bandwidth_seconds(n, g, grad_bytes, shards, t.inter_gbps) + 2 * t.alpha
    return compute + max(0.0, comm - t.overlap * compute * 2 / 3) + overhead(n, t)


def ps_efficiency(n, g, batch, rate1, grad_bytes, t, shards) -> float:
    return (batch / rate1) / ps_step_time(n, g, batch, rate1, grad_bytes, t, shards)


def compare_ps(counts=PS_COUNTS, shards=PS_SHARDS) -> dict:
    """Predicted efficiency of ring and hierarchical allreduce and of P parameter servers in SOURCE_SETUP."""
    c, t = SOURCE_SETUP, SOURCE_TRANSPORT
    args = (c["per_node"], c["batch"], c["rate1"], c["grad_bytes"], t)
    out = {
        "ring": {n: efficiency(n, *args, False) for n in counts},
        "hierarchical": {n: efficiency(n, *args, True) for n in counts},
    }
    for p in shards:
        out[f"ps{p}"] = {n: ps_efficiency(n, *args, p) for n in counts}
    return out


def shards_for(n: int, target: float, most: int = 4096) -> int | None:
    """The fewest PS shards at which the model reaches `target` efficiency at n GPUs in SOURCE_SETUP; None when
    no count up to `most` does (the worker side's NIC caps it)."""
    c = SOURCE_SETUP
    for p in range(1, most + 1):
        if ps_efficiency(n, c["per_node"], c["batch"], c["rate1"], c["grad_bytes"], SOURCE_TRANSPORT, p) >= target:
            return p
    return None


def print_compare_ps(plot: pathlib.Path | None) -> int:
    c = SOURCE_SETUP
    table = compare_ps()
    print(
        f"setup: ResNet-50 ({c['grad_bytes'] / 1e6:.0f} MB fp32 gradients), {c['gpu']} at {c['rate1']} img/s, batch "
        f"{c['batch']}/GPU, {c['per_node']} GPUs per node, {c['nic_gbps'] * 8:.0f} Gbit/s per node (PS nodes too), "
        f"overlap {SOURCE_TRANSPORT.overlap}, overhead {SYNC_SECONDS * 1e3:.2f} ms x log2(GPUs)"
    )
    print("GPUs  " + "  ".join(f"{k:>12}" for k in table))
    for n in PS_COUNTS:
        print(f"{n:4}  " + "  ".join(f"{table[k][n] * 100:11.1f}%" for k in table))
    for kind, points in SOURCE_POINTS.items():
        for n, e, label in points:
            print(f"source point ({kind}): {n} GPUs {e:.0%}  [{label}]")
    cap = ps_efficiency(128, c["per_node"], c["batch"], c["rate1"], c["grad_bytes"], SOURCE_TRANSPORT, 10**9)
    print(
        f"at 128 GPUs the model's parameter servers reach 50% with {shards_for(128, 0.5)} shards or more; "
        f"90% with {shards_for(128, 0.9) or 'no count'} (the workers' NICs cap it at {cap:.1%})"
    )
    if plot:
        _plot_compare_ps(plot, table)
    return 0


def _plot_compare_ps(path: pathlib.Path, table: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 6))
    for key, row in table.items():
        style = "-" if key in ("ring", "hierarchical") else "--"
        label = f"allreduce, {key}" if not key.startswith("ps") else f"parameter servers, {key[2:]} shard(s)"
        wide = {"linewidth": 5, "alpha": 0.4} if key == "ring" else {}  # hierarchical may lie on top of it
        ax.plot(list(row), [v * 100 for v in row.values()], style, marker=".", label=label, **wide)
    for kind, marker in (("ps", "s"), ("allreduce", "o")):
        points = SOURCE_POINTS[kind]
        label = (
            points[0][2] if len(points) == 1 else "Horovod README: Inception V3 / ResNet-101, 4 Pascal per server, 90%"
        )
        ax.plot(
            [n for n, _, _ in points],
            [e * 100 for _, e, _ in points],
            marker,
            color="black",
            markersize=9,
            markerfacecolor="none" if kind == "ps" else "black",
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_ylim(0, 105)
    c = SOURCE_SETUP
    ax.set_title(
        f"Planner: synchronous allreduce vs parameter servers (ResNet-50, {c['gpu']} {c['rate1']} img/s, "
        f"batch {c['batch']}, {c['nic_gbps'] * 8:.0f} Gbit/s)",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--check-seed", action="store_true", help="compare with the seed benchmarks' 32-GPU figures")
    ap.add_argument(
        "--check-overhead",
        action="store_true",
        help="the per-step overhead term: its fit to NVIDIA's 8-GPU figures and this machine's residuals",
    )
    ap.add_argument(
        "--compare-ps",
        action="store_true",
        help="parameter servers vs allreduce at 8-512 GPUs in the source documents' setup",
    )
    ap.add_argument("--plot", type=pathlib.Path)
    ap.add_argument("--vm-size", default="Standard_ND96isr_H100_v5")
    ap.add_argument("--gpu-images-per-sec", type=float, help="measured single-GPU throughput")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--gradient-mbytes", type=float, default=RESNET50_BYTES / 1e6)
    ap.add_argument(
        "--gpus",
        type=lambda t: [int(x) for x in t.split(",")],
        default=COUNTS,
        help="comma-separated GPU counts to predict, e.g. 64,148 (the land-cover seed's)",
    )
    ap.add_argument(
        "--landcover-seed",
        action="store_true",
        help="the land-cover seed's configuration (U-Net ResNet-34, 64 and 148 GPUs) on --vm-size",
    )
    args = ap.parse_args(argv)
    if args.landcover_seed:
        rows = landcover_seed(args.vm_size)
        print(
            f"land-cover U-Net (ResNet-34 encoder), {rows[0]['gradient_mbytes']:.1f} MB of gradients, "
            f"{rows[0]['gflops_per_patch']:.1f} GFLOPs per 256 px patch (forward + backward), batch "
            f"{LANDCOVER['batch']}/GPU on {args.vm_size}; single-GPU rate assumed from H100 utilisation"
        )
        for r in rows:
            print(
                f"{r['utilisation'] * 100:3.0f}% of peak ({r['gpu_patches_per_sec']:,.0f} patches/s/GPU), {r['gpus']:3} GPUs, "
                f"{'hierarchical' if r['hierarchical'] else 'ring':12}: efficiency {r['efficiency'] * 100:5.1f}%, "
                f"{r['patches_per_sec']:,.0f} patches/s"
            )
        return 0
    if args.compare_ps:
        return print_compare_ps(args.plot)
    if args.check_seed:
        return check_seed(args.plot)
    if args.check_overhead:
        return check_overhead()
    size = vm_sizes.lookup(args.vm_size)
    if size is None or size.gpus == 0:
        print(f"error: {args.vm_size} is not a GPU size in the catalog", file=sys.stderr)
        return 2
    if not args.gpu_images_per_sec:
        print("error: --gpu-images-per-sec is required (measure one GPU with the synthetic job)", file=sys.stderr)
        return 2
    t = nccl_transport(size)
    print(
        f"{size.name}: {size.gpus}x {size.gpu_model}, {size.intra_node} in the node, "
        f"{size.infiniband or 'no'} InfiniBand ({t.inter_gbps:.0f} GB/s per node)"
    )
    print(
        f"per-step overhead {SYNC_SECONDS * 1e3:.2f} ms x log2(GPUs) (--check-overhead); the last column is "
        "the hierarchical efficiency without it"
    )
    print("GPUs  ring: step ms / efficiency   hierarchical: step ms / efficiency   no overhead term")
    flat = replace(t, sync=0.0)
    for n in args.gpus:
        cells = []
        for hier in (False, True):
            s = step_time(n, size.gpus, args.batch, args.gpu_images_per_sec, args.gradient_mbytes * 1e6, t, hier)
            cells.append(f"{s * 1e3:8.1f} / {args.batch / args.gpu_images_per_sec / s * 100:5.1f}%")
        e0 = efficiency(n, size.gpus, args.batch, args.gpu_images_per_sec, args.gradient_mbytes * 1e6, flat, True)
        print(f"{n:4}  {cells[0]}        {cells[1]}                {e0 * 100:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
