"""One rank's weights nudged by one ulp of one element before the payload digests them, for every Python process
started with this folder on PYTHONPATH and NUDGE_RANK set: the rank whose HOROVOD_RANK (horovodrun) or RANK
(torchrun) equals it. A test shows with it that `ranks_identical` (payloads/common/metrics.py, from every rank's
parameters_digest) turns False when the ranks differ by a single bit, so its many `is True` checks can fail."""

import importlib.abc
import importlib.util
import os
import sys

TARGET = "payloads.pytorch.models"


def _nudge(models) -> None:
    real = models.parameters_digest

    def digest(model):
        import torch

        first = next(iter(model.parameters()))
        with torch.no_grad():
            flat = first.view(-1)
            flat[0] = torch.nextafter(flat[0], flat[0] + 1)
        return real(model)

    models.parameters_digest = digest


class _After(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _nudge(module)

        spec.loader.exec_module = exec_module
        return spec


_rank = os.environ.get("HOROVOD_RANK", os.environ.get("RANK"))
if os.environ.get("NUDGE_RANK") is not None and _rank == os.environ["NUDGE_RANK"]:
    sys.meta_path.insert(0, _After())
