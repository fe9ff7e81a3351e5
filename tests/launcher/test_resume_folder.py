"""--resume-from a run folder of the logs container: what survives a platform's destroy and up.

The new workspace knows no job of the old one, but the data stack kept the logs container, where each run
wrote OUTPUT/checkpoints/. The folder must hold checkpoints (listed with the user's login through the Blob
service REST API, "List Blobs": learn.microsoft.com/rest/api/storageservices/list-blobs), or the payload
would silently start from epoch 0.
"""

import pytest
import yaml
from test_submit import SYNTHETIC, azure, small_job  # noqa: F401  (fixtures)

from azureaccess import stack
from azureaccess.errors import JobError
from launcher import __main__ as cli
from launcher import azureml, jobspec

RUN = "runs/pytorch-resnet50-synthetic/witty_jackal_3d4kq79d3v/"


@pytest.mark.parametrize(
    "given", [RUN, RUN.rstrip("/"), RUN + "checkpoints/", "/" + RUN, "azureml://datastores/training_logs/paths/" + RUN]
)
def test_a_folder_in_any_of_its_spellings_becomes_the_jobs_output(dev_outputs, capsys, given):
    code = cli.main(
        [
            str(SYNTHETIC),
            "--stack-outputs",
            str(dev_outputs),
            "--cluster",
            "gpu-ib",
            "--dry-run",
            "--resume-from",
            given,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    job = yaml.safe_load(out)
    assert job["outputs"]["run"]["path"] == "azureml://datastores/training_logs/paths/" + RUN
    assert "its checkpoints are not checked (dry run)" in out


@pytest.mark.parametrize(
    "given,message",
    [
        ("runs/../secrets/", "not a folder of the logs container"),
        ("runs//x/", "not a folder of the logs container"),
        ("azureml://datastores/training_data/paths/" + RUN, "not a folder of the logs datastore"),
    ],
)
def test_bad_folders_are_refused(dev_outputs, capsys, given, message):
    code = cli.main(
        [
            str(SYNTHETIC),
            "--stack-outputs",
            str(dev_outputs),
            "--cluster",
            "gpu-ib",
            "--dry-run",
            "--resume-from",
            given,
        ]
    )
    assert code == 2 and message in capsys.readouterr().err


def _listing(*names):
    blobs = "".join(
        f"<Blob><Name>{n}</Name><Properties><Content-Length>10</Content-Length>"
        "<BlobType>BlockBlob</BlobType></Properties></Blob>"
        for n in names
    )
    return (
        '<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint="https://x.blob.core.windows.net/" '
        f'ContainerName="logs"><Blobs>{blobs}</Blobs><NextMarker /></EnumerationResults>'
    )


def _submit(dev_outputs, code_dir, folder):
    outs = stack.load_file(dev_outputs)
    filled = jobspec.resume(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), folder, SYNTHETIC
    )
    job = jobspec.validate(filled, SYNTHETIC)
    (code_dir / "train.py").write_text("print('hello')\n")
    job.code = str(code_dir)
    return outs, azureml.submit(job, outs, stream=False, resume_from=folder)


def _blob_list(method, url):
    return ".blob.core.windows.net/logs" in url and "comp=list" in url


def test_a_folder_with_checkpoints_is_resumed_without_asking_the_workspace_for_an_old_job(
    azure, dev_outputs, small_job, capsys
):
    azure.fail = (
        _blob_list,
        200,
        _listing(RUN + "checkpoints/checkpoint-epoch-0007.pt"),
        {"Content-Type": "application/xml"},
    )
    outs, code = _submit(dev_outputs, small_job, RUN)
    assert code == 0
    [sent] = azure.jobs.values()
    assert sent["properties"]["outputs"]["run"]["uri"].endswith("/paths/" + RUN)
    assert sent["properties"]["tags"]["resumed_from"] == RUN
    account = outs["datastores"]["logs"]["account"]
    listed = [path for method, path in azure.calls if account in path]
    assert listed, "the folder was checked in the logs account the stack outputs name"
    assert f"resuming from {RUN}checkpoints/checkpoint-epoch-0007.pt" in capsys.readouterr().out


def test_an_empty_folder_is_refused_before_submission(azure, dev_outputs, small_job):
    azure.fail = (_blob_list, 200, _listing(), {"Content-Type": "application/xml"})
    with pytest.raises(JobError, match="no checkpoint under logs/" + RUN + "checkpoints/ .* would start from epoch 0"):
        _submit(dev_outputs, small_job, RUN)
    assert azure.jobs == {}


def test_a_folder_the_user_cannot_read_names_the_access_it_needs(azure, dev_outputs, small_job):
    body = (
        '<?xml version="1.0" encoding="utf-8"?><Error><Code>AuthorizationPermissionMismatch</Code><Message>This '
        'request is not authorized to perform this operation using this permission.</Message></Error>'
    )
    azure.fail = (
        _blob_list,
        403,
        body,
        {"Content-Type": "application/xml", "x-ms-error-code": "AuthorizationPermissionMismatch"},
    )
    with pytest.raises(JobError) as e:
        _submit(dev_outputs, small_job, RUN)
    assert "403" in str(e.value) and "Storage Blob Data Reader on the logs container" in str(e.value)
    assert azure.jobs == {}
