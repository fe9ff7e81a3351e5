"""Reading one job's history from Azure, with the person's sign-in, into ledger.Facts. Each a documented REST shape:
- the job (ARM "Jobs - Get"): its cluster (computeId), node count (resources.instanceCount), output folder
  (outputs.run.uri), status, tags;
- its cluster (ARM "Compute - Get"): vmSize, vmPriority and scaleSettings (minNodeCount,
  nodeIdleTimeBeforeScaleDown), and the region it is in;
- run history (runs/{name}/details, what `az ml job stream` polls): createdTimeUtc, startTimeUtc, endTimeUtc,
  computeDuration ("the cumulative time spent in an active status for a terminal run"),
  effectiveStartTimeUtc ("compute duration of an active run is now() - EffectiveStartTimeUtc"),
  lastStartTimeUtc, currentAttemptId, and compute.vmSize/priority/instanceCount, what the run ran on;
- the status log, where the workspace sends its AmlRunStatusChangedEvent diagnostic log to Log Analytics
  (--status-log WORKSPACE_ID, the Log Analytics workspace's id; without it, the stack output status_log_workspace_id:
  the platform stack declares that diagnostic setting and grants its users Log Analytics Reader there): every status
  change with its time, which tells queue, preparation and each requeue after a preemption apart. Without it run
  history gives totals only: the wait before the first start, the time nodes were held, how many times the run
  started;
- the payload's metrics.json (epochs, images, startup_seconds, the --epochs it aims at) and the times of the
  checkpoints' completion markers, every version the logs container keeps, in the job's output folder.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import re
from typing import Any

from azureaccess.errors import JobError
from azureaccess.stack import StackOutputs
from payloads.common import checkpoint

from .. import prices
from .ledger import Facts, parse_time

LOGS_ENDPOINT = "https://api.loganalytics.io"
LOGS_SCOPE = LOGS_ENDPOINT + "/.default"
GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
JOB_NAME = re.compile(r"^[a-zA-Z0-9][\w-]{0,255}$")  # jobspec.JOB_NAME: safe inside a KQL string


def utcnow() -> dt.datetime:
    """The time a running job's ledger is taken at (tests fix it)."""
    return dt.datetime.now(dt.UTC)


def _status(value) -> str:
    return str(getattr(value, "value", value) or "")


def run_details(ml, name: str) -> dict[str, Any]:
    """Run history's details of the job as Azure answers them (the fields azure-ai-ml's model drops kept), through
    azure-ai-ml's own run-history client: the call ml.jobs.stream() polls."""
    runs = ml.jobs._runs_operations
    scope = runs._operation_scope
    return runs._operation.get_details(
        scope.subscription_id,
        scope.resource_group_name,
        runs._workspace_name,
        name,
        cls=lambda response, _deserialized, _headers: response.http_response.json(),
    )


def read_status_log(credential, workspace_id: str, name: str, since: dt.datetime, transport=None):
    """Every status change of run `name` from AmlRunStatusChangedEvent (Log Analytics query API: POST
    /v1/workspaces/{id}/query, answer {"tables": [{"columns": [{"name", "type"}], "rows": [[...]]}]})."""
    from azure.core import PipelineClient
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
    from azure.core.pipeline import policies
    from azure.core.rest import HttpRequest

    client = PipelineClient(
        base_url=LOGS_ENDPOINT,
        transport=transport,
        policies=[
            policies.RequestIdPolicy(),
            policies.HeadersPolicy(),
            policies.UserAgentPolicy("azure-horovod-training-cost"),
            policies.RetryPolicy(),
            policies.BearerTokenCredentialPolicy(credential, LOGS_SCOPE),
            policies.RedirectPolicy(),
        ],
    )
    query = (
        f'AmlRunStatusChangedEvent | where RunId == "{name}" | project TimeGenerated, Status '
        "| order by TimeGenerated asc"
    )
    frm = (since - dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    request = HttpRequest(
        "POST",
        f"{LOGS_ENDPOINT}/v1/workspaces/{workspace_id}/query",
        json={"query": query, "timespan": f"{frm}/{utcnow().strftime('%Y-%m-%dT%H:%M:%SZ')}"},
    )
    response = client.send_request(request)
    if response.status_code == 401:
        raise ClientAuthenticationError(response=response)
    if response.status_code != 200:
        raise HttpResponseError(response=response)
    tables = response.json().get("tables") or []
    out = []
    for table in tables[:1]:
        columns = [c["name"] for c in table.get("columns", [])]
        for row in table.get("rows", []):
            record = dict(zip(columns, row))
            when, status = parse_time(record.get("TimeGenerated")), record.get("Status")
            if when and status:
                out.append((when, str(status)))
    return out


def blob_folder(outputs: StackOutputs, path: str | None) -> str | None:
    """The folder inside the logs container that an output's azureml:// path names, or None elsewhere."""
    head = f"azureml://datastores/{outputs.datastore('logs')}/paths/"
    if not path or not path.startswith(head):
        return None
    return path[len(head) :].strip("/") + "/"


def read_metrics(outputs: StackOutputs, folder: str, credential) -> dict | None:
    """metrics.json of a run folder in the logs container, or its spare copy when a crash cut it short
    (payloads/common/metrics.py); None when there is neither."""
    from azure.core.exceptions import ResourceNotFoundError

    client = outputs.blob_container("logs", credential)
    for name in ("metrics.json", ".metrics.json.spare"):
        try:
            data = json.loads(client.download_blob(folder + name).readall())
        except (ResourceNotFoundError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def read_checkpoint_times(outputs: StackOutputs, folder: str, credential) -> list[tuple[dt.datetime, int | None]]:
    """(time, epoch) of every checkpoint completion marker under the folder's checkpoints/, every version the
    container keeps: the payload rotates old checkpoints out and their versions stay 7 days (docs/jobs.md). Without
    markers (a payload older than them), the checkpoint files' own times."""
    markers, files = [], []
    for blob in outputs.blob_container("logs", credential).list_blobs(
        name_starts_with=folder + "checkpoints/", include=["versions"]
    ):
        at = checkpoint.marked(blob.name)  # the payloads' own marker names
        (markers if at else files).append((blob.last_modified.astimezone(dt.UTC), at[0] if at else None))
    return sorted(set(markers or files))


def _describe(error: Exception, doing: str) -> str:
    from azurecheck.arm import describe

    return describe(error, doing)


def gather(
    name: str,
    outputs: StackOutputs,
    ml=None,
    credential=None,
    status_log: str | None = None,
    metrics_file: pathlib.Path | None = None,
    gpu_images_per_sec: float | None = None,
    price_per_node_hour: float | None = None,
    now: dt.datetime | None = None,
    status_log_from: str = "--status-log",
) -> Facts:
    """Read the job, its cluster, run history, the status log and its output folder; JobError when the job, its
    size or its price cannot be found (naming the fix). What is merely unreadable becomes a note. `status_log_from`:
    where the status log's workspace id came from, said in the ledger's sources."""
    _check_names(name, status_log, status_log_from)
    if credential is None:
        from azureaccess.credential import azure_credential

        credential = azure_credential()
    if ml is None:
        from azure.ai.ml import MLClient

        ml = MLClient(credential, outputs["subscription_id"], outputs["resource_group"], outputs["workspace_name"])
    now = now or utcnow()
    job, run = _read_job(ml, name, outputs)
    notes: list[str] = []
    created = parse_time(run.get("createdTimeUtc")) or getattr(job.creation_context, "created_at", None)
    if created is None:
        raise JobError(f"job {name}: neither the job nor run history records when it was created")
    compute_name = str(job.compute or "").rsplit("/", 1)[-1]
    cluster = _read_cluster(ml, compute_name, notes)
    ran_on = run.get("compute") or {}
    vm_size = ran_on.get("vmSize") or getattr(cluster, "size", None)
    if not vm_size:
        raise JobError(
            f"job {name}: no VM size: run history records none and cluster {compute_name or '(none)'} was not "
            "read; the ledger prices command jobs on a compute cluster"
        )
    priority = ran_on.get("priority")
    if priority:  # run history: "Dedicated", "LowPriority"
        low = any(word in str(priority).lower() for word in ("low", "spot"))
    else:
        low = getattr(cluster, "tier", "") == "low_priority"
    nodes = ran_on.get("instanceCount") or getattr(getattr(job, "resources", None), "instance_count", None) or 1
    region = getattr(cluster, "location", None) or outputs.values.get("location")
    scale_min = getattr(cluster, "min_instances", None)
    idle = getattr(cluster, "idle_time_before_scale_down", None)
    facts = Facts(
        name=name,
        status=_status(job.status) or str(run.get("status") or ""),
        created=created.astimezone(dt.UTC),
        now=now,
        nodes=int(nodes),
        vm_size=vm_size,
        low_priority=low,
        quote=_quote(name, vm_size, low, region, price_per_node_hour),
        run=run,
        compute=compute_name,
        min_nodes=None if scale_min is None else int(scale_min),
        idle_seconds=None if idle is None else float(idle),
        gpu_images_per_sec=gpu_images_per_sec,
        sources={"job": f"workspace {outputs['workspace_name']}, job {name}"},
        notes=notes,
    )
    if status_log:
        _read_status_log_into(facts, credential, status_log, status_log_from)
    _read_output_folder(facts, outputs, job, credential, metrics_file)
    return facts


def _check_names(name: str, status_log: str | None, status_log_from: str) -> None:
    if not JOB_NAME.match(name):
        raise JobError(
            f"{name!r} is not an Azure ML job name (letters, digits, _ and -, e.g. witty_jackal_3d4kq79d3v): "
            "copy it from the studio or `az ml job list`"
        )
    if status_log is not None and not GUID.match(status_log):
        raise JobError(
            f"{status_log_from} {status_log!r}: expected the Log Analytics workspace's id (a GUID): `az monitor "
            "log-analytics workspace show -g <group> -n <name> --query customerId -o tsv`"
        )


def _read_job(ml, name: str, outputs: StackOutputs) -> tuple[Any, dict[str, Any]]:
    """(the job, run history's details: {} when run history has none)."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    ws, rg = outputs["workspace_name"], outputs["resource_group"]
    try:
        job = ml.jobs.get(name)
    except ResourceNotFoundError:
        raise JobError(
            f"workspace {ws} has no job {name}: check the name (`az ml job list -g {rg} -w {ws} --query "
            "[].name -o tsv`) and that the stack outputs are this workspace's"
        ) from None
    except AzureError as e:
        raise JobError(_describe(e, f"reading job {name} in workspace {ws}")) from None
    try:
        run = run_details(ml, name)
    except ResourceNotFoundError:
        run = {}
    except AzureError as e:
        raise JobError(_describe(e, f"reading run history of job {name}")) from None
    return job, run


def _read_cluster(ml, compute_name: str, notes: list[str]):
    """The job's cluster, or None (a note says why) when it is gone or unreadable."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    if not compute_name:
        return None
    try:
        return ml.compute.get(compute_name)
    except ResourceNotFoundError:
        notes.append(f"cluster {compute_name} no longer exists: its scale-down settings are unknown")
    except AzureError as e:
        notes.append(_describe(e, f"cluster {compute_name} not read"))
    return None


def _quote(name: str, vm_size: str, low: bool, region: str | None, given: float | None) -> prices.Quote:
    if given is not None:
        return prices.Quote(
            vm_size=vm_size,
            per_node_hour=given,
            kind="given",
            region=region or "unknown",
            wanted_region=region or "unknown",
            date=None,
            source="--price-per-node-hour",
            no_low_priority_price=False,
        )
    quote, missing = prices.quote(vm_size, low, region, prices.TABLE)
    if quote is None:
        raise JobError(f"job {name}: {missing}, or pass --price-per-node-hour USD")
    return quote


def _read_status_log_into(facts: Facts, credential, status_log: str, status_log_from: str) -> None:
    from azure.core.exceptions import AzureError

    try:
        facts.transitions = read_status_log(credential, status_log, facts.name, facts.created) or None
    except AzureError as e:
        facts.notes.append(
            _describe(e, f"status log not read from Log Analytics workspace {status_log} ({status_log_from})")
            + " (the Azure ML workspace needs a diagnostic setting that sends AmlRunStatusChangedEvent there, "
            "and you need Log Analytics Reader on it)"
        )
        return
    facts.sources["status log"] = (
        f"Log Analytics workspace {status_log} ({status_log_from}): {len(facts.transitions or [])} status change(s)"
    )
    if not facts.transitions:
        facts.notes.append(
            f"the status log has no AmlRunStatusChangedEvent for {facts.name}: is the workspace's diagnostic "
            "setting sending it there (it arrives minutes late)?"
        )


def _read_output_folder(facts: Facts, outputs: StackOutputs, job, credential, metrics_file: pathlib.Path | None):
    """metrics.json (or the file given) and the checkpoints' completion times, from the job's output folder."""
    from azure.core.exceptions import AzureError

    from ..jobspec import earlier_output_path

    name, notes, sources = facts.name, facts.notes, facts.sources
    output = getattr((job.outputs or {}).get("run"), "path", None)
    folder = blob_folder(outputs, earlier_output_path(output, name) if output else None)
    facts.own_folder = folder is None or folder.rstrip("/").endswith("/" + name)
    if metrics_file is not None:
        try:
            facts.metrics = json.loads(metrics_file.read_text())
            sources["metrics"] = str(metrics_file)
        except (OSError, ValueError) as e:
            raise JobError(f"--metrics {metrics_file}: not a readable metrics.json ({e})") from None
    logs = outputs["datastores"]["logs"]
    if folder is None:
        notes.append("the job's output `run` is not in the logs container: no metrics.json or checkpoint times")
        return
    if not logs.get("account") or not logs.get("container"):
        notes.append(
            "the stack outputs lack datastores.logs.account and .container (a stack older than this tool): no "
            "metrics.json or checkpoint times; run pulumi up and write the outputs again, or pass --metrics FILE"
        )
        return
    account = f" (storage account {logs.get('account')})"
    where = f"{logs.get('container')}/{folder}"
    if metrics_file is None:
        ws, rg = outputs["workspace_name"], outputs["resource_group"]
        fix = f"pass --metrics FILE (`az ml job download -n {name} --output-name run -g {rg} -w {ws}`)"
        try:
            facts.metrics = read_metrics(outputs, folder, credential)
            sources["metrics"] = (f"{where}metrics.json" if facts.metrics else f"no metrics.json in {where}") + account
        except AzureError as e:
            notes.append(
                _describe(e, f"{where}metrics.json{account} not read") + f": epochs, images and start-up unknown; {fix}"
            )
    try:
        facts.checkpoints = read_checkpoint_times(outputs, folder, credential)
        sources["checkpoints"] = f"{len(facts.checkpoints)} checkpoint time(s) in {where}checkpoints/{account}"
    except AzureError as e:
        notes.append(_describe(e, f"{where}checkpoints/{account} not listed") + ": checkpoint times unknown")
