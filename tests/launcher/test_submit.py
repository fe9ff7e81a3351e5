"""Submission to Azure ML: every way a submission can end (completed, failed, cancelled, Ctrl-C at each stage,
refused by ARM, storage or the service), with azure-ai-ml replaced only where it would reach the network
(fake_azureml.py)."""

import json

import fake_azureml
import pytest
from fake_azureml import SYNTHETIC, arm, blob, storage_error, submit

from azureaccess import stack
from launcher import __main__ as cli


def test_completed_job_end_to_end(azure, dev_outputs, capsys):
    azure.run_statuses = ["Queued", "Running", "Completed"]
    code = cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--nodes", "2"])
    out = capsys.readouterr().out
    name = next(iter(azure.jobs))
    assert code == 0 and f"job {name} ended: Completed" in out
    sent = azure.jobs[name]["properties"]
    compute_name = stack.load_file(dev_outputs).cluster("gpu-ib")["compute_name"]  # the Azure ML name, hashed
    assert sent["computeId"].endswith(f"/computes/{compute_name}") and sent["resources"]["instanceCount"] == 2
    # the image by digest, read from the registry at submission and printed: what runs is what was built
    image = f"{fake_azureml.REGISTRY}/training/pytorch"
    assert azure.images == [f"{image}@{fake_azureml.DIGEST}"]
    assert f"image {image}:torch2.14.1-horovod0.28.1: {image}@{fake_azureml.DIGEST}" in out


def test_an_image_the_registry_does_not_hold_is_refused_before_submitting(azure, dev_outputs, small_job):
    azure.fail = (lambda method, url: "/_tags/" in url, 404, {"errors": [{"code": "TAG_UNKNOWN"}]}, {})
    result = submit(dev_outputs, small_job)
    assert result.startswith("error: image ") and "is not in hvddevacr0e4baacb.azurecr.io: build it first" in result
    assert not azure.jobs


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
