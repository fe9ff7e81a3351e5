"""Metrics in the Azure ML studio: rank 0 logs the run to MLflow where MLFLOW_TRACKING_URI points (Azure ML sets
it, with MLFLOW_RUN_ID, in every job). Tested with real 2-process jobs against MLflow's file store: one run,
params and per-epoch metrics equal to metrics.json, for every payload; bad tracking set-ups fail before training."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
from helpers import ROOT, TINY, env, horovodrun, metrics

from payloads.common import tracking
from payloads.common.errors import ConfigError
from payloads.common.metrics import MetricsFile


def _store_env(store: pathlib.Path, **extra) -> dict:
    e = env()
    e.pop("MLFLOW_RUN_ID", None)
    e.update(
        {
            "MLFLOW_TRACKING_URI": store.as_uri(),
            # MLflow 3.x refuses new file stores unless asked (it wants a database; skinny has no SQL store)
            "MLFLOW_ALLOW_FILE_STORE": "true",
            **extra,
        }
    )
    return e


def _run(np: int, args: list[str], e: dict, payload: str = "pytorch") -> subprocess.CompletedProcess:
    return subprocess.run(horovodrun(np, args, payload), cwd=ROOT, env=e, capture_output=True, text=True, timeout=600)


def _param_strings(run_record: dict) -> dict[str, str]:
    """What the params must be, written apart from tracking.flatten: MLflow params are flat strings, one per leaf
    of metrics.json's run record, named by the dotted path and read as metrics.json reads (JSON: null, true)."""
    out, todo = {}, [((), run_record)]
    while todo:
        path, node = todo.pop()
        if isinstance(node, dict):
            todo += [((*path, key), value) for key, value in node.items()]
        else:
            out[".".join(path)] = node if isinstance(node, str) else json.dumps(node)
    return out


def _client(store: pathlib.Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store.as_uri())


def _runs(store: pathlib.Path):
    client = _client(store)
    return client, [r for exp in client.search_experiments() for r in client.search_runs([exp.experiment_id])]


# The TensorFlow payloads' runs here also carry the thread test: each records the threads it got, read back from
# TensorFlow and from its training dataset's options, for --threads 0 (one per core of the process's share) and 2.
THREADS = {"pytorch": None, "tensorflow": "0", "keras": "2"}


@pytest.mark.launches
@pytest.mark.parametrize("payload", ["pytorch", "tensorflow", "keras"])
def test_rank_zero_logs_one_run_equal_to_metrics_json(tmp_path, monkeypatch, payload):
    store, out = tmp_path / "mlruns", tmp_path / "out"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for this process's client
    args = TINY + ["--epochs", "2", "--batch-size", "8", "--output-dir", str(out)]
    threads = THREADS[payload]
    if threads is not None:
        i = args.index("--threads")
        args = args[:i] + args[i + 2 :] + ["--threads", threads, "--workers", "3"]
    proc = _run(2, args, _store_env(store), payload)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = metrics(out)
    if threads is not None:
        from payloads.tensorflow import runtime

        world, cores = m["run"]["world"], runtime.available_cores()
        want = runtime.thread_plan(int(threads), cores, 2, 3)
        assert world["threads"] == {
            "intra_op": want.intra_op,
            "inter_op": want.inter_op,
            "tf_data_private": want.data,
            "cores_available": cores,
        }
        assert world["threads_per_process"] == want.intra_op
        assert world["synthetic"]["distinct_images"] == 128 and world["synthetic"]["device"].endswith("CPU:0")

    client, runs = _runs(store)
    assert len(runs) == 1, f"rank 0 alone logs: expected one run, found {len(runs)}"
    run = runs[0]
    assert run.info.status == "FINISHED"
    # params: metrics.json's run record (config and world), flattened
    assert run.data.params == _param_strings(m["run"])
    assert run.data.params["config.model"] == "tiny_cnn" and run.data.params["world.processes"] == "2"
    # per-epoch metrics: every number of every epoch record, at step = epoch
    for key in ("train_loss", "train_accuracy", "images_per_sec", "lr", "images", "epoch_seconds"):
        history = sorted((h.step, h.value) for h in client.get_metric_history(run.info.run_id, key))
        assert history == [(e["epoch"], e[key]) for e in m["epochs"]], key
    # the final throughput and the ranks' agreement
    assert run.data.metrics["summary.total_images_per_sec"] == m["summary"]["total_images_per_sec"] > 0
    assert run.data.metrics["summary.images"] == m["summary"]["images"]
    if payload == "pytorch":
        # PyTorch's throughput is steady state: the first --startup-steps (10) of each rank's 8-image steps are out
        assert m["summary"]["all_images"] == 2 * 128 == run.data.metrics["summary.all_images"]
        assert m["summary"]["images"] == 2 * 128 - 2 * 10 * 8
    else:
        assert m["summary"]["images"] == 2 * 128
    assert run.data.tags["summary.parameters_sha256"] == m["summary"]["parameters_sha256"]
    assert run.data.tags["summary.ranks_identical"] == "true"


@pytest.mark.launches
def test_the_job_run_named_by_azure_ml_is_continued(tmp_path, monkeypatch):
    """Azure ML hands the job its run (MLFLOW_RUN_ID): metrics go to that run, no second one is made."""
    store, out = tmp_path / "mlruns", tmp_path / "out"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = _client(store)
    job_run = client.create_run(client.create_experiment("job-experiment")).info.run_id
    proc = _run(
        2,
        TINY + ["--epochs", "1", "--batch-size", "8", "--output-dir", str(out)],
        _store_env(store, MLFLOW_RUN_ID=job_run),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _, runs = _runs(store)
    assert [r.info.run_id for r in runs] == [job_run]
    assert runs[0].data.metrics["summary.total_images_per_sec"] == metrics(out)["summary"]["total_images_per_sec"]


def test_no_tracking_without_the_variable_or_with_no_mlflow(tmp_path, monkeypatch):
    monkeypatch.delenv(tracking.URI, raising=False)
    assert tracking.start({"config": {"mlflow": True}}) is None
    monkeypatch.setenv(tracking.URI, (tmp_path / "mlruns").as_uri())
    assert tracking.start({"config": {"mlflow": False}}) is None
    assert tracking.tracking_uri(True) == (tmp_path / "mlruns").as_uri()


@pytest.mark.launches
def test_azure_ml_uri_without_the_plugin_fails_before_training(tmp_path):
    """.venv has no azureml-mlflow (the images do): an azureml:// URI is exactly the set-up that cannot track."""
    uri = (
        "azureml://westeurope.api.azureml.ms/mlflow/v1.0/subscriptions/s/resourceGroups/g/providers/"
        "Microsoft.MachineLearningServices/workspaces/w"
    )
    with pytest.raises(ConfigError, match=r"azureml-mlflow plugin is not installed: install .*--no-mlflow"):
        tracking.check(True, {tracking.URI: uri})
    tracking.check(False, {tracking.URI: uri})  # --no-mlflow: nothing to check
    proc = _run(
        2, TINY + ["--epochs", "1", "--batch-size", "8", "--output-dir", str(tmp_path)], {**env(), tracking.URI: uri}
    )
    assert proc.returncode != 0
    assert "azureml-mlflow plugin is not installed" in proc.stderr
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.json").exists()
    # --no-mlflow trains without it
    ok = _run(
        1,
        TINY + ["--epochs", "1", "--batch-size", "8", "--no-mlflow", "--output-dir", str(tmp_path / "ok")],
        {**env(), tracking.URI: uri},
    )
    assert ok.returncode == 0, ok.stderr[-3000:]


def test_missing_mlflow_is_named_with_its_fix(monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "mlflow" else real(name))
    with pytest.raises(ConfigError, match=r"MLflow is not installed: install mlflow-skinny and azureml-mlflow"):
        tracking.check(True, {tracking.URI: "http://tracking.example:5000"})


def test_a_store_that_cannot_start_fails_before_training_naming_the_fix(tmp_path, monkeypatch):
    # MLflow's own refusal (a file store without MLFLOW_ALLOW_FILE_STORE) stands for any start-up failure.
    monkeypatch.setenv(tracking.URI, (tmp_path / "mlruns").as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    with pytest.raises(ConfigError, match=r"cannot start: .*MLFLOW_ALLOW_FILE_STORE.*--no-mlflow"):
        MetricsFile(tmp_path / "metrics.json", {"config": {"model": "m"}})


@pytest.mark.launches
def test_a_logging_failure_mid_run_warns_and_keeps_metrics_json(tmp_path, monkeypatch, caplog):
    import mlflow

    monkeypatch.setenv(tracking.URI, (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    m = MetricsFile(tmp_path / "metrics.json", {"config": {"model": "m"}})

    def unreachable(*args, **kwargs):
        raise ConnectionError("workspace unreachable")

    monkeypatch.setattr(mlflow, "log_metrics", unreachable)
    m.add_epoch({"epoch": 1, "train_loss": 0.5})
    m.set_summary({"total_images_per_sec": 10.0, "ranks_identical": True})
    assert metrics(tmp_path)["epochs"] == [{"epoch": 1, "train_loss": 0.5}]
    assert "could not log the epoch metrics (workspace unreachable)" in caplog.text
    assert mlflow.active_run() is None, "the run is ended all the same"


def test_a_restarted_job_with_changed_params_keeps_training(tmp_path, monkeypatch, caplog):
    """Azure ML restarts a preempted job in its own run: params logged again must not stop it, even changed."""
    monkeypatch.setenv(tracking.URI, (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    first = MetricsFile(tmp_path / "metrics.json", {"config": {"epochs": 2}, "world": {"threads_per_process": 4}})
    first.set_summary({"total_images_per_sec": 1.0})
    monkeypatch.setenv("MLFLOW_RUN_ID", first.tracker.run_id)
    again = MetricsFile(tmp_path / "metrics.json", {"config": {"epochs": 2}, "world": {"threads_per_process": 8}})
    again.add_epoch({"epoch": 2, "train_loss": 0.25})
    again.set_summary({"total_images_per_sec": 2.0})
    assert again.tracker.run_id == first.tracker.run_id
    assert "could not log the params" in caplog.text
    history = _client(tmp_path / "mlruns").get_metric_history(first.tracker.run_id, "train_loss")
    assert [(h.step, h.value) for h in history] == [(2, 0.25)]


def _pins(path: str) -> dict[str, str]:
    text = (ROOT / path).read_text()
    return {
        m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==(\S+)", text, re.M)
    }


@pytest.mark.launches
@pytest.mark.one_core
def test_tensorboard_events_are_written_without_importing_tensorflow(tmp_path):
    """The PyTorch payloads' writer uses tensorboard's stub, not TensorFlow, which .venv also holds (about 4 s
    at every start): the events it writes are still TensorBoard's, read back with tensorboard's own reader."""
    code = (
        "import sys; from payloads.pytorch import runtime; w = runtime.summary_writer(sys.argv[1]); "
        "w.add_scalar('loss', 0.5, 3); w.close(); print('tensorflow' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "False", "TensorFlow was imported by the PyTorch payload's TensorBoard writer"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(3, 0.5)]


def test_both_images_carry_mlflow_and_the_azure_ml_plugin_at_the_same_pins():
    payloads = _pins("payloads/requirements.txt") | _pins("payloads/azureml-requirements.txt")
    tf = _pins("images/tensorflow/requirements.txt")
    for package in ("mlflow-skinny", "azureml-mlflow"):
        assert package in payloads and tf.get(package) == payloads[package], package
    assert _pins("constraints.txt")["mlflow-skinny"] == payloads["mlflow-skinny"]
    # The PyTorch image installs payloads/requirements.txt and, unconstrained, the plugin list.
    dockerfile = (ROOT / "images/pytorch/Dockerfile").read_text()
    assert re.search(r"^COPY .*payloads/azureml-requirements\.txt", dockerfile, re.M)
    assert re.search(r"pip install [^\n]*-r /src/payloads/azureml-requirements\.txt", dockerfile)
