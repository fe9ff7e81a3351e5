"""tf.data input for the TensorFlow and Keras payloads: synthetic images and TFRecord shards, sharded by rank.

Both give one stream of batches (x, labels) that runs through every remaining epoch (Keras' fit and our loop
take `steps` batches per epoch from it), with the same step count on every rank. x is decoded images for
TFRecords; for synthetic data it is positions in a pool of images on the device, which Input.prepare turns
into images inside the training step.

Resumed inside an epoch (a mid-epoch checkpoint, `skip` steps of the first epoch done), the stream starts at that
epoch's step `skip` (Input.skip), so its first epoch has steps - skip batches:
- synthetic: the order is a function of (seed, epoch, rank) (common/sharding.py), so the rest of the epoch is the
  batches the stopped run would have trained on, the same samples in the same order;
- TFRecords: the shuffle is seeded from (seed, the epoch the run starts at, rank), so the run resumed at step S of
  epoch E reads what a run started at epoch E would read from its S x batch-th record on, skipped unread (no
  decode). That is the stopped run's own order only when the stopped run had itself started at epoch E (a run
  started at epoch 0 and stopped in it, say); otherwise, as for a resume at an epoch's end, the records of the
  rest of the epoch come from another shuffle. The random crops and flips are drawn anew either way.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from ..common import sharding
from ..common.errors import ConfigError
from . import tfrecords

log = logging.getLogger("payloads.tensorflow")

# ImageNet channel statistics (0-255 scale), as the PyTorch payload's normalisation. Plain tuples: a
# tf.constant at import would start TensorFlow's runtime before the payload sets its thread counts.
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class SkipCounter:
    """The records --skip-corrupt-images drops on this rank, per epoch, each counted once per epoch: a rank whose
    share holds fewer good records than an epoch trains on reads its share again within the epoch (the stream
    repeats), and meets the same bad record again. Every record of the stream carries its position in the
    rank's share (`record`) and whether it decoded; an epoch is `per_epoch` good records, so the epoch of any
    record read is the good records before it // per_epoch, whatever the pipeline reads ahead."""

    def __init__(self, records: int, per_epoch: int, epochs: int):
        self.per_epoch = tf.constant(per_epoch, tf.int64)
        self.last = tf.constant(epochs, tf.int64)  # slot for what is read ahead past the run's last epoch
        self.kept = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.counted_in = tf.Variable(tf.fill([records], tf.constant(-1, tf.int64)), trainable=False)
        self.counts = tf.Variable(tf.zeros([epochs + 1], tf.int64), trainable=False)
        self._epoch = 0

    def see(self, image, label, record, ok):
        """Runs on every record in stream order (a sequential map): counts a bad record once per epoch."""
        epoch = tf.minimum(self.kept.read_value() // self.per_epoch, self.last)
        before = self.counted_in.sparse_read(record)  # the epoch this record was last counted in
        fresh = tf.logical_and(tf.logical_not(ok), tf.not_equal(before, epoch))
        with tf.control_dependencies([epoch, before]):
            updates = [
                self.counts.scatter_nd_add([[epoch]], [tf.cast(fresh, tf.int64)]),
                self.counted_in.scatter_nd_update([[record]], [tf.where(fresh, epoch, before)]),
                self.kept.assign_add(tf.cast(ok, tf.int64)),
            ]
        with tf.control_dependencies(updates):
            return tf.identity(image), tf.identity(label), tf.identity(ok)

    def epoch_done(self) -> int:
        """Records dropped in the epoch that just ended (call once after each epoch)."""
        dropped = int(self.counts[min(self._epoch, int(self.last))].numpy())
        self._epoch += 1
        return dropped


class ValidationSkips:
    """Validation records --skip-corrupt-images drops on this rank, per pass: a pass reads this rank's whole
    share once (no repeat, nothing read ahead into the next pass), so dropped = its records - records kept."""

    def __init__(self, expected: int):
        self.expected = expected
        self.kept = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._before = 0

    def keep(self, image, label):
        with tf.control_dependencies([self.kept.assign_add(1)]):
            return tf.identity(image), tf.identity(label)

    def pass_done(self) -> int:
        """Records dropped by the pass that just ended."""
        now = int(self.kept.numpy())
        kept, self._before = now - self._before, now
        return self.expected - kept


def identity(x):
    return x


def entry_step(step: int, written_steps: int | None, steps: int, rank: int = 0) -> int:
    """The step a run resumed from a checkpoint written `step` steps into an epoch of `written_steps` steps
    enters that epoch at, when this run's epoch has `steps`: the same step, or 0 (the epoch starts again, with a
    warning) when the step counts differ (another world size, batch or --max-steps-per-epoch)."""
    if step <= 0:
        return 0
    if written_steps == steps and step < steps:
        return step
    if rank == 0:
        log.warning(
            "the checkpoint was written %d steps into an epoch of %s steps; this run's epoch has %d (another world "
            "size, batch or --max-steps-per-epoch): the epoch starts again from its first step",
            step,
            written_steps,
            steps,
        )
    return 0


@dataclass
class Input:
    train: tf.data.Dataset  # batches (x, labels int32) for every remaining epoch
    steps: int  # per epoch, equal on every rank
    num_classes: int
    validation: tf.data.Dataset | None = None  # this rank's share, one pass
    skips: SkipCounter | None = None  # training records dropped as corrupt (--skip-corrupt-images)
    val_skips: ValidationSkips | None = None
    # x -> images NHWC float32, run inside the training step on its device: synthetic x are pool positions
    prepare: Callable[[tf.Tensor], tf.Tensor] = identity
    description: dict = field(default_factory=dict)  # for metrics.json's world record
    skip: int = 0  # steps of the first epoch done before (a mid-epoch resume): `train` starts after them

    def private_threads(self) -> int:
        """tf.data's private threadpool size, as the training dataset carries it (0: TensorFlow's default)."""
        return int(self.train.options().threading.private_threadpool_size or 0)

    def epoch_skipped(self) -> int:
        """Call once after each epoch."""
        return self.skips.epoch_done() if self.skips else 0

    def validation_skipped(self) -> int:
        """Call once after each validation pass."""
        return self.val_skips.pass_done() if self.val_skips else 0


# The synthetic pool's cap: 128 MiB of float32 images (222 distinct images at 224 px), small beside a
# GPU's memory; an epoch of --synthetic-samples cycles through them (sample i is pool image i % size).
POOL_BYTES = 128 << 20
# Images drawn per stateless random call: image i's values depend on (seed, i) alone, not on the pool size.
CHUNK = 64


class SyntheticImages:
    """A learnable stand-in for ImageNet, made once on the device with vectorised TensorFlow ops (Horovod's
    synthetic benchmarks make their one batch there too): each class a smooth random pattern, each image its
    class pattern plus noise, deterministic per (seed, index) on every rank and every resume. At most
    `max_bytes` of distinct images are kept; each step gathers its batch from them on the device, so the
    input costs no host work and no host-to-device copy of images."""

    def __init__(
        self,
        num_samples: int,
        num_classes: int,
        image_size: int,
        seed: int,
        noise: float = 1.0,
        max_bytes: int = POOL_BYTES,
    ):
        self.num_samples = num_samples
        self.distinct = max(1, min(num_samples, max_bytes // (image_size * image_size * 3 * 4)))
        s, reps = image_size, -(-image_size // 8)
        patterns = tf.random.stateless_normal((num_classes, 8, 8, 3), seed=(seed, 0))
        images, labels = [], []
        for k in range(-(-self.distinct // CHUNK)):
            label = tf.random.stateless_uniform((CHUNK,), seed=(seed, 2 * k + 1), maxval=num_classes, dtype=tf.int32)
            coarse = tf.gather(patterns, label)
            pattern = tf.repeat(tf.repeat(coarse, reps, axis=1), reps, axis=2)[:, :s, :s]
            images.append(pattern + noise * tf.random.stateless_normal((CHUNK, s, s, 3), seed=(seed, 2 * k + 2)))
            labels.append(label)
        self.images = tf.concat(images, 0)[: self.distinct]  # on the GPU when there is one
        self._labels = tf.concat(labels, 0)[: self.distinct].numpy()

    def __len__(self) -> int:
        return self.num_samples

    def slots(self, indices: np.ndarray) -> np.ndarray:
        """Pool positions of samples `indices`."""
        return (np.asarray(indices) % self.distinct).astype(np.int32)

    def labels(self, indices: np.ndarray) -> np.ndarray:
        return self._labels[self.slots(indices)]

    def take(self, slots: tf.Tensor) -> tf.Tensor:
        """The images at pool positions `slots`, gathered where the pool lives (inside the training step)."""
        return tf.gather(self.images, slots)

    def batch(self, indices: np.ndarray) -> tuple[tf.Tensor, np.ndarray]:
        return self.take(self.slots(indices)), self.labels(indices)


def synthetic_batches(
    samples: int, rank: int, size: int, batch: int, seed: int, start_epoch: int, epochs: int, steps: int, skip: int = 0
):
    """This rank's sample indices, one array per epoch from `start_epoch` to `epochs`, `steps` batches each but the
    first, which starts at step `skip`: the order is a function of (seed, epoch, rank) alone."""
    for epoch in range(start_epoch, epochs):
        indices = np.stack(sharding.batches(samples, rank, size, batch, seed, epoch)[:steps])
        yield indices[skip:] if epoch == start_epoch else indices


def synthetic(cfg, rank: int, size: int, batch: int, start_epoch: int, skip: int = 0, written_steps=None) -> Input:
    """Batches of (pool positions, labels): a few bytes per sample through tf.data; the training step
    turns positions into images on the device (Input.prepare)."""
    data = SyntheticImages(cfg.synthetic_samples, cfg.num_classes, cfg.image_size, cfg.seed)
    try:
        sharding.batches(len(data), rank, size, batch, cfg.seed, epoch=0)  # fail now, not mid-epoch
    except ValueError as e:
        raise ConfigError(f"{e} (data set of {len(data)} samples)") from None
    steps = sharding.steps_per_epoch(len(data), size, batch)
    if cfg.max_steps_per_epoch:
        steps = min(steps, cfg.max_steps_per_epoch)
    skip = entry_step(skip, written_steps, steps, rank)

    def epochs():
        for indices in synthetic_batches(len(data), rank, size, batch, cfg.seed, start_epoch, cfg.epochs, steps, skip):
            yield data.slots(indices), data.labels(indices)

    ds = tf.data.Dataset.from_generator(
        epochs, output_signature=(tf.TensorSpec((None, batch), tf.int32), tf.TensorSpec((None, batch), tf.int32))
    ).unbatch()
    return Input(
        ds.prefetch(2),
        steps,
        cfg.num_classes,
        prepare=data.take,
        description={"distinct_images": data.distinct, "device": data.images.device},
        skip=skip,
    )


def _decode(record, image_size: int, num_classes: int, train: bool):
    image, label = _decode_image(record, image_size, train)
    return image, _checked(label, num_classes)


def _checked(label, num_classes: int):
    tf.debugging.assert_less(label, num_classes, message=LABEL_HINT)
    return label


def _decode_image(record, image_size: int, train: bool):
    """(image, label) of one record; raises on a record that does not parse or an image that does not decode."""
    ex = tf.io.parse_single_example(record, tfrecords.feature_spec())
    label = tf.cast(ex["image/class/label"], tf.int32)
    if train:
        # Inception-style random resized crop and flip, as torchvision's RandomResizedCrop.
        image = _random_crop(ex["image/encoded"])
        image = tf.image.resize(image, (image_size, image_size))
        image = tf.image.random_flip_left_right(image)
    else:
        image = tf.io.decode_image(ex["image/encoded"], channels=3, expand_animations=False)
        shorter = tf.cast(tf.reduce_min(tf.shape(image)[:2]), tf.float32)
        scale = image_size * 256 / 224 / shorter
        hw = tf.cast(tf.round(tf.cast(tf.shape(image)[:2], tf.float32) * scale), tf.int32)
        image = tf.image.resize_with_crop_or_pad(tf.image.resize(image, hw), image_size, image_size)
    image = (tf.cast(image, tf.float32) - MEAN) / STD
    return image, label


def _crop_window(shape, seed: int = 0):
    """(begin, extent) of a random resized crop of an image of `shape` [height, width, 3], for tf.slice: 8-100% of
    its area, aspect ratio 3/4-4/3, the whole image after 10 misses. seed 0 (training's): a fresh draw every run."""
    begin, extent, _ = tf.image.sample_distorted_bounding_box(
        shape,
        tf.zeros([0, 0, 4]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return begin, extent


def _whole_jpeg(contents):
    """A JPEG (the bytes decode_image takes for one) that ends in its end-of-image marker. A crop decode reads only
    as far as the window's last row, so it would accept a JPEG cut off below the window; one without the marker
    at its end (cut off, or with bytes after it) is decoded whole instead, and fails or decodes as it always has."""
    end = tf.strings.substr(contents, tf.maximum(tf.strings.length(contents) - 2, 0), 2)
    return tf.logical_and(tf.io.is_jpeg(contents), tf.equal(end, b"\xff\xd9"))


def _jpeg_window(contents, begin, extent, width):
    """The window (begin, extent: tf.slice's) of a JPEG `width` pixels wide, uint8 [h, w, 3], decoded alone
    with decode_and_crop_jpeg, plus one column either side (dropped after) where the image goes on: libjpeg-turbo
    upsamples the chroma of a decoded region's edge columns as if they were the image's, so without the margin the
    crop of a JPEG with subsampled chroma (4:2:0, 4:2:2, 4:1:1) differs from the whole decode's in its first or
    last column. With it, the crop is the whole decode's, bit for bit."""
    y, x, h, w = begin[0], begin[1], extent[0], extent[1]
    left, right = tf.cast(x > 0, tf.int32), tf.cast(x + w < width, tf.int32)
    wider = tf.image.decode_and_crop_jpeg(contents, tf.stack([y, x - left, h, w + left + right]), channels=3)
    return wider[:, left : left + w]


def _random_crop(contents):
    """The training crop of an encoded image, uint8 [h, w, 3]. A JPEG decodes only the window, drawn from the
    shape in its header (_jpeg_window); other images (PNG, GIF, BMP, a JPEG cut off) are decoded whole and
    sliced, as before. The window is drawn by the same op from the same shape either way."""
    jpeg = _whole_jpeg(contents)

    def header():
        return tf.zeros([0, 0, 3], tf.uint8), tf.io.extract_jpeg_shape(contents)[:2]

    def decoded():
        image = tf.io.decode_image(contents, channels=3, expand_animations=False)
        return image, tf.shape(image)[:2]

    whole, hw = tf.cond(jpeg, header, decoded)
    begin, extent = _crop_window(tf.concat([hw, [3]], 0))
    return tf.cond(jpeg, lambda: _jpeg_window(contents, begin, extent, hw[1]), lambda: tf.slice(whole, begin, extent))


def _decoded_or_flagged(image_size: int):
    """record -> a one-element dataset: (image, label, record position, True), or placeholders and False when the
    record does not decode. tf.data's ignore_errors drops a bad element without a trace; inside this one-element
    dataset it lets the stream keep the bad record's position, so it can be counted once (SkipCounter)."""

    def attempt(position, record):
        good = (
            tf.data.Dataset.from_tensors(record)
            .map(lambda r: _decode_image(r, image_size, True))
            .ignore_errors(log_warning=True)
            .map(lambda image, label: (image, label, position, True))
        )
        bad = tf.data.Dataset.from_tensors(
            (tf.zeros([image_size, image_size, 3], tf.float32), tf.constant(-1, tf.int32), position, False)
        )
        return good.concatenate(bad).take(1)

    return attempt


def _records(files, record_shard: bool, rank: int, size: int, parallel) -> tf.data.Dataset:
    ds = tf.data.Dataset.from_tensor_slices([str(f) for f in files])
    cycle = min(8, len(files))
    # tf.data refuses more parallel calls than files in the cycle (a rank reading one file with --workers 2)
    ds = ds.interleave(
        tf.data.TFRecordDataset,
        cycle_length=cycle,
        num_parallel_calls=min(parallel, cycle) if parallel else None,
        deterministic=True,
    )
    return ds.shard(size, rank) if record_shard else ds


def tfrecord(cfg, rank: int, size: int, batch: int, start_epoch: int, skip: int = 0, written_steps=None) -> Input:
    train_files, val_files = tfrecords.find(pathlib.Path(cfg.data_dir))
    counts = [tfrecords.count_records(f) for f in train_files]
    p = tfrecords.plan(train_files, counts, rank, size, batch)
    if p.record_shard and size > 1 and rank == 0:
        log.warning(
            "%d TFRecord files are not a multiple of %d processes: every process reads every file and "
            "keeps every %d-th record; write a multiple of %d shards so that each reads only its own",
            len(train_files),
            size,
            size,
            size,
        )
    steps = min(p.steps, cfg.max_steps_per_epoch) if cfg.max_steps_per_epoch else p.steps
    skip = entry_step(skip, written_steps, steps, rank)
    parallel = cfg.workers if cfg.workers > 0 else None  # None: one decode at a time (reproducible order)
    ds = _records(p.files, p.record_shard, rank, size, parallel)
    if cfg.skip_corrupt_images:
        ds = ds.enumerate()  # each record's position in this rank's share, the same in every pass
    # Shuffle within a buffer (a shard does not fit in memory), reshuffled each epoch; every rank's stream
    # repeats, so skipped corrupt records never leave a rank short of batches.
    ds = ds.shuffle(
        min(10_000, p.samples), seed=cfg.seed * 1_000_003 + start_epoch * 4099 + rank, reshuffle_each_iteration=True
    ).repeat()
    skips = None
    if cfg.skip_corrupt_images:
        skips = SkipCounter(p.samples, steps * batch, cfg.epochs - start_epoch)
        ds = ds.interleave(
            _decoded_or_flagged(cfg.image_size),
            cycle_length=parallel or 1,
            block_length=1,
            num_parallel_calls=parallel,
            deterministic=True,
        )  # in stream order
        ds = ds.map(lambda image, label, position, ok: skips.see(image, label, position, ok))  # sequential
        ds = ds.filter(lambda image, label, ok: ok).map(
            lambda image, label, ok: (image, _checked(label, cfg.num_classes))
        )
        # After the filter: the first epoch's skipped steps are its first good records (decoded, to be counted).
        ds = ds.skip(skip * batch)
    else:
        # Before the decode: every record makes a sample, so the skipped steps are records never decoded.
        ds = ds.skip(skip * batch)
        ds = ds.map(lambda r: _decode(r, cfg.image_size, cfg.num_classes, True), num_parallel_calls=parallel)
    ds = ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    val = val_skips = None
    if val_files:
        v = tfrecords.plan(val_files, [tfrecords.count_records(f) for f in val_files], rank, size, 1)
        val = _records(v.files, v.record_shard, rank, size, parallel).map(
            lambda r: _decode(r, cfg.image_size, cfg.num_classes, False), num_parallel_calls=parallel
        )
        if cfg.skip_corrupt_images:
            val_skips = ValidationSkips(v.samples)
            val = val.ignore_errors(log_warning=True).map(val_skips.keep)
        val = val.batch(batch).prefetch(tf.data.AUTOTUNE)
    return Input(ds, steps, cfg.num_classes, val, skips, val_skips, skip=skip)


def build(
    cfg, rank: int, size: int, batch: int, start_epoch: int, threads: int, skip: int = 0, written_steps=None
) -> Input:
    """Every input problem is raised here, before a step is trained. `threads`: the private threadpool
    tf.data runs this process's input functions on (else they share TensorFlow's inter-op pool). `skip`,
    `written_steps`: a mid-epoch checkpoint's step and its epoch's step count (runtime.Position); the stream
    starts at that step of `start_epoch` when this run's epoch has as many steps (Input.skip: entry_step)."""
    source = synthetic if cfg.data == "synthetic" else tfrecord
    inputs = source(cfg, rank, size, batch, start_epoch, skip, written_steps)
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    inputs.train = inputs.train.with_options(options)
    if inputs.validation is not None:
        inputs.validation = inputs.validation.with_options(options)
    return inputs


LABEL_HINT = (
    "a TFRecord label is not below --num-classes: pass the data's class count as --num-classes "
    "(ImageNet shards from TensorFlow's scripts number classes from 1: use 1001)"
)
CORRUPT_HINT = (
    "an image in the TFRecord shards does not decode: list the bad records with "
    "python -m payloads.tensorflow.tfrecords --check DATA_DIR, or pass --skip-corrupt-images to skip them"
)


def input_error(e: Exception) -> str:
    """The message for an error tf.data raised while reading the shards: a label out of range or a bad image."""
    text = str(e)
    return LABEL_HINT if LABEL_HINT in text else f"{CORRUPT_HINT} ({text.splitlines()[0][:200]})"
