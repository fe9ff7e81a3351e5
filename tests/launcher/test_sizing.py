"""Per-process batch and loader workers from the VM-size catalog, filled into the ResNet jobs' commands."""

import pathlib
import shlex

import pytest
import yaml
from test_interconnect import cluster

from azureaccess import stack
from azureaccess.errors import JobError
from launcher import __main__ as cli
from launcher import jobspec, local, sizing, target
from trainingplatform import vm_sizes

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYNTHETIC = ROOT / "jobs/pytorch-resnet50-synthetic.yaml"
IMAGENET = ROOT / "jobs/pytorch-resnet50-imagenet.yaml"


# size: (per-process batch, loader workers per process) at one process per GPU (one per node on CPU sizes)
EXPECTED = {
    "Standard_D4s_v5": (32, 3),
    "Standard_D8s_v5": (32, 7),
    "Standard_D16s_v5": (32, 15),
    "Standard_NC4as_T4_v3": (256, 3),  # 4 vCPUs for its one T4: 3 workers, one vCPU for training
    "Standard_NC64as_T4_v3": (256, 15),
    "Standard_NC24ads_A100_v4": (256, 16),
    "Standard_NC96ads_A100_v4": (256, 16),
    "Standard_NC40ads_H100_v5": (256, 16),
    "Standard_ND96asr_v4": (256, 11),
    "Standard_ND96amsr_A100_v4": (256, 11),
    "Standard_ND96isr_H100_v5": (256, 11),
    "Standard_ND96isr_H200_v5": (256, 11),
}


def on(size: str, processes_per_node: int) -> target.Target:
    """One node of a cluster of `size`, as target.resolve makes it."""
    return target.Target("c", cluster(size), vm_sizes.lookup(size), 1, processes_per_node)


def test_every_current_size_is_in_the_table():
    assert sorted(EXPECTED) == vm_sizes.available()


@pytest.mark.parametrize("size", sorted(EXPECTED))
def test_batch_and_workers_per_size(size):
    s = vm_sizes.CATALOG[size]
    fit = sizing.for_cluster(on(size, max(1, s.gpus)))
    assert (fit.batch_size, fit.workers) == EXPECTED[size]
    assert size in fit.basis


def test_batches_follow_nvidias_reference_runs():
    """NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/configs.yml, resnet50: AMP (NHWC) 256 per GPU
    on DGX1V (V100 16 GB), T4 (16 GB) and DGXA100 (80 GB); FP32 112 on DGX1V (16 GB)."""
    assert sizing.gpu_batch(16, "amp") == 256 and sizing.gpu_batch(80, "amp") == 256
    assert sizing.gpu_batch(141, "amp") == 256  # no larger per-GPU batch than the reference
    assert sizing.gpu_batch(16, "fp32") == 112
    # less memory, smaller batch: multiples of 8 below the reference
    assert sizing.gpu_batch(12, "amp") == 192 and sizing.gpu_batch(8, "amp") == 128
    assert sizing.gpu_batch(0.1, "amp") == 8


def test_no_amp_takes_the_fp32_batch():
    t4 = on("Standard_NC4as_T4_v3", 1)
    assert sizing.for_cluster(t4, ["--no-amp"]).batch_size == 112
    assert sizing.for_cluster(t4, ["--amp"]).batch_size == 256


@pytest.mark.parametrize("size", sorted(EXPECTED))
def test_every_process_leaves_a_vcpu_for_its_training_thread(size):
    s = vm_sizes.CATALOG[size]
    for ppn in range(1, max(1, s.gpus) + 1):
        fit = sizing.for_cluster(on(size, ppn))
        assert fit.workers + 1 <= s.vcpus // ppn, (size, ppn)
        assert fit.workers <= sizing.MAX_WORKERS


def test_cpu_batch_is_the_payloads_default():
    from payloads.common.config import TrainConfig

    assert sizing.CPU_BATCH == TrainConfig.batch_size


def _payload_args(command: str) -> list[str]:
    words = shlex.split(command)
    return words[words.index("-m") + 2 :]


def _render(outputs_file, job, cluster_name, extra=()):
    template = jobspec.read_template(job)
    outs = stack.load_file(outputs_file)
    filled = jobspec.fill(
        template, outs, target.resolve(outs, cluster_name, template["resources"]["instance_count"], None), list(extra)
    )
    jobspec.validate(filled, job)
    return filled["command"]


def _values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag] + [
        a.split("=", 1)[1] for a in args if a.startswith(flag + "=")
    ]


@pytest.mark.parametrize("cluster_name, batch, workers", [("gpu-ib", "256", "11"), ("cpu-smoke", "32", "3")])
@pytest.mark.parametrize("job", sorted((ROOT / "jobs").glob("*resnet50*.yaml")), ids=lambda p: p.stem)
def test_the_resnet_jobs_get_the_clusters_batch_and_workers(dev_outputs, cluster_name, batch, workers, job):
    """dev stack: gpu-ib is an ND96asr_v4 (8 A100 40 GB, 96 vCPUs), cpu-smoke a D4s_v5 (4 vCPUs). The jobs'
    32g of /dev/shm holds 22 workers per process at 8 processes of 256 uint8 images (8 x 22 x 4 x 38.5 MB =
    27 GB, of 80% of 32 GiB): the vCPUs' 11 bind."""
    args = _payload_args(_render(dev_outputs, job, cluster_name))
    assert _values(args, "--batch-size") == [batch]
    if "<<workers>>" in yaml.safe_load(job.read_text())["command"]:
        assert _values(args, "--workers") == [workers]


def test_workers_fit_the_jobs_shared_memory():
    fit = sizing.Sizing(256, 11, "x")
    assert sizing.shm_bytes("32g") == 32 * 2**30 and sizing.shm_bytes("512m") == 512 * 2**20
    assert sizing.within_shm(fit, "64g", 8, 8, []).workers == 11
    assert sizing.within_shm(fit, "32g", 8, 8, []).workers == 11
    assert sizing.within_shm(fit, "8g", 8, 8, []).workers == 5  # 8 x 5 x 4 x 38.5 MB of 80% of 8 GiB
    assert sizing.within_shm(fit, "8g", 8, 8, ["--batch-size", "64"]).workers == 11  # smaller batches
    assert sizing.within_shm(fit, "8g", 8, 8, ["--image-size", "112"]).workers == 11
    assert sizing.within_shm(fit, "8g", 8, 16, ["--global-batch-size", "1024"]).workers == 11
    with pytest.raises(JobError, match="resources.shm_size 'lots'"):
        sizing.within_shm(fit, "lots", 8, 8, [])


def test_a_users_workers_beyond_the_shared_memory_are_refused(dev_outputs):
    with pytest.raises(
        JobError,
        match=r"--workers 30: .* need 34 GiB of /dev/shm, the job has shm_size 32g: use "
        r"--workers 22 or fewer",
    ):
        _render(dev_outputs, SYNTHETIC, "gpu-ib", ["--workers", "30"])


@pytest.mark.parametrize(
    "extra, batch_flags, workers",
    [
        (["--batch-size", "64"], {"--batch-size": ["64"]}, ["11"]),
        (["--batch-size=48", "--workers", "2"], {"--batch-size": ["48"]}, ["2"]),
        (["--global-batch-size", "2048"], {"--global-batch-size": ["2048"], "--batch-size": []}, ["11"]),
        (["--workers=5"], {"--batch-size": ["256"]}, ["5"]),
    ],
)
def test_the_users_arguments_replace_the_filled_ones(dev_outputs, extra, batch_flags, workers, tmp_path, monkeypatch):
    """Arguments after `--` win, and the job file's flag goes, so that the payload sees each flag once (it refuses
    --batch-size with --global-batch-size): checked by the payload's own parser."""
    from payloads.common import options
    from payloads.pytorch import models

    monkeypatch.chdir(tmp_path)  # the parser creates --output-dir (the job's literal ${{outputs.run}}) here
    args = _payload_args(_render(dev_outputs, IMAGENET, "gpu-ib", extra))
    for flag, values in batch_flags.items():
        assert _values(args, flag) == values, args
    assert _values(args, "--workers") == workers
    cfg = options.parse(args + ["--no-mlflow"], "train", "", list(models.MODELS), ("imagefolder",))
    assert cfg.workers == int(workers[0])
    if "--global-batch-size" in extra:
        assert cfg.batch_size is None and cfg.per_process_batch(8) == 256  # 1 node of 8 GPUs
    else:
        assert cfg.batch_size == int(batch_flags["--batch-size"][0])


def test_dry_run_shows_the_filled_command(dev_outputs, capsys):
    assert cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--dry-run"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    args = _payload_args(printed["command"])
    assert _values(args, "--batch-size") == ["256"] and _values(args, "--workers") == ["11"]
    assert printed["tags"]["sizing"].startswith("Standard_ND96asr_v4: 40 GiB A100, AMP -> batch 256")
    assert "within shm_size" not in printed["tags"]["sizing"]


def test_the_shm_arithmetic_uses_the_payloads_prefetch():
    """One home is the payload's loader: the launcher's copy of its prefetch_factor must match it."""
    assert f"prefetch_factor={sizing.PREFETCH}" in (ROOT / "payloads/pytorch/inputs.py").read_text()


def test_local_target_fills_from_this_machine_and_keeps_train_locals_own_values(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "_mpi_available", lambda: False)
    template = jobspec.read_template(SYNTHETIC)
    argv, _ = local.plan(template, SYNTHETIC, {}, tmp_path, 2, [], "gloo")
    args = _payload_args(argv[-1])
    assert _values(args, "--batch-size") == [str(sizing.CPU_BATCH)]
    assert _values(args, "--workers") == [str(sizing.for_local(2).workers)]
    # scripts/train-local's arguments: its own batch and workers, each once
    train_local = ["--model", "resnet18", "--batch-size", "16", "--workers", "0", "--threads", "1"]
    argv, _ = local.plan(template, SYNTHETIC, {}, tmp_path, 2, train_local, "gloo")
    args = _payload_args(argv[-1])
    assert _values(args, "--batch-size") == ["16"] and _values(args, "--workers") == ["0"]


def test_local_workers_leave_a_core_per_process():
    assert sizing.for_local(2, cpus=2).workers == 0
    assert sizing.for_local(1, cpus=8).workers == 7
    assert sizing.for_local(4, cpus=64).workers == 15


def test_a_placeholder_away_from_its_flag_is_a_job_file_error(tmp_path):
    job = yaml.safe_load(IMAGENET.read_text())
    job["code"] = str(ROOT)
    job["command"] = job["command"].replace("--workers <<workers>>", "--threads <<workers>>")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(job))
    with pytest.raises(JobError, match=r"<<workers>> must follow --workers \(write `--workers <<workers>>`"):
        jobspec.read_template(path)


def test_an_unknown_vm_size_is_refused_with_the_fix():
    with pytest.raises(JobError, match="not in the VM-size catalog.*--batch-size and --workers"):
        sizing.for_cluster(target.Target("c", {**cluster("Standard_D4s_v5"), "vm_size": "Standard_X1"}, None, 1, 1))


def test_the_docs_table_is_what_the_launcher_sets():
    """docs/job-settings.md's per-size table: batch, workers and NCCL column, row by row, against the code."""
    from launcher import interconnect

    rows = {}
    for line in (ROOT / "docs/job-settings.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("Standard_"):
            rows[cells[0]] = cells
    assert sorted(rows) == vm_sizes.available()
    for size, (_, _gpus, mpi, nccl, batch, workers) in rows.items():
        s = vm_sizes.CATALOG[size]
        env = interconnect.environment(cluster(size), max(1, s.gpus))
        assert (int(batch), int(workers)) == EXPECTED[size], size
        assert mpi.startswith(env["OMPI_MCA_pml"]) and "eth0" in mpi and env["OMPI_MCA_btl_tcp_if_include"] == "eth0"
        if not s.gpus:
            assert nccl.startswith("none")
        elif env["NCCL_IB_DISABLE"] == "0":
            assert nccl == f"InfiniBand, {env['NCCL_TOPO_FILE'].rsplit('/', 1)[1]}", size
        else:
            assert nccl == "sockets on eth0" and env["NCCL_SOCKET_IFNAME"] == "eth0", size


@pytest.mark.parametrize("nodes", [1, 2])  # gpu-ib scales to 2 nodes in the dev stack
@pytest.mark.parametrize("job", sorted((ROOT / "jobs").glob("*resnet50-synthetic.yaml")), ids=lambda p: p.stem)
def test_synthetic_jobs_time_300_steady_steps_per_rank_at_any_node_count(dev_outputs, job, nodes):
    """A fixed 128,000 samples gave each of 8 GPUs about 53 steady steps at batch 256 and 16 GPUs 22: seconds,
    in which one checkpoint or the first NCCL call moves the figure by percents. The launcher sizes the sample
    count so that every rank, as the payloads' own split deals the samples (payloads/common/sharding.py), runs
    its start-up steps and then at least sizing.STEADY_STEPS."""
    from payloads.common import sharding

    template = jobspec.read_template(job)
    outs = stack.load_file(dev_outputs)
    filled = jobspec.fill(template, outs, target.resolve(outs, "gpu-ib", nodes, None), [])
    args = _payload_args(filled["command"])
    (samples,), (batch,) = _values(args, "--synthetic-samples"), _values(args, "--batch-size")
    processes = nodes * 8  # gpu-ib: ND96asr_v4, 8 GPUs a node
    for rank in (0, processes - 1):
        steps = len(sharding.batches(int(samples), rank, processes, int(batch), 42, 0))
        assert steps - 10 >= 300, (nodes, rank, steps)  # 10: the payloads' --startup-steps default
    assert f"{samples} synthetic samples" in filled["tags"]["sizing"]
    # A user's own count after `--` wins, and a larger batch or more start-up steps raise the filled one.
    mine = jobspec.fill(template, outs, target.resolve(outs, "gpu-ib", nodes, None), ["--synthetic-samples", "5"])
    assert _values(_payload_args(mine["command"]), "--synthetic-samples") == ["5"]
    more = jobspec.fill(template, outs, target.resolve(outs, "gpu-ib", nodes, None), ["--startup-steps", "50"])
    assert int(_values(_payload_args(more["command"]), "--synthetic-samples")[0]) == processes * 256 * 350
