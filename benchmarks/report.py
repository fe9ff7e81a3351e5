"""Regenerate the benchmark tables of docs/benchmarks.md: `python -m benchmarks.report --run` (about 20 minutes on 2 cores).

`--run` runs benchmarks.allreduce and benchmarks.scaling (its configs, and every payload) and saves their JSON under
benchmarks/results/; without it, the table is rebuilt from the saved results. The planner's check against
the seed figures is recomputed each time (it is arithmetic). The figures (PNGs) are `python -m benchmarks.plots`.
It writes docs/benchmarks.md between its markers, never the README.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import re
import subprocess
import sys

from . import planner

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"
PAGE = HERE.parent / "docs" / "benchmarks.md"
START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"


def run_all() -> None:
    RESULTS.mkdir(exist_ok=True)
    py = [sys.executable, "-m"]
    subprocess.run(py + ["benchmarks.allreduce", "--json", str(RESULTS / "allreduce.json")], check=True)
    # the local job: both controllers, alternating, median of 3; ResNet-50 (slow here): the default only
    subprocess.run(
        py
        + [
            "benchmarks.scaling",
            "--config",
            "local",
            "--controllers",
            "auto,gloo",
            "--repeats",
            "3",
            "--json",
            str(RESULTS / "scaling-local.json"),
        ],
        check=True,
    )
    subprocess.run(
        py + ["benchmarks.scaling", "--config", "resnet50", "--json", str(RESULTS / "scaling-resnet50.json")],
        check=True,
    )
    for payload in ("pytorch", "tensorflow", "keras"):
        subprocess.run(
            py
            + [
                "benchmarks.scaling",
                "--config",
                "frameworks",
                "--payload",
                payload,
                "--json",
                str(RESULTS / f"frameworks-{payload}.json"),
            ],
            check=True,
        )
    subprocess.run(
        py
        + [
            "benchmarks.scaling",
            "--config",
            "landcover",
            "--payload",
            "segmentation",
            "--json",
            str(RESULTS / "scaling-landcover.json"),
        ],
        check=True,
    )
    (RESULTS / "machine.json").write_text(
        json.dumps(
            {
                "host": platform.node(),
                "cores": os.cpu_count(),
                "cpu": cpu_model(),
                "python": platform.python_version(),
                "date": dt.date.today().isoformat(),
            },
            indent=2,
        )
    )


def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def table() -> str:
    m = json.loads((RESULTS / "machine.json").read_text())
    ar = json.loads((RESULTS / "allreduce.json").read_text())
    lines = [
        f"Measured {m['date']} on {m['cores']} cores ({m['cpu']}), Python {m['python']}, "
        f"2 processes, one thread each, Horovod 0.28.1 ({ar.get('horovod_build', 'Gloo')}); MPI runs use "
        f"the launcher's local configuration (Open MPI yielding when idle, unbound) unless marked busy-polling.",
        "",
        "| allreduce (median ms) | " + " | ".join(r["label"] for r in ar["runs"]) + " | memory copy |",
        "| --- " * (len(ar["runs"]) + 2) + "|",
    ]
    for i, row in enumerate(ar["runs"][0]["results"]):
        cells = [f"{r['results'][i]['seconds'] * 1e3:.1f}" for r in ar["runs"]]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + f" | {ar['memory_copy_seconds'][i] * 1e3:.1f} |")
    lines += [
        "",
        "| training (images/sec) | plain PyTorch, 1 process | 2 plain loops at once, no communication "
        "(ceiling) | Horovod, 1 process | Horovod, 2 processes | scaling efficiency | Horovod overhead at "
        "1 process |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for config, label in (
        ("local", "the local job, scripts/train-local (ResNet-18, 64 px, batch 16)"),
        ("resnet50", "ResNet-50, 224 px, batch 32"),
    ):
        path = RESULTS / f"scaling-{config}.json"
        if not path.exists():
            continue
        s = json.loads(path.read_text())
        ceiling = (s.get("independent") or {}).get("2")
        ceiling_cell = f"{ceiling:.1f} ({ceiling / (2 * s['plain']) * 100:.0f}%)" if ceiling else "-"
        for controller, rates in (s.get("controllers") or {s.get("controller", "gloo"): s["horovod"]}).items():
            h = {int(k): v for k, v in rates.items()}
            lines.append(
                f"| {label}, over {controller} | {s['plain']:.1f} | {ceiling_cell} | {h[1]:.1f} | {h[2]:.1f} | "
                f"{h[2] / (2 * h[1]) * 100:.0f}% | {(h[1] / s['plain'] - 1) * 100:+.1f}% |"
            )
    frameworks = [(p, RESULTS / f"frameworks-{p}.json") for p in ("pytorch", "tensorflow", "keras")]
    if any(path.exists() for _, path in frameworks):
        lines += [
            "",
            "| payload: ResNet-50, 64 px, batch 16 (images/sec) | Horovod, 1 process | Horovod, 2 processes | "
            "scaling efficiency |",
            "| --- | --- | --- | --- |",
        ]
        for name, path in frameworks:
            if path.exists():
                h = {int(k): v for k, v in json.loads(path.read_text())["horovod"].items()}
                lines.append(f"| {name} | {h[1]:.1f} | {h[2]:.1f} | {h[2] / (2 * h[1]) * 100:.0f}% |")
    landcover = RESULTS / "scaling-landcover.json"
    if landcover.exists():
        h = {int(k): v for k, v in json.loads(landcover.read_text())["horovod"].items()}
        lines += [
            "",
            "| land-cover U-Net, ResNet-18 encoder, 64 px patches, batch 8 (patches/sec) | Horovod, 1 process | "
            "Horovod, 2 processes | scaling efficiency |",
            "| --- | --- | --- | --- |",
            f"| scripts/train-landcover's run | {h[1]:.1f} | {h[2]:.1f} | {h[2] / (2 * h[1]) * 100:.0f}% |",
        ]
    t = planner.calibrate()
    lines += [
        "",
        "| planner vs seed, 32 GPUs (images/sec) | measured | predicted | error |",
        "| --- | --- | --- | --- |",
    ]
    for gpu, (_size, r1, r32) in planner.SEED.items():
        pred = planner.efficiency(32, 4, 64, r1, planner.RESNET50_BYTES, t, False) * 32 * r1
        role = "calibration" if gpu in planner.CALIBRATE_ON else "check"
        lines.append(f"| {gpu} ({role}) | {r32:,} | {pred:,.0f} | {(pred - r32) / r32 * 100:+.1f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="run the benchmarks first (else use benchmarks/results/)")
    args = ap.parse_args(argv)
    if args.run:
        run_all()
    text = PAGE.read_text()
    if START not in text or END not in text:
        print(f"error: {PAGE} lacks the {START} ... {END} markers", file=sys.stderr)
        return 2
    new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{table()}\n{END}", text, flags=re.S)
    PAGE.write_text(new)
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
