"""Submit a validated job to Azure ML with azure-ai-ml, follow its logs, and end with one line: how it ended
and why.

Exit status of `python -m launcher` for --target azureml: 0 the job Completed (or was submitted with
--no-stream); 1 it ended in any other state (Failed, Canceled, NotResponding); 2 it was not submitted
(the cause and the fix are printed); 130 interrupted with Ctrl-C: the job keeps running, the line says
how to follow or cancel it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time

from azureaccess.errors import JobError, first_line
from azureaccess.stack import StackOutputs

DONE_OK = {"Completed"}
EXIT_ENDED_BADLY, EXIT_INTERRUPTED = 1, 130


def client(outputs: StackOutputs):
    from azure.ai.ml import MLClient

    # the person's sign-in (or env credentials), not a machine's identity
    from azureaccess.credential import azure_credential

    return MLClient(
        azure_credential(), outputs["subscription_id"], outputs["resource_group"], outputs["workspace_name"]
    )


def _chain(error: BaseException):
    """The exception and what caused it: azure-ai-ml wraps storage and REST errors in its own types."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _first_line(text: str, limit: int = 300) -> str:
    return first_line(text, limit)


def _http(error: BaseException):
    from azure.core.exceptions import HttpResponseError

    return next((e for e in _chain(error) if isinstance(e, HttpResponseError) and e.status_code), None)


def _error_code(http) -> str:
    """The service's error code: ARM's error.code, or Azure Storage's x-ms-error-code."""
    code = getattr(http, "error_code", None) or getattr(getattr(http, "error", None), "code", None)
    if not code and http.response is not None:
        code = http.response.headers.get("x-ms-error-code")
    return str(getattr(code, "value", code) or "")


def submission_failure(error: BaseException, outputs: StackOutputs, compute: str, image: str) -> str:
    """One line: why Azure refused the submission, and what to do about it."""
    from azure.core.exceptions import ClientAuthenticationError

    ws, rg = outputs["workspace_name"], outputs["resource_group"]
    auth = next((e for e in _chain(error) if isinstance(e, ClientAuthenticationError)), None)
    if auth is not None:
        tenant = outputs.values.get("tenant_id")
        return (
            f"not signed in to Azure ({_first_line(auth.message)}): run `az login"
            f"{f' --tenant {tenant}' if tenant else ''}` and `az account set --subscription "
            f"{outputs['subscription_id']}`, or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET for a "
            "service principal (a machine's managed identity only with AZURE_TOKEN_CREDENTIALS=ManagedIdentityCredential)"
        )
    http = _http(error)
    if http is None:
        return f"azure-ai-ml refused the job: {_first_line(error)}"
    code, status = _error_code(http), http.status_code
    url = http.response.request.url if http.response is not None and http.response.request is not None else ""
    message = _first_line(http.message or str(http))
    message = message.removeprefix(f"({code}) ")  # azure-core's format repeats the code
    if status == 403 and ".blob.core." in url:
        # The code snapshot goes to the workspace's storage account (shared keys off, firewall default Deny).
        # https://learn.microsoft.com/rest/api/storageservices/blob-service-error-codes
        if code in ("AuthorizationFailure", "AuthorizationSourceIPMismatch"):
            return (
                f"the workspace storage refused the code upload (403 {code}): its firewall admits only "
                "network.allowedClientIps: add this machine's public IP there in Pulumi.<stack>.yaml and "
                "run pulumi up (or submit from inside the VNet)"
            )
        # azure-ai-ml's own advice on AuthorizationPermissionMismatch (_artifacts/_blob_storage_helper.py)
        return (
            f"the workspace storage refused the code upload (403 {code or 'Forbidden'}): the identity writing "
            "the snapshot needs the role 'Storage Blob Data Contributor' on the workspace's storage account "
            f"(the AzureML Data Scientist role on {ws} does not include data access)"
        )
    if status == 403:
        return (
            f"Azure refused the submission (403 {code or 'Forbidden'}: {message}): you need the role "
            f"'AzureML Data Scientist' (or Contributor) on workspace {ws}: az role assignment create "
            f"--role 'AzureML Data Scientist' --assignee <you> --scope <workspace id, `az ml workspace show "
            f"-n {ws} -g {rg} --query id`>"
        )
    mentions = message.lower()
    if compute and compute.lower() in mentions and "compute" in mentions:
        return (
            f"Azure ML has no usable compute {compute!r} in workspace {ws} ({status} {code}: {message}): the "
            "stack outputs are older than the stack, or pulumi up has not finished: run pulumi up, write the "
            "outputs again and pick a cluster they list"
        )
    if image and ("image" in mentions or image.split("/")[0].lower() in mentions):
        return (
            f"Azure ML refused the image {image} ({status} {code}: {message}): build it in the stack's "
            "registry with `az acr build` (docs/images.md#building) and check the job file's image tag"
        )
    if status == 404 and ws.lower() in mentions + url.lower():
        return (
            f"workspace {ws} in resource group {rg} was not found ({message}): the stack outputs belong to "
            "another stack, subscription or a destroyed stack: `az account show`, then write them again"
        )
    return f"Azure ML refused the job ({status} {code}): {message}"


# A refused sign-in (no token, an on-behalf-of token no longer issued, a 401 or 403) does not come back by waiting: a
# chain stops after this many in a row, where a supervisor would otherwise poll a dead token for its 14 days.
AUTH_TRIES = 3


def refused(error: BaseException, outputs: StackOutputs) -> str | None:
    """The one line naming the fix where Azure refused who asks (ClientAuthenticationError, HTTP 401 or 403); None
    for anything else (an outage, which waiting mends)."""
    from azure.core.exceptions import ClientAuthenticationError

    http = _http(error)
    if not any(isinstance(e, ClientAuthenticationError) for e in _chain(error)) and getattr(
        http, "status_code", None
    ) not in (401, 403):
        return None
    from azureaccess.credential import ON_BEHALF_OF

    if os.environ.get(ON_BEHALF_OF[0]):
        return (
            f"Azure refused the on-behalf-of sign-in of the person who submitted this supervisor "
            f"({_first_line(error, 200)}): the token is no longer issued, or their access to workspace "
            f"{outputs['workspace_name']} has gone; follow the chain from a signed-in machine (python -m launcher JOB "
            "--auto-resume N --follow <the newest job>), or hand it to a new supervisor with --supervise there"
        )
    return submission_failure(error, outputs, "", "").replace("the submission", "the read")


def count_refusal(error: BaseException, refusals: int, outputs: StackOutputs, name: str) -> int:
    """The refusals in a row with `error` counted (0: it was none); the AUTH_TRIES-th ends the chain (JobError)."""
    line = refused(error, outputs)
    if line is None:
        return 0
    if refusals + 1 >= AUTH_TRIES:
        raise JobError(f"job {name}: {line}; asked {AUTH_TRIES} times, the chain stops here (the job is not affected)")
    return refusals + 1


def failure_cause(error: BaseException) -> str:
    """The one-line cause azure-ai-ml's stream() puts in the JobException it raises for a Failed job: the run's
    error as JSON after 'Exception :' (azure/ai/ml/operations/_job_ops_helper.py)."""
    text = str(error)
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            detail = json.loads(text[start : end + 1])
        except json.JSONDecodeError:
            detail = None
        if isinstance(detail, dict):
            inner = detail.get("error", detail)
            if isinstance(inner, dict) and inner.get("message"):
                code = inner.get("code")
                return f"{code}: {_first_line(inner['message'])}" if code else _first_line(inner["message"])
    return _first_line(text) or "no error recorded on the run"


def _interrupted(name: str, studio_url: str | None, outputs: StackOutputs) -> int:
    print(
        f"\ninterrupted: job {name} is still running on Azure ML (Ctrl-C only stopped following it). "
        f"Follow it again: az ml job stream -n {name} -g {outputs['resource_group']} -w {outputs['workspace_name']}"
        f"{f' or {studio_url}' if studio_url else ''}; cancel it: az ml job cancel -n {name} "
        f"-g {outputs['resource_group']} -w {outputs['workspace_name']}",
        file=sys.stderr,
        flush=True,
    )
    return EXIT_INTERRUPTED


def check_resumable(ml, earlier: str, job, outputs: StackOutputs):
    """The earlier job exists in this workspace, ran the same job definition, and no longer writes: that job."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    ws, rg = outputs["workspace_name"], outputs["resource_group"]
    try:
        found = ml.jobs.get(earlier)
    except ResourceNotFoundError:
        raise JobError(
            f"--resume-from {earlier}: workspace {ws} has no such job (names: `az ml job list -g {rg} "
            f"-w {ws} --query [].name`)"
        ) from None
    except AzureError as e:
        raise JobError(f"--resume-from {earlier}: " + submission_failure(e, outputs, "", "")) from None
    if found.display_name != job.display_name:
        raise JobError(
            f"--resume-from {earlier}: that job ran {found.display_name!r}, not {job.display_name!r}: "
            "its checkpoints belong to another job definition"
        )
    from azure.ai.ml.operations._run_history_constants import RunHistoryConstants  # what stream() waits out

    status = str(getattr(found.status, "value", found.status))
    if status not in {str(getattr(s, "value", s)) for s in RunHistoryConstants.TERMINAL_STATUSES}:
        raise JobError(
            f"--resume-from {earlier}: that job is still {status} and writes to the same folder: wait "
            f"for it, or cancel it first: az ml job cancel -n {earlier} -g {rg} -w {ws}"
        )
    return found


def follow_earlier_outputs(job, found, earlier: str) -> list[str]:
    """Point the new job's outputs at the folders `found` (job `earlier`) wrote to, as Azure ML records them.

    jobspec.resume put `earlier`'s name in place of `${{name}}`; that is right only when `earlier` ran under its
    own name. A chain A -> B -> C: B was resumed from A and wrote to runs/<job>/A/; runs/<job>/B/ is empty and
    C would silently train from epoch 0. Outputs with a fixed path are the same in both (same job definition,
    checked above); outputs with no path (Azure ML's default location) are left alone.
    Returns one line per output whose path changed from the guess."""
    from .jobspec import earlier_output_path

    changed = []
    for name, out in (job.outputs or {}).items():
        path = getattr(out, "path", None)
        if not path:
            continue
        recorded = getattr((found.outputs or {}).get(name), "path", None)
        if not recorded:
            raise JobError(
                f"--resume-from {earlier}: Azure ML records no folder for that job's output {name!r}, so "
                "there is no checkpoint of it to resume from: submit without --resume-from (a fresh "
                "start)"
            )
        followed = earlier_output_path(recorded, earlier)
        if followed != path:
            out.path = followed
            origin = (found.tags or {}).get("resumed_from")
            changed.append(
                f"output {name} -> {followed} (where {earlier} wrote"
                f"{f'; it was itself resumed from {origin}' if origin else ''})"
            )
    return changed


def check_quota(outputs: StackOutputs, cluster: str, nodes: int, credential=None, transport=None) -> None:
    """Before submitting: can the cluster's quota ever hold `nodes` nodes? Refuses (JobError) a job that would
    wait in the queue for good; prints warnings (quota below maxNodes, busy now). Always says where its numbers came
    from: read live from Azure ML just now, or nowhere (the read was refused: then it warns, says what grants the read
    and submits anyway). The platform's users read the subscription's quota through the stack's quota reader role
    (config quotaReaderRole, stack output `quota_reader_role`); workspace roles alone cannot. azurecheck/."""
    from azurecheck import arm, quota
    from azurecheck import findings as f

    if credential is None:
        from azureaccess.credential import azure_credential

        credential = azure_credential()
    c, location = outputs.cluster(cluster), outputs.values.get("location") or ""
    need = quota.Need(cluster, c["vm_size"], int(c["max_nodes"]), bool(c.get("low_priority")))
    from azurecheck import workspace

    sub = outputs["subscription_id"]
    source = f"read live from Azure ML (usages, VM sizes, quotas in {location}) just now"
    try:
        client = arm.Arm(credential, transport)
        region = quota.read_region(client, sub, location)
    except Exception as e:  # noqa: BLE001  advisory: sign-in and any other failure to read is the submission's to name
        print(
            f"warning: quota not checked (source: none; {arm.describe(e, f'reading Azure ML quotas in {location}')})"
            f"{_quota_read_hint(e, outputs)}; submitting anyway",
            file=sys.stderr,
            flush=True,
        )
        return
    try:
        quota.read_workspace_quotas(
            client, region, sub, workspace.resource_id(sub, outputs["resource_group"], outputs["workspace_name"])
        )
    except Exception as e:  # noqa: BLE001  the subscription's quota still applies
        source += ", without the workspace's own quotas"
        print(
            f"warning: {arm.describe(e, 'reading the workspace quotas')}; checking the subscription's only",
            file=sys.stderr,
            flush=True,
        )
    found = quota.check(region, need, nodes)
    for finding in found:
        if finding.status == f.WARN:
            print(f"warning: {finding.render()}", file=sys.stderr, flush=True)
    failed = [x for x in found if x.status == f.FAIL]
    if failed:
        raise JobError(
            " ".join(x.message + (f"; fix: {x.fix}" if x.fix else "") for x in failed)
            + f" (quota {source}; --skip-quota-check submits anyway)"
        )
    fits = "; ".join(x.message for x in found if x.status == f.OK) or "fits, with the warnings above"
    print(f"quota {source}: {cluster}: {fits}", file=sys.stderr, flush=True)


def _quota_read_hint(error: BaseException, outputs: StackOutputs) -> str:
    """What gives a refused quota read: the stack's quota reader role, which its `users` hold at the subscription."""
    http = _http(error)
    if http is None or http.status_code != 403:
        return ""
    role = outputs.values.get("quota_reader_role")
    if role:
        return (
            f": the stack gives its users this read through the role '{role}' on subscription "
            f"{outputs['subscription_id']}: ask the deployer to list you (or your group) in `users` and run pulumi up; "
            "a new role assignment can take some minutes to apply"
        )
    return (
        ": this stack grants its users no quota read (quotaReaderRole: false, or a stack deployed before it): the "
        "deployer sets quotaReaderRole: true and runs pulumi up (docs/deploying.md#who-can-use-it), or gives you "
        "Reader on the subscription"
    )


@contextlib.contextmanager
def _code_snapshot(job):
    """A local `code` folder is handed to azure-ai-ml as the files its snapshot holds, linked into a temporary
    folder (launcher/snapshot.py): azure-ai-ml would walk all of it, .venv included, several times."""
    code = getattr(job, "code", None)
    if not isinstance(code, (str, os.PathLike)) or not os.path.isdir(code):
        yield  # an asset reference (azureml:...) or no code
        return
    from .snapshot import staged

    with staged(code) as folder:
        job.code = folder
        try:
            yield
        finally:
            job.code = code


def pin_image(job, outputs: StackOutputs, ml=None) -> None:
    """The job's image by digest: a tag in the stack's registry read now, so that what runs is what was built, not
    what a push moved the tag to before the nodes pulled it; printed. An image by digest or from elsewhere stays."""
    env, login = getattr(job, "environment", None), outputs["registry_login_server"]
    image = str(getattr(env, "image", "") or "")
    if "@" in image or not image.startswith(login + "/"):
        return
    from azure.containerregistry import ContainerRegistryClient
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    credential = getattr(ml, "_credential", None)
    if credential is None:
        from azureaccess.credential import azure_credential

        credential = azure_credential()
    try:
        credential.get_token("https://management.azure.com/.default")
    except AzureError as e:  # no sign-in, said as such before any request (the registry's first is anonymous)
        raise JobError(submission_failure(e, outputs, "", "")) from None
    repo, _, tag = image.removeprefix(login + "/").rpartition(":")
    client = ContainerRegistryClient(f"https://{login}", credential, audience="https://management.azure.com")
    try:
        digest = client.get_tag_properties(repo, tag).digest
    except ResourceNotFoundError:
        raise JobError(f"image {image} is not in {login}: build it first (docs/images.md#building)") from None
    except AzureError as e:
        raise JobError(
            f"image {image}: its digest was not read from {login} ({_first_line(e, 200)}): jobs are submitted by "
            "digest, which needs AcrPull on the registry (the stack grants it to `users`)"
        ) from None
    env.image = f"{login}/{repo}@{digest}"
    print(f"image {image}: {env.image}", flush=True)


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a followed job ended: Azure ML's final status, and the run's error where it Failed."""

    name: str
    status: str
    cause: str | None
    studio_url: str | None


def create(ml, job, outputs: StackOutputs, resume_from: str | None = None):
    """Check what resuming needs, send the job (its code snapshot first) and print its name: the created job, or
    EXIT_INTERRUPTED after Ctrl-C (said on stderr)."""
    from azure.core.exceptions import AzureError

    if resume_from and "/" in resume_from:  # a folder of the logs container (jobspec.is_folder)
        from .checkpoints import check_folder
        from .jobspec import run_folder

        first = check_folder(outputs, run_folder(resume_from, outputs.datastore("logs")))
        print(f"--resume-from {resume_from}: resuming from {first} and what follows it", flush=True)
    elif resume_from:
        earlier = check_resumable(ml, resume_from, job, outputs)
        for line in follow_earlier_outputs(job, earlier, resume_from):
            print(f"--resume-from {resume_from}: {line}", flush=True)
    # create_or_update rewrites these into ARM ids: keep the names the user knows for the messages
    compute = str(getattr(job, "compute", "") or "").removeprefix("azureml:")
    image = str(getattr(getattr(job, "environment", None), "image", "") or "")
    pin_image(job, outputs, ml)
    sending, created = False, None
    try:
        with _code_snapshot(job):
            sending = True
            created = ml.jobs.create_or_update(job)
    except KeyboardInterrupt:
        if not sending:  # while the code snapshot was listed or staged: nothing had gone to Azure
            print("\ninterrupted before anything was sent: no job was submitted", file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        if created is not None:  # while the staged snapshot was removed: the job exists
            print(f"submitted {created.name}: {created.studio_url}", flush=True)
            return _interrupted(created.name, created.studio_url, outputs)
        print(
            f"\ninterrupted while submitting: the job may or may not exist; look for it with `az ml job list "
            f"-g {outputs['resource_group']} -w {outputs['workspace_name']} --max-results 5`",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INTERRUPTED
    except AzureError as e:  # azure-ai-ml's MlException and azure-core's HTTP/auth errors all derive from it
        raise JobError(submission_failure(e, outputs, compute, image)) from None
    print(f"submitted {created.name}: {created.studio_url}", flush=True)
    return created


def follow(ml, name: str, studio_url: str | None, outputs: StackOutputs, patient: bool = False) -> Ended | int:
    """Stream the job's logs until it ends: how it ended, EXIT_INTERRUPTED after Ctrl-C, or (not `patient`)
    EXIT_ENDED_BADLY when Azure ML stops answering. `patient` (auto-resume): a failure to read the job's status is
    never taken as its end; the status is polled again until Azure says the job ended."""
    from azure.ai.ml.exceptions import JobException
    from azure.core.exceptions import AzureError

    cause = None
    try:
        ml.jobs.stream(name)  # returns when the job ends; raises JobException when it Failed
        final = ml.jobs.get(name).status
    except KeyboardInterrupt:
        return _interrupted(name, studio_url, outputs)
    except JobException as e:
        # stream() turns Ctrl-C into a JobException raised from the KeyboardInterrupt
        if any(isinstance(c, KeyboardInterrupt) for c in _chain(e)):
            return _interrupted(name, studio_url, outputs)
        cause = failure_cause(e)
        try:
            final = ml.jobs.get(name).status
        except KeyboardInterrupt:
            return _interrupted(name, studio_url, outputs)
        except AzureError:
            final = "Failed"  # stream() raises only for a Failed run
    except AzureError as e:
        if not patient:
            print(
                f"lost contact with Azure ML while following job {name} ({_first_line(e)}); the job itself is "
                f"not affected: az ml job stream -n {name} -g {outputs['resource_group']} "
                f"-w {outputs['workspace_name']}",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_ENDED_BADLY
        try:
            final, cause = wait_for_end(ml, name, outputs, first_error=e)
        except KeyboardInterrupt:
            return _interrupted(name, studio_url, outputs)
    return Ended(name, str(getattr(final, "value", final)), cause, studio_url)


POLL_SECONDS = 60.0


def pause(seconds: float) -> None:
    time.sleep(seconds)


def wait_for_end(
    ml, name: str, outputs: StackOutputs, first_error: BaseException | None = None
) -> tuple[str, str | None]:
    """Poll the job's status until it is terminal: (status, the run's error). A read that fails is said, and tried
    again after POLL_SECONDS (doubling to 15 minutes): only AUTH_TRIES refused sign-ins in a row end the wait."""
    from azure.ai.ml.operations._run_history_constants import RunHistoryConstants
    from azure.core.exceptions import AzureError

    terminal = {str(getattr(s, "value", s)) for s in RunHistoryConstants.TERMINAL_STATUSES}
    error, wait, refusals = first_error, POLL_SECONDS, 0
    while True:
        if error is not None:
            refusals = count_refusal(error, refusals, outputs, name)
            print(
                f"cannot read job {name}'s status ({_first_line(error)}): nothing is done while it is unknown; "
                f"asking again in {wait:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            pause(wait)
            wait = min(2 * wait, 900.0)
        try:
            job = ml.jobs.get(name)
        except AzureError as e:
            error = e
            continue
        error, wait, refusals = None, POLL_SECONDS, 0
        status = str(getattr(job.status, "value", job.status))
        if status in terminal:
            return status, _job_error(ml, name) if status == "Failed" else None
        pause(POLL_SECONDS)


def _job_error(ml, name: str) -> str | None:
    """The run's error message (run history's details), or None where it cannot be read."""
    from .cost.history import run_details

    try:
        error = (run_details(ml, name).get("error") or {}).get("error") or {}
    except Exception:  # noqa: BLE001  the cause is extra; the status is what the decision needs
        return None
    message = error.get("message")
    return f"{error.get('code')}: {_first_line(message)}" if message and error.get("code") else message


def report(ended: Ended) -> int:
    """The line a followed job ends with, and the launcher's exit status for it."""
    if ended.status in DONE_OK:
        print(f"job {ended.name} ended: {ended.status}", flush=True)
        return 0
    why = ended.cause or f"see its logs: {ended.studio_url} (Outputs + logs, user_logs/)"
    print(f"job {ended.name} ended: {ended.status}: {why}", file=sys.stderr, flush=True)
    return EXIT_ENDED_BADLY


def submit(job, outputs: StackOutputs, stream: bool = True, ml_client=None, resume_from: str | None = None) -> int:
    ml = ml_client or client(outputs)
    created = create(ml, job, outputs, resume_from)
    if isinstance(created, int):
        return created
    if not stream:
        return 0
    ended = follow(ml, created.name, created.studio_url, outputs)
    if isinstance(ended, int):
        return ended
    from .cost import after_watch

    after_watch(ml, ended.name, outputs)  # the job's cost ledger (docs/job-cost.md#what-a-job-cost); never raises
    return report(ended)
