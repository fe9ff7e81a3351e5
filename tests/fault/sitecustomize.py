"""A fault in one rank's numbers, for every Python process started with this folder on PYTHONPATH and FAULT set: the
rank whose HOROVOD_RANK (horovodrun), RANK (torchrun) or OMPI_COMM_WORLD_RANK (mpirun) equals FAULT_RANK. In each
training forward pass whose number (counted from 1 in this process) is in FAULT_AT (comma-separated), before the pass:
- FAULT=flip: one bit of the first element of the model's first parameter flips (a faulty GPU's memory);
- FAULT=nan: the pass's output gets a NaN gradient while its value stays as it is, so this rank's own gradients are
  not finite before the average and its loss is (a kernel that computes NaN in backward).
tests/test_replicas.py shows with it that the replica sentinel (payloads/pytorch/sentinel.py) names the rank and
rolls back. The fault is this rank's only: the others train as they would."""

import os
import sys

KIND = os.environ.get("FAULT", "")
AT = {int(n) for n in os.environ.get("FAULT_AT", "").split(",") if n}
# mpirun's ranks know theirs from Open MPI alone (Horovod reads it through MPI)
_rank = os.environ.get("HOROVOD_RANK", os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK")))
CALLS = [0]


def _models(models) -> None:
    import torch

    class NanGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad * float("nan")

    real = models.build

    def build(*args, **kwargs):
        model = real(*args, **kwargs)

        def before(module, inputs):
            if not module.training:
                return None
            CALLS[0] += 1
            if CALLS[0] in AT and KIND == "flip":
                with torch.no_grad():
                    first = next(iter(module.parameters()))
                    first.view(torch.int32)[(0,) * first.dim()].bitwise_xor_(1)  # any memory format
                sys.stderr.write(f"tests/fault: rank {_rank} flipped a bit before its forward pass {CALLS[0]}\n")
            return None

        def after(module, inputs, output):
            if module.training and CALLS[0] in AT and KIND == "nan":
                sys.stderr.write(f"tests/fault: rank {_rank} NaN gradients in its forward pass {CALLS[0]}\n")
                return NanGradient.apply(output)
            return None

        model.register_forward_pre_hook(before)
        model.register_forward_hook(after)
        return model

    models.build = build


if KIND and _rank is not None and _rank == os.environ.get("FAULT_RANK"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: import_hooks
    from import_hooks import after_import

    sys.path.pop(0)
    after_import("payloads.pytorch.models", _models)
