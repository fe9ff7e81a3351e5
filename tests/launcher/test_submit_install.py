"""The submission-only install (issue 28, item 7): requirements-submit.txt gives `python -m launcher` (submit, --dry-run,
preflight, doctor, cost, nodes) and `python -m datatools.transfer` without torch, Horovod or TensorFlow, on the jump
host's Python 3.12 (docs/private-access.md#tools-on-the-jump-host).

Three checks: the file's packages and everything they pull in (read from the installed distributions' metadata, as pip
resolves them for Python 3.11 and 3.12 on Linux) hold no training framework and take .venv's pins; every import of
every module those commands can reach, function-level ones included, is the standard library, the checkout's own,
or a package of that set (packages_distributions()); and the commands themselves run in a Python where nothing else
can be imported (submit_only_probe.py)."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements-submit.txt"
FRAMEWORKS = {
    "torch",
    "torchvision",
    "horovod",
    "tensorflow",
    "tensorflow-cpu",
    "keras",
    "tf-keras",
    "jax",
    "tensorboard",
}
# The Pythons the install is for: the jump host's (Ubuntu 24.04) and .venv's (README: Python 3.11).
PYTHONS = ("3.11", "3.12")
FIRST_PARTY = {"launcher", "azurecheck", "azureaccess", "datatools", "payloads", "benchmarks", "trainingplatform"}
# What the commands start from: the launcher's entry point, every check, the cost ledger, node checks, the transfer.
ENTRY = ["launcher/__main__.py", "launcher/nodes.py", "datatools/transfer.py"] + sorted(
    str(p.relative_to(ROOT)) for folder in ("azurecheck", "launcher/cost") for p in (ROOT / folder).glob("*.py")
)
# Imports inside functions that those commands never call, each with the command that does. Everything else any reached
# module imports, at any depth, must come with the submission install.
ELSEWHERE = {
    ("launcher/local.py", "horovod"): "--target local: runs a job here with horovodrun (the full .venv)",
    ("launcher/__main__.py", "launcher.drill"): "--target local --drill: reads the payloads' checkpoints with torch",
    ("launcher/__main__.py", "launcher.simcluster"): "--target local --nodes N and rehearse: jobs on simulated nodes",
    # jobspec.takes_backend reads the payloads' option groups; the MLflow run they start is the payload's own
    ("payloads/common/tracking.py", "mlflow"): "a training run's MLflow tracking, imported when the payload starts it",
}
# Standard-library modules Python 3.12 no longer has (What's New in Python 3.12, "Removed").
REMOVED_IN_312 = {"distutils", "imp", "asynchat", "asyncore", "smtpd"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_lines(path: pathlib.Path) -> tuple[list[Requirement], dict[str, str]]:
    """(requirements, constraint pins) of a requirements file, following its -r and -c files as pip does (paths
    relative to the file that names them)."""
    reqs, pins = [], {}
    for raw in path.read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "-c ")):
            more_reqs, more_pins = _requirement_lines(path.parent / line[3:].strip())
            if line.startswith("-r "):
                reqs += more_reqs
                pins.update(more_pins)
            else:
                pins.update({canonical(r.name): str(r.specifier) for r in more_reqs})
            continue
        reqs.append(Requirement(line))
    return reqs, pins


def _environment(python: str) -> dict[str, str]:
    return {
        "python_version": python,
        "python_full_version": python + ".0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


def closure(requirements: list[Requirement]) -> dict[str, str]:
    """{distribution: installed version} of the requirements and all they require, for every Python in PYTHONS."""
    found: dict[str, str] = {}
    todo = [(r, python) for r in requirements for python in PYTHONS]
    while todo:
        req, python = todo.pop()
        env = _environment(python)
        if req.marker and not req.marker.evaluate({**env, "extra": ""}):
            continue
        dist = metadata.distribution(req.name)
        key = canonical(dist.metadata["Name"])
        extras = sorted(req.extras)
        if (key, python, tuple(extras)) in found.setdefault("__seen__", set()):  # type: ignore[arg-type]
            continue
        found["__seen__"].add((key, python, tuple(extras)))  # type: ignore[union-attr]
        found[key] = dist.version
        for text in dist.requires or ():
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({**env, "extra": e}) for e in ["", *extras]):
                todo.append((Requirement(str(sub).split(";")[0]), python))
    found.pop("__seen__")
    return found


@pytest.fixture(scope="module")
def submit():
    reqs, pins = _requirement_lines(REQUIREMENTS)
    return reqs, pins, closure(reqs)


def test_the_submission_install_holds_no_training_framework_and_takes_venvs_pins(submit):
    reqs, pins, dists = submit
    named = {canonical(r.name) for r in reqs}
    assert not named & FRAMEWORKS and not set(dists) & FRAMEWORKS, set(dists) & FRAMEWORKS
    assert "numpy" not in dists, "nothing the submission runs needs numpy"
    constraints, _ = _requirement_lines(ROOT / "constraints.txt")
    venv_pins = {canonical(r.name): str(r.specifier) for r in constraints}
    assert pins == venv_pins, "the file constrains its install with constraints.txt"
    # Every package the install can pull in is pinned there (a resolution of .venv's requirements), and the file's own
    # pins are those pins: no second set of versions to keep in step.
    assert set(dists) <= set(venv_pins), sorted(set(dists) - set(venv_pins))
    for r in reqs:
        assert str(r.specifier) == venv_pins[canonical(r.name)], r
        assert str(r.specifier).startswith("=="), f"{r}: pin it"
    for name, version in dists.items():
        assert venv_pins[name] == f"=={version}", f"{name}: .venv has {version}, constraints.txt {venv_pins[name]}"
    # The file names the one command of the docs.
    assert "python3 -m venv ~/.venv-submit && ~/.venv-submit/bin/pip install -r requirements-submit.txt -e infra" in (
        REQUIREMENTS.read_text()
    )


def _module_file(name: str) -> pathlib.Path | None:
    """The checkout's file for a first-party module (trainingplatform lives in infra/)."""
    parts = name.split(".")
    base = ROOT / "infra" if parts[0] == "trainingplatform" else ROOT
    for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT / "infra" if path.is_relative_to(ROOT / "infra") else ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(path: pathlib.Path) -> list[str]:
    """Every module `path` imports, at any depth (functions included), as absolute names."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                stem = f"{base}.{node.module}" if node.module else base
            else:
                stem = node.module
            found.append(stem)
            found += [f"{stem}.{a.name}" for a in node.names if _module_file(f"{stem}.{a.name}")]  # from . import x
    return found


def reached_imports() -> dict[str, set[str]]:
    """{file: the non-first-party modules it imports} for every first-party file the commands can reach."""
    todo = [ROOT / p for p in ENTRY]
    seen: dict[str, set[str]] = {}
    while todo:
        path = todo.pop()
        rel = str(path.relative_to(ROOT))
        if rel in seen:
            continue
        seen[rel] = set()
        # a package's __init__ runs before its modules
        for parent in path.relative_to(ROOT).parents:
            init = ROOT / parent / "__init__.py"
            if parent != pathlib.Path(".") and init.is_file():
                todo.append(init)
        for name in _imports(path):
            if (rel, name) in ELSEWHERE or any(name.startswith(k + ".") for (f, k) in ELSEWHERE if f == rel):
                continue
            if name.split(".")[0] in FIRST_PARTY:
                target = _module_file(name) or _module_file(name.rpartition(".")[0])
                assert target is not None, f"{rel}: {name} is not in the checkout"
                todo.append(target)
            else:
                seen[rel].add(name)
    return seen


def _distribution_of(module: str, top_level: dict[str, list[str]], by_path: dict[str, str]) -> str | None:
    owners = top_level.get(module.split(".")[0], [])
    if len(owners) == 1:
        return canonical(owners[0])
    parts = module.split(".")  # a namespace package (azure, opentelemetry): the distribution holding the module
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in by_path:
            return by_path[".".join(parts[:n])]
    return None


def test_every_import_the_commands_can_reach_comes_with_the_submission_install(submit):
    _, _, dists = submit
    top_level = metadata.packages_distributions()
    by_path = {}
    for dist in metadata.distributions():
        for f in dist.files or ():
            if f.suffix == ".py":
                parts = f.with_suffix("").parts
                parts = parts[:-1] if parts[-1] == "__init__" else parts
                by_path.setdefault(".".join(parts), canonical(dist.metadata["Name"]))
    reached = reached_imports()
    # What the commands reach, by construction: the launcher, its checks, the transfer and what they use.
    assert {"launcher/jobspec.py", "azurecheck/quota.py", "payloads/common/manifest.py"} <= set(reached)
    assert "infra/trainingplatform/naming.py" in reached and "infra/trainingplatform/scaling.py" in reached
    assert not any(rel.startswith("benchmarks/") for rel in reached), "the product reaches the benchmarks"
    missing = []
    for rel, modules in sorted(reached.items()):
        for module in sorted(modules):
            top = module.split(".")[0]
            assert top not in REMOVED_IN_312, f"{rel} imports {module}, which Python 3.12 removed"
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            owner = _distribution_of(module, top_level, by_path)
            if owner not in dists:
                missing.append(f"{rel}: {module} ({owner or 'no installed distribution'})")
    assert not missing, "not in requirements-submit.txt's install:\n" + "\n".join(missing)


def test_the_commands_run_where_only_the_submission_packages_exist(submit):
    """Every job's --dry-run (azure-ai-ml validates it), each subcommand's options, and the import of every module
    the commands reach, in a Python that can import nothing outside the install (submit_only_probe.py)."""
    _, _, dists = submit
    modules = sorted(
        {
            _module_name(ROOT / rel)
            for rel in reached_imports()
            if not rel.endswith("__init__.py") and not rel.startswith(("payloads", "benchmarks"))
        }
    )
    outputs = str(ROOT / "infra" / "review" / "dev-outputs.json")
    jobs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "jobs").glob("*.yaml"))
    # [module whose main(args) runs, *args]
    commands = [
        ["launcher.__main__", job, "--stack-outputs", outputs, "--cluster", "gpu-ib", "--dry-run"] for job in jobs
    ]
    commands += [["launcher.__main__", sub, "--help"] for sub in ("preflight", "doctor", "cost", "nodes")]
    commands += [["azurecheck.cli", sub, "--help"] for sub in ("preflight", "doctor")]
    commands += [["datatools.transfer", "--help"]]
    proc = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).with_name("submit_only_probe.py")), json.dumps(modules),
         json.dumps(commands)],
        cwd=ROOT, env={**os.environ, "SUBMIT_ONLY_DISTS": json.dumps(sorted(dists))},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(line[len("PROBE ") :])
    failed = [r for r in report["results"] if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)[:6000]
    assert {"azurecheck.preflight", "launcher.cost.history", "datatools.transfer"} <= set(modules)
    assert len(report["results"]) == len(modules) + len(commands)
    dry_run = next(r for r in report["results"] if "pytorch-resnet50-synthetic.yaml" in r["step"])
    assert "# cost of one hour" in dry_run["stdout"]
    assert report["heavy_loaded"] == [], report["heavy_loaded"]
    # The premise: the finder refused what lies outside the install (azure-ai-ml asks for optional packages).
    assert all(r["distribution"] not in dists for r in report["refused"])
