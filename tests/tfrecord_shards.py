"""Class folders of small images, and the TFRecord shards the data line writes from them: the TensorFlow tests'
data (test_tensorflow.py, test_tensorflow_input.py)."""

import types

import numpy as np


def write_images(root, classes=3, per_class=8, size=20):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = np.full((size, size, 3), 60 * c, np.uint8) + rng.integers(0, 40, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")
    return root


def write_shards(images, shards_dir, shards=3):
    """The data line's writer (python -m datatools.prepare --formats tfrecord); returns the folder the
    TensorFlow payloads read (--data-dir)."""
    from datatools import prepare

    prepare.run(images, shards_dir, shards=shards, formats=["tfrecord"], workers=1, progress=False)
    return shards_dir / "tfrecord"


def tfrecord_config(shards, **changes) -> types.SimpleNamespace:
    """What payloads/tensorflow/data.build reads of the configuration, for the shards in `shards`."""
    settings = dict(data="tfrecord", data_dir=shards, image_size=8, num_classes=2, seed=42, epochs=1)
    settings.update(max_steps_per_epoch=0, workers=1, skip_corrupt_images=False)
    return types.SimpleNamespace(**{**settings, **changes})
