"""Checkpoints written off the step path (issue 29, item 6): rank 0 snapshots the state to CPU memory and a background
thread writes it, one write at a time; the job waits for it only at the next save, the end of training or a stop.
In one process, with the Single backend (no launch) and a tiny model; torch.save is gated so that a write is held
in flight while the test trains or looks at the folder."""

import dataclasses
import errno
import os
import re
import shutil
import signal
import threading

import pytest
import torch

from payloads.common import checkpoint, concerns
from payloads.common import preemption as preempt
from payloads.common.config import TrainConfig
from payloads.common.errors import ConfigError
from payloads.pytorch import backends, checkpoints, loop, runtime

SUFFIX = checkpoints.SUFFIX
SINGLE = backends.Single()
STEPS = 5  # steps per epoch, as the checkpoints record it


@pytest.fixture(autouse=True)
def _nothing_left_in_flight():
    yield
    checkpoints.settle()


class Gate:
    """torch.save held until `release` is set; `names`: the checkpoints it was asked to write, in order."""

    def __init__(self, save):
        self.save, self.names = save, []
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, state, path):
        self.names.append(os.path.basename(path))
        self.entered.set()
        assert self.release.wait(30), "the test never released the write"
        self.save(state, path)


@pytest.fixture
def gate(monkeypatch):
    held = Gate(torch.save)
    monkeypatch.setattr(torch, "save", held)
    yield held
    held.release.set()


def _cfg(tmp_path) -> TrainConfig:
    return TrainConfig(output_dir=tmp_path / "out", epochs=3, keep_checkpoints=0)


def _step(model, opt) -> None:
    """A training step: parameters, momentum buffers and BatchNorm's running statistics change in place."""
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    opt.step()


def _tiny(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, opt)
    return model, opt


def _copy_of(model, opt) -> dict:
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "momentum": [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()],
    }


def _assert_holds(saved: dict, expected: dict) -> None:
    assert saved["model"].keys() == expected["model"].keys()
    for key, value in expected["model"].items():
        assert torch.equal(saved["model"][key], value), key
    momentum = [saved["optimizer"]["state"][i]["momentum_buffer"] for i in range(len(expected["momentum"]))]
    assert all(torch.equal(a, b) for a, b in zip(momentum, expected["momentum"], strict=True))
    for name, value in saved["rank_buffers"][0].items():  # this rank's running statistics
        assert torch.equal(value, expected["model"][name]), name


def _stop(signalled: bool = False) -> preempt.Preemption:
    stop = preempt.Preemption(0, 0)  # the clock off; not installed: the test sets the flag the handler would
    stop.signalled = signal.SIGTERM if signalled else None
    return stop


def _run(cfg, backend, model, opt, stop=None, step: int = 0):
    """A run in epoch 1 at `step` (0-based) of STEPS, whose only concern is its checkpoints (the loop's
    Checkpoints, with `stop` as its SIGTERM flag and clock)."""
    settings = runtime.Settings("cpu", "fp32", False, False, False, 8, 1, 0.1, 1.0, 1, 0, None)
    run = loop.Run(cfg, settings, backend, torch.device("cpu"), None, loop.Task(), model=model, trained=model)
    run.optimizer, run.steps, run.step = opt, STEPS, step
    concern = concerns.Checkpoints(run)
    concern.stop = stop or _stop()
    run.concerns = [concern]
    return run, concern


def _latest(cfg):
    return checkpoint.latest(cfg.checkpoint_dir, SUFFIX)


def test_save_returns_before_the_write_and_the_file_is_the_state_at_save_time(tmp_path, gate):
    """Fails with a reference instead of a copy (checkpoints.snapshot returning its argument): the file then holds the
    parameters, momentum and running statistics as training left them when the write ran."""
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    at_save = _copy_of(model, opt)
    checkpoints.save(cfg, SINGLE, 1, model, opt, None, 0, STEPS)
    assert gate.entered.wait(30) and _latest(cfg) is None  # returned; the write is held in flight
    for _ in range(3):  # training goes on meanwhile
        _step(model, opt)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    gate.release.set()
    checkpoints.finish_checkpoints(SINGLE)
    path = checkpoints.checkpoint_path(cfg, 1)
    assert _latest(cfg) == (1, path)
    saved = torch.load(path, weights_only=False)
    _assert_holds(saved, at_save)
    assert not torch.equal(saved["model"]["0.weight"], model.state_dict()["0.weight"])  # training did move on


def test_one_write_at_a_time_the_next_save_waits_for_it(tmp_path, gate):
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    checkpoints.save(cfg, SINGLE, 1, model, opt, None, 0, STEPS)
    assert gate.entered.wait(30)
    waited = {}
    second = threading.Thread(
        target=lambda: waited.update(s=checkpoints.save(cfg, SINGLE, 2, model, opt, None, 0, STEPS))
    )
    second.start()
    second.join(0.5)
    assert second.is_alive() and gate.names == ["checkpoint-epoch-0001.pt"]  # waiting; no second write started
    gate.release.set()
    second.join(30)
    assert not second.is_alive() and waited["s"] >= 0.4  # save's seconds count the wait for the previous write
    checkpoints.finish_checkpoints(SINGLE)
    assert gate.names == ["checkpoint-epoch-0001.pt", "checkpoint-epoch-0002.pt"]
    assert [e for e, _ in checkpoint.list_checkpoints(cfg.checkpoint_dir, SUFFIX)] == [1, 2]


def _no_space(state, path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _today(message: str) -> str:
    return re.sub(r"/\S*checkpoint-\w+", "TMP", message)  # the temporary folder's name differs per write


@pytest.mark.parametrize("found_at", ["next save", "end of training"])
def test_a_failed_write_ends_the_job_at_the_next_wait_with_todays_line(tmp_path, monkeypatch, found_at):
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    checkpoints.save(cfg, SINGLE, 1, model, opt, None, 0, STEPS)
    checkpoints.finish_checkpoints(SINGLE)
    monkeypatch.setattr(torch, "save", _no_space)
    with pytest.raises(checkpoint.OutputFull) as written_at_once:  # the line a write in the step path gives
        checkpoints.save(cfg, SINGLE, 2, model, opt, None, 0, STEPS, wait=True)
    checkpoints.save(cfg, SINGLE, 2, model, opt, None, 0, STEPS)  # returns: the write fails in the background
    _step(model, opt)
    with pytest.raises(checkpoint.OutputFull) as raised:
        if found_at == "next save":
            checkpoints.save(cfg, SINGLE, 3, model, opt, None, 0, STEPS)
        else:
            with loop.ending(_run(cfg, SINGLE, model, opt)[0]):
                pass
    line = str(raised.value)
    assert line.startswith("the temporary folder ") and "set TMPDIR to a folder on a disk with room" in line
    assert _today(line) == _today(str(written_at_once.value))
    assert [e for e, _ in checkpoint.list_checkpoints(cfg.checkpoint_dir, SUFFIX)] == [1]  # epoch 3 never started
    assert _latest(cfg)[0] == 1 and not checkpoint.incomplete(cfg.checkpoint_dir, SUFFIX)


class Rank(backends.Single):
    """One rank of a two-rank job, run in this process: its collectives by name, in order. Rank 1 receives what
    rank 0's broadcasts sent (rank 0 runs first): the replay hangs nowhere only if both call the same ones."""

    def __init__(self, rank: int, sent: list):
        super().__init__()
        self._rank, self.sent, self.calls = rank, sent, []

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return 2

    def broadcast_object(self, obj, name):
        self.calls.append(name)
        if self._rank == 0:
            self.sent.append(obj)
            return obj
        return self.sent.pop(0)

    def allgather_object(self, obj, name):
        self.calls.append(name)
        return [obj, obj]


@pytest.mark.parametrize("fails", [None, 2, 3])
def test_every_rank_calls_the_same_collectives_and_ends_with_the_same_line(tmp_path, monkeypatch, fails):
    """Rank 0 finds a failed write when it waits for it, before the broadcast every rank makes there (the next save
    or the end of training), however long the write took."""
    real = torch.save

    def save(state, path):
        if fails and f"-{fails:04d}" in os.path.basename(path):
            _no_space(state, path)
        real(state, path)

    monkeypatch.setattr(torch, "save", save)
    cfg = _cfg(tmp_path)
    sent: list = []
    runs = []
    for rank in (0, 1):
        backend, model, opt = Rank(rank, sent), *_tiny()
        line = None
        try:
            with loop.ending(_run(cfg, backend, model, opt)[0]):
                for epoch in range(cfg.epochs):
                    _step(model, opt)
                    checkpoints.save(cfg, backend, epoch + 1, model, opt, None, 0, STEPS)
        except checkpoint.OutputFull as e:
            line = str(e)
        runs.append((backend.calls, line))
    (calls0, line0), (calls1, line1) = runs
    assert calls0 == calls1 and line0 == line1 and not sent
    assert calls0[-1] == ("saved" if fails == 2 else "written")
    assert (line0 is None) == (fails is None)
    assert [e for e, _ in checkpoint.list_checkpoints(cfg.checkpoint_dir, SUFFIX)] == list(range(1, (fails or 4)))


def test_a_write_cut_short_leaves_the_previous_checkpoint_to_resume_from(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    checkpoints.save(cfg, SINGLE, 1, model, opt, None, 0, STEPS)
    checkpoints.finish_checkpoints(SINGLE)
    at_one = _copy_of(model, opt)
    _step(model, opt)
    crashed = tmp_path / "crashed"

    def cut(src, dst, chunk=0):
        data = src.read_bytes()
        dst.write_bytes(data[: len(data) // 2])
        shutil.copytree(cfg.output_dir, crashed)  # the folder as a process killed at this instant leaves it
        raise RuntimeError("killed in the middle of the copy")

    monkeypatch.setattr(checkpoint.durable, "copy", cut)
    checkpoints.save(cfg, SINGLE, 2, model, opt, None, 0, STEPS)
    with pytest.raises(RuntimeError, match="killed"):  # not a full folder: rank 0's own error, as before
        checkpoints.finish_checkpoints(SINGLE)
    kept = crashed / "checkpoints"
    assert [p.name for _, p in checkpoint.incomplete(kept, SUFFIX)] == ["checkpoint-epoch-0002.pt"]
    assert checkpoint.latest(kept, SUFFIX)[0] == 1
    fresh, fresh_opt = _tiny(seed=1)
    resumed = checkpoints.restore(dataclasses.replace(cfg, output_dir=crashed), SINGLE, fresh, fresh_opt, None, STEPS)
    assert resumed == (1, 0)
    for key, value in at_one["model"].items():
        assert torch.equal(fresh.state_dict()[key], value), key
    # The writer that was not killed cleaned up after itself: only the complete checkpoint is left.
    assert _latest(cfg)[0] == 1 and not checkpoint.incomplete(cfg.checkpoint_dir, SUFFIX)


def test_a_stop_mid_epoch_exits_only_after_its_checkpoint_is_complete(tmp_path, gate):
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    run, concern = _run(cfg, SINGLE, model, opt, _stop(signalled=True), step=2)
    threading.Timer(0.5, gate.release.set).start()
    with pytest.raises(preempt.Stopped) as raised:
        concern._pause(run, "signal")
    assert _latest(cfg) == (0, checkpoints.checkpoint_path(cfg, 0, 3))  # complete, marker and all
    assert float(re.search(r" in ([\d.]+)s;", str(raised.value)).group(1)) >= 0.4


def test_the_clock_checkpoint_is_written_while_training_goes_on(tmp_path, gate):
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    run, concern = _run(cfg, SINGLE, model, opt, step=2)
    concern._pause(run, "clock")  # returns with the write held
    assert gate.entered.wait(30) and _latest(cfg) is None
    gate.release.set()
    checkpoints.finish_checkpoints(SINGLE)
    assert _latest(cfg) == (0, checkpoints.checkpoint_path(cfg, 0, 3))


def test_a_stop_at_an_epochs_end_waits_for_that_epochs_checkpoint(tmp_path, gate):
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    run, concern = _run(cfg, SINGLE, model, opt, _stop(signalled=True))
    with pytest.raises(preempt.Stopped) as raised, loop.ending(run):
        concern.checkpoint(run)  # epoch 1's
        assert gate.entered.wait(30) and _latest(cfg) is None
        threading.Timer(0.5, gate.release.set).start()
        try:
            concern.after_epoch(run)
        except preempt.Stopped:
            assert _latest(cfg) == (1, checkpoints.checkpoint_path(cfg, 1))  # before ending() sees the stop
            raise
    assert float(re.search(r" in ([\d.]+)s;", str(raised.value)).group(1)) >= 0.4


def test_an_error_exit_still_lets_the_write_in_flight_end(tmp_path, gate):
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    with pytest.raises(ConfigError, match="a data error"), loop.ending(_run(cfg, SINGLE, model, opt)[0]):
        checkpoints.save(cfg, SINGLE, 1, model, opt, None, 0, STEPS)
        assert gate.entered.wait(30)
        threading.Timer(0.3, gate.release.set).start()
        raise ConfigError("a data error")
    assert _latest(cfg) == (1, checkpoints.checkpoint_path(cfg, 1))


def test_a_restore_in_the_same_process_finds_the_checkpoint_still_being_written(tmp_path, gate):
    """toolchain/check_training_path.py saves and restores at once: restore waits for the write in flight."""
    cfg = _cfg(tmp_path)
    model, opt = _tiny()
    checkpoints.save(cfg, SINGLE, 1, model, opt, None, 0, STEPS)
    assert gate.entered.wait(30)
    threading.Timer(0.3, gate.release.set).start()
    fresh, fresh_opt = _tiny(seed=1)
    assert checkpoints.restore(cfg, SINGLE, fresh, fresh_opt, None, STEPS) == (1, 0)
    assert torch.equal(fresh.state_dict()["0.weight"], model.state_dict()["0.weight"])
