import pytest

from payloads.common.schedule import learning_rate


def test_warmup_goes_linearly_from_base_to_scaled_lr():
    lr = lambda epoch, step=0: learning_rate(0.1, 8, epoch, step, steps_per_epoch=10, warmup_epochs=5)
    assert lr(0) == pytest.approx(0.1)
    assert lr(2, 5) == pytest.approx(0.1 * (1 + 7 * 2.5 / 5))
    assert lr(5) == pytest.approx(0.8)
    assert lr(29, 9) == pytest.approx(0.8)


def test_step_decay_at_30_60_80():
    lr = lambda epoch: learning_rate(0.1, 4, epoch, 0, steps_per_epoch=10)
    assert [lr(e) for e in (29, 30, 59, 60, 79, 80, 89)] == pytest.approx(
        [0.4, 0.04, 0.04, 0.004, 0.004, 0.0004, 0.0004]
    )


def test_no_warmup():
    assert learning_rate(0.1, 2, 0, 0, 10, warmup_epochs=0) == pytest.approx(0.2)
