"""Data side of the scaling plan: what a cluster reads from the data account at its predicted speed.

    .venv/bin/python -m benchmarks.data_planner --vm-size Standard_ND96isr_H100_v5 --gpu-images-per-sec 3000
    .venv/bin/python -m benchmarks.data_planner ... --manifest SHARDS/webdataset/manifest.json   # its bytes per image

For 1-64 nodes: the cluster's images/sec (GPUs x single-GPU rate x the planner's hierarchical NCCL
efficiency), the bytes/s and requests/s that rate reads in the first epoch, against the storage account's
documented targets, and whether to mount (ro_mount: read while training) or download (copy the whole set
to every node before the script starts). With sharded data every rank reads its own files, so the cluster
reads the set once per epoch; later epochs read nothing when the node's part stays in the mount's cache
or in memory (--cache-decoded).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from dataclasses import dataclass

from benchmarks import planner

# Azure Storage account targets. "Scalability and performance targets for standard storage accounts"
# (learn.microsoft.com/azure/storage/common/scalability-targets-standard-account; MicrosoftDocs/azure-docs
# includes/azure-storage-account-limits-standard.md), whose table covers "general-purpose v1, v2, Blob
# storage, and block blob storage accounts": egress 50 Gbps, 20,000 requests per second per account. The
# premium block blob page publishes no lower figure and asks beyond it for a support request.
EGRESS_BYTES_PER_SEC = 50e9 / 8
REQUESTS_PER_SEC = 20_000
HEADROOM = 0.8  # plan to use at most this share of a target: other jobs share the account
# ImageNet-1k training set (ILSVRC2012): 1,281,167 JPEGs, about 138 GiB.
IMAGENET = (1_281_167, 138 * 2**30)
READ_BLOCK = 8 * 2**20  # an assumption: a mount reads large files in ranged GETs of several MiB


@dataclass(frozen=True)
class DataSet:
    images: int
    bytes: float
    sharded: bool

    @property
    def bytes_per_image(self) -> float:
        return self.bytes / self.images


@dataclass(frozen=True)
class Plan:
    nodes: int
    images_per_sec: float  # predicted for the cluster, data aside
    bytes_per_sec: float  # what that rate reads in epoch 1
    requests_per_sec: float
    storage_images_per_sec: float  # the most the account's targets let the cluster read
    advice: str


def from_manifest(path: pathlib.Path) -> DataSet:
    from payloads.common import manifest

    m = manifest.load_complete(pathlib.Path(path).parent, manifest.read(pathlib.Path(path).parent).format)
    train = m.splits[manifest.TRAIN]
    return DataSet(train.samples, sum(s.bytes for s in train.shards), sharded=True)


def plan(nodes: int, images_per_sec: float, data: DataSet, node_cache_bytes: float | None = None) -> Plan:
    bps = images_per_sec * data.bytes_per_image
    rps = images_per_sec if not data.sharded else bps / READ_BLOCK
    by_bytes = HEADROOM * EGRESS_BYTES_PER_SEC / data.bytes_per_image
    by_requests = HEADROOM * REQUESTS_PER_SEC * (1 if not data.sharded else READ_BLOCK / data.bytes_per_image)
    storage_rate = min(by_bytes, by_requests)
    download_s = nodes * data.bytes / (HEADROOM * EGRESS_BYTES_PER_SEC)  # every node copies the whole set
    part = data.bytes / nodes
    keeps = node_cache_bytes is None or part <= node_cache_bytes
    notes = []
    if not data.sharded and rps > HEADROOM * REQUESTS_PER_SEC:
        notes.append(
            f"one GET per image is {rps:,.0f} requests/s, over the account's {REQUESTS_PER_SEC:,} target: use shards"
        )
    if storage_rate >= images_per_sec:
        advice = (
            f"mount: epoch 1 reads {bps / 1e9:.2f} GB/s, {bps / EGRESS_BYTES_PER_SEC * 100:.0f}% of the "
            "account's egress target"
        )
    else:
        advice = (
            f"mount reads at most {storage_rate:,.0f} images/s ({storage_rate / images_per_sec * 100:.0f}% of the "
            f"predicted rate) while it reads from storage; download mode copies {nodes} x {data.bytes / 1e9:.0f} GB "
            f"first (about {download_s / 60:.0f} min at the account's target), or pre-resize the shards "
            "(prepare --resize) to read fewer bytes per image"
        )
    if keeps:
        advice += "; later epochs read nothing (the node's part fits its cache, or use --cache-decoded)"
    else:
        advice += f"; the node's part ({part / 1e9:.0f} GB) exceeds its cache, so every epoch reads storage"
    return Plan(nodes, images_per_sec, bps, rps, storage_rate, "; ".join(notes + [advice]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("--vm-size", default="Standard_ND96isr_H100_v5")
    ap.add_argument("--gpu-images-per-sec", type=float, required=True, help="measured single-GPU throughput")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--manifest", type=pathlib.Path, help="a prepared shard set's manifest.json (else ImageNet's size)")
    ap.add_argument("--class-folders", action="store_true", help="plan for class-folder files instead of shards")
    ap.add_argument("--node-cache-gb", type=float, default=None, help="node disk or RAM that keeps the node's part")
    args = ap.parse_args(argv)
    size = planner.vm_sizes.lookup(args.vm_size)
    if size is None or size.gpus == 0:
        print(f"error: {args.vm_size} is not a GPU size in the catalog", file=sys.stderr)
        return 2
    data = from_manifest(args.manifest) if args.manifest else DataSet(*IMAGENET, sharded=not args.class_folders)
    if args.class_folders:
        data = DataSet(data.images, data.bytes, sharded=False)
    t = planner.nccl_transport(size)
    print(
        f"{size.name}: {size.gpus} GPUs/node at {args.gpu_images_per_sec:,.0f} images/s each; data "
        f"{data.images:,} images, {data.bytes_per_image / 1e3:.0f} KB each, {'shards' if data.sharded else 'class folders'}"
    )
    print("nodes  cluster img/s  epoch-1 GB/s  requests/s  storage allows img/s  advice")
    for nodes in [1, 2, 4, 8, 16, 32, 64]:
        n = nodes * size.gpus
        eff = planner.efficiency(n, size.gpus, args.batch, args.gpu_images_per_sec, planner.RESNET50_BYTES, t, True)
        p = plan(
            nodes, n * args.gpu_images_per_sec * eff, data, args.node_cache_gb * 1e9 if args.node_cache_gb else None
        )
        allows = "-" if math.isinf(p.storage_images_per_sec) else f"{p.storage_images_per_sec:,.0f}"
        print(
            f"{nodes:5}  {p.images_per_sec:13,.0f}  {p.bytes_per_sec / 1e9:12.2f}  {p.requests_per_sec:10,.0f}  "
            f"{allows:>20}  {p.advice}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
