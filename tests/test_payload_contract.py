"""The mechanical parts of docs/payload-contract.md, on a one-process run of each of the four payloads: the
common options, the outputs folder, metrics.json's schema, the closing lines, and exit code 2 for a configuration
error with nothing written."""

from __future__ import annotations

import re

import pytest
from helpers import TINY, metrics, train
from test_options import PAYLOADS, listed_options

# Every payload's options (docs/payload-contract.md, "Options"): payloads/common/options.py's COMMON groups.
COMMON = {
    "--model",
    "--data-dir",
    "--image-size",
    "--epochs",
    "--batch-size",
    "--global-batch-size",
    "--max-steps-per-epoch",
    "--base-lr",
    "--momentum",
    "--weight-decay",
    "--warmup-epochs",
    "--lr-decay-epochs",
    "--output-dir",
    "--keep-checkpoints",
    "--resume",
    "--no-resume",
    "--progress",
    "--no-progress",
    "--mlflow",
    "--no-mlflow",
    "--seed",
    "--threads",
    "--amp",
    "--no-amp",
}
SUFFIX = {"pytorch": ".pt", "segmentation": ".pt", "tensorflow": ".npz", "keras": ".npz"}
EPOCH_KEYS = {"epoch", "train_loss", "images", "images_per_sec", "epoch_seconds", "lr"}
SUMMARY_KEYS = {"epochs_run", "images", "train_seconds", "total_images_per_sec", "parameters_sha256", "ranks_identical"}


@pytest.fixture(scope="module")
def tiles(tmp_path_factory):
    from datatools.landcover import prepare, synthetic

    root = tmp_path_factory.mktemp("tiles")
    pairs = synthetic.write_tiles(root / "raw", 2, 64, 64, 6)
    prepare.prepare(root / "prepared", pairs[:1], [pairs[1]], block_size=64)
    return root / "prepared"


def arguments(payload: str, tiles) -> list[str]:
    if payload == "segmentation":
        return [
            "--model",
            "unet_tiny",
            "--image-size",
            "32",
            "--patches-per-epoch",
            "16",
            "--threads",
            "1",
            "--no-progress",
            "--warmup-epochs",
            "0",
            "--data-dir",
            str(tiles),
            "--batch-size",
            "8",
        ]
    return TINY + ["--batch-size", "16", "--max-steps-per-epoch", "4"]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_payload_offers_the_common_options(payload, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    flags = {f for option in listed_options(payload, capsys) for f in option.flags}
    assert COMMON <= flags, COMMON - flags


@pytest.mark.launches
@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_run_writes_the_outputs_metrics_and_lines_of_the_contract(payload, tiles, tmp_path):
    out = tmp_path / "out"
    proc = train(
        1,
        arguments(payload, tiles) + ["--epochs", "2", "--keep-checkpoints", "1", "--output-dir", str(out)],
        payload=payload,
    )
    m = metrics(out)
    assert set(m) == {"run", "epochs", "summary"}
    assert isinstance(m["run"]["config"], dict) and m["run"]["config"]["epochs"] == 2
    assert m["run"]["world"]["processes"] == 1 and m["run"]["world"]["device"]
    assert [e["epoch"] for e in m["epochs"]] == [1, 2]
    for record in m["epochs"]:
        assert EPOCH_KEYS <= set(record), EPOCH_KEYS - set(record)
        assert record["images"] > 0 and record["epoch_seconds"] > 0 and record["images_per_sec"] > 0
    s = m["summary"]
    assert SUMMARY_KEYS <= set(s), SUMMARY_KEYS - set(s)
    # One process cannot disagree with itself: here `ranks_identical` is only the schema's boolean. That it turns
    # False when two ranks differ by one bit is shown with 2 processes (test_distributed.py, tests/nudge).
    assert s["epochs_run"] == 2 and type(s["ranks_identical"]) is bool
    assert s["total_images_per_sec"] == pytest.approx(s["images"] / s["train_seconds"])
    assert re.fullmatch(r"[0-9a-f]{64}", s["parameters_sha256"])
    # The closing lines, each on its own line; the throughput is summary.total_images_per_sec.
    lines = [re.sub(r"^\[\d+\]<stdout>:", "", line) for line in proc.stdout.splitlines()]  # horovodrun's rank tag
    (throughput,) = [line for line in lines if line.startswith("Total images/sec: ")]
    assert float(throughput.split(": ")[1]) == pytest.approx(s["total_images_per_sec"], abs=0.051)
    for line in (
        f"Checkpoints: {out / 'checkpoints'}",
        f"TensorBoard: {out / 'tensorboard'}",
        f"Metrics: {out / 'metrics.json'}",
    ):
        assert line in lines, line
    # Outputs: the newest checkpoint (--keep-checkpoints 1) with its marker, and TensorBoard's events.
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    suffix = SUFFIX[payload]
    assert names == [f".checkpoint-epoch-0002{suffix}.complete", f"checkpoint-epoch-0002{suffix}"], names
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tensorboard").rglob("*"))


@pytest.mark.launches
@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_configuration_error_exits_2_with_one_error_line_and_writes_nothing(payload, tiles, tmp_path):
    import subprocess
    import sys

    from helpers import ROOT, env

    out = tmp_path / "out"
    # The payload itself (horovodrun reports any failing rank as its own exit 1 with a traceback of its own).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            f"payloads.{payload}.train",
            *arguments(payload, tiles),
            "--epochs",
            "0",
            "--output-dir",
            str(out),
        ],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: --epochs must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "metrics.json").exists() and not (out / "checkpoints").exists()
