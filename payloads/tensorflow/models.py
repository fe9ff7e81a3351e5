"""Keras models by name: Keras Applications' ImageNet classifiers, plus small ones for CPU runs and tests.

Shared by the TensorFlow and Keras payloads. Weights are never downloaded (weights=None): training starts
from a seeded random initialisation, the same on every rank.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import tensorflow as tf

_APPLICATIONS = {
    "resnet50": "ResNet50",
    "resnet101": "ResNet101",
    "resnet152": "ResNet152",
    "mobilenet_v2": "MobileNetV2",
}


def _tiny_cnn(num_classes: int, image_size: int) -> tf.keras.Model:
    # No batch norm: per-rank batch statistics would make a 2-process run differ from a 1-process run on
    # the same global batch, which the averaging tests compare. Same shape as the PyTorch tiny_cnn.
    L = tf.keras.layers
    return tf.keras.Sequential(
        [
            L.Input((image_size, image_size, 3)),
            L.Conv2D(16, 3, strides=2, padding="same", activation="relu"),
            L.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
            L.GlobalAveragePooling2D(),
            L.Dense(num_classes),
        ],
        name="tiny_cnn",
    )


def _mlp(num_classes: int, image_size: int) -> tf.keras.Model:
    L = tf.keras.layers
    return tf.keras.Sequential(
        [L.Input((image_size, image_size, 3)), L.Flatten(), L.Dense(64, activation="relu"), L.Dense(num_classes)],
        name="mlp",
    )


def _application(class_name: str) -> Callable[[int, int], tf.keras.Model]:
    def build(num_classes: int, image_size: int) -> tf.keras.Model:
        cls = getattr(tf.keras.applications, class_name)
        # Logits out (no softmax): the loss takes from_logits=True, which is stabler in float16.
        return cls(
            weights=None, classes=num_classes, input_shape=(image_size, image_size, 3), classifier_activation=None
        )

    return build


MODELS: dict[str, Callable[[int, int], tf.keras.Model]] = {
    **{name: _application(cls) for name, cls in _APPLICATIONS.items()},
    "tiny_cnn": _tiny_cnn,
    "mlp": _mlp,
}


def build(name: str, num_classes: int, image_size: int) -> tf.keras.Model:
    """The model under the current Keras precision policy. Under a mixed policy its logits come out in
    float32 (Keras' mixed-precision guide: keep the model's last output float32), so that Keras' loss and
    metrics compute softmax and cross-entropy in float32, as the TensorFlow loop does by casting."""
    model = MODELS[name](num_classes, image_size)
    if model.outputs[0].dtype == tf.float32:
        return model
    logits = tf.keras.layers.Activation("linear", dtype="float32", name="logits_float32")(model.outputs[0])
    return tf.keras.Model(model.inputs, logits, name=model.name)


def gradient_bytes(model: tf.keras.Model) -> int:
    """Bytes one fp32 allreduce of all gradients moves (ResNet-50: about 102 MB)."""
    return sum(int(v.shape.num_elements()) * 4 for v in model.trainable_variables)


def parameters_digest(model: tf.keras.Model) -> str:
    """Hash of every weight's exact bytes, in layer order: equal across ranks iff the weights are equal.
    Shapes, not names, go in: Keras numbers layer names per process (dense_1...)."""
    h = hashlib.sha256()
    for w in model.weights:
        h.update(str(tuple(w.shape)).encode())
        h.update(w.numpy().tobytes())
    return h.hexdigest()
