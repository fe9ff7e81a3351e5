"""--resume-from: an earlier job (its output folder, down a chain of resumes), or a run folder of the logs container,
what survives a platform's destroy and up.

The new workspace knows no job of the old one, but the data stack kept the logs container, where each run
wrote OUTPUT/checkpoints/. The folder must hold checkpoints (listed with the user's login through the Blob
service REST API, "List Blobs": learn.microsoft.com/rest/api/storageservices/list-blobs), or the payload
would silently start from epoch 0.
"""

import pytest
import yaml
from fake_azureml import SYNTHETIC, submit

from azureaccess import stack
from azureaccess.errors import JobError
from launcher import __main__ as cli
from launcher import azureml, jobspec, target

RUN = "runs/pytorch-resnet50-synthetic/witty_jackal_3d4kq79d3v/"


def dry_run(dev_outputs, *args) -> int:
    return cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--dry-run", *args])


def resumed(dev_outputs, code_dir, earlier: str):
    """(stack outputs, the synthetic job resuming `earlier`, a job name or a run folder), as __main__ builds it."""
    outs = stack.load_file(dev_outputs)
    filled = jobspec.resume(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, target.resolve(outs, "gpu-ib", 2, None), []),
        earlier,
        SYNTHETIC,
    )
    job = jobspec.validate(filled, SYNTHETIC)
    (code_dir / "train.py").write_text("print('hello')\n")
    job.code = str(code_dir)
    return outs, job


@pytest.mark.parametrize(
    "given", [RUN, RUN.rstrip("/"), RUN + "checkpoints/", "/" + RUN, "azureml://datastores/training_logs/paths/" + RUN]
)
def test_a_folder_in_any_of_its_spellings_becomes_the_jobs_output(dev_outputs, capsys, given):
    code = dry_run(dev_outputs, "--resume-from", given)
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
    code = dry_run(dev_outputs, "--resume-from", given)
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
    outs, job = resumed(dev_outputs, code_dir, folder)
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


def test_resume_dry_run_writes_to_the_earlier_jobs_folder(dev_outputs, capsys):
    code = dry_run(dev_outputs, "--resume-from", "witty_jackal_3d4kq79d3v")
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

    outs, job = resumed(dev_outputs, small_job, earlier)
    azure.run_statuses, azure.job_status = ["Running", "Completed"], "Completed"
    assert azureml.submit(job, outs, resume_from=earlier) == 0
    new = [name for name in azure.jobs if name != earlier][0]
    sent = azure.jobs[new]["properties"]
    assert sent["outputs"]["run"]["uri"] == earlier_path
    assert earlier_path.endswith(f"/runs/pytorch-resnet50-synthetic/{earlier}/")
    assert sent["tags"]["resumed_from"] == earlier


@pytest.mark.parametrize("name", ["bad name", "-leading-dash", "x" * 300, "a.b"])
def test_resume_from_an_ill_formed_name(dev_outputs, capsys, name):
    code = dry_run(dev_outputs, f"--resume-from={name}")
    assert code == 2
    assert "is not an Azure ML job name" in capsys.readouterr().err


def resubmit(dev_outputs, code_dir, earlier):
    outs, job = resumed(dev_outputs, code_dir, earlier)
    with pytest.raises(JobError) as e:
        azureml.submit(job, outs, resume_from=earlier)
    return str(e.value)


def resume_job(azure, dev_outputs, code_dir, earlier):
    """Submit the synthetic job with --resume-from `earlier` as __main__ does; (exit status, its new name)."""
    outs, job = resumed(dev_outputs, code_dir, earlier)
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
