"""One rank's weights nudged by one ulp of one element before the payload digests them, for every Python process
started with this folder on PYTHONPATH and NUDGE_RANK set: the rank whose HOROVOD_RANK (horovodrun) or RANK
(torchrun) equals it. A test shows with it that `ranks_identical` (payloads/common/metrics.py, from every rank's
parameters_digest) turns False when the ranks differ by a single bit, so its many `is True` checks can fail."""

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


_rank = os.environ.get("HOROVOD_RANK", os.environ.get("RANK"))
if os.environ.get("NUDGE_RANK") is not None and _rank == os.environ["NUDGE_RANK"]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: import_hooks
    from import_hooks import after_import

    sys.path.pop(0)
    after_import(TARGET, _nudge)
