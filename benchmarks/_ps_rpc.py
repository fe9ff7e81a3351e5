"""Worker side of benchmarks/backends.py for a synchronous parameter server over torch.distributed.rpc.

Launched by torchrun with N + 1 processes: rank 0 is the parameter server (PS), ranks 1..N the workers. The PS
holds the only authoritative copy of the parameters and the SGD optimizer. Every step, each worker computes
the gradients of its fixed batch (benchmarks/_backend_common.py) on the parameters it last pulled, sends them
to the PS in one RPC and blocks; the PS sums the N pushes of the step, and when the N-th arrives divides by N,
applies one SGD step (lr 0.01 x N, as the Horovod and DDP loops) and answers all N calls with the new
parameters. So every worker's step k starts from the same parameters version k: synchronous SGD, the same
update an allreduce of averaged gradients gives (up to the order floating-point sums are taken in). BatchNorm
running statistics are buffers, not parameters: each worker keeps its own, as in the Horovod loop.
The pattern is PyTorch's batch-updating parameter server (pytorch/examples distributed/rpc/batch), with the
gradient sum taken under the lock. Worker rank 1 prints the total images/sec (its rate x N: synchronous workers
run at one pace); every process prints its parameters' digest.
"""

from __future__ import annotations

import argparse
import os
import threading

import torch
import torch.distributed.rpc as rpc
import torch.nn.functional as F
import torchvision

from benchmarks import _backend_common as common


class ParameterServer:
    def __init__(self, model: torch.nn.Module, workers: int, lr: float):
        self.params = list(model.parameters())
        self.sums = [torch.zeros_like(p) for p in self.params]
        self.workers = workers
        self.optimizer = torch.optim.SGD(self.params, lr=lr)
        self.lock = threading.Lock()
        self.pending = 0
        self.future = torch.futures.Future()

    def current(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    def push(self, grads: list[torch.Tensor]) -> torch.futures.Future:
        with self.lock:  # RPCs arrive on several threads at once
            for s, g in zip(self.sums, grads):
                s.add_(g)
            self.pending += 1
            fut = self.future
            if self.pending == self.workers:
                for p, s in zip(self.params, self.sums):
                    p.grad = s.div_(self.workers)
                self.optimizer.step()
                self.sums = [torch.zeros_like(p) for p in self.params]
                self.pending = 0
                self.future = torch.futures.Future()
                fut.set_result(self.current())
        return fut


SERVER: ParameterServer | None = None  # set on the PS process before RPC starts


def fetch() -> list[torch.Tensor]:
    return SERVER.current()


@rpc.functions.async_execution
def push_and_pull(grads: list[torch.Tensor]) -> torch.futures.Future:
    return SERVER.push(grads)


def main() -> None:
    global SERVER
    ap = argparse.ArgumentParser()
    common.add_loop_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    workers = world - 1
    if workers < 1:
        raise SystemExit("the parameter-server run needs at least 2 processes: 1 PS and 1 worker")
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=args.num_classes)
    initial = common.snapshot(model.parameters())
    if rank == 0:
        SERVER = ParameterServer(model, workers, lr=0.01 * workers)
        rpc.init_rpc("ps", rank=0, world_size=world)
        rpc.shutdown()  # waits until every worker has finished and shut down
        common.emit({"backend": "ps", "rank": "ps", "size": workers, **common.fingerprint(model, initial)})
        return
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
    params = list(model.parameters())
    with torch.no_grad():
        for p, v in zip(params, rpc.rpc_sync("ps", fetch)):
            p.copy_(v)
    initial = common.snapshot(params)
    data, target = common.batch(args, rank - 1)

    def step():
        model.zero_grad(set_to_none=False)
        F.cross_entropy(model(data), target).backward()
        new = rpc.rpc_sync("ps", push_and_pull, args=([p.grad for p in params],))
        with torch.no_grad():
            for p, v in zip(params, new):
                p.copy_(v)

    rate = common.timed_rate(step, args)
    if rank == 1:
        common.emit({"backend": "ps", "images_per_sec": workers * rate})
    common.emit(
        {"backend": "ps", "rank": rank - 1, "size": workers, **common.fingerprint(model, initial)}
    )  # params are the model's
    rpc.shutdown()


if __name__ == "__main__":
    main()
