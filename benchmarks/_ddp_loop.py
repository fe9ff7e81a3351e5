"""Worker side of benchmarks/backends.py for torch DDP over Gloo: the loop of benchmarks/_horovod_loop.py (one
fixed batch, SGD, warm-up batches untimed) with DistributedDataParallel averaging the gradients in the backward
pass. Launched by torchrun (RANK/WORLD_SIZE/MASTER_ADDR in the environment); rank 0 prints the total
images/sec, every rank its parameters' digest (benchmarks/_backend_common.py)."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel

from benchmarks import _backend_common as common


def main() -> None:
    ap = argparse.ArgumentParser()
    common.add_loop_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=args.num_classes)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters and buffers
    # The same learning-rate scaling as the Horovod loop: averaged gradients, lr x processes.
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01 * size)
    data, target = common.batch(args, rank)
    initial = common.snapshot(model.parameters())

    def step():
        optimizer.zero_grad()
        F.cross_entropy(ddp(data), target).backward()
        optimizer.step()

    rate = common.timed_rate(step, args)
    if rank == 0:
        common.emit({"backend": "ddp", "images_per_sec": size * rate})
    common.emit({"backend": "ddp", "rank": rank, "size": size, **common.fingerprint(model, initial)})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
