"""TensorFlow (DistributedGradientTape) and Keras (model.fit + DistributedOptimizer) payloads, run as two
real Horovod processes: gradients averaged (the Keras 3 failure mode would fail here), ranks agree,
resume is exact, the LR schedule is the PyTorch payload's, TFRecord input is sharded and checked, and a SIGTERM
mid-epoch stops every rank at one step with a checkpoint the run resumes from at that step (issue 31)."""

import numpy as np
import pytest
from helpers import TINY, metrics, stop_lines, stopped_run, train

from payloads.common import schedule

PAYLOADS = ["tensorflow", "keras"]


def weights(out, epoch=None) -> list[np.ndarray]:
    from payloads.common import checkpoint

    found = checkpoint.list_checkpoints(out / "checkpoints", ".npz")
    path = dict(found)[epoch] if epoch else found[-1][1]
    with np.load(path) as z:
        return [z[k] for k in sorted(z.files) if k.startswith("model/")]


def max_diff(a, b) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(a, b))


# Per run: (its flags, max weight difference 2 processes vs the float32 one-process run, relative loss tolerance,
# precision recorded); the un-averaged control must exceed the weight tolerance 4-fold. What a GPU switches on
# (--amp: mixed_float16 with loss scaling there, mixed_bfloat16 on a CPU; --xla) runs together, so one run holds
# both to the averaging test. bfloat16 keeps 8 bits of mantissa, so that run rounds its forward pass (measured
# here, both payloads, --amp alone: 0.0068 from the float32 one process, losses 3.5e-3 relative; control 0.34);
# XLA alone changed rounding only (7.8e-08 from the float32 one process).
FLAGS = {
    "float32": ([], 1e-5, 1e-4, "float32"),
    "amp-xla": (["--amp", "--xla"], 0.05, 1e-2, "mixed_bfloat16"),
}


@pytest.fixture(scope="module")
def float32_references(tmp_path_factory):
    """Per payload, once per test run: one process at the global batch and the un-averaged control, with no flag.
    Every two-process run is held to them: XLA changes rounding only (measured: its two-process run ends 7.8e-08
    from the float32 one process, the control 0.34 away), --amp its forward pass's precision (FLAGS)."""
    made = {}

    def get(payload):
        if payload not in made:
            root = tmp_path_factory.mktemp(f"{payload}-float32-references")
            common = TINY + ["--epochs", "3"]
            for name, batch in (("one", "32"), ("unaveraged", "16")):
                out = ["--output-dir", str(root / name)]
                train(1, common + ["--batch-size", batch, "--base-lr", "0.1", *out], payload=payload)
            made[payload] = root / "one", root / "unaveraged"
        return made[payload]

    return get


@pytest.mark.launches
@pytest.mark.parametrize("flag", list(FLAGS))
@pytest.mark.parametrize("payload", PAYLOADS)
def test_two_processes_average_gradients_exactly(tmp_path, monkeypatch, payload, flag, float32_references):
    flags, tolerance, loss_rel, policy = FLAGS[flag]
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # TensorFlow's INFO line says when XLA compiled a cluster
    two = tmp_path / "two"
    common = TINY + ["--epochs", "3"] + flags
    proc = train(2, common + ["--batch-size", "16", "--base-lr", "0.05", "--output-dir", str(two)], payload=payload)
    m = metrics(two)
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < 0.8 * losses[0], losses
    world = m["run"]["world"]
    assert world["processes"] == 2 and world["keras"].startswith("2.")
    assert world["onednn"] is True  # the payload turns oneDNN on where TensorFlow would not
    assert world["precision"] == policy and world["xla"] is ("--xla" in flags)
    # XLA on a CPU compiles only with --tf_xla_cpu_global_jit (TensorFlow's XLA guide, auto-clustering),
    # which the payload adds: without it --xla would run, uncompiled. TensorFlow logs this once per process.
    assert ("Compiled cluster using XLA" in proc.stdout + proc.stderr) is ("--xla" in flags)
    assert m["summary"]["ranks_identical"] is True
    assert "Total images/sec:" in proc.stdout

    # Same global batch in one float32 process with the same effective LR: equal within the flag's rounding.
    # Control: each process stepping on its own half-batch, as un-averaged gradients would.
    one, unaveraged = float32_references(payload)
    one_losses = [e["train_loss"] for e in metrics(one)["epochs"]]
    diff = max_diff(weights(two), weights(one))
    control = max_diff(weights(unaveraged), weights(one))
    loss_diff = max(abs(a / b - 1) for a, b in zip(losses, one_losses))
    print(
        f"{payload} {flag}: max |2-process - 1-process| = {diff:.3g} (losses {loss_diff:.3g} "
        f"relative); unaveraged control = {control:.3g}"
    )
    # Every payload reports the cross-entropy alone as train_loss (Keras' own "loss" adds weight decay).
    assert losses == pytest.approx(one_losses, rel=loss_rel)
    assert diff < tolerance, f"2-process weights differ from the 1-process run by {diff}"
    assert control > 4 * tolerance, (control, diff)


@pytest.mark.launches
@pytest.mark.parametrize("payload", PAYLOADS)
def test_sigterm_mid_epoch_stops_both_ranks_at_one_step_and_the_run_resumes_there_exactly(
    processes_without_rename, payload
):
    """Issue 31 for the TensorFlow payloads. Only rank 1 gets SIGTERM: the agreement stops rank 0 at the same step,
    every rank says so and exits 75, and the mid-epoch checkpoint holds the position and the data order. Resumed
    there, the run ends as the uninterrupted one did (weights, and the LR each epoch ends with: warm-up over 1.5
    epochs, decay at epoch 3, common/schedule.py's whether Horovod's Keras callbacks or our loop set it). On an
    output folder where rename raises (a blob mount without it): both ranks of the straight and the resumed run save,
    and resume, under the hook."""
    from payloads.common import checkpoint, preemption
    from payloads.tensorflow import runtime

    runs, hooked = processes_without_rename
    args = TINY + ["--batch-size", "8", "--base-lr", "0.02", "--warmup-epochs", "1.5", "--lr-decay-epochs", "3"]
    args += ["--epochs", "4", "--checkpoint-every-minutes", "0"]
    steps = 128 // (2 * 8)
    straight, out = runs / "straight", runs / "stopped"
    train(2, args + ["--output-dir", str(straight)], payload=payload)
    proc = stopped_run(out, args, backend="horovod", signalled=[1], payload=payload)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    lines = stop_lines(text)
    assert len(lines) == 2, text[-4000:]
    assert all(line.count("stopped by") == 1 and line.endswith(f"(exit {preemption.EXIT_CODE})") for line in lines)
    assert sorted("stopped by SIGTERM" in line for line in lines) == [False, True], lines
    found = checkpoint.latest(out / "checkpoints", ".npz")
    assert found, text[-3000:]
    path = found[1]
    epochs, step = checkpoint.position(path)
    assert (epochs, step) == (0, 1), path.name  # the first agreement after the signal
    assert all(path.name in line for line in lines), lines
    meta = runtime.read_meta(path)
    assert (meta["epoch"], meta["step"], meta["steps_per_epoch"]) == (0, step, steps)
    assert meta["data_order"] == {"seed": 42, "epoch": 0, "skip": step}

    resumed = train(2, args + ["--output-dir", str(out)], payload=payload)
    said = resumed.stdout + resumed.stderr
    assert f"resuming from {path} (0 epochs done, {step} steps of epoch 1)" in said, said[-3000:]
    # The stopped run loads tests/stop_at's sitecustomize instead (Python imports the first one on the path).
    assert hooked(f"payloads.{payload}.train") == 4, "both ranks of the straight and resumed runs ran under the hook"
    m = metrics(out)
    assert [e["epoch"] for e in m["epochs"]] == [1, 2, 3, 4]
    first, second = m["epochs"][:2]
    assert first["resumed_at_step"] == step and "resumed_at_step" not in second
    # The resumed epoch trained its remaining steps only, the next one all of its steps.
    assert (first["images"], second["images"]) == ((steps - step) * 2 * 8, steps * 2 * 8)
    assert m["summary"]["ranks_identical"] is True
    assert checkpoint.latest(out / "checkpoints", ".npz")[1].name == "checkpoint-epoch-0004.npz"
    diff = max_diff(weights(straight), weights(out))
    assert diff < 1e-5, f"resumed run differs from a straight one by {diff}"
    want = [schedule.learning_rate(0.02, 2, e, steps - 1, steps, 1.5, (3,)) for e in range(4)]
    for run in (straight, out):
        got = [e["lr"] for e in metrics(run)["epochs"]]
        assert got == pytest.approx(want, rel=1e-6), (run.name, got, want)
    assert want[0] < want[1] == want[2] and want[3] == pytest.approx(want[2] / 10)  # warm-up, plateau, decay


def _images(root, classes=3, per_class=8, size=20):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = np.full((size, size, 3), 60 * c, np.uint8) + rng.integers(0, 40, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")
    return root


def _write_shards(images, shards_dir, shards=3):
    """The data line's writer (python -m datatools.prepare --formats tfrecord); returns the folder the
    TensorFlow payloads read (--data-dir)."""
    from datatools import prepare

    prepare.run(images, shards_dir, shards=shards, formats=["tfrecord"], workers=1, progress=False)
    return shards_dir / "tfrecord"


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

    shards = _write_shards(_images(tmp_path / "images"), tmp_path / "shards")
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

    shards = _write_shards(_images(tmp_path / "images", per_class=2), tmp_path / "shards", shards=1)
    (f,) = tfrecords.shard_files(shards, "train")
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(ConfigError, match="truncated in record 6"):
        tfrecords.count_records(f)
    with pytest.raises(ConfigError, match="no TFRecord shards named train-.*datatools.prepare"):
        tfrecords.find(tmp_path / "images")


@pytest.mark.launches
@pytest.mark.parametrize("payload", PAYLOADS)
def test_trains_on_tfrecord_shards_with_validation(tmp_path, payload):
    _images(tmp_path / "images" / "train")
    _images(tmp_path / "images" / "val", per_class=4)
    shards = _write_shards(tmp_path / "images", tmp_path / "shards")
    out = tmp_path / "out"
    train(
        2,
        TINY
        + [
            "--data",
            "tfrecord",
            "--data-dir",
            str(shards),
            "--num-classes",
            "3",
            "--batch-size",
            "4",
            "--epochs",
            "2",
            "--output-dir",
            str(out),
        ],
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

    _images(tmp_path / "images" / "train")
    _images(tmp_path / "images" / "val", per_class=4)
    shards = _write_shards(tmp_path / "images", tmp_path / "shards", shards=2)
    train_shard, val_shard = tfrecords.shard_files(shards, "train")[0], tfrecords.shard_files(shards, "validation")[0]
    _corrupt_record(train_shard)  # rank 0 reads this file: 13 records, 12 good
    _corrupt_record(val_shard, label=2)
    bad = tfrecords.check(shards)
    assert [line.split(":")[0] for line in bad] == [f"{train_shard}#12", f"{val_shard}#{_records(val_shard) - 1}"]
    args = TINY + [
        "--data",
        "tfrecord",
        "--data-dir",
        str(shards),
        "--num-classes",
        "3",
        "--batch-size",
        "4",
        "--epochs",
        "3",
        "--output-dir",
        str(tmp_path / "out"),
    ]
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
    import types

    import numpy as np

    from payloads.tensorflow import data, tfrecords

    shards = _write_shards(_images(tmp_path / "images", classes=2, per_class=1), tmp_path / "shards", shards=1)
    (shard,) = tfrecords.shard_files(shards, "train")
    _corrupt_record(shard)
    cfg = types.SimpleNamespace(
        data="tfrecord",
        data_dir=shards,
        image_size=8,
        num_classes=2,
        seed=42,
        epochs=4,
        max_steps_per_epoch=0,
        workers=2,
        skip_corrupt_images=True,
    )
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
    import types

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
    shards = _write_shards(root, tmp_path / "shards", shards=1)
    for skip_corrupt in (False, True):
        cfg = types.SimpleNamespace(
            data="tfrecord",
            data_dir=shards,
            image_size=16,
            num_classes=2,
            seed=42,
            epochs=1,
            max_steps_per_epoch=0,
            workers=2,
            skip_corrupt_images=skip_corrupt,
        )
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
@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "imagefolder", "--data-dir", "x"], "convert class folders to TFRecord shards"),
        (["--backward-passes-per-step", "2"], "PyTorch payload option"),
        (["--no-channels-last"], "TensorFlow always trains NHWC"),
        (["--shuffle-buffer", "100"], "is an option of the PyTorch payloads"),
        (["--model", "resnet18"], "unknown model 'resnet18'"),
    ],
)
def test_bad_input_names_the_problem_and_the_fix(tmp_path, args, message):
    proc = train(1, TINY + ["--epochs", "1", "--output-dir", str(tmp_path), *args], check=False, payload="keras")
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    assert not (tmp_path / "checkpoints").exists()


def test_horovods_tf_functions_are_traced_without_autograph():
    """toolchain/patch_horovod.py: the tf.functions Horovod builds eagerly (the gradient allreduce of
    DistributedGradientTape and of the Keras DistributedOptimizer, broadcast_variables) are traced without
    AutoGraph. Off shows in behaviour: a Python `if` on a tensor is refused while tracing instead of being
    rewritten into a tf.cond. Every averaging test above traces Horovod's real ones."""
    import tensorflow as tf
    from horovod.tensorflow import util

    def magnitude(x):
        if x > 0:
            return x
        return -x

    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        util._make_subgraph(magnitude)(tf.constant(-2.0))
    assert float(tf.function(magnitude)(tf.constant(-2.0))) == 2.0  # with AutoGraph the same function converts


@pytest.mark.launches
@pytest.mark.one_core
def test_label_beyond_num_classes_is_explained(tmp_path):
    shards = _write_shards(_images(tmp_path / "images"), tmp_path / "shards")
    proc = train(
        1,
        TINY
        + [
            "--data",
            "tfrecord",
            "--data-dir",
            str(shards),
            "--num-classes",
            "2",
            "--batch-size",
            "4",
            "--epochs",
            "1",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        check=False,
        payload="tensorflow",
    )
    assert proc.returncode != 0
    assert "not below --num-classes" in proc.stderr + proc.stdout


def _two_rank_reference_tf(epochs: int, batch: int, base_lr: float, mean: bool = False) -> list[np.ndarray]:
    """The TensorFlow payload's 2-rank Adasum run, in one process: each rank's gradient on its own shard,
    combined per tensor by Adasum's definition (horovod/common/ops/adasum/adasum.h, ScaledAdd), then one
    SGD step with momentum, as DistributedGradientTape(op=Adasum) and the loop do."""
    import types

    import tensorflow as tf

    from payloads.common import sharding
    from payloads.tensorflow import data, models, runtime

    def adasum(a, b):
        a, b = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
        dot, aa, bb = (a * b).sum(), (a * a).sum(), (b * b).sum()
        ca = 1 - dot / aa / 2 if aa >= 1e-8 else 1.0
        cb = 1 - dot / bb / 2 if bb >= 1e-8 else 1.0
        return tf.constant((ca * a + cb * b).astype(np.float32))

    combine = (lambda a, b: (a + b) / 2) if mean else adasum

    tf.keras.utils.set_random_seed(42)
    model = models.build("tiny_cnn", 4, 16)
    dataset = data.SyntheticImages(128, 4, 16, 42)
    cfg = types.SimpleNamespace(weight_decay=1e-4)  # the payloads' default
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = tf.keras.optimizers.SGD(learning_rate=base_lr, momentum=0.9)
    for epoch in range(epochs):
        shards = [sharding.batches(128, r, 2, batch, 42, epoch) for r in range(2)]
        for step, indices in enumerate(zip(*shards)):
            grads = []
            for idx in indices:
                images, labels = dataset.batch(idx)
                with tf.GradientTape() as tape:
                    loss = loss_fn(labels, model(images, training=True)) + runtime.weight_decay_loss(cfg, model)
                grads.append(tape.gradient(loss, model.trainable_variables))
            optimizer.learning_rate.assign(
                schedule.learning_rate(base_lr, 1, epoch, step, len(shards[0]), 0, (30, 60, 80))
            )
            optimizer.apply_gradients(zip([combine(a, b) for a, b in zip(*grads)], model.trainable_variables))
    return model.get_weights()


@pytest.mark.launches
@pytest.mark.one_core
def test_tensorflow_adasum_two_processes_follow_adasums_definition(tmp_path):
    import subprocess

    from helpers import ROOT, env, horovodrun

    out = tmp_path / "adasum"
    cmd = horovodrun(
        2, TINY + ["--epochs", "2", "--batch-size", "16", "--adasum", "--output-dir", str(out)], "tensorflow"
    )
    i = cmd.index("--gloo")
    cmd[i : i + 1] = ["--mpi", "--mpi-args=--bind-to none"]  # Adasum exists only under MPI
    e = env()
    e["OMPI_MCA_mpi_yield_when_idle"] = "1"
    proc = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert metrics(out)["summary"]["ranks_identical"] is True
    diff = max_diff(weights(out), _two_rank_reference_tf(2, 16, 0.05))
    control = max_diff(weights(out), _two_rank_reference_tf(2, 16, 0.05, mean=True))  # averaged gradients
    print(f"TensorFlow Adasum vs its definition: {diff:.3g}; vs averaged gradients {control:.3g}")
    assert diff < 1e-5, diff
    assert control > 100 * max(diff, 1e-7), (diff, control)


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
    import types

    from payloads.common import sharding
    from payloads.tensorflow import data

    cfg = types.SimpleNamespace(
        synthetic_samples=128, num_classes=4, image_size=16, seed=42, epochs=2, max_steps_per_epoch=0, data="synthetic"
    )
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


# SIGTERM mid-epoch (issue 31; payloads/common/preemption.py). 20 steps an epoch (2 processes x batch 2): rank 1
# signals itself after step 1 (tests/stop_at), where the first agreement stops both ranks. The watchdog keeps its
# default limit: a short one ended runs when the machine was loaded (the end of Keras' fit() took over 4 s under a
# load of 7 on 2 cores). --checkpoint-every-minutes 0: only the signal checkpoints mid-epoch.
def test_a_resumed_epoch_is_entered_at_its_step_only_with_the_step_count_it_was_written_in(caplog):
    from payloads.common import sharding
    from payloads.tensorflow import data

    assert data.entry_step(0, None, 10) == 0  # an epoch's end
    assert data.entry_step(4, 10, 10) == 4
    with caplog.at_level("WARNING", logger="payloads.tensorflow"):
        assert data.entry_step(4, 12, 10, rank=1) == 0  # another world size or batch: the epoch starts again
        assert not caplog.records  # rank 0 says it, once for the job
        assert data.entry_step(4, 12, 10) == 0
    assert "the epoch starts again from its first step" in caplog.text
    # The synthetic order is a function of (seed, epoch, rank): the resumed stream is the rest of the epoch's.
    got = list(data.synthetic_batches(128, 1, 2, 8, 42, start_epoch=1, epochs=3, steps=7, skip=3))
    assert [len(a) for a in got] == [4, 7]
    assert np.array_equal(got[0], np.stack(sharding.batches(128, 1, 2, 8, 42, 1)[3:7]))
    assert np.array_equal(got[1], np.stack(sharding.batches(128, 1, 2, 8, 42, 2)[:7]))


def _stream(inputs, n) -> list[np.ndarray]:
    batches = iter(inputs.train)
    return [np.asarray(next(batches)[1]) for _ in range(n)]


def test_resumed_input_starts_at_the_step_for_synthetic_data_and_tfrecords(tmp_path):
    """data.build(skip=S): the stream starts at step S of the first epoch, S batches of the stream that starts
    at that epoch's first step later (labels compared: TFRecord crops and flips are drawn anew)."""
    import types

    from payloads.tensorflow import data

    cfg = types.SimpleNamespace(
        synthetic_samples=128, num_classes=4, image_size=16, seed=42, epochs=2, max_steps_per_epoch=0, data="synthetic"
    )
    whole = data.build(cfg, rank=1, size=2, batch=8, start_epoch=0, threads=1)
    resumed = data.build(cfg, rank=1, size=2, batch=8, start_epoch=0, threads=1, skip=3, written_steps=8)
    assert (whole.skip, resumed.skip, resumed.steps) == (0, 3, 8)
    x_whole = [x for x, _ in whole.train.as_numpy_iterator()]
    x_resumed = [x for x, _ in resumed.train.as_numpy_iterator()]
    assert len(x_resumed) == len(x_whole) - 3 and all(np.array_equal(a, b) for a, b in zip(x_whole[3:], x_resumed))
    other = data.build(cfg, rank=1, size=2, batch=8, start_epoch=0, threads=1, skip=3, written_steps=16)
    assert other.skip == 0 and len(list(other.train)) == 16  # written in an epoch of another step count

    shards = _write_shards(_images(tmp_path / "images"), tmp_path / "shards", shards=1)
    cfg = types.SimpleNamespace(
        data="tfrecord",
        data_dir=shards,
        image_size=8,
        num_classes=3,
        seed=42,
        epochs=3,
        max_steps_per_epoch=0,
        workers=1,
        skip_corrupt_images=False,
    )
    for corrupt in (False, True):  # records skipped before the decode; or decoded and counted, after the filter
        cfg.skip_corrupt_images = corrupt
        whole = _stream(data.build(cfg, rank=0, size=1, batch=4, start_epoch=1, threads=1), 9)
        inputs = data.build(cfg, rank=0, size=1, batch=4, start_epoch=1, threads=1, skip=2, written_steps=6)
        assert (inputs.steps, inputs.skip) == (6, 2)
        resumed = _stream(inputs, 7)
        assert all(np.array_equal(a, b) for a, b in zip(whole[2:], resumed)), (whole, resumed)
        assert not all(np.array_equal(a, b) for a, b in zip(whole, resumed))


def test_keras_fit_enters_the_resumed_epoch_at_its_step():
    """keras.train.EnterAt on the installed Keras: fit() runs the first epoch from the step on, numbering its
    batches from there (what Horovod's LR callback and the preemption agreement read), takes as many batches from
    the stream, and runs every later epoch whole."""
    import tensorflow as tf

    from payloads.keras.train import EnterAt

    trained, seen = [], []

    class Recording(tf.keras.Model):
        def train_step(self, data):  # eager (run_eagerly): which batch of the stream this step trains on
            trained.append(int(data[0].numpy()[0, 0]))
            return {"loss": 0.0}

    class Batches(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            seen.append((epoch, []))

        def on_train_batch_begin(self, batch, logs=None):
            seen[-1][1].append(batch)

    inputs = tf.keras.layers.Input((1,))
    model = Recording(inputs, tf.keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    stream = tf.data.Dataset.range(100).map(lambda i: (tf.fill([1, 1], tf.cast(i, tf.float32)), tf.zeros([1, 1])))
    with EnterAt(1, 3).entering(model):
        model.fit(stream, steps_per_epoch=5, epochs=3, initial_epoch=1, callbacks=[Batches()], verbose=0)
    assert model._training_state is None
    assert seen == [(1, [3, 4]), (2, [0, 1, 2, 3, 4])]
    assert trained == list(range(7))  # 2 batches of the stream for the resumed epoch, then 5: one stream
    with EnterAt(1, 0).entering(model):  # an epoch's start: nothing is set
        assert model._training_state is None


def test_pause_writes_the_position_on_the_clock_and_stops_on_a_signal(tmp_path):
    """The shared Checkpoints concern with the TensorFlow saver, in one process (a stand-in for Horovod's rank 0 of
    1): the clock's verdict writes the mid-epoch checkpoint and goes on, a signal's writes it and raises the stop
    line naming it, an epoch's last step leaves it to the epoch's own checkpoint; load() returns the position
    written."""
    import signal
    import types

    import tensorflow as tf

    from payloads.common import checkpoint, concerns, preemption
    from payloads.tensorflow import models, runtime

    hvd = types.SimpleNamespace(rank=lambda: 0, size=lambda: 1, broadcast_object=lambda obj, root_rank, name: obj)
    cfg = types.SimpleNamespace(
        checkpoint_dir=tmp_path / "checkpoints",
        keep_checkpoints=0,
        seed=42,
        to_json=lambda: {"seed": 42},
        checkpoint_every_minutes=0,
        epochs=3,
    )
    model = models.build("tiny_cnn", 4, 16)
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    runtime.build_optimizer_state(optimizer, model)
    run = types.SimpleNamespace(
        cfg=cfg,
        hvd=hvd,
        backend=runtime.Collectives(hvd),
        model=model,
        optimizer=optimizer,
        saver=runtime.Saver(),
        settings=runtime.Settings("CPU", "float32", False, 8, 0.1, 1.0, {}),
        log=runtime.log,
        root=True,
        epoch=1,
        step=4,
        steps=10,
        doing=lambda what: None,
    )
    checkpoints = concerns.Checkpoints(run)
    stop = checkpoints.stop

    checkpoints.pause(run, None)
    run.step = 9
    stop._handler(signal.SIGTERM, None)
    checkpoints.step_end(run)  # the epoch's last step: its own checkpoint and agreement follow, no sum here
    assert not cfg.checkpoint_dir.exists()
    stop.signalled = None
    run.step = 4
    checkpoints.pause(run, "clock")
    assert [p.name for _, p in checkpoint.list_checkpoints(cfg.checkpoint_dir, ".npz")] == [
        "checkpoint-epoch-0001-step-000005.npz"
    ]
    assert stop.write_seconds is not None
    stop._handler(signal.SIGTERM, None)
    run.step = 6
    with pytest.raises(preemption.Stopped, match=r"stopped by SIGTERM: wrote .*checkpoint-epoch-0001-step-000007\.npz"):
        checkpoints.pause(run, "signal")
    path = checkpoint.latest(cfg.checkpoint_dir, ".npz")[1]
    assert runtime.load(path, model, optimizer) == runtime.Position(1, 7, 10)
    assert runtime.read_meta(path)["data_order"] == {"seed": 42, "epoch": 1, "skip": 7}
