"""Job definitions render for the dev stack, validate with azure-ai-ml, and reach the SDK call intact."""

import json
import pathlib
import subprocess
import sys

import fake_azureml
import pytest
import yaml

from azureaccess import stack
from launcher import __main__ as cli
from launcher import jobspec, target

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOBS = sorted((ROOT / "jobs").glob("*.yaml"))


# The payload arguments of the local runs below: two epochs of a tiny model on synthetic data, in seconds.
SMALL_RUN = ["--model", "tiny_cnn", "--image-size", "16", "--num-classes", "4", "--synthetic-samples", "64"]
SMALL_RUN += ["--batch-size", "8", "--epochs", "2", "--workers", "0", "--threads", "1"]


def render(outputs_file, job, cluster, nodes=None, ppn=None, extra=()):
    outs = stack.load_file(outputs_file)
    template = jobspec.read_template(job)
    filled = jobspec.fill(
        template,
        outs,
        target.resolve(outs, cluster, nodes or template["resources"]["instance_count"], ppn),
        list(extra),
    )
    return filled, jobspec.validate(filled, job)


@pytest.mark.parametrize("job", JOBS, ids=[j.stem for j in JOBS])
@pytest.mark.parametrize("cluster", ["cpu-smoke", "gpu-ib"])
def test_every_job_renders_and_validates_for_the_dev_stack(dev_outputs, job, cluster):
    outs = json.loads(dev_outputs.read_text())
    filled, sdk_job = render(dev_outputs, job, cluster)
    gpus = outs["clusters"][cluster]["gpus_per_node"]
    assert sdk_job.distribution.process_count_per_instance == (gpus or 1)
    assert sdk_job.compute == outs["clusters"][cluster]["compute_name"]  # the Azure ML name
    assert sdk_job.environment.image.startswith(outs["registry_login_server"] + "/")
    for out in (sdk_job.outputs or {}).values():
        assert out.path.startswith(f"azureml://datastores/{outs['datastores']['logs']['name']}/")
    for inp in (sdk_job.inputs or {}).values():
        assert inp.path.startswith(f"azureml://datastores/{outs['datastores']['data']['name']}/")
    env = sdk_job.environment_variables
    if cluster == "gpu-ib":
        assert env["NCCL_IB_DISABLE"] == "0" and env["OMPI_MCA_pml"] == "ob1" and "UCX_TLS" not in env
    else:
        assert env["HOROVOD_CPU_OPERATIONS"] == "mpi" and env["OMP_NUM_THREADS"] == "4"
        assert env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert "<<" not in yaml.safe_dump(filled), "every stack token is filled"


def test_azure_target_sends_the_job_it_built(dev_outputs, monkeypatch):
    """Everything real down to the SDK call that would go to the network."""
    from azure.ai.ml.operations import JobOperations

    sent = {}

    class Created:
        name, studio_url, status = "job-123", "https://ml.azure.com/runs/job-123", "Completed"

    monkeypatch.setattr(
        JobOperations, "create_or_update", lambda self, job, **kw: sent.setdefault("job", job) and Created
    )
    monkeypatch.setattr(JobOperations, "stream", lambda self, name: sent.setdefault("streamed", name))
    monkeypatch.setattr(JobOperations, "get", lambda self, name: Created)
    fake_azureml.install(monkeypatch)  # the sign-in, and the registry that gives the image's digest
    job = ROOT / "jobs/pytorch-resnet50-imagenet.yaml"
    code = cli.main([str(job), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--nodes", "2"])
    assert code == 0 and sent["streamed"] == "job-123"
    j = sent["job"]
    assert (j.distribution.type, j.distribution.process_count_per_instance) == ("mpi", 8)
    assert j.resources.instance_count == 2 and j.resources.shm_size == "64g"
    assert j.compute == json.loads(dev_outputs.read_text())["clusters"]["gpu-ib"]["compute_name"]
    assert j.inputs["imagenet"].path == "azureml://datastores/training_data/paths/imagenet/"
    assert j.inputs["imagenet"].mode == "ro_mount"
    assert j.outputs["run"].path.startswith("azureml://datastores/training_logs/paths/runs/pytorch-resnet50-imagenet/")
    assert j.environment_variables["DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED"] == "true"
    assert "--data-dir ${{inputs.imagenet}}" in j.command
    assert j.tags["processes"] == "16"
    assert j.environment.image == f"{fake_azureml.REGISTRY}/training/pytorch@{fake_azureml.DIGEST}"


def test_dry_run_prints_the_job_and_its_hourly_cost(dev_outputs, capsys):
    job = ROOT / "jobs/pytorch-resnet50-synthetic.yaml"
    assert (
        cli.main([str(job), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--nodes", "2", "--dry-run"])
        == 0
    )
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    compute_name = stack.load_file(dev_outputs).cluster("gpu-ib")["compute_name"]
    assert compute_name.startswith("gpu-ib-") and compute_name != "gpu-ib"
    assert (
        resolved["distribution"]["process_count_per_instance"] == 8 and resolved["compute"] == f"azureml:{compute_name}"
    )  # the Azure ML name (stack output compute_name)
    assert "# cost of one hour: $10.88 (2 x Standard_ND96asr_v4 (low priority) at $5.439/node-hour" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--cluster", "gpu-big"], "unknown cluster 'gpu-big': the stack declares cpu-smoke, gpu-ib"),
        (["--cluster", "gpu-ib", "--processes-per-node", "9"], "more than the 8 GPUs of a Standard_ND96asr_v4 node"),
        (["--cluster", "gpu-ib", "--nodes", "3"], "cluster gpu-ib scales to 2 nodes"),
        ([], "--cluster is required"),
    ],
)
def test_bad_submissions(dev_outputs, capsys, args, message):
    job = ROOT / "jobs/pytorch-resnet50-synthetic.yaml"
    assert cli.main([str(job), "--stack-outputs", str(dev_outputs), *args]) == 2
    assert message in capsys.readouterr().err


def test_missing_stack_outputs(tmp_path, capsys):
    job = str(ROOT / "jobs/pytorch-resnet50-synthetic.yaml")
    assert cli.main([job, "--stack-outputs", str(tmp_path / "nope.json"), "--cluster", "x"]) == 2
    assert "not found: write it with `pulumi stack output --json" in capsys.readouterr().err
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"subscription_id": "s", "clusters": {}}))
    assert cli.main([job, "--stack-outputs", str(partial), "--cluster", "x"]) == 2
    assert (
        "lacks stack outputs resource_group, workspace_name, registry_login_server, clusters, datastores"
        in capsys.readouterr().err
    )
    assert cli.main([job]) == 2
    assert "--target azureml needs the stack outputs" in capsys.readouterr().err


@pytest.mark.launches
def test_invalid_job_files(dev_outputs, tmp_path, capsys):
    good = yaml.safe_load((ROOT / "jobs/pytorch-resnet50-imagenet.yaml").read_text())
    good["code"] = str(ROOT)  # the copies live in tmp_path
    cases = {
        "not-yaml.yaml": ("type: command\ncommand: [unclosed", "is not valid YAML"),
        "no-mpi.yaml": (
            {**good, "distribution": {"type": "tensorflow"}},
            "distribution.type must be mpi (Horovod, started by mpirun) or pytorch",
        ),
        "pytorch-without-ddp.yaml": (
            {**good, "distribution": {"type": "pytorch"}},
            "distribution.type pytorch starts PyTorch DDP processes, but the command has no --backend ddp",
        ),
        "mpi-with-ddp.yaml": (
            {**good, "command": good["command"] + " --backend ddp"},
            "the command trains with --backend ddp, whose processes need the rendezvous",
        ),
        "dangling.yaml": (
            {**good, "command": good["command"] + " --x ${{inputs.labels}}"},
            "uses ${{inputs.labels}} but the job declares no input 'labels'",
        ),
        "sdk-rejects.yaml": (
            {**good, "inputs": {"imagenet": {"type": "uri_folderz", "path": "x"}}},
            "is not a valid Azure ML job",
        ),
        "gloo-ops.yaml": (
            {**good, "environment_variables": {"HOROVOD_CPU_OPERATIONS": "gloo"}},
            "environment_variables of the job file: HOROVOD_CPU_OPERATIONS=gloo crashes Horovod",
        ),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
        assert cli.main([str(path), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib"]) == 2, name
        assert message in capsys.readouterr().err, name
    assert cli.main([str(tmp_path / "absent.yaml"), "--stack-outputs", str(dev_outputs)]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.launches
def test_local_target_needs_existing_data(tmp_path, capsys):
    job = str(ROOT / "jobs/pytorch-resnet50-imagenet.yaml")
    assert cli.main([job, "--target", "local", "--input", f"imagenet={tmp_path / 'missing'}"]) == 2
    assert "data path not found" in capsys.readouterr().err
    assert cli.main([job, "--target", "local"]) == 2
    assert "input 'imagenet' of pytorch-resnet50-imagenet.yaml needs a local path here" in capsys.readouterr().err
    assert cli.main([job, "--target", "local", "--input", f"labels={tmp_path}"]) == 2
    assert "declares no such input" in capsys.readouterr().err


def _launch(args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],  # the launcher as users run it
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.launches
@pytest.mark.parametrize(
    "job, controller, suffix",
    [
        ("pytorch-resnet50-synthetic", "auto", ".pt"),
        ("keras-resnet50-synthetic", "gloo", ".npz"),
    ],
)
def test_local_target_runs_the_job_end_to_end(tmp_path, job, controller, suffix):
    from launcher import local

    out = tmp_path / "out"
    proc = _launch(
        [
            f"jobs/{job}.yaml",
            "--target",
            "local",
            "--np",
            "2",
            "--controller",
            controller,
            "--output-dir",
            str(out),
            "--",
            *SMALL_RUN,
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = out / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["run"]["world"]["processes"] == 2 and len(metrics["epochs"]) == 2
    assert metrics["run"]["world"]["horovod_controller"] == local.controller(controller)
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == f"checkpoint-epoch-0002{suffix}"
    assert list((run / "tensorboard").rglob("events.out.tfevents.*"))
    assert f"run: {run}" in proc.stdout


@pytest.mark.launches
def test_controller_choice(monkeypatch):
    from azureaccess.errors import JobError
    from launcher import local

    monkeypatch.setattr(local, "_mpi_available", lambda: True)
    assert local.controller() == "mpi" and local.controller("gloo") == "gloo"
    monkeypatch.setattr(local, "_mpi_available", lambda: False)
    assert local.controller() == "gloo"
    with pytest.raises(JobError, match="built without MPI"):
        local.controller("mpi")


@pytest.mark.launches
def test_gloo_operations_under_mpi_are_refused_before_launch(monkeypatch, tmp_path):
    from azureaccess.errors import JobError
    from launcher import local

    job = yaml.safe_load((ROOT / "jobs/pytorch-resnet50-synthetic.yaml").read_text())
    source = ROOT / "jobs/pytorch-resnet50-synthetic.yaml"
    monkeypatch.setattr(local, "_mpi_available", lambda: True)
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "gloo")
    with pytest.raises(
        JobError, match="this shell's environment: HOROVOD_CPU_OPERATIONS=gloo crashes.*--controller gloo"
    ):
        local.plan(job, source, {}, tmp_path, 2, [], "auto")
    argv, _ = local.plan(job, source, {}, tmp_path, 2, [], "gloo")  # Horovod's Gloo launcher sets Gloo up
    assert "--gloo" in argv


# ---- --backend ddp: Azure ML's pytorch distribution, torchrun locally --------------------------------------

DDP_JOBS = ["pytorch-resnet50-synthetic", "pytorch-landcover-unet"]


@pytest.mark.launches
@pytest.mark.parametrize("job", DDP_JOBS)
@pytest.mark.parametrize("cluster", ["cpu-smoke", "gpu-ib"])
def test_backend_ddp_renders_a_pytorch_distribution_job(dev_outputs, job, cluster):
    from azure.ai.ml import PyTorchDistribution

    outs = json.loads(dev_outputs.read_text())
    source = ROOT / "jobs" / f"{job}.yaml"
    template = jobspec.with_backend(jobspec.read_template(source), "ddp", source)
    outs = stack.load_file(dev_outputs)
    filled = jobspec.fill(template, outs, target.resolve(outs, cluster, 1, None), ["--epochs", "2"])
    sdk_job = jobspec.validate(filled, source)
    assert isinstance(sdk_job.distribution, PyTorchDistribution)
    assert sdk_job.distribution.process_count_per_instance == (outs["clusters"][cluster]["gpus_per_node"] or 1)
    assert sdk_job.command.endswith("--backend ddp --epochs 2"), sdk_job.command
    assert sdk_job.tags["backend"] == "ddp"
    env = sdk_job.environment_variables
    assert not [k for k in env if k.startswith(("OMPI_", "HOROVOD_"))], "no mpirun, no Horovod in a DDP job"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    if cluster == "gpu-ib":
        assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_TOPO_FILE"].startswith("/opt/microsoft/")
    else:
        assert env["OMP_NUM_THREADS"] == "4"
    # and back: the Horovod job the file describes
    again = jobspec.with_backend(template, "horovod", source)
    assert again["distribution"]["type"] == "mpi" and "--backend" not in again["command"]
    assert again["command"] == jobspec.read_template(source)["command"]


def test_azure_target_sends_the_ddp_job(dev_outputs, monkeypatch):
    from azure.ai.ml.operations import JobOperations

    sent = {}

    class Created:
        name, studio_url, status = "job-123", "https://ml.azure.com/runs/job-123", "Completed"

    monkeypatch.setattr(
        JobOperations, "create_or_update", lambda self, job, **kw: sent.setdefault("job", job) and Created
    )
    monkeypatch.setattr(JobOperations, "stream", lambda self, name: None)
    monkeypatch.setattr(JobOperations, "get", lambda self, name: Created)
    fake_azureml.install(monkeypatch)  # the sign-in, and the registry that gives the image's digest
    job = ROOT / "jobs/pytorch-resnet50-imagenet.yaml"
    code = cli.main(
        [str(job), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--nodes", "2", "--backend", "ddp"]
    )
    assert code == 0
    j = sent["job"]
    assert (j.distribution.type, j.distribution.process_count_per_instance) == ("pytorch", 8)
    assert j.resources.instance_count == 2 and j.tags["processes"] == "16"
    assert "--backend ddp" in j.command and "OMPI_MCA_pml" not in j.environment_variables


def test_a_hand_written_pytorch_distribution_job_is_read_as_ddp(dev_outputs, tmp_path, capsys):
    good = yaml.safe_load((ROOT / "jobs/pytorch-resnet50-synthetic.yaml").read_text())
    good.update(
        code=str(ROOT),
        distribution={"type": "pytorch", "process_count_per_instance": 1},
        command=good["command"] + " --backend ddp",
    )
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(good))
    assert cli.main([str(path), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--dry-run"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["distribution"] == {"type": "pytorch", "process_count_per_instance": 8}
    assert resolved["command"].count("--backend ddp") == 1


AZURE = ["--stack-outputs", "<outputs>", "--cluster", "gpu-ib", "--dry-run"]


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["tensorflow-resnet50-synthetic.yaml", *AZURE, "--backend", "ddp"],
            "--backend ddp: tensorflow-resnet50-synthetic.yaml does not run a PyTorch training payload",
        ),
        (
            ["healthcheck-allreduce.yaml", *AZURE, "--backend", "ddp"],
            "the TensorFlow, Keras and health check jobs run on Horovod only",
        ),
        (
            ["pytorch-resnet50-synthetic.yaml", *AZURE, "--", "--backend", "ddp"],
            "--backend after `--` reaches only the payload, not the job's distribution",
        ),
        (
            ["pytorch-resnet50-synthetic.yaml", "--target", "local", "--controller", "gloo", "--backend", "ddp"],
            "--controller gloo: the controller is Horovod's; this job trains with PyTorch DDP",
        ),
    ],
)
def test_backend_misuse_is_refused_before_anything_runs(dev_outputs, capsys, args, message):
    job, *rest = args
    rest = [str(dev_outputs) if a == "<outputs>" else a for a in rest]
    assert cli.main([str(ROOT / "jobs" / job), *rest]) == 2
    assert message in capsys.readouterr().err


def test_the_jobs_that_take_backend_ddp_are_those_whose_payload_declares_backend():
    """jobspec.takes_backend reads the payload's option groups from its source (the launcher's install has no torch):
    the PyTorch payloads declare options.PYTORCH, which holds --backend; TensorFlow, Keras and the health check do not."""
    found = {f.name: jobspec.takes_backend(jobspec.read_template(f)["command"]) for f in (ROOT / "jobs").glob("*.yaml")}
    assert sorted(name for name, takes in found.items() if takes) == [
        "pytorch-landcover-unet.yaml",
        "pytorch-resnet50-imagenet-shards.yaml",
        "pytorch-resnet50-imagenet.yaml",
        "pytorch-resnet50-synthetic.yaml",
    ]
    assert len(found) == 9


@pytest.mark.launches
def test_local_target_runs_the_ddp_job_with_torchrun(tmp_path):
    out = tmp_path / "out"
    proc = _launch(
        [
            "jobs/pytorch-resnet50-synthetic.yaml",
            "--target",
            "local",
            "--np",
            "2",
            "--backend",
            "ddp",
            "--output-dir",
            str(out),
            "--",
            *SMALL_RUN,
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "torchrun --standalone --nproc-per-node 2" in proc.stdout
    metrics = json.loads((out / "run" / "metrics.json").read_text())
    world = metrics["run"]["world"]
    assert (world["backend"], world["processes"], world["local_processes"]) == ("ddp", 2, 2)
    assert metrics["summary"]["ranks_identical"] is True and len(metrics["epochs"]) == 2
    assert sorted(p.name for p in (out / "run" / "checkpoints").iterdir())[-1] == "checkpoint-epoch-0002.pt"
