"""Which parameters decay, and by how much: Goyal et al. 2017 (the linear-scaling recipe the payloads follow):
"weight decay of 0.0001 ... we do not apply weight decay on the learnable BN coefficients (namely, gamma and
beta)"; NVIDIA's ResNet-50 (DeepLearningExamples, PyTorch/Classification/ConvNets) also leaves biases
undecayed. The expected sets here come from the modules' types, not from the shape rule the payloads use."""

import pytest
import torch

from payloads.common.config import TrainConfig
from payloads.pytorch import models, runtime


def _decay_by_name(model, opt) -> dict[str, float]:
    group_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    return {name: group_of[id(p)] for name, p in model.named_parameters()}


def _expected(model, wd: float) -> dict[str, float]:
    out = {}
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            decays = isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)) and p_name == "weight"
            out[name] = wd if decays else 0.0
    return out


@pytest.mark.parametrize("name", ["resnet50", "tiny_cnn"])
def test_kernels_decay_and_batchnorm_and_biases_do_not(name):
    model = models.build(name, 10, 32)
    cfg = TrainConfig(batch_size=8)
    assert cfg.weight_decay == 1e-4  # Goyal et al.'s value (NVIDIA's 3.05e-5 goes with its cosine schedule)
    opt = runtime.optimizer(cfg, model, 0.1, torch.device("cpu"))
    got = _decay_by_name(model, opt)
    assert got == _expected(model, 1e-4)
    if name == "resnet50":
        assert got["bn1.weight"] == got["bn1.bias"] == got["fc.bias"] == 0.0
        assert got["conv1.weight"] == got["fc.weight"] == 1e-4


def test_a_step_on_zero_gradients_shrinks_only_the_decaying_weights():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten())
    with torch.no_grad():
        model[1].weight.fill_(2.0)
    cfg = TrainConfig(batch_size=8, weight_decay=0.01)
    opt = runtime.optimizer(cfg, model, 0.5, torch.device("cpu"))
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    assert torch.allclose(after["0.weight"], before["0.weight"] * (1 - 0.5 * 0.01))
    for k in ("0.bias", "1.weight", "1.bias"):
        assert torch.equal(after[k], before[k]), k


def test_tensorflow_decays_the_same_variables():
    import types

    tf = pytest.importorskip("tensorflow")
    from payloads.tensorflow import runtime as tf_runtime

    model = tf.keras.Sequential(
        [
            tf.keras.Input((8, 8, 3)),
            tf.keras.layers.Conv2D(4, 3),
            tf.keras.layers.BatchNormalization(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(2),
        ]
    )
    for v in model.trainable_variables:
        v.assign(tf.ones_like(v) * 2.0)
    kernels = [v for layer in model.layers for v in getattr(layer, "trainable_weights", []) if "kernel" in v.name]
    assert len(kernels) == 2
    expected = 1e-4 * sum(float(tf.reduce_sum(k * k)) / 2 for k in kernels)
    got = float(tf_runtime.weight_decay_loss(types.SimpleNamespace(weight_decay=1e-4), model))
    assert got == pytest.approx(expected, rel=1e-6)
