"""The run's params and metrics in MLflow, which is how the Azure ML studio shows a job's metrics.

Azure ML configures MLflow in every job it runs: MLFLOW_TRACKING_URI points at the workspace
(azureml://...) and MLFLOW_RUN_ID names the job's own run, set by the runtime and overriding the job's own
values ("jobs that run on Azure Machine Learning compute clusters": learn.microsoft.com/azure/machine-learning/
how-to-use-mlflow-configure-tracking; Azure/azure-sdk-for-python#38813). mlflow.start_run() continues that
run, so the metrics land on the job's page. The same variable points MLflow anywhere else (a tracking
server, a local file store in the tests); without it nothing is tracked and MLflow is never imported.

Only MetricsFile uses this, and only rank 0 holds a MetricsFile: one run per job, not one per process.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

URI = "MLFLOW_TRACKING_URI"
log = logging.getLogger("payloads.tracking")

_INSTALL = (
    "install mlflow-skinny and azureml-mlflow (payloads/requirements.txt, payloads/azureml-requirements.txt; "
    "the training images carry both)"
)


def tracking_uri(enabled: bool = True, environ: Mapping[str, str] = os.environ) -> str | None:
    """The tracking URI when this run is tracked: MLflow configured by the environment and not --no-mlflow."""
    return (environ.get(URI) or None) if enabled else None


def check(enabled: bool = True, environ: Mapping[str, str] = os.environ) -> None:
    """Before Horovod starts, on every process: a tracked run must be able to track. Cheap: imports nothing."""
    uri = tracking_uri(enabled, environ)
    if uri is None:
        return
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError(
            f"{URI} is set ({_scheme(uri)}://..., Azure ML sets it in every job) but MLflow is not "
            f"installed: {_INSTALL}, or pass --no-mlflow"
        )
    scheme = _scheme(uri)
    if scheme == "azureml" and "azureml" not in _store_plugins():
        # mlflow finds the workspace's store through azureml-mlflow's entry point; without it the first
        # call fails with "Could not find a registered tracking store for scheme 'azureml'".
        raise ConfigError(
            f"{URI} points at an Azure ML workspace (azureml://...) but the azureml-mlflow plugin is "
            f"not installed: {_INSTALL}, or pass --no-mlflow"
        )


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else "file"


def _store_plugins() -> set[str]:
    return {e.name for e in importlib.metadata.entry_points(group="mlflow.tracking_store")}


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"config": {"model": "x"}} -> {"config.model": "x"}: MLflow params are flat strings. Non-strings are
    JSON (so a value reads as it does in metrics.json: null, true, [30, 60, 80])."""
    out: dict[str, str] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


def numbers(record: Mapping[str, Any], skip: tuple[str, ...] = ()) -> dict[str, float]:
    """The numeric entries of a record (bools are not metrics)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class MlflowRun:
    """Rank 0's MLflow run. Starting is checked (a run that cannot start is a configuration problem, said
    before training); later calls only warn, so a tracking hiccup never costs a training job."""

    def __init__(self, run: Mapping[str, Any]):
        # MLflow 3 sends usage telemetry to its own servers by default; a training job's data goes only where
        # MLFLOW_TRACKING_URI points (set the variable to false to allow it).
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        import mlflow

        self._mlflow = mlflow
        try:
            # Under Azure ML this continues the job's run (MLFLOW_RUN_ID); elsewhere it starts a new one.
            self.run_id = mlflow.start_run().info.run_id
        except Exception as e:  # noqa: BLE001 - MLflow and its store plugins raise many types
            raise ConfigError(
                f"MLflow tracking at {os.environ.get(URI)} cannot start: {e} "
                "(fix the tracking configuration, or pass --no-mlflow to train without it)"
            ) from None
        log.info("MLflow run %s at %s", self.run_id, mlflow.get_tracking_uri())
        # Params are write-once: a job Azure ML restarts continues its run and logs them again, which
        # MLflow refuses if any value changed. That is worth a warning, not the job.
        self._call("params", mlflow.log_params, flatten(run))

    def epoch(self, record: Mapping[str, Any]) -> None:
        self._call(
            "epoch metrics", self._mlflow.log_metrics, numbers(record, skip=("epoch",)), step=int(record["epoch"])
        )

    def summary(self, summary: Mapping[str, Any]) -> None:
        # "summary." as in metrics.json: the epochs' "images" and the run's total must not share a name.
        self._call("summary", self._mlflow.log_metrics, {f"summary.{k}": v for k, v in numbers(summary).items()})
        self._call(
            "summary tags",
            self._mlflow.set_tags,
            {
                f"summary.{k}": (v if isinstance(v, str) else json.dumps(v))
                for k, v in summary.items()
                if isinstance(v, (str, bool))
            },
        )
        self._end("FINISHED")

    def _call(self, what: str, fn, *args, **kwargs) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            log.warning("MLflow: could not log the %s (%s); metrics.json and TensorBoard have them", what, e)

    def _end(self, status: str) -> None:
        try:
            if self._mlflow.active_run() is not None:
                self._mlflow.end_run(status)
        except Exception as e:  # noqa: BLE001
            log.warning("MLflow: could not end the run (%s)", e)


def start(run: Mapping[str, Any]) -> MlflowRun | None:
    """The run's tracker, or None when the environment configures no tracking or the config says
    --no-mlflow (run["config"]["mlflow"])."""
    enabled = bool(run.get("config", {}).get("mlflow", True))
    return MlflowRun(run) if tracking_uri(enabled) else None
