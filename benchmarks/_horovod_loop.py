"""Horovod's synthetic benchmark loop (the pattern of horovod/examples/pytorch/pytorch_synthetic_benchmark.py:
one fixed random batch, SGD through DistributedOptimizer, warm-up batches not timed), with the payload's model,
batch, image size and threads. Run under horovodrun by benchmarks/backends.py; prints the total
images/sec of all processes on its last line."""

from __future__ import annotations

import argparse
import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F
import torchvision

from benchmarks import _backend_common as common


def main() -> None:
    ap = argparse.ArgumentParser()
    common.add_loop_args(ap)
    ap.add_argument(
        "--optimizer",
        choices=("plain", "payload"),
        default="plain",
        help="plain: Horovod's benchmark (SGD without momentum); payload: the payload's optimizer "
        "(payloads.pytorch.runtime.optimizer: momentum and weight decay, fused or foreach)",
    )
    ap.add_argument("--fingerprint", action="store_true", help="per-rank batches; print each rank's parameter digest")
    args = ap.parse_args()
    hvd.init()
    torch.set_num_threads(args.threads)
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=args.num_classes)
    if args.optimizer == "payload":
        from payloads.common.config import TrainConfig
        from payloads.pytorch import runtime

        base = runtime.optimizer(TrainConfig(), model, 0.01 * hvd.size(), torch.device("cpu"))
    else:
        base = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))
    if args.fingerprint:
        data, target = common.batch(args, hvd.rank())
        initial = common.snapshot(model.parameters())

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    rate = common.timed_rate(step, args)
    if hvd.rank() == 0:
        # One write: under mpirun, print()'s separate newline gets its own "[1,0]<stdout>:" tag.
        sys.stdout.write(f"loop images/sec: {hvd.size() * rate:.2f}\n")
        sys.stdout.flush()
    if args.fingerprint:
        common.emit(
            {
                "backend": "horovod",
                "rank": hvd.rank(),
                "size": hvd.size(),
                **common.fingerprint(model, initial),
            }
        )


if __name__ == "__main__":
    main()
