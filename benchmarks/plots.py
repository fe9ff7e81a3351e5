"""Draw the benchmark figures of docs/benchmarks.md from the saved results: `python -m benchmarks.plots`.

Reads benchmarks/results/*.json (written by `python -m benchmarks.report --run` and the commands it names)
and writes PNGs under docs/figures/:

    scaling.png      images/sec from 1 to N processes per measured job, against linear and the machine's ceiling
    allreduce.png    allreduce bus bandwidth by message size, per variant
    planner-seed.png the planner against the source documents' 32-GPU figures (arithmetic, no results needed)
    efficiency.png   the planner's scaling efficiency, 1-512 GPUs (benchmarks.planner --check-seed --plot)
    decoders.png     the input pipeline's JPEG decoders per CPU-second (results/decoders.json)

A result that is missing is reported with the command that produces it; the other figures are still drawn.
Nothing here measures anything: re-running it on unchanged results gives the same figures.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from . import planner

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
FIGURES = HERE.parent / "docs" / "figures"

PRODUCERS = {  # result file -> the command that writes it
    "allreduce.json": "python -m benchmarks.allreduce --json benchmarks/results/allreduce.json",
    "scaling-local.json": "python -m benchmarks.scaling --config local --controllers auto,gloo --repeats 3 "
    "--json benchmarks/results/scaling-local.json",
    "scaling-resnet50.json": "python -m benchmarks.scaling --config resnet50 --json benchmarks/results/scaling-resnet50.json",
    "scaling-landcover.json": "python -m benchmarks.scaling --config landcover --payload segmentation "
    "--json benchmarks/results/scaling-landcover.json",
    "decoders.json": "python -m benchmarks.input_pipeline --decoders-only --images 300 "
    "--json benchmarks/results/decoders.json",
}
for _p in ("pytorch", "tensorflow", "keras"):
    PRODUCERS[f"frameworks-{_p}.json"] = (
        f"python -m benchmarks.scaling --config frameworks --payload {_p} "
        f"--json benchmarks/results/frameworks-{_p}.json"
    )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, out: pathlib.Path) -> bool:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def _load(name: str, missing: list[str]) -> dict | None:
    path = RESULTS / name
    if not path.exists():
        missing.append(f"{name}: {PRODUCERS.get(name, '?')}")
        return None
    return json.loads(path.read_text())


def _machine() -> str:
    path = RESULTS / "machine.json"
    if not path.exists():
        return "machine not recorded"
    m = json.loads(path.read_text())
    return f"{m['cores']} cores ({m['cpu']}), {m['date']}"


def scaling(out: pathlib.Path, missing: list[str]) -> bool:
    """Images/sec (patches/sec for land cover) at each measured process count, per job and controller."""
    series = []
    for name, label in (
        ("scaling-local.json", "local job, ResNet-18 64 px"),
        ("scaling-resnet50.json", "ResNet-50 224 px"),
        ("frameworks-pytorch.json", "PyTorch payload, ResNet-50 64 px"),
        ("frameworks-tensorflow.json", "TensorFlow payload, ResNet-50 64 px"),
        ("frameworks-keras.json", "Keras payload, ResNet-50 64 px"),
        ("scaling-landcover.json", "land-cover U-Net (patches)"),
    ):
        s = _load(name, missing)
        if s is None:
            continue
        for controller, rates in (s.get("controllers") or {s.get("controller", "?"): s["horovod"]}).items():
            h = {int(k): v for k, v in rates.items()}
            ceiling = (s.get("independent") or {}).get("2")
            series.append((f"{label}, {controller}", h, ceiling))
    if not series:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    top = max(n for _, h, _ in series for n in h)
    for label, h, ceiling in series:
        counts = sorted(h)
        speedup = [h[n] / h[1] for n in counts]
        (line,) = ax.plot(counts, speedup, "o-", label=f"{label} ({h[counts[-1]] / (counts[-1] * h[1]) * 100:.0f}%)")
        if ceiling:  # two plain loops at once, no communication: the most any allreduce could reach here
            ax.plot([2], [ceiling / h[1]], "_", markersize=18, color=line.get_color())
    ax.plot([1, top], [1, top], ":", color="grey", label="linear")
    ax.plot([], [], "_", markersize=18, color="black", label="2 plain loops at once (the machine's ceiling)")
    ax.set_xlabel("Horovod processes")
    ax.set_ylabel("speed-up over 1 process")
    ax.set_xticks(range(1, top + 1))
    ax.set_title(f"Scaling on {_machine()}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _save(plt, fig, out)


def allreduce(out: pathlib.Path, missing: list[str]) -> bool:
    """Bus bandwidth (NCCL-tests' definition: bytes x 2(n-1)/n / time) for the plain sizes, per variant."""
    ar = _load("allreduce.json", missing)
    if ar is None:
        return False
    n = ar.get("np", 2)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in ar["runs"]:
        rows = [r for r in run["results"] if r["name"].endswith(" MB")]
        ax.plot(
            [r["bytes"] for r in rows],
            [r["bytes"] * 2 * (n - 1) / n / r["seconds"] / 1e9 for r in rows],
            "o-",
            label=run["label"],
        )
    ax.set_xscale("log")
    ax.set_xlabel("allreduce size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"Allreduce, {n} processes on one machine: {_machine()}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(plt, fig, out)


def planner_seed(out: pathlib.Path) -> bool:
    """The planner's 32-GPU prediction for each GPU of the seed benchmarks against the measured figure."""
    t = planner.calibrate()
    gpus, measured, predicted = [], [], []
    for gpu, (_size, r1, r32) in planner.SEED.items():
        role = "calibration" if gpu in planner.CALIBRATE_ON else "check"
        gpus.append(f"{gpu}\n({role})")
        measured.append(r32)
        predicted.append(planner.efficiency(32, 4, 64, r1, planner.RESNET50_BYTES, t, False) * 32 * r1)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = range(len(gpus))
    ax.bar([i - 0.2 for i in x], measured, 0.4, label="source documents, measured")
    ax.bar([i + 0.2 for i in x], predicted, 0.4, label="planner, predicted")
    for i, (m, p) in enumerate(zip(measured, predicted)):
        ax.annotate(f"{(p - m) / m * 100:+.1f}%", (i + 0.2, p), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), gpus)
    ax.set_ylabel("images/sec, 32 GPUs (ResNet-50)")
    ax.set_title("Planner vs the seed benchmarks (Horovod, Intel MPI, no NCCL)")
    ax.legend(fontsize=8)
    return _save(plt, fig, out)


def decoders(out: pathlib.Path, missing: list[str]) -> bool:
    """Images per CPU-second of each JPEG decoder, decode alone and with the training crop, per image set."""
    d = _load("decoders.json", missing)
    if d is None:
        return False
    sets = list(dict.fromkeys(r["images"] for r in d["rows"]))
    names = list(dict.fromkeys(r["decoder"] for r in d["rows"]))
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), sharey=False)
    width = 0.8 / len(names)
    for ax, key, title in (
        (axes[0], "decode_per_core", "decode"),
        (axes[1], "decode_crop_per_core", f"decode + crop {d.get('image_size', 224)} px"),
    ):
        for j, name in enumerate(names):
            rates = {r["images"]: r[key] for r in d["rows"] if r["decoder"] == name}
            ax.bar([i + j * width for i in range(len(sets))], [rates.get(s, 0) for s in sets], width, label=name)
        ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(sets))], sets)
        ax.set_title(title)
        ax.set_ylabel("images per CPU-second")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"JPEG decoders, 1 process x 1 thread: {d['cores']} cores ({d['cpu']}), {d['date']}")
    return _save(plt, fig, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=pathlib.Path, default=FIGURES, help="folder for the PNGs (default docs/figures)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    missing: list[str] = []
    drawn = [
        name
        for name, ok in (
            ("scaling.png", scaling(args.out / "scaling.png", missing)),
            ("allreduce.png", allreduce(args.out / "allreduce.png", missing)),
            ("planner-seed.png", planner_seed(args.out / "planner-seed.png")),
            ("decoders.png", decoders(args.out / "decoders.png", missing)),
        )
        if ok
    ]
    planner.plot_efficiency(args.out / "efficiency.png", planner.calibrate())
    drawn.append("efficiency.png")
    for name in drawn:
        print(f"wrote {args.out / name}")
    for line in missing:
        print(f"missing result {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
