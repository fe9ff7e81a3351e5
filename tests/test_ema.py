"""The EMA of the weights (issue 52, items 1-2; payloads/pytorch/ema.py), the example of a concern with state: in one
process its step, its validation on the averaged weights and its state through a checkpoint; with two real DDP
processes a run stopped mid-epoch and resumed ends bitwise equal to a straight one, its average and the EMA's
validation figures included (the Horovod case: test_segmentation.py's mid-epoch resume, with --ema-decay). Also
the concerns' handler names, checked when a concern is attached."""

from __future__ import annotations

import pytest
import torch
from helpers import check_resume_is_exact, metrics
from test_segmentation import BATCH, SEG, _with, tiles  # noqa: F401 - tiles: the module fixture

from payloads.common import checkpoint
from payloads.common.config import TrainConfig
from payloads.pytorch import backends, checkpoints, ema, loop, runtime

SETTINGS = runtime.Settings("cpu", "fp32", False, False, False, 8, 1, 0.1, 1.0, 1, 0, None)


class FirstWeight(loop.Task):
    """Validation's figure: the model's first weight, so that the test sees which weights were validated."""

    def evaluate(self, run, epoch):
        return {"val_first": run.model.weight.flatten()[0].item()}


def _run(tmp_path, decay: float = 0.5) -> loop.Run:
    model = torch.nn.Linear(3, 2)
    cfg = TrainConfig(output_dir=tmp_path, ema_decay=decay)
    run = loop.Run(
        cfg, SETTINGS, backends.Single(), torch.device("cpu"), None, FirstWeight(), model=model, trained=model
    )
    run.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run.attach([ema.EMA(run)])
    return run


def test_the_average_moves_by_one_minus_the_decay_and_validates_beside_the_weights(tmp_path):
    run = _run(tmp_path)
    (average,) = run.concerns
    run.fire("run_start")
    start = run.model.weight.detach().clone()
    with torch.no_grad():
        run.model.weight.add_(1.0)
    run.fire("step_end")
    assert torch.equal(average.average[0], torch.lerp(start, start + 1.0, 0.5))
    trained = run.model.weight.detach().clone()
    record = {"val_first": trained.flatten()[0].item()}
    run.fire("validation_end", record)
    assert record["ema_val_first"] == average.average[0].flatten()[0].item() != record["val_first"]
    assert torch.equal(run.model.weight, trained)  # the trained weights back, bit for bit

    # Its state through a checkpoint: a fresh run with the EMA gets it back; one without it starts from the weights.
    checkpoints.save(run.cfg, run.backend, 1, run.model, run.optimizer, None, concerns=run.concerns)
    checkpoints.finish_checkpoints(run.backend)
    saved = torch.load(checkpoint.latest(run.cfg.checkpoint_dir, ".pt")[1], weights_only=False)
    assert torch.equal(saved["concerns"]["EMA"]["average"][0], average.average[0])
    fresh = _run(tmp_path)
    assert fresh.restore(resume=True) == (1, 0)
    fresh.fire("run_start")
    assert all(torch.equal(a, b) for a, b in zip(fresh.concerns[0].average, average.average))


def test_a_misspelt_handler_is_refused_naming_the_events(tmp_path):
    class Late:
        def step_ended(self, run):
            pass

    run = _run(tmp_path)
    with pytest.raises(TypeError, match=r"Late.step_ended is no event: a concern's handlers are named doing, .*"):
        run.attach([Late()])


def test_the_decay_is_refused_outside_zero_to_one():
    from payloads.common.errors import ConfigError

    with pytest.raises(ConfigError, match="--ema-decay must be at least 0 and below 1"):
        TrainConfig(ema_decay=1.0).validate(["resnet50"])


@pytest.mark.launches
@pytest.mark.one_core  # DDP ranks wait without spinning: about one core (tests/README.md)
def test_a_ddp_run_resumed_mid_epoch_keeps_its_average_bitwise(tiles, tmp_path):  # noqa: F811 - the fixture
    args = _with(SEG, {"--patches-per-epoch": "640"}) + ["--ema-decay", "0.9", "--checkpoint-every-minutes", "0"]
    args += ["--data-dir", str(tiles), "--batch-size", str(BATCH), "--epochs", "1"]
    state = check_resume_is_exact(tmp_path, args, "ddp", [1], payload="segmentation")
    assert len(state["concerns"]["EMA"]["average"]) > 0 and state["concerns"]["EMA"]["decay"] == 0.9
    straight, stopped = (tmp_path / run for run in ("straight", "stopped"))
    averages = [
        torch.load(checkpoint.latest(out / "checkpoints", ".pt")[1], weights_only=False)["concerns"]["EMA"]["average"]
        for out in (straight, stopped)
    ]
    assert all(torch.equal(a, b) for a, b in zip(*averages))
    records = [metrics(out)["epochs"][-1] for out in (straight, stopped)]
    assert records[0]["ema_val_miou"] == records[1]["ema_val_miou"] != records[0]["val_miou"]
    assert records[0]["ema_val_confusion_matrix"] == records[1]["ema_val_confusion_matrix"]
