"""TensorFlow (DistributedGradientTape) and Keras (model.fit + DistributedOptimizer) payloads, run as two
real Horovod processes: gradients averaged (the Keras 3 failure mode would fail here), ranks agree,
resume is exact, the LR schedule is the PyTorch payload's, Adasum follows its definition, and a SIGTERM
mid-epoch stops every rank at one step with a checkpoint the run resumes from at that step (issue 31); in one
process, the resumed input, fit() and the mid-epoch pause that resume rests on. Their input (TFRecord shards,
decoding, corrupt records, synthetic data, threads): test_tensorflow_input.py."""

import numpy as np
import pytest
from helpers import TINY, metrics, stop_lines, stopped_run, train
from tfrecord_shards import tfrecord_config, write_images, write_shards

from payloads.common import schedule
from payloads.common.config import TrainConfig

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


@pytest.mark.launches
def test_bad_input_names_the_problem_and_the_fix(tmp_path):
    """A refusal ends a real Keras process before training; the other refusals: test_options.py, in-process."""
    args = TINY + ["--epochs", "1", "--output-dir", str(tmp_path), "--data", "imagefolder", "--data-dir", "x"]
    proc = train(1, args, check=False, payload="keras")
    assert proc.returncode != 0
    assert "convert class folders to TFRecord shards" in proc.stderr + proc.stdout
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


def _two_rank_reference_tf(epochs: int, batch: int, base_lr: float, mean: bool = False) -> list[np.ndarray]:
    """The TensorFlow payload's 2-rank Adasum run, in one process: each rank's gradient on its own shard,
    combined per tensor by Adasum's definition (horovod/common/ops/adasum/adasum.h, ScaledAdd), then one
    SGD step with momentum, as DistributedGradientTape(op=Adasum) and the loop do."""

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
    cfg = TrainConfig()  # the payloads' weight decay, 1e-4
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

    from payloads.tensorflow import data

    cfg = TrainConfig(synthetic_samples=128, num_classes=4, image_size=16, epochs=2)
    whole = data.build(cfg, rank=1, size=2, batch=8, start_epoch=0, threads=1)
    resumed = data.build(cfg, rank=1, size=2, batch=8, start_epoch=0, threads=1, skip=3, written_steps=8)
    assert (whole.skip, resumed.skip, resumed.steps) == (0, 3, 8)
    x_whole = [x for x, _ in whole.train.as_numpy_iterator()]
    x_resumed = [x for x, _ in resumed.train.as_numpy_iterator()]
    assert len(x_resumed) == len(x_whole) - 3 and all(np.array_equal(a, b) for a, b in zip(x_whole[3:], x_resumed))
    other = data.build(cfg, rank=1, size=2, batch=8, start_epoch=0, threads=1, skip=3, written_steps=16)
    assert other.skip == 0 and len(list(other.train)) == 16  # written in an epoch of another step count

    shards = write_shards(write_images(tmp_path / "images"), tmp_path / "shards", shards=1)
    cfg = tfrecord_config(shards, num_classes=3, epochs=3)
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
    cfg = TrainConfig(output_dir=tmp_path, keep_checkpoints=0, checkpoint_every_minutes=0, epochs=3)
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

    checkpoints._pause(run, None)
    run.step = 9
    stop._handler(signal.SIGTERM, None)
    checkpoints.step_end(run)  # the epoch's last step: its own checkpoint and agreement follow, no sum here
    assert not cfg.checkpoint_dir.exists()
    stop.signalled = None
    run.step = 4
    checkpoints._pause(run, "clock")
    assert [p.name for _, p in checkpoint.list_checkpoints(cfg.checkpoint_dir, ".npz")] == [
        "checkpoint-epoch-0001-step-000005.npz"
    ]
    assert stop.write_seconds is not None
    stop._handler(signal.SIGTERM, None)
    run.step = 6
    with pytest.raises(preemption.Stopped, match=r"stopped by SIGTERM: wrote .*checkpoint-epoch-0001-step-000007\.npz"):
        checkpoints._pause(run, "signal")
    path = checkpoint.latest(cfg.checkpoint_dir, ".npz")[1]
    assert runtime.load(path, model, optimizer) == runtime.Position(1, 7, 10)
    assert runtime.read_meta(path)["data_order"] == {"seed": 42, "epoch": 1, "skip": 7}
