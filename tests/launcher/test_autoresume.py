"""Auto-resume on Azure ML (launcher/autoresume.py), with azure-ai-ml and azure-storage-blob running for real down to
the HTTP layer (fake_azureml.py): each job the chain submits ends as scripted, its run folder in the logs
container holding what the payloads write (heartbeats, the watchdog's report). The decision table against real
local runs' folders is asserted where those runs happen (test_replicas, test_watchdog, test_bad_input,
test_preemption); a rank killed under the local launcher resumes by itself in test_drill."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import time
import urllib.parse

import fake_arm
import pytest
from fake_azureml import SYNTHETIC
from fake_azureml import FakeAzure as SubmitFake

from azureaccess import stack
from azureaccess.errors import JobError
from launcher import __main__ as cli
from launcher import autoresume, azureml, endings, jobspec, target

HOST = "10.0.0.5-node"


def beats(at: tuple[int, int], doing: str = "training", codes=(None, None), host: str = HOST) -> dict[str, dict]:
    """Two ranks' last heartbeats of one attempt, as payloads/common/watchdog.py writes them."""
    now = time.time() + 60
    out = {}
    for r, code in enumerate(codes):
        beat = {"run": f"run-{at}", "rank": r, "size": 2, "host": host, "steps": 9, "at": list(at), "doing": doing}
        beat["written_at"] = now
        if code is not None:
            beat["exit_code"] = code
        out[f"progress/rank{r}.json"] = beat
    return out


def failed(code: int) -> str:
    return f"Execution failed. User process 'python' exited with status code {code}. Please check log file"


class Chained(SubmitFake):
    """Each job created ends as the next outcome: (status, run error message, files of the run folder)."""

    def __init__(self, outputs: stack.StackOutputs):
        super().__init__()
        self.outcomes: list[tuple[str, str | None, dict]] = []
        self.ended: dict[str, tuple[str, str | None, dict]] = {}
        self.outage = 0  # job and run-history reads that answer 503 (azure-core retries each a few times first)
        self.refused = False  # job and run-history reads answer 403 (the person's role on the workspace gone)
        self.race = False  # another launcher creates the next attempt just before this one does
        logs = outputs["datastores"]["logs"]
        self.blob_host = f"https://{logs['account']}.blob.core.windows.net/{logs['container']}/"
        self.folder = None  # the chain's run folder (the first job's)

    def __call__(self, request):
        method, url = request.method, request.url.split("?")[0]
        if url.startswith(self.blob_host):
            relative = url[len(self.blob_host) :]
            files = self.ended[max(self.ended, key=len)][2] if self.ended else {}  # the newest job's files
            name = relative.removeprefix(self.folder or "")
            if method == "GET" and name in files:
                status, body, headers = fake_arm.blob_content(json.dumps(files[name]).encode(), fake_arm_now())
                return self.response(request, status, headers=headers, raw=body)
            status, body, headers = fake_arm.storage_error(404, "BlobNotFound", "The specified blob does not exist.")
            return self.response(request, status, headers=headers, raw=body)
        m = re.search(r"/jobs/([^/]+)$", url)
        if m and method == "PUT" and self.race and m[1] not in self.jobs and m[1].endswith("-r1"):
            self.race = False
            self(request)  # the winner's identical job, a moment earlier
            body = {"error": {"code": "Conflict", "message": f"A job named {m[1]} already exists"}}
            return self.response(request, 409, body)
        if m and method == "PUT":
            response = super().__call__(request)
            self.ended[m[1]] = self.outcomes.pop(0)
            self.digest = "sha256:" + "cd" * 32  # the image's tag pushed again once the chain's first job is in
            if self.folder is None:
                run = self.jobs[m[1]]["properties"]["outputs"]["run"]["uri"]
                self.folder = run.split("/paths/", 1)[1].replace("${{name}}", m[1])
            return response
        if method == "GET" and self.refused and (m or "/details" in url):
            body = {"error": {"code": "AuthorizationFailed", "message": "The client does not have authorization"}}
            return self.response(request, 403, body)
        if method == "GET" and self.outage and (m or "/details" in url):
            self.outage -= 1
            return self.response(request, 503, {"error": {"code": "ServiceUnavailable", "message": "try later"}})
        if m and method == "GET" and m[1] in self.jobs:
            self.job_status = self.ended[m[1]][0]
        m = re.search(r"/runs/([^/]+)/details$", url)
        if m and m[1] in self.ended:
            self.run_statuses = [self.ended[m[1]][0]]
            self.run_error = {"code": "UserError", "message": self.ended[m[1]][1]} if self.ended[m[1]][1] else None
        return super().__call__(request)


def fake_arm_now():
    return dt.datetime.now(dt.UTC)


@pytest.fixture
def chained(monkeypatch, dev_outputs, tmp_path):
    from azure.core.credentials import AccessToken, AccessTokenInfo

    fake = Chained(stack.load_file(dev_outputs))
    fake.scopes = []

    def token(scopes) -> str:  # the person's token for the scope's resource (azure-ai-ml reads its audience)
        fake.scopes += scopes
        return fake_arm.jwt({**fake_arm.USER, "aud": scopes[0].removesuffix("/.default"), "tid": "t"})

    class Credential:  # what `az login` gives DefaultAzureCredential
        def get_token(self, *scopes, **kw):
            return AccessToken(token(scopes), int(time.time()) + 3600)

        def get_token_info(self, *scopes, **kw):
            return AccessTokenInfo(token(scopes), int(time.time()) + 3600)

    import requests.adapters

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", lambda self, request, **kw: fake(request))
    monkeypatch.setattr("azure.identity.DefaultAzureCredential", lambda **kw: Credential())
    monkeypatch.setattr("azure.ai.ml.operations._job_ops_helper._wait_before_polling", lambda seconds: 0)
    monkeypatch.setattr("azure.core.pipeline.policies.RetryPolicy.sleep", lambda *a, **kw: None)  # its backoff
    fake.paused = []
    monkeypatch.setattr(azureml, "pause", fake.paused.append)
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('hello')\n")
    fake.code = code
    return fake


def chain(fake, dev_outputs, budget: int, follow: str | None = None, health=None, cap: float | None = None) -> int:
    """The launcher's --auto-resume on the synthetic job, as __main__ builds it."""
    outs = stack.load_file(dev_outputs)
    filled = jobspec.fill(jobspec.read_template(SYNTHETIC), outs, target.resolve(outs, "gpu-ib", 2, 1), [])

    def build(earlier):
        job = jobspec.validate(jobspec.resume(filled, earlier, SYNTHETIC) if earlier else filled, SYNTHETIC)
        job.code = str(fake.code)
        return job

    return autoresume.run_azureml(build, outs, budget, cap, follow_name=follow, health=health)


def outs_registry(dev_outputs) -> str:
    return stack.load_file(dev_outputs)["registry_login_server"]


def tags(fake, name: str) -> dict:
    return fake.jobs[name]["properties"]["tags"]


def test_a_chain_resumes_what_can_resume_and_stops_on_the_same_failure_twice(chained, dev_outputs, capsys):
    chained.outcomes = [
        ("Failed", failed(75), beats((0, 5), doing="stopped", codes=(75, 75))),  # preempted, stopped with a checkpoint
        ("Failed", failed(137), beats((1, 2))),  # a node lost: unknown, resume from the newest checkpoint
        ("Failed", failed(137), beats((1, 2))),  # the same again at the same step: deterministic
    ]
    assert chain(chained, dev_outputs, budget=5) == 1
    out = capsys.readouterr().out
    first, second, third = chained.jobs
    assert (second, third) == (f"{first}-r1", f"{first}-r2")  # named by the chain: submitted once, whoever submits
    folder = chained.jobs[first]["properties"]["outputs"]["run"]["uri"].replace("${{name}}", first)
    for name, earlier in ((second, first), (third, second)):
        sent = chained.jobs[name]["properties"]
        assert sent["outputs"]["run"]["uri"] == folder and sent["tags"]["resumed_from"] == earlier
    assert tags(chained, second)["autoresume_history"] == "stopped|75|0.5"
    assert tags(chained, third)["autoresume_history"] == "stopped|75|0.5;unknown|137|1.2"
    assert (tags(chained, third)["autoresume_attempt"], tags(chained, third)["autoresume_chain"]) == ("2", first)
    pinned = f"{outs_registry(dev_outputs)}/training/pytorch@sha256:{'ab' * 32}"
    assert chained.images == [pinned] * 3 and tags(chained, third)["autoresume_image"] == pinned  # the tag moved
    assert f"image {outs_registry(dev_outputs)}/training/pytorch:torch2.14.1-horovod0.28.1: {pinned}" in out
    assert f"{first} (attempt 1 of chain {first}) ended: stopped, exit 75 at epoch 1, step 5" in out
    assert "resume 1 of 5" in out and "resume 2 of 5" in out
    assert "not resumed: attempt 2 ended the same way at the same step (unknown|137|1.2)" in out


def test_two_launchers_share_one_budget_and_submit_each_attempt_once(chained, dev_outputs, capsys):
    chained.outcomes = [
        ("Failed", failed(75), beats((0, 5), doing="stopped", codes=(75, 75))),
        ("Failed", failed(75), beats((0, 9), doing="stopped", codes=(75, 75))),
    ]
    # The first launcher resubmits once, then is stopped while it follows the resumed job.
    real_follow = azureml.follow
    followed = []

    def follow_then_stop(ml, name, url, outputs, patient=False):
        followed.append(name)
        return azureml.EXIT_INTERRUPTED if len(followed) == 2 else real_follow(ml, name, url, outputs, patient)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(azureml, "follow", follow_then_stop)
        assert chain(chained, dev_outputs, budget=1) == azureml.EXIT_INTERRUPTED
    first, second = chained.jobs
    capsys.readouterr()
    # A second launcher, started on the first job (already ended and resubmitted): it follows the resubmission
    # instead of submitting it again, and the chain's budget (1, from the tags) holds over its own 5.
    assert chain(chained, dev_outputs, budget=5, follow=first) == 1
    out = capsys.readouterr().out
    assert list(chained.jobs) == [first, second], "no job submitted twice, none past the budget"
    assert f"{first}'s chain has a budget of 1 resume(s): that budget holds, not 5" in out
    assert f"{second} was already submitted by another launcher following this chain: following it" in out
    assert "not resumed: the chain's budget of 1 resume(s) is spent" in out


def test_the_launcher_that_loses_the_race_for_the_next_name_follows_the_winners_job(chained, dev_outputs, capsys):
    chained.outcomes = [
        ("Failed", failed(75), beats((0, 5), doing="stopped", codes=(75, 75))),
        ("Completed", None, beats((2, 0), doing="finished", codes=(0, 0))),
    ]
    chained.race = True
    assert chain(chained, dev_outputs, budget=2) == 0
    first, second = chained.jobs
    out = capsys.readouterr().out
    assert f"{second} was already submitted by another launcher following this chain: following it" in out
    assert f"job {second} ended: Completed" in out


def test_nothing_is_decided_while_the_status_cannot_be_read(chained, dev_outputs, capsys):
    chained.outcomes = [("Completed", None, beats((2, 0), doing="finished", codes=(0, 0)))]
    chained.outage = 40  # the stream loses contact, then the status cannot be read for a while
    assert chain(chained, dev_outputs, budget=3) == 0
    err = capsys.readouterr().err
    unknown = err.count("nothing is done while it is unknown")
    assert unknown >= 2 and chained.outage == 0, err
    assert chained.paused[:2] == [azureml.POLL_SECONDS, 2 * azureml.POLL_SECONDS]  # backing off, never ending
    assert len(chained.jobs) == 1


def test_a_refused_read_ends_the_chain_after_a_few_tries_naming_the_fix(chained, dev_outputs):
    """A 403 (the person's role gone) does not mend by waiting: the third refusal in a row ends the chain."""
    chained.outcomes = [("Failed", failed(75), beats((0, 5), doing="stopped", codes=(75, 75)))]
    chained.refused = True
    with pytest.raises(JobError) as e:
        chain(chained, dev_outputs, budget=3)
    assert "Azure refused the read (403 AuthorizationFailed" in str(e.value) and "'AzureML Data Scientist'" in str(
        e.value
    )
    assert str(e.value).endswith("asked 3 times, the chain stops here (the job is not affected)")
    assert chained.paused == [azureml.POLL_SECONDS, 2 * azureml.POLL_SECONDS] and len(chained.jobs) == 1


def test_a_supervisor_whose_on_behalf_of_token_is_no_longer_issued_stops_naming_the_fix(
    chained, dev_outputs, monkeypatch
):
    """Inside the supervisor (Azure ML's on-behalf-of credential), a token endpoint that refuses the person's token
    (expired consent, a revoked session) ends the chain with one line, not 14 days of polling."""
    chained.outcomes = [("Completed", None, beats((2, 0), doing="finished", codes=(0, 0)))]
    assert chain(chained, dev_outputs, budget=1) == 0
    first = next(iter(chained.jobs))
    real, asked = chained.__call__, []

    def refusing_obo(request):
        if request.url.startswith("http://obo.local/"):
            asked.append(request.url)
            body = {"error": "invalid_grant", "error_description": "AADSTS50173: the provided grant has expired"}
            return chained.response(request, 400, body)
        return real(request)

    import requests.adapters

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", lambda self, request, **kw: refusing_obo(request))
    monkeypatch.setenv("LAUNCHER_CREDENTIAL", "azureml-on-behalf-of")
    monkeypatch.setenv("OBO_ENDPOINT", "http://obo.local/token")
    with pytest.raises(JobError) as e:
        chain(chained, dev_outputs, budget=1, follow=first)
    assert f"job {first}: Azure refused the on-behalf-of sign-in of the person who submitted this supervisor" in str(
        e.value
    )
    assert "--follow <the newest job>" in str(e.value) and "asked 3 times" in str(e.value) and asked


@pytest.mark.parametrize("verdict", [0, 1])
def test_a_hang_runs_the_health_check_before_the_resume(chained, dev_outputs, capsys, verdict):
    stall = {"run": "run-(0, 7)", "line": "stalled: rank 1 on node-3 stopped", "ranks": []}
    stall["ranks"] = [{"rank": 0, "host": HOST, "why": "waiting"}, {"rank": 1, "host": "node-3", "why": "stopped"}]
    chained.outcomes = [
        ("Failed", failed(124), {**beats((0, 7)), "stalls/report.json": stall}),
        ("Completed", None, beats((2, 0), doing="finished", codes=(0, 0))),
    ]
    checks = []
    code = chain(chained, dev_outputs, budget=2, health=lambda: checks.append("check") or verdict)
    out = capsys.readouterr().out
    assert checks == ["check"]
    assert "hang, exit 124 at epoch 1, step 7 on node-3: stalled: rank 1 on node-3 stopped" in out
    assert "resume 1 of 2, after the health check of the job's nodes (named: node-3)" in out
    if verdict:
        assert code == 1 and len(chained.jobs) == 1 and "the health check failed" in out
    else:
        assert code == 0 and len(chained.jobs) == 2


@pytest.mark.parametrize(
    "outcome, says",
    [
        (("Failed", failed(2), beats((0, 3), codes=(2, 143))), "permanent, exit 2 at epoch 1, step 3"),
        (("Canceled", None, beats((0, 3))), "canceled on Azure ML"),
        # a person's cancel stops every rank with a checkpoint, as a preemption's SIGTERM does: Canceled decides
        (("Canceled", None, beats((0, 3), doing="stopped", codes=(75, 75))), "canceled at epoch 1, step 3: canceled"),
    ],
)
def test_a_refused_configuration_or_a_cancel_ends_the_chain(chained, dev_outputs, capsys, outcome, says):
    chained.outcomes = [outcome]
    assert chain(chained, dev_outputs, budget=3) == 1
    out = capsys.readouterr().out
    assert says in out and "not resumed" in out and len(chained.jobs) == 1


def test_a_preempted_job_is_resumed_each_time_azure_ml_preempts_it(chained, dev_outputs, capsys):
    """Azure ML does not restart a preempted job ("You have to restart a preempted job"): it ends Failed with a
    preemption error, before or after any step, and the chain resumes it; the same preemption twice is Azure's doing,
    not a deterministic failure."""
    preempted = "PreemptionError: Received pre-emption warning signal, the job is being preempted"
    chained.outcomes = [
        ("Failed", preempted, {}),
        ("Failed", preempted, {}),
        ("Completed", None, beats((2, 0), doing="finished", codes=(0, 0))),
    ]
    assert chain(chained, dev_outputs, budget=3) == 0
    out = capsys.readouterr().out
    first = next(iter(chained.jobs))
    assert list(chained.jobs) == [first, f"{first}-r1", f"{first}-r2"]
    assert re.search(rf"ended: preempted at before the first step: .*{preempted}; resume 1 of 3", out), out
    assert (
        "resume 2 of 3" in out and tags(chained, f"{first}-r2")["autoresume_history"] == "preempted|-|-;preempted|-|-"
    )


def test_the_decision_table(tmp_path):
    stopped = endings.Ending(endings.STOPPED, 75, (0, 5))
    fresh = autoresume.Chain("a", budget=2, cap_usd=100.0)
    assert autoresume.decide(stopped, fresh, 10.0).action == autoresume.RESUME
    assert "cost $100.00, at its cap" in autoresume.decide(stopped, fresh, 100.0).line
    spent = dataclasses.replace(fresh, attempt=2)
    assert "budget of 2" in autoresume.decide(stopped, spent, 0.0).line
    later = autoresume.decide(endings.Ending(endings.STOPPED, 75, (0, 9)), fresh.after(stopped, 1.0), 1.0)
    assert later.action == autoresume.RESUME  # the same class further on is progress, not a loop
    node = endings.Ending(endings.NODE_FAULT, 70, (1, 0), ("node-7",))
    assert autoresume.decide(node, fresh, 0.0).action == autoresume.CHECK_THEN_RESUME
    # Azure ML's message for a node short of GPUs is a node fault without the payload's files
    read = endings.local_reader(tmp_path / "nowhere")
    found = endings.classify("Failed", None, read, 8, "Expected 8 GPUs but the number of GPUs found is 7")
    assert found.kind == endings.NODE_FAULT and found.at is None
    # A rank whose decode worker died ends 74 and says so in its last heartbeat: an input fault on its host, resumed
    beats = {f"progress/rank{r}.json": {"run": "t", "size": 2, "at": [0, 46], "host": f"node-{r}", "written_at": 1,
                                        "exit_code": 74 if r else 1} for r in (0, 1)}  # fmt: skip
    for launcher_saw in (74, 1):  # mpirun's first non-zero code, or horovodrun's 1 hiding it
        fault = endings.classify("Failed", launcher_saw, beats.get, 2)
        assert (fault.kind, fault.exit_code, fault.hosts) == (endings.INPUT_FAULT, 74, ("node-1",)), fault
        assert "decode worker died" in fault.line() and autoresume.decide(fault, fresh, 0.0).action == autoresume.RESUME
    # A node lost where mpirun names no host (it heard of the daemon's end from its launch agent first): the host whose
    # ranks fell silent a heartbeat period (5 s, as the heartbeats say) before the others' last beat is named
    lost = "ORTE was unable to reliably start one or more daemons.\nThis usually is caused by:"
    for (t0, t1), named in (((106.0, 100.0), ("node-1",)), ((104.0, 100.0), ()), ((100.0, 106.0), ("node-0",))):
        beats = {f"progress/rank{r}.json": {"run": "t", "size": 2, "at": [0, 30], "host": f"node-{r}", "written_at": t,
                                            "every": 5.0} for r, t in ((0, t0), (1, t1))}  # fmt: skip
        fault = endings.classify("Failed", 9, beats.get, 2, lost)
        assert (fault.kind, fault.hosts) == (endings.NODE_FAULT, named), fault


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--follow", "abc"], "belong to --auto-resume N"),
        (["--auto-resume", "-1"], "0 or more"),
        (["--auto-resume", "2", "--no-stream"], "drop --no-stream"),
        (["--auto-resume", "2", "--auto-resume-cap", "0"], "above 0"),
        (["--auto-resume", "2", "--target", "local", "--auto-resume-cap", "5"], "are for Azure ML jobs"),
        (["--auto-resume", "2", "--target", "local", "--drill", "term"], "drop --auto-resume"),
    ],
)
def test_auto_resume_refusals_name_the_fix(dev_outputs, capsys, argv, message):
    code = cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", *argv])
    assert code == 2 and message in capsys.readouterr().err


def test_a_local_state_this_tool_did_not_write_is_refused(tmp_path):
    (tmp_path / autoresume.LOCAL_STATE).write_text("{not json")
    with pytest.raises(JobError, match="move it away to start a new chain"):
        autoresume.run_local(lambda: 0, tmp_path, 2, 1)


def test_a_supervisor_job_follows_the_chain_with_the_persons_identity(chained, dev_outputs, monkeypatch, tmp_path):
    """--supervise: the training job, then the supervisor on the stack's CPU cluster with `identity: user_identity`;
    run as that job runs it (its command, its environment, Azure ML's on-behalf-of token endpoint faked at HTTP),
    it follows the chain, resumes it from the first job's code asset, and asks for no token but the person's."""
    chained.outcomes = [
        ("Failed", failed(75), beats((0, 5), doing="stopped", codes=(75, 75))),  # the training job
        ("Running", None, {}),  # the supervisor itself: not followed here
        ("Completed", None, beats((2, 0), doing="finished", codes=(0, 0))),  # the resumed job
    ]
    args = [str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--nodes", "2"]
    args += ["--skip-quota-check", "--auto-resume", "3", "--supervise", "--", "--epochs", "2"]
    assert cli.main(args) == 0
    # A user-identity job is sent with the person's Azure ML token beside the ARM one (azure-ai-ml's
    # _set_headers_with_user_aml_token): the submitter must be able to get one.
    assert "https://ml.azure.com/.default" in chained.scopes
    first, supervisor = chained.jobs
    sent = chained.jobs[supervisor]["properties"]
    outs = stack.load_file(dev_outputs)
    assert sent["identity"]["identityType"] == "UserIdentity"
    assert sent["computeId"].endswith("/computes/" + outs.cluster("cpu-smoke")["compute_name"])
    assert chained.images[-1] == f"{outs['registry_login_server']}/training/launcher@sha256:{'cd' * 32}"
    env = sent["environmentVariables"]
    assert (
        env["LAUNCHER_CREDENTIAL"] == "azureml-on-behalf-of"
        and json.loads(env["LAUNCHER_STACK_OUTPUTS"]) == outs.values
    )
    command = sent["command"].split("python -m launcher ", 1)[1].split()
    assert command[:2] == ["jobs/pytorch-resnet50-synthetic.yaml", "--stack-outputs"]
    assert f"--follow {first} --auto-resume 3" in " ".join(command) and command[-3:] == ["--", "--epochs", "2"]

    # What the supervisor runs, in its environment: the person's token through Azure ML's on-behalf-of endpoint.
    tokens = []
    real = chained.__call__

    def with_obo(request):
        if request.url.startswith("http://obo.local/"):
            resource = urllib.parse.unquote(request.url.split("resource=", 1)[1])
            tokens.append(resource)
            person = fake_arm.jwt({**fake_arm.USER, "aud": resource, "tid": "t"})
            body = {"access_token": person, "expires_in": "3600", "token_type": "Bearer", "resource": resource}
            return chained.response(request, 200, body)
        return real(request)

    import requests.adapters

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", lambda self, request, **kw: with_obo(request))
    monkeypatch.setattr("azure.identity.DefaultAzureCredential", lambda **kw: pytest.fail("not the person's OBO"))
    monkeypatch.setenv("LAUNCHER_CREDENTIAL", env["LAUNCHER_CREDENTIAL"])
    monkeypatch.setenv("OBO_ENDPOINT", "http://obo.local/token")
    outputs_file = tmp_path / "stack-outputs.json"
    outputs_file.write_text(env["LAUNCHER_STACK_OUTPUTS"])
    command[command.index("--stack-outputs") + 1] = str(outputs_file)
    assert cli.main(command) == 0
    assert list(chained.jobs) == [first, supervisor, f"{first}-r1"]
    resumed = chained.jobs[f"{first}-r1"]["properties"]
    assert resumed["codeId"] == chained.jobs[first]["properties"]["codeId"]  # the chain's code, not the checkout's
    assert resumed["tags"]["resumed_from"] == first
    assert "https://management.azure.com" in tokens, tokens  # ARM, through Azure ML's on-behalf-of endpoint


def test_the_supervisor_carries_every_module_its_launcher_imports():
    """The supervisor's code is the folder `carried` builds, not the checkout: every module of the launcher and of
    the packages it imports (the checks, the sign-in) imports there, from there."""
    import subprocess
    import sys

    import yaml

    from launcher import supervisor

    with supervisor.carried(SYNTHETIC, yaml.safe_load(SYNTHETIC.read_text())) as folder:
        modules = sorted(
            ".".join(p.relative_to(folder).with_suffix("").parts).removesuffix(".__init__")
            for top in ("launcher", "azurecheck", "azureaccess")
            for p in (folder / top).rglob("*.py")
            if p.name != "__main__.py"
        )
        probe = "import importlib, sys\nfor m in sys.argv[1:]:\n    print(importlib.import_module(m).__file__)"
        proc = subprocess.run([sys.executable, "-c", probe, *modules], cwd=folder, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        files = proc.stdout.split()
        assert len(files) == len(modules) > 30 and all(f.startswith(str(folder)) for f in files), files


def test_supervise_refuses_a_stack_without_a_cpu_cluster_a_gpu_cluster_and_a_low_priority_one(
    dev_outputs, tmp_path, capsys
):
    from launcher import supervisor

    outs = stack.load_file(dev_outputs)
    gpu_only = {k: v for k, v in outs.values["clusters"].items() if v.get("gpus_per_node")}
    with pytest.raises(JobError, match="no dedicated CPU cluster to run the supervisor on"):
        supervisor.cpu_cluster(stack.StackOutputs({**outs.values, "clusters": gpu_only}), None)
    with pytest.raises(JobError, match="a GPU cluster; the supervisor only follows a job"):
        supervisor.cpu_cluster(outs, "gpu-ib")
    spot = {**outs.values["clusters"], "cpu-smoke": {**outs.values["clusters"]["cpu-smoke"], "low_priority": True}}
    with pytest.raises(JobError, match=r"a low-priority cluster \(jobs there live 7 days\).*\(the stack has none\)"):
        supervisor.cpu_cluster(stack.StackOutputs({**outs.values, "clusters": spot}), "cpu-smoke")
    assert supervisor.cpu_cluster(outs, None).name == "cpu-smoke"


def test_an_unknown_launcher_credential_is_refused(monkeypatch):
    from azureaccess import credential

    monkeypatch.setenv("LAUNCHER_CREDENTIAL", "managed")
    with pytest.raises(JobError, match="the one value is azureml-on-behalf-of"):
        credential.azure_credential()
