"""Bad input fails before training with a message that names the problem and the fix."""

import os
import pathlib
import re
import tempfile

import pytest
from helpers import TINY, ending_of, train
from PIL import Image

from launcher import autoresume, endings
from payloads.common import imagefolder, options
from payloads.common.errors import ConfigError
from payloads.pytorch import models

MODELS = list(models.MODELS)


def parse(*args):
    # parse() creates --output-dir (config.check_output_dir): one under the session's temporary folder, not the
    # checkout's outputs/; a test's own --output-dir comes later and wins.
    out = os.path.join(tempfile.gettempdir(), "parsed-outputs")
    return options.parse(["--output-dir", out, *args], "train", "", MODELS)


def test_unknown_model_lists_the_choices():
    with pytest.raises(ConfigError, match=r"unknown model 'resnet5'.*resnet50"):
        parse("--model", "resnet5")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--data", "imagefolder"], "needs --data-dir"),
        (["--data", "tfrecord"], "read by the TensorFlow and Keras payloads"),
        (["--data", "parquet"], "choose synthetic or imagefolder"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--batch-size", "8", "--global-batch-size", "16"], "not both"),
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--lr-decay-epochs", "60,30"], "increasing"),
        (["--adasum", "--fp16-allreduce"], "cannot be combined"),
        (["--base-lr", "-1"], "must be positive"),
        (["--startup-steps", "-1"], "--startup-steps must not be negative"),
        (["--loss-scale-init", "0"], "--loss-scale-init must be positive"),
    ],
)
def test_config_errors(args, message):
    with pytest.raises(ConfigError, match=message):
        parse(*args)


def test_global_batch_below_world_size():
    cfg = parse("--global-batch-size", "1")
    with pytest.raises(ConfigError, match="below the number of processes"):
        cfg.per_process_batch(2)
    with pytest.raises(ConfigError, match="use a multiple of 2"):
        parse("--global-batch-size", "5").per_process_batch(2)
    assert parse("--global-batch-size", "64").per_process_batch(2) == 32


def test_missing_and_empty_data_directories(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        imagefolder.scan(tmp_path / "nope")
    with pytest.raises(ConfigError, match="has no class folders"):
        imagefolder.scan(tmp_path)


def test_class_folder_without_images_is_named(tmp_path):
    (tmp_path / "cat").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "cat" / "a.png")
    (tmp_path / "dog").mkdir()
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    with pytest.raises(ConfigError, match=r"class folder .*dog has no images"):
        imagefolder.scan(tmp_path)


def _tree(root: pathlib.Path, classes=3, per_class=8) -> pathlib.Path:
    for c in range(classes):
        d = root / f"class{c}"
        d.mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (20, 20), color=(80 * c, 10 * i, 40)).save(d / f"img{i}.png")
    return root


def test_a_global_batch_the_processes_cannot_share_is_refused_naming_the_fix():
    """In-process: how a refusal ends a two-process job is the missing data folder's test below."""
    with pytest.raises(ConfigError, match=r"--global-batch-size 1 is below the number of processes \(2\)"):
        parse("--global-batch-size", "1").per_process_batch(2)
    with pytest.raises(ConfigError, match="does not divide evenly over 2 processes: use a multiple of 2, e.g. 2"):
        parse("--global-batch-size", "3").per_process_batch(2)


@pytest.mark.launches
def test_missing_data_dir_fails_the_distributed_job(tmp_path):
    proc = train(
        2,
        TINY
        + [
            "--data",
            "imagefolder",
            "--data-dir",
            str(tmp_path / "missing"),
            "--epochs",
            "1",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        check=False,
    )
    assert proc.returncode != 0
    assert "missing does not exist" in proc.stderr + proc.stdout
    assert not (tmp_path / "out" / "checkpoints").exists(), "nothing may be trained or written"


@pytest.mark.launches
def test_corrupt_image_fails_naming_the_file_or_is_skipped_and_counted(tmp_path):
    data = _tree(tmp_path / "data")
    bad = data / "class1" / "img3.png"
    bad.write_bytes(b"\x89PNG this is not a picture")
    args = [
        "--model",
        "tiny_cnn",
        "--image-size",
        "16",
        "--data",
        "imagefolder",
        "--data-dir",
        str(data),
        "--batch-size",
        "4",
        "--epochs",
        "1",
        "--workers",
        "0",
        "--threads",
        "1",
        "--no-progress",
    ]
    failed = train(2, args + ["--output-dir", str(tmp_path / "strict")], check=False)
    assert failed.returncode != 0
    assert f"cannot decode image {bad}" in failed.stderr + failed.stdout
    # the rank that did not meet it: Horovod shut down under it, said in one line, not a traceback (horovodrun's own
    # traceback after it is horovodrun's)
    assert not re.search(r"^\[\d\]<std(err|out)>:Traceback", failed.stderr + failed.stdout, re.M), failed.stderr[-3000:]
    assert "--skip-corrupt-images" in failed.stderr + failed.stdout
    ending, decision = ending_of(tmp_path / "strict", failed.returncode)  # auto-resume: a rerun fails the same way
    assert (ending.kind, ending.exit_code, decision.action) == (endings.PERMANENT, 2, autoresume.STOP), ending
    # the same through data-loader worker processes (as the cluster jobs run)
    failed = train(2, args + ["--output-dir", str(tmp_path / "strict-workers"), "--workers", "1"], check=False)
    assert failed.returncode != 0 and f"cannot decode image {bad}" in failed.stderr + failed.stdout

    train(2, args + ["--output-dir", str(tmp_path / "lenient"), "--skip-corrupt-images"])
    from helpers import metrics

    epoch = metrics(tmp_path / "lenient")["epochs"][0]
    assert epoch["skipped_images"] == 1
    assert epoch["images"] == 3 * 8 - 1


@pytest.mark.launches
def test_corrupt_validation_image_is_skipped_and_counted(tmp_path):
    _tree(tmp_path / "data" / "train")
    val = _tree(tmp_path / "data" / "val", per_class=4)
    (val / "class0" / "img2.png").write_bytes(b"\x89PNG this is not a picture")
    train(
        2,
        [
            "--model",
            "tiny_cnn",
            "--image-size",
            "16",
            "--data",
            "imagefolder",
            "--data-dir",
            str(tmp_path / "data"),
            "--batch-size",
            "4",
            "--epochs",
            "2",
            "--workers",
            "0",
            "--threads",
            "1",
            "--no-progress",
            "--skip-corrupt-images",
            "--output-dir",
            str(tmp_path / "out"),
        ],
    )
    from helpers import metrics

    epochs = metrics(tmp_path / "out")["epochs"]
    assert [e["val_skipped_images"] for e in epochs] == [1, 1]
    assert [e["skipped_images"] for e in epochs] == [0, 0]
    import same_numbers

    same_numbers.check("classification/horovod/imagefolder-validation", tmp_path / "out")


@pytest.mark.launches
@pytest.mark.parametrize(
    "payload,extra,message,fix",
    [
        # Adasum exists only over MPI: under Gloo the first step would fail with "No Adasum operation enabled".
        ("pytorch", [], "--adasum needs Horovod's MPI controller", "horovodrun --mpi"),
        ("tensorflow", [], "--adasum needs Horovod's MPI controller", "horovodrun --mpi"),
    ],
)
def test_adasum_combinations_horovod_cannot_run_fail_before_training(tmp_path, payload, extra, message, fix):
    proc = train(
        2,
        TINY + ["--adasum", "--epochs", "1", "--batch-size", "4", "--output-dir", str(tmp_path), *extra],
        check=False,
        payload=payload,
    )
    text = proc.stderr + proc.stdout
    assert proc.returncode != 0 and message in text, text[-3000:]
    assert fix in text, "the message names the fix for this refusal"
    assert "drop --adasum" in text
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.json").exists()


def test_adasum_needs_mpi_and_a_power_of_two_world_and_no_fp16():
    """What each payload checks once Horovod has started (hvd.size(), hvd.mpi_enabled()); the refusal ending a
    two-process job before training is the Gloo runs above. The fp16 refusal: test_precision.py; Keras's: its
    REFUSED table (test_options.py)."""
    cfg = parse("--adasum")
    for world, mpi in ((1, False), (2, True), (4, True), (8, True)):
        cfg.check_adasum_world(world, mpi)
    with pytest.raises(ConfigError, match="--adasum needs Horovod's MPI controller.*horovodrun --mpi.*drop --adasum"):
        cfg.check_adasum_world(2, False)
    with pytest.raises(ConfigError, match="power-of-two number of processes, this job has 3: use 2 or 4 processes, or"):
        cfg.check_adasum_world(3, True)
    with pytest.raises(ConfigError, match="this job has 6: use 4 or 8 processes"):
        cfg.check_adasum_world(6, True)
    parse().check_adasum_world(3, False)  # without --adasum, any world


def test_default_lr_follows_the_linear_scaling_rule_for_the_batch_used():
    """Goyal et al.: 0.1 per 256 images of the global batch; the payloads multiply the per-process LR by the
    processes (and backward passes), so the per-process default is 0.1 x its batch / 256."""
    cfg = parse("--batch-size", "64")
    assert cfg.base_lr is None
    assert cfg.per_process_batch(8) == 64 and cfg.lr_for(64) == pytest.approx(0.025)  # job LR 0.2 = 0.1 x 512 / 256
    cfg = parse("--global-batch-size", "1024")
    assert cfg.per_process_batch(4) == 256 and cfg.lr_for(256) == pytest.approx(0.1)  # job LR 0.4 = 0.1 x 1024 / 256
    cfg = parse("--batch-size", "64", "--base-lr", "0.05")
    cfg.per_process_batch(2)
    assert cfg.base_lr == 0.05, "an explicit --base-lr wins"
    text = " ".join(options.build_parser("train", "").format_help().split())  # argparse wraps lines
    assert "Goyal" in text and "0.1 per 256 images" in text


@pytest.mark.launches
@pytest.mark.parametrize("payload", ["pytorch", "tensorflow"])
def test_unwritable_output_dir_is_named_before_training(tmp_path, payload):
    """A file where the folder should be, and a folder no one can create (root included: /proc), each named
    with the flag before Horovod or TensorFlow starts."""
    import subprocess

    from helpers import ROOT, env, python_m

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out, expected in (
        (blocker / "run", "is a file, not a folder"),
        (pathlib.Path("/proc/no-such/run"), "is not writable"),
    ):
        proc = subprocess.run(
            [*python_m(f"payloads.{payload}.train"), *TINY, "--epochs", "1", "--output-dir", str(out)],
            cwd=ROOT,
            env=env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"--output-dir {out}" in proc.stderr and expected in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
