"""The cost ledger nobody asks for: printed at the end of a job `python -m launcher submit` watches (fake_azureml.py's
fake, with cost_helpers.py's recorded history), its failure leaving the job's exit status alone, and a local run's
time split the same way."""

import json
import re

import fake_arm
import pytest
import urllib3
from cost_helpers import (
    DAY,
    EPOCH_IMAGES,
    GPU_SIZE,
    NODES,
    PLAIN_EPOCHS,
    Workspace,
    at,
    gpu_rate,
    iso,
    metrics_json,
    price_row,
    seconds,
    timespan,
)
from fake_azureml import FakeAzure as SubmitFake
from fake_azureml import submit

from launcher.cost import local

# ---- at the end of a watched job ------------------------------------------------------------------------------------


class Watched(SubmitFake):
    """fake_azureml.py's fake (create, stream, get), with the ledger's reads answered from recorded routes and the
    job's run history carrying its times."""

    def __init__(self, routes: fake_arm.FakeAzure, details: dict):
        super().__init__()
        self.routes, self.details = routes, details

    def __call__(self, request):
        url = urllib3.util.parse_url(request.url)
        target = f"{url.host}{url.path}"
        if any(m == request.method and p.fullmatch(target) for m, p, _ in self.routes.routes):
            return self.routes(request)
        response = super().__call__(request)
        if request.method == "GET" and re.search(r"/runs/[^/]+/details$", target):
            body = {**json.loads(response._content), **self.details}
            response._content = json.dumps(body).encode()
        elif request.method == "GET" and re.search(r"/jobs/[^/]+$", target) and response.status_code == 200:
            body = json.loads(response._content)
            body["systemData"] = {"createdAt": iso(at("09:00")), "createdBy": "someone@example.com"}
            response._content = json.dumps(body).encode()
        return response


@pytest.fixture
def watched(monkeypatch, dev_outputs):
    import requests.adapters

    routes = fake_arm.FakeAzure()
    space = Workspace(routes, json.loads(dev_outputs.read_text()))
    logs = space.logs
    base = re.escape(f"{logs['account']}.blob.core.windows.net/{logs['container']}/runs/pytorch-resnet50-synthetic/")
    routes.on(
        "GET",
        base + r"[^/]+/metrics\.json",
        fake_arm.blob_content(json.dumps(metrics_json(PLAIN_EPOCHS, 3, 95.5)).encode(), DAY),
    )
    listing = fake_arm.list_blobs_xml(logs["account"], logs["container"], "runs/", [])
    routes.on("GET", re.escape(f"{logs['account']}.blob.core.windows.net/{logs['container']}"), (200, listing, {}))
    details = {
        "createdTimeUtc": iso(at("09:00"), 7),
        "startTimeUtc": iso(at("09:09")),
        "endTimeUtc": iso(at("10:40")),
        "computeDuration": timespan(seconds("09:09", "10:40")),
        "compute": {"vmSize": GPU_SIZE, "instanceCount": NODES, "priority": "LowPriority"},
    }
    fake = Watched(routes, details)
    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", lambda self, request, **kw: fake(request))
    monkeypatch.setattr("azure.identity.DefaultAzureCredential", lambda **kw: fake_arm.Credential())
    monkeypatch.setattr("azure.ai.ml.operations._job_ops_helper._wait_before_polling", lambda seconds: 0)
    return fake


def test_a_watched_job_ends_with_its_ledger(watched, dev_outputs, tmp_path, capsys):
    watched.run_statuses = ["Running", "Completed"]
    assert submit(dev_outputs, tmp_path) == 0
    out = capsys.readouterr().out
    _, dedicated, low, _ = price_row(GPU_SIZE, "westeurope")
    held = seconds("09:09", "10:40")
    name = next(iter(watched.jobs))
    ledger_at = out.index(f"cost of job {name} (Completed)")
    assert ledger_at < out.index(f"job {name} ended: Completed")
    total = next(x for x in out.splitlines() if x.startswith("total"))
    assert f"${held * gpu_rate(low, dedicated):,.2f}" in total
    assert "per epoch: " in out


def test_a_ledger_that_cannot_be_computed_leaves_the_exit_status_alone(watched, dev_outputs, tmp_path, capsys):
    watched.run_statuses = ["Running", "Failed"]
    watched.job_status = "Failed"
    watched.details["compute"] = {}  # no size in run history, and the cluster is gone:
    watched.routes.on("GET", r"management\.azure\.com/.*/computes/.*", fake_arm.arm_error(404, "NotFound", "gone"))
    assert submit(dev_outputs, tmp_path) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert any(line.startswith("cost: not computed: job ") and "no VM size" in line for line in err)
    assert err[-1].startswith(f"job {next(iter(watched.jobs))} ended: Failed")


# ---- a local run ---------------------------------------------------------------------------------------------------


def test_a_local_run_splits_its_time_the_same_way(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(metrics_json([(1, 40.0), (2, 38.0)], 2, startup=6.25)))
    split = local.local_split(path, 90.0)
    assert split["startup_seconds"] == 6.25 and split["training_seconds"] == 90.0 - 6.25
    assert split["epochs"] == 2 and split["images"] == 2 * EPOCH_IMAGES and split["in_epochs_seconds"] == 78.0
    assert local.render_local(split).startswith("time: 0:01:30 in all = start-up 0:00:06")
    path.write_text("{cut short")  # a crash mid-write: the spare copy has the previous epoch
    path.with_name(".metrics.json.spare").write_text(json.dumps(metrics_json([(1, 40.0)], 2)))
    split = local.local_split(path, 50.0)
    assert split["epochs"] == 1 and split["startup_seconds"] is None and split["training_seconds"] == 50.0
    assert local.local_split(tmp_path / "none.json", 5.0)["metrics"] is None
