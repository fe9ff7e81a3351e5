"""Submission to Azure ML: bad launcher input, prices per region, resuming, data modes,
and every way a submission can end, with azure-ai-ml replaced only where it would reach the network."""

import json
import pathlib

import pytest
import yaml

from azureaccess import stack
from launcher import __main__ as cli
from launcher import prices

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYNTHETIC = ROOT / "jobs/pytorch-resnet50-synthetic.yaml"
IMAGENET = ROOT / "jobs/pytorch-resnet50-imagenet.yaml"


def outputs_with(dev_outputs, tmp_path, **changes) -> pathlib.Path:
    values = json.loads(dev_outputs.read_text())
    for key, value in changes.items():
        values[key] = value
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(values))
    return path


# ---- item 12: launcher input gaps ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["--nodes", "0"], "--nodes 0: a job needs at least 1 node"),
        (["--nodes", "-2"], "--nodes -2: a job needs at least 1 node"),
        (["--processes-per-node", "0"], "--processes-per-node 0: at least 1 process per node"),
        (["--processes-per-node", "-1"], "--processes-per-node -1: at least 1 process per node"),
    ],
)
@pytest.mark.parametrize("cluster", ["cpu-smoke", "gpu-ib"])
def test_zero_and_negative_counts_are_refused(dev_outputs, capsys, args, message, cluster):
    """0 used to fall back to the job file's value and negatives passed; both are errors, before validation."""
    code = cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", cluster, "--dry-run", *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_missing_outputs_file_message_names_the_path(tmp_path, capsys):
    missing = tmp_path / "outputs.prod.json"
    assert cli.main([str(SYNTHETIC), "--stack-outputs", str(missing), "--cluster", "x"]) == 2
    err = capsys.readouterr().err
    assert f"> {missing}`" in err and "{path}" not in err


def test_pulumi_output_that_is_not_json_is_a_clear_error(monkeypatch, capsys):
    class Proc:
        returncode, stderr = 0, ""
        stdout = "warning: A new version of Pulumi is available.\n{\"clusters\": {}}"

    monkeypatch.setattr(stack.subprocess, "run", lambda *a, **kw: Proc)
    assert cli.main([str(SYNTHETIC), "--stack", "dev", "--cluster", "gpu-ib"]) == 2
    err = capsys.readouterr().err
    assert "`pulumi stack output --json --stack dev` did not print JSON" in err
    assert "'warning: A new version" in err and "--stack-outputs FILE" in err


def test_retired_size_in_old_outputs_names_its_successors(dev_outputs, tmp_path, capsys):
    values = json.loads(dev_outputs.read_text())
    values["clusters"]["gpu-ib"]["vm_size"] = "Standard_NC24rs_v3"  # retired 2025-09-30 (vm_sizes.py)
    old = outputs_with(dev_outputs, tmp_path, clusters=values["clusters"])
    for extra in ([], ["--dry-run"]):
        assert cli.main([str(SYNTHETIC), "--stack-outputs", str(old), "--cluster", "gpu-ib", *extra]) == 2
        err = capsys.readouterr().err
        assert "Standard_NC24rs_v3, which Azure retired on 2025-09-30" in err
        assert "Standard_ND96asr_v4 or Standard_ND96amsr_A100_v4" in err and "pulumi up" in err


def write_table(tmp_path, rows: str) -> pathlib.Path:
    path = tmp_path / "prices.csv"
    path.write_text("# Test prices, USD per node-hour.\nregion,vm_size,dedicated,low_priority\n" + rows)
    return path


def test_prices_come_from_the_stacks_region(tmp_path):
    table = write_table(
        tmp_path, "eastus,Standard_ND96asr_v4,27.197,5.439\nwesteurope,Standard_ND96asr_v4,30.000,6.000\n"
    )
    cost, how = prices.hourly("Standard_ND96asr_v4", 2, True, "westeurope", table)
    assert cost == pytest.approx(12.0) and "in westeurope" in how and "NOT" not in how
    cost, how = prices.hourly("Standard_ND96asr_v4", 2, False, "eastus", table)
    assert cost == pytest.approx(54.394)


def test_price_from_another_region_says_so(tmp_path):
    table = write_table(tmp_path, "eastus,Standard_ND96asr_v4,27.197,5.439\n")
    cost, how = prices.hourly("Standard_ND96asr_v4", 1, False, "westeurope", table)
    assert cost == pytest.approx(27.197)
    assert "in eastus" in how and "NOT the stack's region (westeurope)" in how
    assert "--refresh westeurope" in how
    cost, how = prices.hourly("Standard_ND96asr_v4", 1, False, None, table)
    assert "NOT the stack's region (unknown: the stack outputs have no location)" in how


def test_size_missing_from_the_table(tmp_path):
    table = write_table(tmp_path, "eastus,Standard_ND96asr_v4,27.197,5.439\n")
    cost, how = prices.hourly("Standard_ND96isr_H200_v5", 1, False, "westeurope", table)
    assert cost is None and "no price for Standard_ND96isr_H200_v5" in how and "--refresh westeurope" in how


def test_dry_run_prices_the_dev_stack_in_west_europe(dev_outputs, capsys):
    """The dev stack is in westeurope and the shipped table has eastus rows only: the line must say so."""
    assert json.loads(dev_outputs.read_text())["location"] == "westeurope"
    assert cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--dry-run"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("# cost of one hour")][0]
    _, shipped = prices.table()
    if ("westeurope", "Standard_ND96asr_v4") in shipped:
        assert "in westeurope" in line and "NOT" not in line
    else:
        assert "in eastus" in line and "NOT the stack's region (westeurope)" in line


def test_refresh_replaces_one_region_and_keeps_the_others(tmp_path):
    table = write_table(tmp_path, "eastus,Standard_D4s_v5,0.192,0.038\neastus,Standard_ND96asr_v4,27.197,5.439\n")
    asked = []

    def fetch(region, size):  # the Retail Prices API's item shape
        asked.append((region, size))
        if size == "Standard_D4s_v5":
            return [
                {
                    "productName": "Virtual Machines Dsv5 Series",
                    "skuName": "D4s v5",
                    "retailPrice": 0.21,
                    "type": "Consumption",
                },
                {
                    "productName": "Virtual Machines Dsv5 Series",
                    "skuName": "D4s v5 Spot",
                    "retailPrice": 0.04,
                    "type": "Consumption",
                },
                {
                    "productName": "Virtual Machines Dsv5 Series Windows",
                    "skuName": "D4s v5",
                    "retailPrice": 0.39,
                    "type": "Consumption",
                },
            ]
        return []  # not offered in that region

    table.write_text(prices.refresh("westeurope", table, fetch))
    _, got = prices.table(table)
    assert sorted(asked) == [("westeurope", "Standard_D4s_v5"), ("westeurope", "Standard_ND96asr_v4")]
    assert got[("westeurope", "Standard_D4s_v5")] == (0.21, 0.04)
    assert ("westeurope", "Standard_ND96asr_v4") not in got
    assert got[("eastus", "Standard_ND96asr_v4")] == (27.197, 5.439)
    table.write_text(prices.refresh("westeurope", table, fetch))  # idempotent, header included
    assert table.read_text().count("westeurope: fetched") == 1


# ---- item 4: how a submission ends ---------------------------------------------------------------------
# azure-ai-ml runs for real, down to the HTTP layer: requests' adapter answers as Azure Resource Manager,
# the workspace's run history and its storage would. The exceptions are the ones the SDK itself raises
# from those answers (HttpResponseError, ClientAuthenticationError, ResourceNotFoundError, JobException).

WS = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/hvd-dev475c-rg/providers/"
    "Microsoft.MachineLearningServices/workspaces/hvd-dev475c-mlwx7k2q5b8e"
)
API = "https://westeurope.api.azureml.ms"


class FakeAzure:
    """Just enough of ARM, run history and Blob Storage for create_or_update, stream and get."""

    def __init__(self):
        self.calls = []
        self.jobs = {}
        self.run_statuses = ["Completed"]  # what run history answers, one per poll (the last repeats)
        self.run_error = None  # the run's error when it Failed
        self.job_status = "Completed"  # what GET job answers once the job exists
        self.upload_code = False  # False: the code snapshot is already there (hash match)
        self.fail = None  # (predicate(method, url), status, body, headers) to inject
        self.resolve_name = False  # True: record output paths with ${{name}} replaced by the job name

    @staticmethod
    def response(request, status, body=None, headers=None, raw=None):
        import io

        import requests
        import urllib3

        r = requests.Response()
        r.status_code, r.reason, r.request, r.url = status, "fake", request, request.url
        r._content = raw if raw is not None else json.dumps(body or {}).encode()
        r.headers.update({"Content-Type": "application/json", **(headers or {})})
        r.raw = urllib3.response.HTTPResponse(
            body=io.BytesIO(r._content), headers=r.headers, status=status, preload_content=False
        )
        return r

    def __call__(self, request):
        import re

        method, url = request.method, request.url
        path = url.split("?")[0].replace("https://management.azure.com", "")
        self.calls.append((method, path))
        if self.fail and self.fail[0](method, url):
            status, body, headers = self.fail[1:]
            if isinstance(body, BaseException):
                raise body
            raw = body.encode() if isinstance(body, str) else None
            return self.response(request, status, body, headers, raw)
        code = "https://hvddevmlws5b3f81.blob.core.windows.net/azureml-blobstore/LocalUpload/abc"
        if re.search(r"/codes/[^/]+/versions$", path) and method == "GET":
            found = [] if self.upload_code else [{"id": f"{path}/1", "name": "1", "properties": {"codeUri": code}}]
            return self.response(request, 200, {"value": found})
        if re.search(r"/codes/[^/]+/versions/1$", path):
            return self.response(request, 200, {"id": path, "name": "1", "properties": {"codeUri": code}})
        if path.endswith("/startPendingUpload"):
            return self.response(
                request,
                200,
                {
                    "blobReferenceForConsumption": {
                        "blobUri": code,
                        "credential": {"credentialType": "SAS", "sasUri": code + "?sv=2021-08-06&sig=x"},
                    },
                    "pendingUploadId": "abc",
                    "pendingUploadType": "TemporaryBlobReference",
                },
            )
        if re.search(r"/environments/[^/]+/versions/[^/]+$", path) and method == "PUT":
            body = json.loads(request.body)
            return self.response(request, 200, {**body, "id": path, "name": path.rsplit("/", 1)[1]})
        m = re.search(r"/jobs/([^/]+)$", path)
        if m and method == "PUT":
            body = json.loads(request.body)
            body.update(id=path, name=m[1])
            if self.resolve_name:
                body = json.loads(json.dumps(body).replace("${{name}}", m[1]))
            body["properties"]["services"] = {"Studio": {"endpoint": f"https://ml.azure.com/runs/{m[1]}"}}
            body["properties"]["status"] = "Queued"
            self.jobs[m[1]] = body
            return self.response(request, 201, body)
        if m and method == "GET" and m[1] in self.jobs:
            body = json.loads(json.dumps(self.jobs[m[1]]))
            body["properties"]["status"] = self.job_status
            return self.response(request, 200, body)
        if path == WS:
            return self.response(
                request,
                200,
                {
                    "id": WS,
                    "name": "hvd-dev475c-mlwx7k2q5b8e",
                    "location": "westeurope",
                    "properties": {"discoveryUrl": f"{API}/discovery"},
                },
            )
        if url.startswith(f"{API}/discovery"):
            return self.response(request, 200, {"api": API, "history": API})
        m = re.search(r"/runs/([^/]+)/details$", path)
        if m:
            status = self.run_statuses.pop(0) if len(self.run_statuses) > 1 else self.run_statuses[0]
            if status == "Ctrl-C":
                raise KeyboardInterrupt
            details = {"runId": m[1], "status": status, "logFiles": {}, "warnings": []}
            if status == "Failed" and self.run_error:
                details["error"] = {"error": self.run_error}
            return self.response(request, 200, details)
        return self.response(request, 404, {"error": {"code": "NotFound", "message": f"fake Azure has no {path}"}})


@pytest.fixture
def azure(monkeypatch):
    import time

    import requests.adapters
    from azure.core.credentials import AccessToken, AccessTokenInfo

    class Credential:  # what `az login` gives DefaultAzureCredential
        def get_token(self, *scopes, **kw):
            return AccessToken("token", int(time.time()) + 3600)

        def get_token_info(self, *scopes, **kw):
            return AccessTokenInfo("token", int(time.time()) + 3600)

    fake = FakeAzure()
    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", lambda self, request, **kw: fake(request))
    monkeypatch.setattr("azure.identity.DefaultAzureCredential", lambda **kw: Credential())
    # stream() sleeps between polls of run history
    monkeypatch.setattr("azure.ai.ml.operations._job_ops_helper._wait_before_polling", lambda seconds: 0)
    return fake


@pytest.fixture(scope="module")
def small_job(tmp_path_factory):
    """The synthetic job for the dev stack, with a one-file code folder: hashing the real checkout walks
    .venv (azure-ai-ml follows links), seconds per test that these tests do not need."""
    return tmp_path_factory.mktemp("code")


def submit(dev_outputs, code_dir, stream=True):
    from launcher import azureml, jobspec

    outs = stack.load_file(dev_outputs)
    job = jobspec.validate(jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), SYNTHETIC)
    (code_dir / "train.py").write_text("print('hello')\n")
    job.code = str(code_dir)
    try:
        return azureml.submit(job, outs, stream=stream)
    except Exception as e:  # noqa: BLE001 - asserted below: what __main__ prints for a JobError
        from azureaccess.errors import JobError

        assert isinstance(e, JobError), e
        return f"error: {e}"


def test_completed_job_end_to_end(azure, dev_outputs, capsys):
    azure.run_statuses = ["Queued", "Running", "Completed"]
    code = cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--nodes", "2"])
    out = capsys.readouterr().out
    name = next(iter(azure.jobs))
    assert code == 0 and f"job {name} ended: Completed" in out
    sent = azure.jobs[name]["properties"]
    compute_name = stack.load_file(dev_outputs).cluster("gpu-ib")["compute_name"]  # the Azure ML name, hashed
    assert sent["computeId"].endswith(f"/computes/{compute_name}") and sent["resources"]["instanceCount"] == 2


def test_failed_job_exits_1_with_its_cause(azure, dev_outputs, small_job, capsys):
    azure.run_statuses = ["Running", "Failed"]
    azure.job_status = "Failed"
    azure.run_error = {
        "code": "UserError",
        "message": "Execution failed. User process 'python' exited with status "
        "code 1. Please check log file 'user_logs/std_log_process_0.txt'",
    }
    assert submit(dev_outputs, small_job) == 1
    err = capsys.readouterr().err
    name = next(iter(azure.jobs))
    last = err.strip().splitlines()[-1]  # the one line the launcher ends with
    assert last.startswith(
        f"job {name} ended: Failed: UserError: Execution failed. User process 'python' exited with status code 1"
    ), last


@pytest.mark.parametrize("status", ["Canceled", "NotResponding"])
def test_job_that_ends_otherwise_exits_1(azure, dev_outputs, small_job, capsys, status):
    azure.run_statuses = ["Running", status]  # stream() returns normally for these
    azure.job_status = status
    assert submit(dev_outputs, small_job) == 1
    name = next(iter(azure.jobs))
    assert f"job {name} ended: {status}: see its logs: https://ml.azure.com/runs/{name}" in capsys.readouterr().err


def test_ctrl_c_while_following_leaves_the_job_running(azure, dev_outputs, small_job, capsys):
    azure.run_statuses = ["Running", "Ctrl-C"]  # azure-ai-ml turns it into a JobException
    assert submit(dev_outputs, small_job) == 130
    err = capsys.readouterr().err
    name = next(iter(azure.jobs))
    assert f"job {name} is still running on Azure ML" in err
    assert f"az ml job cancel -n {name} -g hvd-dev475c-rg -w hvd-dev475c-mlwx7k2q5b8e" in err
    assert not any(method == "POST" and "cancel" in path for method, path in azure.calls)


def test_ctrl_c_while_submitting(azure, dev_outputs, small_job, capsys):
    azure.fail = (lambda method, url: method == "PUT" and "/jobs/" in url, 0, KeyboardInterrupt(), None)
    assert submit(dev_outputs, small_job) == 130
    assert "the job may or may not exist" in capsys.readouterr().err


def test_ctrl_c_while_the_code_snapshot_is_listed_says_nothing_was_sent(azure, dev_outputs, small_job, capsys):
    from launcher import snapshot

    staged = []

    def interrupted(root, ignore=None):
        staged.append(root)
        raise KeyboardInterrupt  # Ctrl-C in the walk, before azure-ai-ml has the job

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(snapshot, "kept_files", interrupted)
        assert submit(dev_outputs, small_job) == 130
    assert staged, "the snapshot was not listed: the test interrupted nothing"
    assert "interrupted before anything was sent: no job was submitted" in capsys.readouterr().err
    assert not azure.jobs and not any("/jobs/" in path or "/codes/" in path for _, path in azure.calls)


def test_ctrl_c_after_the_job_was_created_names_it(azure, dev_outputs, small_job, capsys):
    """Ctrl-C while the staged snapshot is removed, create_or_update having returned: the job exists and is named."""
    import contextlib

    from launcher import snapshot

    real = snapshot.staged

    @contextlib.contextmanager
    def interrupted_on_exit(root):
        with real(root) as folder:
            yield folder
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(snapshot, "staged", interrupted_on_exit)
        assert submit(dev_outputs, small_job) == 130
    name = next(iter(azure.jobs))
    assert f"job {name} is still running on Azure ML" in capsys.readouterr().err


def test_no_stream_returns_after_submitting(azure, dev_outputs, small_job):
    assert submit(dev_outputs, small_job, stream=False) == 0
    assert not any("/runs/" in path for _, path in azure.calls)


def arm(method, url):
    return url.startswith("https://management.azure.com")


def blob(method, url):
    return ".blob.core.windows.net" in url


def storage_error(code, message):
    xml = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}\n'
        'RequestId:0\nTime:2026-11-23T11:00:00Z</Message></Error>'
    )
    return xml, {"x-ms-error-code": code, "Content-Type": "application/xml"}


@pytest.mark.parametrize(
    "where,status,body,headers,expected",
    [
        # ARM: the signed-in identity lacks a role on the workspace
        (
            arm,
            403,
            {
                "error": {
                    "code": "AuthorizationFailed",
                    "message": "The client 'me@contoso.com' with object id "
                    "'x' does not have authorization to perform action 'Microsoft.MachineLearningServices/workspaces/"
                    "codes/versions/read'",
                }
            },
            None,
            [
                "403 AuthorizationFailed",
                "'AzureML Data Scientist'",
                "workspace hvd-dev475c-mlwx7k2q5b8e",
                "az role assignment create",
            ],
        ),
        # ARM: a token from the wrong tenant (azure-core raises ClientAuthenticationError for 401)
        (
            arm,
            401,
            {
                "error": {
                    "code": "InvalidAuthenticationTokenTenant",
                    "message": "The access token is from the wrong issuer.",
                }
            },
            None,
            ["not signed in to Azure", "az login --tenant 11111111-1111-1111-1111-111111111111", "az account set"],
        ),
        # Storage: the workspace storage firewall does not admit this machine
        (
            blob,
            403,
            *storage_error("AuthorizationFailure", "This request is not authorized to perform this operation."),
            ["refused the code upload (403 AuthorizationFailure)", "network.allowedClientIps"],
        ),
        (
            blob,
            403,
            *storage_error(
                "AuthorizationPermissionMismatch",
                "This request is not authorized to perform this operation using this permission.",
            ),
            ["refused the code upload (403 AuthorizationPermissionMismatch)", "'Storage Blob Data Contributor'"],
        ),
        # the workspace does not exist (outputs of a destroyed stack, another subscription)
        (
            arm,
            404,
            {
                "error": {
                    "code": "ResourceNotFound",
                    "message": "The Resource 'Microsoft.MachineLearningServices/"
                    "workspaces/hvd-dev475c-mlwx7k2q5b8e' under resource group 'hvd-dev475c-rg' was not found.",
                }
            },
            None,
            ["workspace hvd-dev475c-mlwx7k2q5b8e in resource group hvd-dev475c-rg was not found"],
        ),
    ],
)
def test_refused_submissions_name_the_fix(azure, dev_outputs, small_job, where, status, body, headers, expected):
    azure.upload_code = True
    azure.fail = (where, status, body, headers)
    message = submit(dev_outputs, small_job)
    assert isinstance(message, str) and message.startswith("error: "), message
    for part in expected:
        assert part in message, (part, message)
    assert "\n" not in message


@pytest.mark.parametrize(
    "body,expected",
    [
        (
            {"error": {"code": "UserError", "message": "Compute gpu-ib-jvedj not found in workspace."}},
            "Azure ML has no usable compute 'gpu-ib-jvedj' in workspace hvd-dev475c-mlwx7k2q5b8e",
        ),
        (
            {"error": {"code": "UserError", "message": "Invalid image name {registry}/training/pytorch:x"}},
            "Azure ML refused the image {registry}/training/pytorch:torch2.14.1-horovod0.28.1",
        ),
        (
            {"error": {"code": "UserError", "message": "Something else."}},
            "Azure ML refused the job (400 UserError): Something else.",
        ),
    ],
)
def test_job_refused_at_creation(azure, dev_outputs, small_job, body, expected):
    # The registry's name is the stack's (hashed from the subscription), not a literal.
    registry = json.loads(dev_outputs.read_text())["registry_login_server"]
    body = json.loads(json.dumps(body).replace("{registry}", registry))
    expected = expected.replace("{registry}", registry)
    azure.fail = (lambda method, url: method == "PUT" and "/jobs/" in url, 400, body, None)
    message = submit(dev_outputs, small_job)
    assert isinstance(message, str) and expected in message, message


def test_sign_in_failure_before_any_request(azure, dev_outputs, small_job, monkeypatch):
    from azure.core.exceptions import ClientAuthenticationError

    class NoLogin:  # DefaultAzureCredential with no `az login`, managed identity or env credentials
        def get_token(self, *scopes, **kw):
            raise ClientAuthenticationError(
                "DefaultAzureCredential failed to retrieve a token from the included "
                "credentials.\nAttempted credentials: ..."
            )

        get_token_info = get_token

    monkeypatch.setattr("azure.identity.DefaultAzureCredential", lambda **kw: NoLogin())
    message = submit(dev_outputs, small_job)
    assert "not signed in to Azure (DefaultAzureCredential failed to retrieve a token" in message
    assert "az login" in message and azure.calls == []


# ---- item 9: --resume-from ---------------------------------------------------------------------------


def test_resume_dry_run_writes_to_the_earlier_jobs_folder(dev_outputs, capsys):
    code = cli.main(
        [
            str(SYNTHETIC),
            "--stack-outputs",
            str(dev_outputs),
            "--cluster",
            "gpu-ib",
            "--dry-run",
            "--resume-from",
            "witty_jackal_3d4kq79d3v",
        ]
    )
    out = capsys.readouterr().out
    job = yaml.safe_load(out)
    assert code == 0
    assert (
        job["outputs"]["run"]["path"]
        == "azureml://datastores/training_logs/paths/runs/pytorch-resnet50-synthetic/witty_jackal_3d4kq79d3v/"
    )
    assert job["tags"]["resumed_from"] == "witty_jackal_3d4kq79d3v"
    assert "not checked against the workspace (dry run)" in out
    assert "if it was itself resumed (a chain)" in out and "confirmed only at submission" in out


def test_resumed_job_writes_where_the_earlier_job_wrote(azure, dev_outputs, small_job):
    azure.run_statuses, azure.job_status = ["Failed"], "Failed"
    azure.run_error = {"code": "UserError", "message": "preempted twice, then failed"}
    assert submit(dev_outputs, small_job) == 1
    earlier = next(iter(azure.jobs))
    earlier_path = azure.jobs[earlier]["properties"]["outputs"]["run"]["uri"].replace("${{name}}", earlier)

    from launcher import azureml, jobspec

    outs = stack.load_file(dev_outputs)
    filled = jobspec.resume(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), earlier, SYNTHETIC
    )
    job = jobspec.validate(filled, SYNTHETIC)
    job.code = str(small_job)
    azure.run_statuses, azure.job_status = ["Running", "Completed"], "Completed"
    assert azureml.submit(job, outs, resume_from=earlier) == 0
    new = [name for name in azure.jobs if name != earlier][0]
    sent = azure.jobs[new]["properties"]
    assert sent["outputs"]["run"]["uri"] == earlier_path
    assert earlier_path.endswith(f"/runs/pytorch-resnet50-synthetic/{earlier}/")
    assert sent["tags"]["resumed_from"] == earlier


@pytest.mark.parametrize("name", ["bad name", "-leading-dash", "x" * 300, "a.b"])
def test_resume_from_an_ill_formed_name(dev_outputs, capsys, name):
    code = cli.main(
        [
            str(SYNTHETIC),
            "--stack-outputs",
            str(dev_outputs),
            "--cluster",
            "gpu-ib",
            "--dry-run",
            f"--resume-from={name}",
        ]
    )
    assert code == 2
    assert "is not an Azure ML job name" in capsys.readouterr().err


def resubmit(dev_outputs, code_dir, earlier):
    from azureaccess.errors import JobError
    from launcher import azureml, jobspec

    outs = stack.load_file(dev_outputs)
    filled = jobspec.resume(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), earlier, SYNTHETIC
    )
    job = jobspec.validate(filled, SYNTHETIC)
    job.code = str(code_dir)
    with pytest.raises(JobError) as e:
        azureml.submit(job, outs, resume_from=earlier)
    return str(e.value)


def resume_job(azure, dev_outputs, code_dir, earlier):
    """Submit the synthetic job with --resume-from `earlier` as __main__ does; (exit status, its new name)."""
    from launcher import azureml, jobspec

    outs = stack.load_file(dev_outputs)
    filled = jobspec.resume(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), earlier, SYNTHETIC
    )
    job = jobspec.validate(filled, SYNTHETIC)
    job.code = str(code_dir)
    before = set(azure.jobs)
    code = azureml.submit(job, outs, stream=False, resume_from=earlier)
    return code, (set(azure.jobs) - before).pop()


@pytest.mark.parametrize("recorded", ["as submitted", "resolved"])
def test_resume_chain_writes_where_the_first_job_wrote(azure, dev_outputs, small_job, capsys, recorded):
    """A fails; B resumes A (writes to runs/<job>/A/) and fails; C resumes B: C must write to runs/<job>/A/,
    where the checkpoints are, not to runs/<job>/B/, which is empty (the payload would start at epoch 0).
    Azure ML may record an output path with ${{name}} as submitted or resolved: both must lead to A's folder."""
    azure.resolve_name = recorded == "resolved"
    azure.job_status = "Failed"
    assert submit(dev_outputs, small_job, stream=False) == 0
    a = next(iter(azure.jobs))
    a_path = azure.jobs[a]["properties"]["outputs"]["run"]["uri"].replace("${{name}}", a)
    assert a_path.endswith(f"/runs/pytorch-resnet50-synthetic/{a}/")
    assert ("${{name}}" in azure.jobs[a]["properties"]["outputs"]["run"]["uri"]) == (recorded == "as submitted")
    capsys.readouterr()

    code, b = resume_job(azure, dev_outputs, small_job, a)
    assert code == 0 and azure.jobs[b]["properties"]["outputs"]["run"]["uri"] == a_path
    assert "--resume-from" not in capsys.readouterr().out.replace(f"submitted {b}", "")  # no path changed

    code, c = resume_job(azure, dev_outputs, small_job, b)
    sent = azure.jobs[c]["properties"]
    assert code == 0 and len({a, b, c}) == 3
    assert sent["outputs"]["run"]["uri"] == a_path, "C must resume from A's folder, where B wrote"
    assert sent["tags"]["resumed_from"] == b
    assert (
        f"--resume-from {b}: output run -> {a_path} (where {b} wrote; it was itself resumed from {a})"
        in capsys.readouterr().out
    )

    code, d = resume_job(azure, dev_outputs, small_job, c)  # and on down the chain
    assert code == 0 and azure.jobs[d]["properties"]["outputs"]["run"]["uri"] == a_path


def test_resume_from_a_job_with_no_recorded_output_folder(azure, dev_outputs, small_job):
    azure.job_status = "Failed"
    assert submit(dev_outputs, small_job, stream=False) == 0
    earlier = next(iter(azure.jobs))
    del azure.jobs[earlier]["properties"]["outputs"]["run"]
    message = resubmit(dev_outputs, small_job, earlier)
    assert f"--resume-from {earlier}: Azure ML records no folder for that job's output 'run'" in message
    assert "submit without --resume-from" in message and len(azure.jobs) == 1


def test_resume_from_an_unknown_job(azure, dev_outputs, small_job):
    message = resubmit(dev_outputs, small_job, "no_such_job_123")
    assert "--resume-from no_such_job_123: workspace hvd-dev475c-mlwx7k2q5b8e has no such job" in message
    assert not any(method == "PUT" for method, _ in azure.calls)


def test_resume_from_a_job_still_running(azure, dev_outputs, small_job):
    azure.run_statuses, azure.job_status = ["Running"], "Running"
    assert submit(dev_outputs, small_job, stream=False) == 0
    earlier = next(iter(azure.jobs))
    message = resubmit(dev_outputs, small_job, earlier)
    assert "that job is still Running" in message and f"az ml job cancel -n {earlier}" in message
    assert len(azure.jobs) == 1


def test_resume_from_another_kind_of_job(azure, dev_outputs, small_job):
    azure.job_status = "Failed"
    assert submit(dev_outputs, small_job, stream=False) == 0
    earlier = next(iter(azure.jobs))
    azure.jobs[earlier]["properties"]["displayName"] = "tensorflow-resnet50-synthetic"
    message = resubmit(dev_outputs, small_job, earlier)
    assert "that job ran 'tensorflow-resnet50-synthetic', not 'pytorch-resnet50-synthetic'" in message


def test_resume_is_for_azure_ml_only(capsys):
    assert cli.main([str(SYNTHETIC), "--target", "local", "--resume-from", "x1"]) == 2
    assert "--output-dir" in capsys.readouterr().err


# ---- item 11: how jobs read their data ---------------------------------------------------------------

IMAGENET_JOBS = [IMAGENET, ROOT / "jobs/tensorflow-resnet50-imagenet.yaml"]


def resolved(dev_outputs, job, *args):
    from launcher import jobspec

    outs = stack.load_file(dev_outputs)
    mode = args[0] if args else None
    filled = jobspec.fill(jobspec.read_template(job), outs, "gpu-ib", 1, None, [], mode, job)
    return jobspec.validate(filled, job)


@pytest.mark.parametrize("job", IMAGENET_JOBS, ids=lambda p: p.stem)
def test_imagenet_jobs_mount_with_the_block_cache(dev_outputs, job):
    """Azure ML's default mount caches whole files (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false); its
    documented setting for many small files over several epochs, and for large sequential files, is the
    block-based cache. The job must ask for it: leaving it out means whole-file caching."""
    sdk_job = resolved(dev_outputs, job)
    assert sdk_job.inputs["imagenet"].mode == "ro_mount"
    assert sdk_job.environment_variables["DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED"] == "true"
    template = yaml.safe_load(job.read_text())
    assert "false" not in str(
        (template.get("environment_variables") or {}).get("DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED")
    )


@pytest.mark.parametrize("job", IMAGENET_JOBS, ids=lambda p: p.stem)
def test_download_mode_copies_the_data_first(dev_outputs, job, capsys):
    sdk_job = resolved(dev_outputs, job, "download")
    assert sdk_job.inputs["imagenet"].mode == "download"
    assert not [k for k in sdk_job.environment_variables if k.startswith("DATASET_MOUNT_")]
    assert (
        cli.main(
            [
                str(job),
                "--stack-outputs",
                str(dev_outputs),
                "--cluster",
                "gpu-ib",
                "--dry-run",
                "--input-mode",
                "download",
            ]
        )
        == 0
    )
    assert yaml.safe_load(capsys.readouterr().out)["inputs"]["imagenet"]["mode"] == "download"


@pytest.mark.parametrize(
    "job,mode,message",
    [
        (IMAGENET, "mount", "--input-mode 'mount': choose ro_mount (stream"),
        (IMAGENET, "rw_mount", "--input-mode 'rw_mount': choose ro_mount"),
        (SYNTHETIC, "download", "--input-mode download: pytorch-resnet50-synthetic.yaml declares no inputs"),
    ],
)
def test_bad_input_modes(dev_outputs, capsys, job, mode, message):
    assert (
        cli.main(
            [str(job), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--dry-run", "--input-mode", mode]
        )
        == 2
    )
    assert message in capsys.readouterr().err


def test_job_file_mount_settings_win(dev_outputs, tmp_path):
    """Whole-file caching stays available to a job that reads large files at random (the docs' case for it)."""
    from launcher import jobspec

    template = yaml.safe_load(IMAGENET.read_text())
    template["environment_variables"] = {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"}
    filled = jobspec.fill(template, stack.load_file(dev_outputs), "gpu-ib", 1, None, [], None, IMAGENET)
    assert filled["environment_variables"]["DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED"] == "false"
