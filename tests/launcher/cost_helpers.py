"""The recorded job histories the cost ledger's tests read (test_cost.py, test_cost_watched.py): the dev stack's
workspace with one job, answered through tests/fake_arm.py, and the figures worked out from the recorded times and the
price table's row, never by the ledger's own arithmetic."""

import csv
import datetime as dt
import json
import re
import urllib.parse

import fake_arm

from launcher import prices

DAY = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
NAME = "bright_sail_x7k2m9q4wd"
LOG_WS = "5b1b4a39-7e2f-4c1e-9d3a-2f6c0e8b7a11"  # a Log Analytics workspace id (customerId)
EPOCH_IMAGES = 1_281_167  # one ImageNet epoch
GPU_SIZE, NODES = "Standard_ND96asr_v4", 2


def at(clock: str) -> dt.datetime:
    h, m, *s = (int(x) for x in clock.split(":"))
    return DAY.replace(hour=h, minute=m, second=s[0] if s else 0)


def iso(when: dt.datetime, digits: int = 3) -> str:
    """As run history writes times: '2026-11-20T09:09:00.000Z'; createdTimeUtc with 7 digits and an offset, here
    always '.1234567+00:00' (read as 123456 microseconds: Python keeps 6)."""
    if digits == 7:
        return when.strftime("%Y-%m-%dT%H:%M:%S") + ".1234567+00:00"
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def timespan(seconds: float) -> str:
    """A .NET TimeSpan as run history writes computeDuration: '03:12:00.0000000'."""
    s = int(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}.0000000"


def seconds(a: str, b: str) -> float:
    return (at(b) - at(a)).total_seconds()


def price_row(size: str, region: str) -> tuple[str, float, float | None, str | None]:
    """The table's row for the size in `region`, else its first region's (read here with csv, not prices.py), and
    the date its header gives for that region."""
    lines = prices.TABLE.read_text().splitlines()
    rows = [r for r in csv.DictReader(x for x in lines if not x.startswith("#")) if r["vm_size"] == size]
    row = next((r for r in rows if r["region"] == region), None) or sorted(rows, key=lambda r: r["region"])[0]
    header = " ".join(x for x in lines if x.startswith("#"))
    date = re.search(rf"{row['region']}: [^#]*?(\d{{4}}-\d{{2}}-\d{{2}})", header)
    low = float(row["low_priority"]) if row["low_priority"] else None
    return row["region"], float(row["dedicated"]), low, date.group(1) if date else None


# ---- the recorded workspace ---------------------------------------------------------------------------------------


def metrics_json(epochs: list[tuple[int, float]], target: int, startup: float | None = None) -> dict:
    """metrics.json as payloads/common/metrics.py writes it: run (config, world), epochs, summary."""
    records = [
        {
            "epoch": n,
            "train_loss": 6.9 - 0.1 * n,
            "train_accuracy": 0.001 * n,
            "images": EPOCH_IMAGES,
            "skipped_images": 0,
            "epoch_seconds": secs,
            "images_per_sec": EPOCH_IMAGES / secs,
            "lr": 0.1,
        }
        for n, secs in epochs
    ]
    summary = {}
    if startup is not None:
        summary = {
            "epochs_run": len(epochs),
            "images": EPOCH_IMAGES * len(epochs),
            "train_seconds": sum(s for _, s in epochs),
            "total_images_per_sec": EPOCH_IMAGES * len(epochs) / sum(s for _, s in epochs),
            "startup_seconds": startup,
            "steady_state": True,
            "ranks_identical": True,
        }
    return {
        "run": {
            "config": {"epochs": target, "batch_size": 256, "backward_passes_per_step": 1, "model": "resnet50"},
            "world": {"processes": 16, "local_processes": 8, "gradient_mbytes": 102.228128, "precision": "bf16"},
        },
        "epochs": records,
        "summary": summary,
    }


class Workspace:
    """The dev stack's workspace with one recorded job, answered through tests/fake_arm.py."""

    def __init__(self, fake: fake_arm.FakeAzure, outputs: dict):
        self.fake, self.outputs = fake, outputs
        self.ws_id = (
            f"/subscriptions/{outputs['subscription_id']}/resourceGroups/{outputs['resource_group']}/providers/"
            f"Microsoft.MachineLearningServices/workspaces/{outputs['workspace_name']}"
        )
        self.compute = outputs["clusters"]["gpu-ib"]["compute_name"]
        self.logs = outputs["datastores"]["logs"]
        self.status_queries: list[str] = []
        api = "https://westeurope.api.azureml.ms"
        arm = "management.azure.com" + self.ws_id
        fake.on(
            "GET",
            re.escape(arm),
            (200, {"id": self.ws_id, "name": outputs["workspace_name"], "location": "westeurope",
                   "properties": {"discoveryUrl": f"{api}/discovery"}}, {}),
        )  # fmt: skip
        fake.on("GET", r"westeurope\.api\.azureml\.ms/discovery", (200, {"api": api, "history": api}, {}))
        fake.on(
            "GET",
            re.escape(arm) + r"/computes/" + re.escape(self.compute),
            (200, self.cluster("STANDARD_ND96ASR_V4", "LowPriority", 0, "PT10M"), {}),
        )

    def cluster(self, size: str, priority: str, min_nodes: int, idle: str) -> dict:
        """ARM "Compute - Get" of an AmlCompute cluster (ARM writes some sizes in capitals)."""
        return {
            "id": f"{self.ws_id}/computes/{self.compute}",
            "name": self.compute,
            "type": "Microsoft.MachineLearningServices/workspaces/computes",
            "location": "westeurope",
            "properties": {
                "computeType": "AmlCompute",
                "provisioningState": "Succeeded",
                "properties": {
                    "vmSize": size,
                    "vmPriority": priority,
                    "osType": "Linux",
                    "scaleSettings": {
                        "maxNodeCount": 2,
                        "minNodeCount": min_nodes,
                        "nodeIdleTimeBeforeScaleDown": idle,
                    },
                    "currentNodeCount": 0,
                    "allocationState": "Steady",
                },
            },
        }

    def folder(self, name: str) -> str:
        return f"runs/pytorch-resnet50-synthetic/{name}/"

    def job(self, name: str, status: str, created: dt.datetime, nodes: int = NODES, folder: str | None = None):
        """ARM "Jobs - Get" of a command job; its output `run` in the logs datastore under the job's name."""
        uri = f"azureml://datastores/{self.logs['name']}/paths/{folder or self.folder(name)}"
        body = {
            "id": f"{self.ws_id}/jobs/{name}",
            "name": name,
            "type": "Microsoft.MachineLearningServices/workspaces/jobs",
            "systemData": {"createdAt": iso(created), "createdBy": "someone@example.com", "createdByType": "User"},
            "properties": {
                "jobType": "Command",
                "displayName": "pytorch-resnet50-synthetic",
                "experimentName": "resnet50-synthetic",
                "status": status,
                "computeId": f"{self.ws_id}/computes/{self.compute}",
                "command": "python -m payloads.pytorch.train --model resnet50 --output-dir ${{outputs.run}}",
                "environmentId": f"{self.ws_id}/environments/CliV2AnonymousEnvironment/versions/1",
                "resources": {"instanceCount": nodes, "shmSize": "32g"},
                "distribution": {"distributionType": "Mpi", "processCountPerInstance": 8},
                "outputs": {"run": {"jobOutputType": "uri_folder", "mode": "ReadWriteMount", "uri": uri}},
                "services": {"Studio": {"jobServiceType": "Studio", "endpoint": f"https://ml.azure.com/runs/{name}"}},
                "tags": {},
                "properties": {},
            },
        }
        self.fake.on("GET", re.escape("management.azure.com" + self.ws_id) + "/jobs/" + name, (200, body, {}))

    def run(self, name: str, status: str, created: dt.datetime, start=None, end=None, held=None, **more):
        """Run history's details: what `az ml job stream` polls."""
        body = {
            "runId": name,
            "runUuid": "114befc9-48ce-4762-96f3-63c5817fd851",
            "target": self.compute,
            "status": status,
            "createdTimeUtc": iso(created, 7),
            "startTimeUtc": iso(start) if start else None,
            "endTimeUtc": iso(end) if end else None,
            "computeDuration": timespan(held) if held is not None else None,
            "effectiveStartTimeUtc": None,
            "lastStartTimeUtc": None,
            "currentAttemptId": 1,
            "compute": {
                "target": self.compute,
                "targetType": "AmlCompute",
                "vmSize": "STANDARD_ND96ASR_V4",
                "instanceType": "STANDARD_ND96ASR_V4",
                "instanceCount": NODES,
                "gpuCount": None,
                "priority": "LowPriority",
                "region": None,
            },
            "logFiles": {},
            "warnings": None,
            "error": None,
            **more,
        }
        self.fake.on(
            "GET",
            r"westeurope\.api\.azureml\.ms/history/v1\.0" + re.escape(self.ws_id) + f"/runs/{name}/details",
            (200, body, {}),
        )

    def status_log(self, name: str, changes: list[tuple[str, str]], workspace_id: str = LOG_WS):
        """AmlRunStatusChangedEvent rows for run `name` in Log Analytics workspace `workspace_id` (its customerId),
        answered only to a query for that RunId."""

        def answer(request, match):
            query = json.loads(request.body)["query"]
            self.status_queries.append(query)
            rows = [[iso(at(t)), s] for t, s in changes] if f'RunId == "{name}"' in query else []
            return fake_arm.log_analytics([("TimeGenerated", "datetime"), ("Status", "string")], rows)

        self.fake.on("POST", rf"api\.loganalytics\.io/v1/workspaces/{workspace_id}/query", answer)

    def log_queries(self) -> list[str]:
        """The Log Analytics workspaces the ledger queried, in order."""
        return [
            r.url.split("/workspaces/", 1)[1].split("/", 1)[0] for r in self.fake.requests if "loganalytics" in r.url
        ]

    def outputs_folder(self, name: str, metrics: dict | None, markers: list[tuple[int, str, bool]], folder=None):
        """The run folder in the logs container: metrics.json, and each checkpoint's data file and completion
        marker (epoch, time written, still current: the payload rotates old checkpoints out, their versions stay)."""
        base = folder or self.folder(name)
        host = re.escape(f"{self.logs['account']}.blob.core.windows.net/{self.logs['container']}/")
        if metrics is not None:
            data = json.dumps(metrics).encode()
            self.fake.on("GET", host + re.escape(base + "metrics.json"), fake_arm.blob_content(data, DAY))
        blobs = []
        for epoch, written, current in markers:
            when = at(written)
            version = when.strftime("%Y-%m-%dT%H:%M:%S.0000000Z")
            for file in (f"checkpoint-epoch-{epoch:04d}.pt", f".checkpoint-epoch-{epoch:04d}.pt.complete"):
                blobs.append(
                    {"name": base + "checkpoints/" + file, "last_modified": when, "version_id": version,
                     "current": current, "size": 204_000_000 if not file.startswith(".") else 120}
                )  # fmt: skip

        def listing(request, match):
            # Previous versions are listed only when asked for (include=versions); a prefix filters as Azure does.
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.url).query)
            versions = "versions" in ",".join(query.get("include", [])).split(",")
            prefix = query.get("prefix", [""])[0]
            shown = [b for b in blobs if b["name"].startswith(prefix) and (versions or b["current"])]
            if not versions:
                shown = [{k: v for k, v in b.items() if k != "version_id"} for b in shown]
            xml = fake_arm.list_blobs_xml(self.logs["account"], self.logs["container"], prefix, shown)
            return 200, xml, {"Content-Type": "application/xml"}

        self.fake.on("GET", host.rstrip("/"), listing)


def gpu_rate(per_node_low: float | None, dedicated: float) -> float:
    """USD per second for the job's nodes: the cluster is low priority."""
    return (per_node_low if per_node_low is not None else dedicated) * NODES / 3600


# A plain completed job: its status changes (test_cost.py's record_plain) and its epochs (there, and in the metrics
# of test_cost_watched.py's watched job).
PLAIN = [
    ("09:00:00", "NotStarted"),
    ("09:00:02", "Starting"),
    ("09:00:05", "Preparing"),
    ("09:01:00", "Queued"),
    ("09:09:00", "Running"),
    ("10:39:00", "Finalizing"),
    ("10:40:00", "Completed"),
]
PLAIN_EPOCHS = [(1, 1650.0), (2, 1700.0), (3, 1720.0)]
