"""An exponential moving average of the weights (--ema-decay D, off by default), as NVIDIA's ConvNets keep one
(DeepLearningExamples, image_classification: the EMA model beside the trained one, both validated): a concern of
the loop (listed by concerns.for_run with --ema-decay), and the example of one with state (docs/payload-contract.md#a-new-concern).

After every optimizer step each averaged tensor moves 1 - D of the way to its parameter (one fused lerp, on the
device). With validation data the epoch's validation runs again on the averaged weights, and its figures join the
epoch's record with the prefix ema_. The average is the concern's state: every checkpoint holds it, and a resume or
a rollback gives it back, so a resumed run ends bitwise equal to a straight one. Only the parameters are averaged
(every rank holds them equal); BatchNorm's running statistics stay each rank's own, and the EMA's validation uses
them as they are."""

from __future__ import annotations

import torch


class EMA:
    def __init__(self, run):
        self.decay = run.cfg.ema_decay
        self.weights = [p.detach() for p in run.model.parameters() if p.requires_grad]  # the parameters' storage
        self.average: list[torch.Tensor] | None = None  # loaded by the restore, else made at run_start

    def state_dict(self) -> dict:
        return {"decay": self.decay, "average": self.average}

    def load_state_dict(self, state: dict) -> None:
        self.average = [saved.to(p.device, p.dtype) for saved, p in zip(state["average"], self.weights)]

    def run_start(self, run) -> None:
        if self.average is None:  # a new run, or a checkpoint written without --ema-decay
            self.average = [w.clone() for w in self.weights]

    def step_end(self, run) -> None:
        torch._foreach_lerp_(self.average, self.weights, 1.0 - self.decay)

    def validation_end(self, run, record: dict) -> None:
        """The task's validation again, on the averaged weights; the trained ones back, bit for bit."""
        trained = [w.clone() for w in self.weights]
        torch._foreach_copy_(self.weights, self.average)
        record.update({f"ema_{key}": value for key, value in run.task.evaluate(run, run.epoch).items()})
        torch._foreach_copy_(self.weights, trained)
