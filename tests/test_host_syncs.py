"""Host syncs per step for each loader (issue 55 item 2), counted on this CPU at torch's boundary, the way
tests/test_scaler_in_kernel.py counts .item(). On a GPU the host waits for the device at: a copy to the device that
blocks (PyTorch then synchronises the stream, after all the work queued on it), a copy from pageable memory (the
driver stages it through a host buffer of its own first: host work, not a wait), and a read of a device tensor on the host (.item(), .tolist(),
.cpu(), .numpy(), bool()) or a synchronize. Here every such call is counted while a loader's batches are taken and a
training step runs on them; page-locked memory is what the ring registered through a stand-in runtime.

Each loader hands the loop its steps with none, and the default GPU configuration's step (fp16 with the loss
scaler's flag in the fused kernel, channels_last) adds none: Horovod's synchronize() before the optimizer step, the
exchange itself, is the one wait left on a GPU (docs/pytorch-gpu.md#the-step)."""

from __future__ import annotations

import collections
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from payloads.common import config
from payloads.pytorch import backends, data, inputs, models, ring, runtime, shards
from payloads.pytorch.precision import Precision

CPU = torch.device("cpu")
INPUT_PATH = os.path.dirname(inputs.__file__)


class Syncs:
    """Counts, while `on`, the calls that make a GPU's host wait (see the module's docstring)."""

    def __init__(self, monkeypatch):
        self.on, self.count, self.registered = False, collections.Counter(), []
        real_to = torch.Tensor.to

        def to(t, *args, **kw):
            # Copies the input path makes (its modules' own calls): the step's are of tensors already on the device.
            mine = sys._getframe(1).f_code.co_filename.startswith(INPUT_PATH)
            moved = kw.get("device") is not None or any(isinstance(a, (torch.device, str)) for a in args)
            if self.on and mine and moved:
                self.count["copies to the device"] += 1
                if not kw.get("non_blocking"):
                    self.count["blocking copy"] += 1
                elif not any(a <= t.data_ptr() < a + n for a, n in self.registered):
                    self.count["copy from pageable memory"] += 1
            return real_to(t, *args, **kw)

        monkeypatch.setattr(torch.Tensor, "to", to)
        for name in ("item", "tolist", "cpu", "numpy", "__bool__"):
            real = getattr(torch.Tensor, name)

            def read(t, *a, _real=real, _name=name, **k):
                # Not the DataLoader's own seed for the epoch's workers (a CPU tensor, per epoch): every other read.
                if self.on and "torch/utils/data" not in sys._getframe(1).f_code.co_filename:
                    self.count[f"read on the host ({_name})"] += 1
                return _real(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, read)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: self.count.update(["synchronize"]))
        syncs = self

        class Runtime:  # the ring's registration succeeds and is remembered as page-locked memory
            def cudaHostRegister(self, address, size, flags):
                syncs.registered.append((address, size))
                return 0

            def cudaHostUnregister(self, address):
                return 0

        monkeypatch.setattr(ring, "cuda_runtime", Runtime)

    def waits(self) -> dict:
        return {k: v for k, v in self.count.items() if k != "copies to the device"}


def _step(model, opt, scaler, prec, batch) -> None:
    """The classification task's step in the default GPU configuration (fp16, the scaler's flag in the fused
    kernel), one process: what loop.train_epoch runs per step between taking a batch and the next."""
    images, labels, _ = batch
    opt.zero_grad()
    with prec.autocast():
        loss = F.cross_entropy(model(images), labels)
    scaler.scale(loss).backward()
    runtime.optimizer_step(opt, scaler, backends.Single())


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    from test_inputs import _photos

    from datatools import prepare

    root = tmp_path_factory.mktemp("syncs")
    _photos(root / "img", classes=3, per_class=8)
    prepare.run(root / "img", root / "out", shards=2, formats=["webdataset"], progress=False)
    return root / "out" / "webdataset"


def _loaders(shard_set, tmp_path) -> dict:
    """Each loader as a GPU run builds it, on this CPU: the ring's loaders pinned (pin_memory, as on CUDA)."""
    from test_inputs import _photos

    cfg = config.TrainConfig(data="shards", data_dir=shard_set, image_size=16, workers=2, seed=1, num_classes=3)
    train, _, _ = shards.open_set(shard_set)
    crops = data.Transform(16, train=True)

    def ring_loader(**options):
        return shards.ShardLoader(train, data.Reading.of(cfg, 0, 1, 4, True, pin_memory=True, **options), crops)

    _photos(tmp_path / "img", classes=3, per_class=4)
    folder = config.TrainConfig(data="imagefolder", data_dir=tmp_path / "img", image_size=16, workers=0)
    synthetic = config.TrainConfig(data="synthetic", image_size=16, synthetic_samples=16, num_classes=3, seed=1)
    made = {
        "synthetic": inputs.build(synthetic, 0, 1, 4, CPU).train,
        "imagefolder": inputs.build(folder, 0, 1, 4, CPU).train,
        "shards": inputs.Prefetched(ring_loader(), CPU, True),
        "shards --gpu-decode": ring_loader(encoded=True).on_device(CPU, True),
    }
    return made


def test_no_loader_makes_the_host_wait_for_the_device_and_neither_does_the_step(shard_set, tmp_path, monkeypatch):
    syncs = Syncs(monkeypatch)
    torch.manual_seed(0)
    model = models.build("tiny_cnn", 3, 16).to(memory_format=torch.channels_last)
    cfg = config.TrainConfig(model="tiny_cnn", image_size=16)
    opt = runtime.optimizer(cfg, model, 0.1, CPU)
    prec = Precision("fp16", "cpu")
    scaler = prec.grad_scaler(cfg.loss_scale_init)
    runtime.scaler_in_kernel(opt, scaler)
    got = {}
    for name, loader in _loaders(shard_set, tmp_path).items():
        loader.set_epoch(1)
        syncs.count.clear()
        syncs.on = True
        for batch in loader:  # a whole epoch: a thread one batch ahead (--gpu-decode) is counted whole too
            _step(model, opt, scaler, prec, batch)
        syncs.on = False
        got[name] = (len(loader), syncs.waits(), syncs.count["copies to the device"])
    assert len(got) == 4, got
    for name, (steps, waits, copies) in got.items():
        if name == "synthetic":  # per epoch, not per step: its sample indices go to the device once
            assert (waits, copies) == ({"copy from pageable memory": 1}, 1), got
            continue
        if name == "imagefolder":  # the DataLoader's batches are page-locked on CUDA only (the test below)
            waits.pop("copy from pageable memory", None)
        assert steps >= 3 and waits == {}, got
        # Images and labels from the host loaders; --gpu-decode's labels (the JPEGs cross in nvJPEG's own call).
        assert copies == (steps if name == "shards --gpu-decode" else 2 * steps), got


def test_on_a_gpu_the_class_folder_loader_pins_its_batches():
    """The DataLoader's batches are the one copy source this CPU cannot register: on CUDA it pins them itself."""
    cfg = config.TrainConfig(data="imagefolder", image_size=16, workers=0)
    dataset = data.ImageFiles(type("Tree", (), {"samples": [("x", 0)] * 8})(), 16, True, False)
    assert inputs.FolderLoader(dataset, cfg, 0, 1, 4, True, torch.device("cuda")).loader.pin_memory is True
