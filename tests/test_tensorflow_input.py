"""The TensorFlow payloads' input: TFRecord shards written, counted, planned per rank and checked; JPEG crops
decoded from their window bit for bit as before; corrupt records named, or skipped and counted, in two real Horovod
processes too; a label beyond --num-classes explained; the synthetic pool; threads sized from the cores."""

import numpy as np
import pytest
from helpers import TINY, metrics, train
from tfrecord_shards import tfrecord_config, write_images, write_shards

from payloads.common.config import TrainConfig

PAYLOADS = ["tensorflow", "keras"]


def on_shards(shards, classes: int, epochs: int, out) -> list[str]:
    """The TensorFlow payloads' arguments for a tiny run on TFRecord shards, batch 4 a rank."""
    data = ["--data", "tfrecord", "--data-dir", str(shards), "--num-classes", str(classes), "--batch-size", "4"]
    return TINY + data + ["--epochs", str(epochs), "--output-dir", str(out)]


def _corrupt_record(shard, label: int = 1):
    """Append one record whose image does not decode (prepare never writes one: a damaged copy, a bad disk)."""
    import tensorflow as tf

    from payloads.tensorflow import tfrecords

    records = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    with tf.io.TFRecordWriter(str(shard)) as w:
        for r in records + [tfrecords.example(b"\x89PNG not a picture", label)]:
            w.write(r)


def test_tfrecord_shards_are_written_counted_and_planned_disjoint_and_complete(tmp_path):
    from payloads.tensorflow import tfrecords

    shards = write_shards(write_images(tmp_path / "images"), tmp_path / "shards")
    train_files, val_files = tfrecords.find(shards)
    assert len(train_files) == 3 and val_files == []
    counts = [tfrecords.count_records(f) for f in train_files]
    assert sum(counts) == 24
    assert (shards / "train-classes.txt").read_text().split() == ["class0", "class1", "class2"]
    for size in (1, 2, 3, 4, 5):
        plans = [tfrecords.plan(train_files, counts, r, size, 2) for r in range(size)]
        assert len({p.steps for p in plans}) == 1  # same step count on every rank
        if len(train_files) % size == 0:  # whole files: disjoint, complete
            opened = [f for p in plans for f in p.files]
            assert sorted(opened) == sorted(train_files)
        else:  # records: every size-th one
            assert all(p.record_shard and p.files == tuple(train_files) for p in plans)
            assert sum(p.samples for p in plans) == 24
        assert all(p.steps * 2 <= p.samples for p in plans)
    with pytest.raises(Exception, match="fewer than one batch of 64"):
        tfrecords.plan(train_files, counts, 0, 2, 64)


def test_truncated_or_missing_shards_are_named(tmp_path):
    from payloads.common.errors import ConfigError
    from payloads.tensorflow import tfrecords

    shards = write_shards(write_images(tmp_path / "images", per_class=2), tmp_path / "shards", shards=1)
    (f,) = tfrecords.shard_files(shards, "train")
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(ConfigError, match="truncated in record 6"):
        tfrecords.count_records(f)
    with pytest.raises(ConfigError, match="no TFRecord shards named train-.*datatools.prepare"):
        tfrecords.find(tmp_path / "images")


@pytest.mark.launches
@pytest.mark.parametrize("payload", PAYLOADS)
def test_trains_on_tfrecord_shards_with_validation(tmp_path, payload):
    write_images(tmp_path / "images" / "train")
    write_images(tmp_path / "images" / "val", per_class=4)
    shards = write_shards(tmp_path / "images", tmp_path / "shards")
    out = tmp_path / "out"
    train(
        2,
        on_shards(shards, classes=3, epochs=2, out=str(out)),
        payload=payload,
    )
    m = metrics(out)
    assert m["summary"]["ranks_identical"] is True
    assert [e["images"] for e in m["epochs"]] == [24, 24]  # 3 steps x 4 x 2 ranks
    assert [e["skipped_images"] for e in m["epochs"]] == [0, 0]
    assert all(0.0 <= e["val_accuracy"] <= 1.0 and e["val_loss"] > 0 for e in m["epochs"])


@pytest.mark.launches
def test_corrupt_records_fail_with_the_fix_then_are_skipped_and_counted_when_asked(tmp_path):
    """A corrupt record stops the run naming `--check` (here the validation record, met at the end of epoch 1 before
    rank 0's stream reaches its 13th training record: the TensorFlow payload's validation loop gave a traceback
    until this test met it; the training loop's message is test_label_beyond_num_classes_is_explained's path);
    with --skip-corrupt-images each payload trains on, counting the training record, and skips and counts the
    validation record once per validation pass."""
    from payloads.tensorflow import tfrecords

    write_images(tmp_path / "images" / "train")
    write_images(tmp_path / "images" / "val", per_class=4)
    shards = write_shards(tmp_path / "images", tmp_path / "shards", shards=2)
    train_shard, val_shard = tfrecords.shard_files(shards, "train")[0], tfrecords.shard_files(shards, "validation")[0]
    _corrupt_record(train_shard)  # rank 0 reads this file: 13 records, 12 good
    _corrupt_record(val_shard, label=2)
    bad = tfrecords.check(shards)
    assert [line.split(":")[0] for line in bad] == [f"{train_shard}#12", f"{val_shard}#{_records(val_shard) - 1}"]
    args = on_shards(shards, classes=3, epochs=3, out=str(tmp_path / "out"))
    proc = train(2, args, check=False, payload="tensorflow")
    assert proc.returncode != 0
    assert "payloads.tensorflow.tfrecords --check" in proc.stdout + proc.stderr
    for payload in PAYLOADS:
        out = tmp_path / f"skip-{payload}"
        train(2, args + ["--skip-corrupt-images", "--output-dir", str(out)], payload=payload)
        m = metrics(out)
        assert m["summary"]["ranks_identical"] is True
        assert [e["images"] for e in m["epochs"]] == [24, 24, 24]  # batches stay full: the stream repeats
        skipped = [e["skipped_images"] for e in m["epochs"]]
        # Rank 0 trains on 12 records an epoch from a share of 13 (12 good): each pass's bad record falls in the
        # epoch of that pass or the next, so an epoch may meet it twice (counted once) or not at all.
        assert all(n <= 1 for n in skipped) and sum(skipped) >= 1, skipped
        # Validation reads its share once per epoch: the bad record is met, and counted, once per pass.
        assert [e["val_skipped_images"] for e in m["epochs"]] == [1, 1, 1], m["epochs"]
        assert all(0.0 <= e["val_accuracy"] <= 1.0 and e["val_loss"] > 0 for e in m["epochs"])


def _records(shard) -> int:
    import tensorflow as tf

    return sum(1 for _ in tf.data.TFRecordDataset(str(shard)))


def test_a_corrupt_record_counts_once_per_epoch_however_often_the_stream_meets_it():
    """SkipCounter on a stream whose order is known: bad record 1 is met twice in epoch 2 (counted once), and
    the counts read after each epoch do not move when the pipeline has read ahead."""
    import tensorflow as tf

    from payloads.tensorflow import data

    records = [0, 1, 2, 1, 0, 1, 2, 1, 0, 1]  # the share's positions as the stream meets them
    ok = [r != 1 for r in records]  # record 1 does not decode; 2 good records an epoch
    counter = data.SkipCounter(records=3, per_epoch=2, epochs=3)
    ds = tf.data.Dataset.from_tensor_slices(
        (tf.zeros([10, 2]), tf.zeros([10], tf.int32), tf.constant(records, tf.int64), tf.constant(ok))
    )
    ds = ds.map(counter.see).filter(lambda image, label, good: good).batch(2).prefetch(4)
    batches = iter(ds)
    per_epoch = []
    for _ in range(3):
        next(batches)
        per_epoch.append(counter.epoch_done())
    # epoch 1: 0, 1 (bad), 2; epoch 2: 1 (bad), 0, 1 (bad again), 2; epoch 3: 1 (bad), 0, then read ahead: 1 (bad)
    assert per_epoch == [1, 1, 1]


def test_a_shard_with_one_corrupt_record_is_read_to_full_batches_and_counted_once_per_epoch(tmp_path):
    """The input function itself, one process: a share of 3 records, one bad, trained 3 at a time, so every
    epoch reads across two passes of it."""

    import numpy as np

    from payloads.tensorflow import data, tfrecords

    shards = write_shards(write_images(tmp_path / "images", classes=2, per_class=1), tmp_path / "shards", shards=1)
    (shard,) = tfrecords.shard_files(shards, "train")
    _corrupt_record(shard)
    cfg = tfrecord_config(shards, epochs=4, workers=2, skip_corrupt_images=True)
    inputs = data.build(cfg, rank=0, size=1, batch=3, start_epoch=0, threads=2)
    assert inputs.steps == 1
    batches = iter(inputs.train)
    skipped = []
    for _ in range(cfg.epochs):
        images, labels = next(batches)
        assert tuple(images.shape) == (3, 8, 8, 3) and set(np.asarray(labels).tolist()) <= {0, 1}
        skipped.append(inputs.epoch_skipped())
    # 12 good records over 4 epochs: 6 passes, so the bad record is met 6 times; once an epoch at most
    assert skipped[0] == 1 and all(n <= 1 for n in skipped) and sum(skipped) < 6, skipped


def _encoded(fmt="JPEG", mode="RGB", height=87, width=123, seed=0, **options) -> bytes:
    """An odd-sized image whose colours change from pixel to pixel (the worst case for chroma upsampling)."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = np.cumsum(rng.integers(0, 256, (height, width, 3)), axis=1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, fmt, **options)
    return out.getvalue()


def _jpegs() -> dict[str, bytes]:
    import tensorflow as tf

    pixels = np.random.default_rng(1).integers(0, 256, (87, 123, 3), dtype=np.uint8)
    return {
        "4:2:0": _encoded(quality=90),
        "4:2:2": _encoded(subsampling="4:2:2"),
        "4:4:4": _encoded(subsampling="4:4:4"),
        "4:1:1": _encoded(subsampling="4:1:1"),
        "progressive": _encoded(progressive=True),
        "grey": _encoded(mode="L"),
        "cmyk": _encoded(mode="CMYK"),
        "tf.io.encode_jpeg": tf.io.encode_jpeg(pixels).numpy(),
    }


def test_a_jpeg_crop_decodes_only_its_window_and_equals_the_whole_decode_sliced_bit_for_bit():
    """data._jpeg_window (decode_and_crop_jpeg with a column of margin) against decode_image and slicing, on
    123 x 87 JPEGs of every chroma layout, at the edges, at iMCU boundaries and at random windows."""
    import tensorflow as tf

    from payloads.tensorflow import data

    rng = np.random.default_rng(2)
    without_margin = {}
    for name, jpeg in _jpegs().items():
        whole = tf.io.decode_image(jpeg, channels=3, expand_animations=False).numpy()
        h, w = whole.shape[:2]
        assert (h, w) == (87, 123) and tuple(tf.io.extract_jpeg_shape(jpeg).numpy()[:2]) == (h, w)
        windows = [(0, 0, h, w), (0, 0, 1, 1), (h - 1, w - 1, 1, 1), (0, w - 1, h, 1), (h - 1, 0, 1, w)]
        windows += [(0, 16, h, 32), (16, 32, 17, 16), (5, 8, 40, 20), (1, 1, h - 2, w - 2), (3, 7, 9, w - 7)]
        for _ in range(60):
            y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
            windows.append((y, x, int(rng.integers(1, h - y + 1)), int(rng.integers(1, w - x + 1))))
        worst = 0
        for y, x, dy, dx in windows:
            crop = data._jpeg_window(jpeg, tf.constant([y, x, 0]), tf.constant([dy, dx, -1]), w).numpy()
            assert np.array_equal(crop, whole[y : y + dy, x : x + dx]), (name, (y, x, dy, dx))
            plain = tf.image.decode_and_crop_jpeg(jpeg, [y, x, dy, dx], channels=3).numpy().astype(int)
            worst = max(worst, int(np.abs(plain - whole[y : y + dy, x : x + dx]).max()))
        without_margin[name] = worst
    # Why the margin: libjpeg-turbo upsamples the chroma of a cropped region's edge columns as if they were the
    # image's edges. Measured on these noisy images without it: 39-69 levels off (4:2:0 42, 4:2:2 69, 4:1:1 50) in a
    # crop's first or last column (4-5 on smooth, photo-like ones); exact where the chroma is not subsampled.
    assert without_margin["4:2:0"] > 0 and without_margin["4:2:2"] > 0, without_margin
    assert without_margin["4:4:4"] == without_margin["grey"] == 0, without_margin


def _old_crop(contents, seed):
    """The training crop as the TensorFlow input made it before it decoded only the window: the whole image
    decoded, the window drawn from its shape, sliced."""
    import tensorflow as tf

    image = tf.io.decode_image(contents, channels=3, expand_animations=False)
    begin, extent, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(image),
        tf.zeros([0, 0, 4]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.slice(image, begin, extent)


def _old_decode(record, image_size, seed):
    """The old training decode, whole: crop, resize, flip, normalise."""
    import tensorflow as tf

    from payloads.tensorflow import data, tfrecords

    ex = tf.io.parse_single_example(record, tfrecords.feature_spec())
    image = _old_crop(ex["image/encoded"], seed)
    image = tf.image.random_flip_left_right(tf.image.resize(image, (image_size, image_size)))
    return (tf.cast(image, tf.float32) - data.MEAN) / data.STD, tf.cast(ex["image/class/label"], tf.int32)


def test_the_training_crop_window_is_drawn_as_before_from_the_jpeg_header(tmp_path, monkeypatch):
    """The window is the same op's draw from the same shape (the JPEG header's is the decoded image's): with the
    op seeded (training leaves it unseeded, seed 0: a fresh draw every run, as before), the new crops, and the
    whole training decode with its flip, are the old ones bit for bit, for JPEGs and for PNG and GIF records."""

    import tensorflow as tf

    from payloads.tensorflow import data, tfrecords

    images = list(_jpegs().values()) + [
        _encoded(height=300, width=200, quality=90),
        _encoded("PNG", height=40, width=90),
        _encoded("GIF", height=33, width=57),
    ]
    for jpeg in _jpegs().values():
        decoded = tf.io.decode_image(jpeg, channels=3, expand_animations=False)
        assert np.array_equal(tf.io.extract_jpeg_shape(jpeg)[:2], tf.shape(decoded)[:2])
    records = [tfrecords.example(image, i) for i, image in enumerate(images)] * 3
    unseeded = data._crop_window
    try:
        for seed in (1, 7, 42):
            monkeypatch.setattr(data, "_crop_window", lambda shape, s=seed: unseeded(shape, seed=s))
            encoded = tf.data.Dataset.from_tensor_slices(images * 3)
            old = list(encoded.map(lambda c, s=seed: _old_crop(c, s)).as_numpy_iterator())
            new = list(encoded.map(data._random_crop).as_numpy_iterator())
            assert [a.shape for a in new] == [a.shape for a in old]
            assert all(np.array_equal(a, b) for a, b in zip(old, new))
            assert len({a.shape for a in new}) > 10  # drawn windows, not the whole images
            tf.random.set_seed(seed)  # the flip's seed, as the payload's tf.keras.utils.set_random_seed sets it
            old = list(
                tf.data.Dataset.from_tensor_slices(records)
                .map(lambda r, s=seed: _old_decode(r, 16, s))
                .as_numpy_iterator()
            )
            tf.random.set_seed(seed)
            new = list(
                tf.data.Dataset.from_tensor_slices(records)
                .map(lambda r: data._decode_image(r, 16, True))
                .as_numpy_iterator()
            )
            assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(old, new))
    finally:
        tf.random.set_seed(None)
    monkeypatch.setattr(data, "_crop_window", unseeded)

    # The input function on shards of JPEGs: batches of the image size, float32, with or without the skip path.
    root = tmp_path / "images"
    for c in range(2):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(3):
            (root / f"class{c}" / f"{i}.jpg").write_bytes(_encoded(height=60 + 7 * i, width=45 + 11 * c, seed=i))
    shards = write_shards(root, tmp_path / "shards", shards=1)
    for skip_corrupt in (False, True):
        cfg = tfrecord_config(shards, image_size=16, workers=2, skip_corrupt_images=skip_corrupt)
        images, labels = next(iter(data.build(cfg, rank=0, size=1, batch=3, start_epoch=0, threads=2).train))
        assert images.dtype == tf.float32 and tuple(images.shape) == (3, 16, 16, 3) and labels.dtype == tf.int32


def test_png_gif_cut_off_and_corrupt_records_are_decoded_whole_and_fail_as_before():
    """Only a JPEG that ends in its end-of-image marker is crop-decoded. A PNG, a GIF, a JPEG with bytes after the
    marker decode whole as before; a JPEG cut off (whose crop decode could succeed: it reads only to the window's
    last row), a corrupt PNG and bytes that only start like a JPEG fail the decode, so the run names them, or
    --skip-corrupt-images flags and skips them."""
    import tensorflow as tf

    from payloads.tensorflow import data, tfrecords

    jpeg = _encoded(height=200, width=150, quality=90)
    cut = jpeg[: len(jpeg) * 3 // 5]
    assert tf.image.decode_and_crop_jpeg(cut, [0, 0, 8, 8], channels=3).shape == (8, 8, 3)
    good = {
        "jpeg": jpeg,
        "png": _encoded("PNG", height=40, width=90),
        "gif": _encoded("GIF", height=33, width=57),
        "jpeg and bytes after": jpeg + b"\0" * 10,
    }
    bad = {
        "cut-off jpeg": cut,
        "corrupt png": b"\x89PNG not a picture",
        "jpeg's first bytes": b"\xff\xd8\xff not a picture",
        "jpeg's first and last bytes": b"\xff\xd8\xff not a picture\xff\xd9",
        "empty": b"",
    }
    crop_decoded = {name: bool(data._whole_jpeg(c)) for name, c in {**good, **bad}.items()}
    assert [name for name, yes in crop_decoded.items() if yes] == ["jpeg", "jpeg's first and last bytes"]
    for name, contents in good.items():
        image, label = data._decode_image(tfrecords.example(contents, 1), 16, True)
        assert image.dtype == tf.float32 and tuple(image.shape) == (16, 16, 3) and int(label) == 1, name
    for name, contents in bad.items():
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            tf.io.decode_image(contents, channels=3, expand_animations=False)  # the old decode fails on it too
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            data._decode_image(tfrecords.example(contents, 1), 16, True)
        assert data.CORRUPT_HINT in data.input_error(e.value), name
    # --skip-corrupt-images' path: every record is flagged in stream order with its position, the bad ones False.
    records = [tfrecords.example(c, 0) for c in [*good.values(), *bad.values()]]
    flagged = (
        tf.data.Dataset.from_tensor_slices(records)
        .enumerate()
        .interleave(
            data._decoded_or_flagged(16), cycle_length=2, block_length=1, num_parallel_calls=2, deterministic=True
        )
    )
    got = [(int(position), bool(ok)) for _, _, position, ok in flagged]
    assert got == [(i, i < len(good)) for i in range(len(records))]


@pytest.mark.launches
@pytest.mark.one_core
def test_label_beyond_num_classes_is_explained(tmp_path):
    shards = write_shards(write_images(tmp_path / "images"), tmp_path / "shards")
    proc = train(
        1,
        on_shards(shards, classes=2, epochs=1, out=str(tmp_path / "out")),
        check=False,
        payload="tensorflow",
    )
    assert proc.returncode != 0
    assert "not below --num-classes" in proc.stderr + proc.stdout


def test_synthetic_pool_is_made_once_deterministic_per_index_capped_and_learnable():
    import tensorflow as tf

    from payloads.tensorflow import data

    a = data.SyntheticImages(128, 4, 16, 42)
    capped = data.SyntheticImages(128, 4, 16, 42, max_bytes=50 * 16 * 16 * 3 * 4)  # room for 50 images
    assert (a.distinct, capped.distinct) == (128, 50)
    # Image i depends on (seed, i) alone: the capped pool is the full one's first 50 images.
    assert np.array_equal(capped.images.numpy(), a.images.numpy()[:50])
    assert np.array_equal(capped.labels(np.arange(50)), a.labels(np.arange(50)))
    assert not np.array_equal(data.SyntheticImages(128, 4, 16, 7).images.numpy(), a.images.numpy())
    # Past the cap, sample i is pool image i % 50, label included.
    images, labels = capped.batch(np.array([3, 53, 103]))
    assert np.array_equal(images[0], images[1]) and np.array_equal(images[0], images[2]) and len(set(labels)) == 1
    # The pool lives where TensorFlow places new tensors: the process's GPU when it has one, here the CPU.
    assert a.images.device.endswith("CPU:0") and a.images.dtype == tf.float32
    # Learnable: each image is its class pattern plus unit noise, so averaging its 2x2 blocks (the 8x8
    # pattern upsampled to 16 px) and taking the nearest class mean recovers the label.
    blocks = a.images.numpy().reshape(128, 8, 2, 8, 2, 3).mean(axis=(2, 4)).reshape(128, -1)
    means = np.stack([blocks[a.labels(np.arange(128)) == c].mean(0) for c in range(4)])
    nearest = np.argmin(((blocks[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert (nearest == a.labels(np.arange(128))).mean() > 0.95


def test_synthetic_input_ships_positions_not_images(tmp_path):

    from payloads.common import sharding
    from payloads.tensorflow import data

    cfg = TrainConfig(synthetic_samples=128, num_classes=4, image_size=16, epochs=2)
    inputs = data.build(cfg, rank=1, size=2, batch=8, start_epoch=0, threads=3)
    x_spec, y_spec = inputs.train.element_spec
    assert x_spec.dtype.name == "int32" and tuple(x_spec.shape) == (8,)  # 32 bytes a step, not 8 images
    assert inputs.private_threads() == 3
    pool = data.SyntheticImages(128, 4, 16, 42)
    batches = list(inputs.train.as_numpy_iterator())
    assert len(batches) == 2 * inputs.steps == 16
    want = [i for e in range(2) for i in sharding.batches(128, 1, 2, 8, 42, e)]
    for (x, y), indices in zip(batches, want):
        assert np.array_equal(x, pool.slots(indices)) and np.array_equal(y, pool.labels(indices))
        assert np.array_equal(inputs.prepare(x).numpy(), pool.batch(indices)[0].numpy())


def test_thread_plan_sizes_pools_from_cores_per_local_process(tmp_path, monkeypatch):
    from payloads.tensorflow import runtime

    T = runtime.Threads
    assert runtime.thread_plan(0, 96, 8, 2) == T(12, 12, 12)  # ND96 with 8 GPUs: 12 cores per process
    assert runtime.thread_plan(0, 96, 8, 16) == T(12, 12, 16)  # tf.data's pool runs every --workers decode
    assert runtime.thread_plan(0, 2, 4, 0) == T(1, 1, 1)  # more processes than cores: one each
    assert runtime.thread_plan(3, 96, 8, 2) == T(3, 3, 3)  # --threads overrides the share
    # Cores: the affinity mask, capped by a cgroup v2 quota (kernel cgroup-v2 docs: cpu.max holds
    # "$MAX $PERIOD", "max" when unlimited).
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: set(range(64)))
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert runtime.available_cores(cpu_max) == 64
    cpu_max.write_text("250000 100000\n")  # 2.5 CPUs: 3 threads may run
    assert runtime.available_cores(cpu_max) == 3
    assert runtime.available_cores(tmp_path / "absent") == 64


# The threads a two-process run records: tests/test_tracking.py, in its TensorFlow and Keras runs.
