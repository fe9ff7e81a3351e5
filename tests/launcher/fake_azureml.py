"""A fake of what azure-ai-ml talks to when it submits a job: Azure Resource Manager, the workspace's run history
and its storage, answered at requests' adapter so that the SDK runs for real above it. The exceptions the tests
see are the ones the SDK itself raises from those answers (HttpResponseError, ClientAuthenticationError,
ResourceNotFoundError, JobException). The `azure` fixture (conftest.py) installs it."""

import json
import pathlib

from azureaccess import stack

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYNTHETIC = ROOT / "jobs/pytorch-resnet50-synthetic.yaml"
IMAGENET = ROOT / "jobs/pytorch-resnet50-imagenet.yaml"

WS = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/hvd-dev475c-rg/providers/"
    "Microsoft.MachineLearningServices/workspaces/hvd-dev475c-mlwx7k2q5b8e"
)
API = "https://westeurope.api.azureml.ms"
REGISTRY = "hvddevacr0e4baacb.azurecr.io"  # the dev stack's (infra/review/dev-outputs.json)
DIGEST = "sha256:" + "ab" * 32


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
        self.digest = DIGEST  # what the registry answers for every tag (a push moves it)
        self.images = []  # the images of the environments sent

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
            self.images.append(body["properties"].get("image"))
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
        m = re.match(rf"https://{REGISTRY}/(oauth2/exchange|oauth2/token|acr/v1/(.+)/_tags/([^/?]+))", url)
        if m:  # the registry's data plane (azure-containerregistry): Entra token exchanged, then the tag's digest
            if m[1] == "oauth2/exchange":
                return self.response(request, 200, {"refresh_token": "acr-refresh"})
            if m[1] == "oauth2/token":
                return self.response(request, 200, {"access_token": "acr-access"})
            if request.headers.get("Authorization") != "Bearer acr-access":
                challenge = f'Bearer realm="https://{REGISTRY}/oauth2/token",service="{REGISTRY}",scope="x"'
                return self.response(request, 401, {"errors": []}, {"WWW-Authenticate": challenge})
            return self.response(request, 200, tag_properties(m[2], m[3], self.digest))
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


def tag_properties(repository: str, tag: str, digest: str = DIGEST) -> dict:
    """The registry's answer for a tag (GET /acr/v1/<repository>/_tags/<tag>)."""
    can = {"deleteEnabled": True, "writeEnabled": True, "readEnabled": True, "listEnabled": True}
    when = "2026-11-20T10:00:00Z"
    found = {"name": tag, "digest": digest, "createdTime": when, "lastUpdateTime": when, "changeableAttributes": can}
    return {"registry": REGISTRY, "imageName": repository, "tag": found}


def install(monkeypatch) -> FakeAzure:
    """A FakeAzure behind requests and `az login`'s credential, for one test."""
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


def submit(dev_outputs, code_dir, stream=True):
    from launcher import azureml, jobspec, target

    outs = stack.load_file(dev_outputs)
    job = jobspec.validate(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, target.resolve(outs, "gpu-ib", 2, None), []), SYNTHETIC
    )
    (code_dir / "train.py").write_text("print('hello')\n")
    job.code = str(code_dir)
    try:
        return azureml.submit(job, outs, stream=stream)
    except Exception as e:  # noqa: BLE001 - asserted below: what __main__ prints for a JobError
        from azureaccess.errors import JobError

        assert isinstance(e, JobError), e
        return f"error: {e}"


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
