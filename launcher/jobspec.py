"""Job definitions: templates in jobs/, filled from the stack outputs, validated with azure-ai-ml.

A template is an Azure ML v2 command job (what `az ml job create -f` takes) with tokens the stack fills
in: <<registry>> (login server), <<data>> and <<logs>> (datastore names), and the compute, node count and
processes per node, which come from the chosen cluster (GPUs per node from the VM-size catalog, never
typed in a job file). The command's <<batch_size>> and <<workers>> come from the cluster's size too
(launcher/sizing.py).

Two distributions: `mpi` (Horovod: Azure ML starts the processes with mpirun) and `pytorch` (PyTorch DDP,
the payload's --backend ddp: Azure ML starts process_count_per_instance processes per node and sets the
torch.distributed rendezvous variables MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK, RANK, LOCAL_RANK;
learn.microsoft.com/azure/machine-learning/how-to-train-distributed-gpu, "PyTorch"). The job files are mpi;
`python -m launcher JOB --backend ddp` (with_backend) turns a PyTorch payload's job into the pytorch one.
"""

from __future__ import annotations

import copy
import pathlib
import re
import shlex
import tempfile

import yaml

from azureaccess.errors import JobError
from azureaccess.stack import StackOutputs

from . import interconnect, sizing
from .target import Target

ROOT = pathlib.Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"\$\{\{\s*(inputs|outputs)\.([A-Za-z0-9_]+)\s*\}\}")
TOKENS = ("<<registry>>", "<<data>>", "<<logs>>")

# The payloads' --backend and the Azure ML distribution that starts each one's processes.
DISTRIBUTIONS = {"horovod": "mpi", "ddp": "pytorch"}
BACKENDS = tuple(DISTRIBUTIONS)
DDP_FLAG = re.compile(r"\s*--backend[ =]ddp(?=\s|$)")
PAYLOAD = re.compile(r"-m\s+(payloads(?:\.\w+)+)")


def read_template(path: pathlib.Path) -> dict:
    if not path.is_file():
        raise JobError(f"job file {path} not found: the job definitions are in jobs/")
    try:
        job = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise JobError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(job, dict) or job.get("type") != "command" or not isinstance(job.get("command"), str):
        raise JobError(f"{path} is not an Azure ML command job: it needs `type: command` and a `command`")
    dist = job.get("distribution") or {}
    if dist.get("type") not in DISTRIBUTIONS.values():
        raise JobError(
            f"{path}: distribution.type must be mpi (Horovod, started by mpirun) or pytorch (PyTorch "
            "DDP, with --backend ddp in the command)"
        )
    if dist["type"] == "pytorch" and not DDP_FLAG.search(job["command"]):
        raise JobError(
            f"{path}: distribution.type pytorch starts PyTorch DDP processes, but the command has no "
            "--backend ddp (each process would start Horovod alone and train its own model): add "
            "--backend ddp to the command, or use distribution.type mpi"
        )
    if dist["type"] == "mpi" and DDP_FLAG.search(job["command"]):
        raise JobError(
            f"{path}: the command trains with --backend ddp, whose processes need the rendezvous that "
            "distribution.type pytorch sets up (mpirun does not): use type pytorch, or leave --backend "
            "out of the file and pass it to the launcher (python -m launcher JOB --backend ddp)"
        )
    declared = {"inputs": set(job.get("inputs") or {}), "outputs": set(job.get("outputs") or {})}
    for kind, name in REFERENCE.findall(job["command"]):
        if name not in declared[kind]:
            raise JobError(
                f"{path}: the command uses ${{{{{kind}.{name}}}}} but the job declares no {kind[:-1]} "
                f"{name!r} (declared: {', '.join(sorted(declared[kind])) or 'none'})"
            )
    sizing.check_template(job["command"], path)
    return job


def backend_of(job: dict) -> str:
    """horovod or ddp, from the job's distribution."""
    return {v: k for k, v in DISTRIBUTIONS.items()}[job["distribution"]["type"]]


def with_backend(job: dict, backend: str | None, source: pathlib.Path, extra_args=()) -> dict:
    """The job trained with `backend` (None: as the job file says): the distribution that starts its processes,
    and --backend in the command to match."""
    if any(a == "--backend" or a.startswith("--backend=") for a in extra_args):
        raise JobError(
            "--backend after `--` reaches only the payload, not the job's distribution: give it to the "
            "launcher instead (python -m launcher JOB --backend ddp)"
        )
    if backend is None or backend == backend_of(job):
        return job
    if backend not in DISTRIBUTIONS:
        raise JobError(f"--backend {backend!r}: choose {' or '.join(BACKENDS)}")
    if not takes_backend(job["command"]):
        raise JobError(
            f"--backend {backend}: {source.name} does not run a PyTorch training payload (its options have no "
            "--backend: payloads/common/options.py); the TensorFlow, Keras and health check jobs run on Horovod only"
        )
    job = copy.deepcopy(job)
    command = DDP_FLAG.sub("", job["command"]).rstrip()
    job["command"] = command + " --backend ddp" if backend == "ddp" else command
    job["distribution"] = {**job["distribution"], "type": DISTRIBUTIONS[backend]}
    return job


def takes_backend(command: str) -> bool:
    """Whether the command's payload declares --backend: among the option groups its module names
    (payloads/common/options.py), read from its source (importing it would import torch), is the one holding
    --backend; a call of options.parse or build_parser without `groups` declares their default groups."""
    import ast
    import inspect

    from payloads.common import options

    m = PAYLOAD.search(command)
    path = ROOT / (m[1].replace(".", "/") + ".py") if m else None
    if path is None or not path.is_file():
        return False
    declared = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "options":
            found = getattr(options, node.attr, None)
            declared.update(found if isinstance(found, tuple) else [found])
        if isinstance(node, ast.Call) and getattr(getattr(node.func, "value", None), "id", None) == "options":
            params = inspect.signature(getattr(options, node.func.attr)).parameters
            if "groups" in params and len(node.args) <= list(params).index("groups"):
                if not any(k.arg == "groups" for k in node.keywords):
                    declared.update(params["groups"].default)
    return options.owners_of_flags()["--backend"][1] in declared


# NCCL's own watchdog for DDP jobs (distribution pytorch), behind the payloads' stall watchdog
# (payloads/common/watchdog.py), which names the stuck rank first; names from PyTorch's "ProcessGroupNCCL
# Environment Variables" page, read by torch 2.4 (the oldest the payloads support) and still by 2.14:
#  - TORCH_NCCL_ASYNC_ERROR_HANDLING=3: when a collective fails or passes its timeout (init_process_group's
#    `timeout`, which the payload sets from --stall-timeout: payloads/pytorch/runtime.collective_timeout), tear the
#    process down without aborting the communicator (the default of current torch, pinned here: 0 would let a
#    timed-out rank hang on);
#  - TORCH_NCCL_TRACE_BUFFER_SIZE (the flight recorder: the last N collectives of each rank, with their
#    sequence numbers and state; TORCH_FR_BUFFER_SIZE is its newer name) and TORCH_NCCL_DUMP_ON_TIMEOUT=1: on that
#    timeout each rank dumps them, to <output>/stalls/nccl-trace-rank<r> (the payload sets the file), so a rank
#    whose collective never started is seen beside the ones that waited for it.
# Horovod jobs have Horovod's stall inspector instead (interconnect.STALL_ENV). A job file's own
# environment_variables override these.
DDP_WATCHDOG_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_FR_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


# How a job reads its inputs (Azure ML "Access data in a job", how-to-read-write-data-v2):
#  - ro_mount streams files through a FUSE mount as the job opens them. Its default open mode caches whole
#    files (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED defaults to false); for "millions of small files (images)
#    ... multiple epochs" and large sequential files (TFRecord shards) the docs set block-based caching on,
#    which also keeps blocks on the node's disk for the next epoch. Whole-file caching suits random reads
#    of files over 128 MB, which no payload here does; a job file can still set it.
#  - download copies the whole input to the node's disk before the command starts: for data that fits
#    there (ImageNet's ~150 GB on an ND96asr_v4's 6 TB), read every epoch at local-disk speed.
INPUT_MODES = {
    "ro_mount": {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true"},
    "download": {},
}


def input_mode(job: dict, mode: str | None, source: pathlib.Path) -> tuple[dict, dict[str, str]]:
    """(the job with its inputs in `mode`, the data runtime's environment for the modes its inputs use)."""
    inputs = job.get("inputs") or {}
    if mode is not None:
        if mode not in INPUT_MODES:
            raise JobError(
                f"--input-mode {mode!r}: choose ro_mount (stream through the node's cache: data larger "
                "than the node's disk) or download (copy to the node's disk first: data that fits there)"
            )
        if not inputs:
            raise JobError(f"--input-mode {mode}: {source.name} declares no inputs to mount or download")
        job = copy.deepcopy(job)
        for spec in job["inputs"].values():
            spec["mode"] = mode
    env: dict[str, str] = {}
    for spec in (job.get("inputs") or {}).values():
        env.update(INPUT_MODES.get((spec or {}).get("mode", "ro_mount"), {}))  # Azure ML's default: ro_mount
    return job, env


def fill(
    template: dict,
    outputs: StackOutputs,
    target: Target,
    extra_args: list[str],
    mode: str | None = None,
    source: pathlib.Path | None = None,
) -> dict:
    """The Azure ML job for this stack and its target; `mode` (--input-mode) overrides the inputs' modes."""
    template, data_env = input_mode(template, mode, source or pathlib.Path("the job file"))
    text = yaml.safe_dump(template, sort_keys=False)
    for token, value in zip(
        TOKENS, (outputs["registry_login_server"], outputs.datastore("data"), outputs.datastore("logs"))
    ):
        text = text.replace(token, value)
    job = yaml.safe_load(text)
    job["compute"] = f"azureml:{target.compute}"
    nodes, ppn = target.nodes, target.processes_per_node
    job.setdefault("resources", {})["instance_count"] = nodes
    job["distribution"]["process_count_per_instance"] = ppn
    distribution = job["distribution"]["type"]
    env = {**data_env, **interconnect.environment(target.cluster, ppn, distribution)}
    if distribution == "pytorch":
        env.update(DDP_WATCHDOG_ENV)
    env.update(job.get("environment_variables") or {})  # the job file may override
    if distribution == "mpi":
        interconnect.check_under_mpi(env, "environment_variables of the job file")
    job["environment_variables"] = {k: str(v) for k, v in env.items()}
    if sizing.uses_placeholders(job["command"]):
        args = job["command"].split() + list(extra_args)
        fit = sizing.for_cluster(target, args)
        shm = (job.get("resources") or {}).get("shm_size")
        if shm:
            fit = sizing.within_shm(fit, shm, ppn, nodes * ppn, args)
        if sizing.SAMPLES in job["command"]:
            fit = sizing.with_timed_samples(fit, nodes * ppn, args)
        job["command"] = sizing.apply(job["command"], fit, extra_args)
        job.setdefault("tags", {})["sizing"] = fit.basis  # in the studio, and in --dry-run's output
    if extra_args:
        job["command"] = job["command"].rstrip() + " " + shlex.join(extra_args)
    tags = job.setdefault("tags", {})
    tags.update(
        {
            "cluster": target.name,
            "vm_size": target.vm_size,
            "nodes": str(nodes),
            "processes": str(nodes * ppn),
            "backend": backend_of(job),
        }
    )
    return job


# A job's name is its run id; azure-ai-ml's run history client checks ids against this pattern
# (azure/ai/ml/_restclient/runhistory/operations/_runs_operations.py).
JOB_NAME = re.compile(r"^[a-zA-Z0-9][\w-]{0,255}$")
NAME_TOKEN = re.compile(r"\$\{\{\s*name\s*\}\}")


def is_folder(earlier: str) -> bool:
    """--resume-from takes a job name or a folder of the logs container (job names have no slash)."""
    return "/" in earlier


def run_folder(earlier: str, logs_datastore: str) -> str:
    """The run folder (OUTPUT, ending in /) a --resume-from folder names, inside the logs container.

    Taken as written in the logs container (runs/<job>/<name>/), as its checkpoints/ folder, or as the
    azureml:// path of the logs datastore. A folder outlives the workspace: after a platform's destroy and
    up, the new workspace knows no earlier job, but the data stack kept the logs container."""
    folder = earlier.strip()
    head = f"azureml://datastores/{logs_datastore}/paths/"
    if folder.startswith("azureml://"):
        if not folder.startswith(head):
            raise JobError(
                f"--resume-from {earlier}: not a folder of the logs datastore ({head}...): checkpoints are "
                "written to the logs container only"
            )
        folder = folder[len(head) :]
    folder = folder.strip("/") + "/"
    if folder.endswith("/checkpoints/"):
        folder = folder[: -len("checkpoints/")]
    parts = folder.rstrip("/").split("/")
    if not folder.strip("/") or any(p in ("", ".", "..") for p in parts) or NAME_TOKEN.search(folder):
        raise JobError(
            f"--resume-from {earlier!r}: not a folder of the logs container; write it as the run folder, "
            "e.g. runs/pytorch-resnet50-synthetic/witty_jackal_3d4kq79d3v/"
        )
    return folder


def resume(job: dict, earlier: str, source: pathlib.Path) -> dict:
    """The job writing to `earlier`'s output folders, so that the payload resumes from the newest checkpoint
    there (the payloads resume from OUTPUT/checkpoints). Outputs are per job name (`${{name}}`).

    `earlier` is a job name of this workspace, or a run folder in the logs container (is_folder): the
    output under the job name is pointed at that folder (azureml.submit checks it holds checkpoints).
    The paths here assume a job `earlier` wrote under its own name. A job that was itself resumed wrote under
    the name it resumed from, so the submission replaces them with the paths Azure ML records for `earlier`
    (azureml.follow_earlier_outputs); only a dry run, which asks no workspace, shows this guess."""
    folder = is_folder(earlier)
    if not folder and not JOB_NAME.match(earlier):
        raise JobError(
            f"--resume-from {earlier!r} is not an Azure ML job name (letters, digits, _ and -, e.g. "
            "witty_jackal_3d4kq79d3v): copy it from the studio or `az ml job list`, or give the run's "
            "folder in the logs container (runs/<job>/<name>/)"
        )
    outputs = job.get("outputs") or {}
    named = [name for name, out in outputs.items() if NAME_TOKEN.search(str((out or {}).get("path", "")))]
    if not named:
        raise JobError(
            f"--resume-from: {source.name} has no output under its job name (${{{{name}}}}), "
            "so there is nothing of an earlier run to resume from"
        )
    job = copy.deepcopy(job)
    for name in named:
        path = job["outputs"][name]["path"]
        if folder:
            m = re.match(r"^azureml://datastores/([^/]+)/paths/", path)
            if len(named) > 1 or not m:
                raise JobError(
                    f"--resume-from {earlier}: {source.name} has {len(named)} outputs under its job name; "
                    "a folder can stand for one: resume from the earlier job's name instead"
                )
            job["outputs"][name]["path"] = m[0] + run_folder(earlier, m[1])
        else:
            job["outputs"][name]["path"] = NAME_TOKEN.sub(earlier, path)
    job.setdefault("tags", {})["resumed_from"] = earlier
    return job


def earlier_output_path(recorded: str, earlier: str) -> str:
    """Where job `earlier` wrote an output, from the path Azure ML records for it: `${{name}}` there (the
    template's own path) is `earlier`; a concrete path (a job that was itself resumed) is taken as it is."""
    return NAME_TOKEN.sub(earlier, recorded)


def validate(job: dict, source: pathlib.Path):
    """Load the filled job with azure-ai-ml, offline, and return the SDK's Job object."""
    from azure.ai.ml import load_job

    job = copy.deepcopy(job)
    code = job.get("code")
    if code:
        code_dir = (source.parent / code).resolve()
        if not code_dir.is_dir():
            raise JobError(f"{source}: code: {code} is not a folder (relative to the job file)")
        job["code"] = str(code_dir)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(job, f, sort_keys=False)
    try:
        loaded = load_job(f.name)
        result = loaded._validate()
    except Exception as e:  # noqa: BLE001 - azure-ai-ml raises several validation types; all mean "invalid job file"
        raise JobError(f"{source} is not a valid Azure ML job: {e}") from None
    finally:
        pathlib.Path(f.name).unlink(missing_ok=True)
    if not result.passed:
        raise JobError(f"{source} is not a valid Azure ML job: {result.error_messages}")
    return loaded
