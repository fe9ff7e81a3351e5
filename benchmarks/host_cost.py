"""What the shard loader costs the training process, per image, and what its workers deliver per core.

    .venv/bin/python -m benchmarks.host_cost                      # 1,200 images at 256 px, 2 workers, batch 64
    .venv/bin/python -m benchmarks.host_cost --images 4000 --workers 4 --json out.json
    PYTHONPATH=<another checkout> .venv/bin/python -m benchmarks.host_cost   # the same figures for that code

On a GPU node the training process's Python thread launches the GPU's work; every CPU-microsecond it spends on
the input is taken from that. So the loader is measured alone (no model), one epoch at a time, and reports:
- images/sec over the epoch (wall clock, the first batch included);
- the training process's own CPU time per image (all its threads: getrusage(RUSAGE_SELF));
- the workers' CPU time per image and images per CPU-second of all the processes (images/sec per core);
for plain epochs, and with --cache-decoded its filling epoch and a cached one. The images are generated
(benchmarks.input_pipeline.generate) and prepared as the ImageNet job's shards are (--resize 256).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import sys
import tempfile
import time

from benchmarks.input_pipeline import generate

TICK = os.sysconf("SC_CLK_TCK")


def _descendants_cpu() -> float:
    """CPU seconds (user + system) of every live descendant of this process (forkserver workers are the
    forkserver's children, not ours)."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / TICK
    total, todo = 0.0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(loader, epoch: int) -> dict:
    loader.set_epoch(epoch)
    wall, mine, theirs = time.perf_counter(), _self_cpu(), _descendants_cpu()
    images = 0
    for x, _y, _skipped in loader:
        images += len(x)
    wall, mine, theirs = time.perf_counter() - wall, _self_cpu() - mine, _descendants_cpu() - theirs
    return {
        "images": images,
        "images_per_sec": round(images / wall, 1),
        "trainer_cpu_ms_per_image": round(1e3 * mine / images, 3),
        "workers_cpu_ms_per_image": round(1e3 * theirs / images, 3),
        "images_per_cpu_second": round(images / (mine + theirs), 1),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__)
    p.add_argument("--images", type=int, default=1200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--epochs", type=int, default=2, help="plain epochs (after a first, uncounted one)")
    p.add_argument("--work-dir", type=pathlib.Path, default=None, help="keep the generated shards here")
    p.add_argument("--json", type=pathlib.Path)
    args = p.parse_args(argv)

    from datatools import prepare
    from payloads.pytorch import shards

    work = args.work_dir or pathlib.Path(tempfile.mkdtemp(prefix="host-cost-"))
    tree = generate(work / "images", args.images, 20)
    out = work / f"shards-{args.images}"
    if not (out / "webdataset").is_dir():
        prepare.run(tree, out, shards=16, formats=["webdataset"], resize=256, progress=False)
    train, _, _ = shards.open_set(out / "webdataset")

    def make(cache: bool):
        return shards.ShardLoader(
            train,
            shards.Reading(0, 1, args.batch, workers=args.workers, cache=cache, cache_dir=work),
            shards.Transform(args.image_size, train=True),
        )

    rows = []
    plain = make(False)
    measure(plain, 0)  # workers started, files indexed, page cache warm: not counted
    for e in range(1, args.epochs + 1):
        rows.append({"run": "plain", "epoch": e, **measure(plain, e)})
    cached = make(True)
    rows.append({"run": "cache", "epoch": 0, "filling": True, **measure(cached, 0)})
    rows.append({"run": "cache", "epoch": 1, "filling": False, **measure(cached, 1)})
    for row in rows:
        print(json.dumps(row))
    result = {
        "machine": f"{os.cpu_count()} CPUs",
        "python": sys.version.split()[0],
        "code": os.environ.get("PYTHONPATH", "this checkout"),
        "args": {k: str(v) for k, v in vars(args).items()},
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
