"""The auto-resume supervisor job: `python -m launcher JOB --auto-resume N --supervise [CPU_CLUSTER]`.

The chain of autoresume.py, followed by a small job on one node of the stack's CPU cluster instead of by this
machine, so that nobody's laptop has to stay open overnight. The supervisor runs this launcher with `--follow`
(launcher/supervisor.yaml): with the identity of the person who submitted it (Azure ML's on-behalf-of, identity
`user_identity`; azureaccess/credential.py reads it with AzureMLOnBehalfOfCredential), the stack outputs in its
environment and, as its code, the launcher with what it imports (azureaccess, azurecheck), the VM-size catalog, the
payloads (for the health check) and the job file, copied from this checkout. Resumed jobs run the chain's first job's code asset, whatever the supervisor carries.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shlex
import shutil
import tempfile
from collections.abc import Iterator

import yaml

from azureaccess.errors import JobError
from azureaccess.stack import StackOutputs

from . import target
from .jobspec import ROOT, TOKENS
from .target import Target

TEMPLATE = pathlib.Path(__file__).with_name("supervisor.yaml")
STACK_OUTPUTS_FILE = "/tmp/stack-outputs.json"  # where the supervisor's command writes LAUNCHER_STACK_OUTPUTS
CARRIED = {
    "launcher": ROOT / "launcher",
    "azureaccess": ROOT / "azureaccess",
    "azurecheck": ROOT / "azurecheck",  # the submission's quota and workspace checks
    "payloads": ROOT / "payloads",
    "trainingplatform": ROOT / "infra/trainingplatform",
}


def cpu_cluster(outputs: StackOutputs, chosen: str | None) -> Target:
    """The cluster the supervisor runs on: `chosen`, which must have no GPU and be dedicated, or the stack's first
    such cluster. A low-priority node can be taken at any time, and Azure ML ends a low-priority job after 7 days,
    half the supervisor's 14."""
    cpu = [n for n, c in outputs["clusters"].items() if not c.get("gpus_per_node") and not c.get("low_priority")]
    if chosen:
        on = target.resolve(outputs, chosen, 1, 1)
        if on.cluster.get("gpus_per_node") or on.cluster.get("low_priority"):
            gpus = on.cluster.get("gpus_per_node")
            why = "a GPU cluster" if gpus else "a low-priority cluster (jobs there live 7 days)"
            raise JobError(
                f"--supervise {chosen}: {why}; the supervisor only follows a job: name a dedicated CPU cluster "
                f"({', '.join(cpu) or 'the stack has none'})"
            )
        return on
    if not cpu:
        raise JobError(
            "--supervise: the stack has no dedicated CPU cluster to run the supervisor on: add one to `clusters` in "
            "Pulumi.<stack>.yaml (the dev profile's cpu-smoke), or follow the chain from a machine that stays on "
            "(--follow, docs/preempted-and-resumed.md#my-job-died-overnight)"
        )
    return target.resolve(outputs, cpu[0], 1, 1)


def launcher_args(job_file: pathlib.Path, args, on: Target, follow: str, extra: list[str]) -> list[str]:
    """The supervisor's `python -m launcher` arguments: this command's (on its target), following `follow`."""
    argv = [f"jobs/{job_file.name}", "--stack-outputs", STACK_OUTPUTS_FILE, "--cluster", on.name]
    argv += ["--nodes", str(on.nodes), "--skip-quota-check", "--follow", follow, "--auto-resume", str(args.auto_resume)]
    for flag, value in (
        ("--processes-per-node", args.processes_per_node),
        ("--backend", args.backend),
        ("--input-mode", args.input_mode),
        ("--auto-resume-cap", args.auto_resume_cap),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--", *extra] if extra else [])


def job(outputs: StackOutputs, on: Target, argv: list[str], code: pathlib.Path) -> dict:
    """The supervisor's job definition, filled."""
    text = TEMPLATE.read_text().replace(TOKENS[0], outputs["registry_login_server"])
    spec = yaml.safe_load(text)
    spec["command"] = spec["command"].replace("<<launcher>>", shlex.join(argv))
    spec["environment_variables"]["LAUNCHER_STACK_OUTPUTS"] = json.dumps(outputs.values, sort_keys=True)
    spec["compute"] = f"azureml:{on.compute}"
    spec["code"] = str(code)
    spec.setdefault("tags", {}).update({"follows": argv[argv.index("--follow") + 1], "cluster": on.name})
    return spec


@contextlib.contextmanager
def carried(job_file: pathlib.Path, template: dict) -> Iterator[pathlib.Path]:
    """A temporary folder holding what the supervisor runs: the launcher, azureaccess, azurecheck, the payloads,
    trainingplatform and jobs/ (this checkout's, with the job file given)."""
    if str(template.get("code", "")).rstrip("/") != "..":
        raise JobError(
            f"--supervise: {job_file.name} has `code: {template.get('code')}`; the supervisor carries job files "
            "whose code is the checkout (`code: ..`, as in jobs/)"
        )
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    with tempfile.TemporaryDirectory(prefix="autoresume-supervisor-") as parent:
        folder = pathlib.Path(parent) / "supervisor"
        for name, source in CARRIED.items():
            shutil.copytree(source, folder / name, ignore=skip)
        shutil.copytree(ROOT / "jobs", folder / "jobs", ignore=skip)
        shutil.copyfile(job_file, folder / "jobs" / job_file.name)
        yield folder


def submit(ml, outputs: StackOutputs, on: Target, argv: list[str], job_file: pathlib.Path, template: dict) -> int:
    """Submit the supervisor; 0 once it is submitted (it then follows the chain alone)."""
    from . import azureml, jobspec

    with carried(job_file, template) as code:
        spec = jobspec.validate(job(outputs, on, argv, code), TEMPLATE)
        created = azureml.create(ml, spec, outputs)
    if isinstance(created, int):
        return created
    ws, rg = outputs["workspace_name"], outputs["resource_group"]
    print(
        f"auto-resume: supervisor {created.name} follows {argv[argv.index('--follow') + 1]} on {on.name} with your "
        f"identity; its log: az ml job stream -n {created.name} -g {rg} -w {ws}; stop it (not the training job): "
        f"az ml job cancel -n {created.name} -g {rg} -w {ws}",
        flush=True,
    )
    return 0
