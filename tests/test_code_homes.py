"""Code homes: a payload's entry point is what a job runs, not a library. What two payloads share lives in a module
of its own (payloads/tensorflow/launch.py, runtime.py, data.py; payloads/pytorch/runtime.py, models.py), so no
module imports a payload's entry point, and none reaches into another module's private (_underscore) names.
Folders match roles: nothing outside benchmarks/ imports it (the arrow runs from the benchmarks to the product), the
subscription checks (azurecheck/) never import the launcher, and what the tools share (azureaccess/) imports none of
them; a payload imports nothing outside payloads/ (a job's snapshot holds payloads/ only: .amlignore), the platform
library has one import name (`trainingplatform`, installed from infra/pyproject.toml), and no module edits sys.path. Read from the source (AST): nothing is imported or run."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAYLOADS = ROOT / "payloads"
# The project's import roots: the packages at the repository root, and the platform library installed from infra/.
PACKAGES = {
    "payloads": ROOT / "payloads",
    "datatools": ROOT / "datatools",
    "launcher": ROOT / "launcher",
    "azurecheck": ROOT / "azurecheck",
    "azureaccess": ROOT / "azureaccess",
    "benchmarks": ROOT / "benchmarks",
    "trainingplatform": ROOT / "infra" / "trainingplatform",
}


def module_name(path: pathlib.Path) -> str:
    for top, folder in PACKAGES.items():
        if path.is_relative_to(folder):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            break
    else:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    top, *rest = name.split(".")
    path = PACKAGES.get(top, ROOT / top).joinpath(*rest)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def is_project(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


ENTRY_POINTS = {module_name(p) for p in [*PAYLOADS.glob("*/train.py"), PAYLOADS / "healthcheck/__main__.py"]}


def imports(name: str, is_package: bool, tree: ast.AST):
    """(line, imported module, names taken from it) for every import of a project module, at any depth."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_project(alias.name):
                    yield node.lineno, alias.name, alias.asname or alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not is_project(source):
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if is_module(sub):  # `from . import runtime`: the module itself
                    yield node.lineno, sub, alias.asname or alias.name, ()
                else:  # `from .x import name`: a name of module x
                    yield node.lineno, source, None, (alias.name,)


def violations(name: str, source: str, is_package: bool = False) -> list[str]:
    tree = ast.parse(source)
    found, modules = [], {}
    for line, imported, bound, names in imports(name, is_package, tree):
        if name.startswith("payloads.") and not imported.startswith("payloads"):
            found.append(f"{name}:{line} imports {imported}, which a job's code snapshot does not hold")
        if imported.split(".")[0] == "benchmarks" and name.split(".")[0] != "benchmarks":
            found.append(f"{name}:{line} imports {imported}: the product never depends on the benchmarks")
        if name.split(".")[0] == "azurecheck" and imported.split(".")[0] == "launcher":
            found.append(f"{name}:{line} imports {imported}: the checks stand beside the launcher, not on it")
        if name.split(".")[0] == "azureaccess" and imported.split(".")[0] in {"launcher", "azurecheck", "datatools"}:
            found.append(f"{name}:{line} imports {imported}: what the tools share depends on none of them")
        if imported in ENTRY_POINTS and imported != name:
            found.append(f"{name}:{line} imports the entry point {imported}")
        for n in names:
            if n.startswith("_") and not n.startswith("__"):
                found.append(f"{name}:{line} imports {imported}'s private {n}")
        if bound:
            modules[bound] = imported
    for node in ast.walk(tree):  # module._private, where module is a payloads module bound by an import
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{name}:{node.lineno} uses {modules[node.value.id]}'s private {node.attr}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for target in [module or "", *(a.name for a in node.names)]:
                if target == "infra" or target.startswith("infra."):
                    found.append(f"{name}:{node.lineno} imports {target}: import trainingplatform (one name)")
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            found.append(f"{name}:{node.lineno} uses sys.path: import installed or root packages instead")
    return found


# Every module of the project but the tests (they may reach into what they test): payloads, data tools, launcher, benchmarks, the platform library,
# the stacks' programs, the policy pack and the toolchain's scripts.
SOURCES = sorted(
    p
    for p in [*ROOT.glob("*/**/*.py")]
    if p.relative_to(ROOT).parts[0] in {*PACKAGES, "infra", "policy", "toolchain", "images", "scripts"}
    and not any(part in {"node_modules", "venv"} or part.startswith(".") for part in p.parts)
)


def test_entry_points_are_found():
    assert {
        "payloads.pytorch.train",
        "payloads.tensorflow.train",
        "payloads.keras.train",
        "payloads.segmentation.train",
        "payloads.healthcheck.__main__",
    } <= ENTRY_POINTS


def test_every_folder_with_code_is_scanned():
    names = {module_name(p) for p in SOURCES}
    for expected in (
        "payloads.pytorch.train",
        "datatools.prepare",
        "datatools.landcover.prepare",
        "launcher.jobspec",
        "azurecheck.preflight",
        "azureaccess.credential",
        "benchmarks.planner",
        "trainingplatform.vm_sizes",
        "policy.training_policies",
        "infra.__main__",
        "infra.data-stack.__main__",
    ):
        assert expected in names


@pytest.mark.parametrize("path", SOURCES, ids=[module_name(p) for p in SOURCES])
def test_no_module_imports_an_entry_point_or_private_names(path):
    assert violations(module_name(path), path.read_text(), path.name == "__init__.py") == []


@pytest.mark.parametrize(
    "source, expected",
    [
        # What the Keras payload did before payloads/tensorflow/launch.py held the shared part.
        (
            "from ..tensorflow import train as tf_train\ntf_train.main([])\n",
            "imports the entry point payloads.tensorflow.train",
        ),
        ("import payloads.pytorch.train\n", "imports the entry point payloads.pytorch.train"),
        ("from ..pytorch.train import StepClock\n", "imports the entry point payloads.pytorch.train"),
        # What datatools/prepare.py did with the TFRecord example encoder.
        ("from ..tensorflow.tfrecords import _features\n", "payloads.tensorflow.tfrecords's private _features"),
        (
            "from ..tensorflow import tfrecords\ntfrecords._features(b'', 0)\n",
            "uses payloads.tensorflow.tfrecords's private",
        ),
        # What the launcher and the policy pack did before infra/pyproject.toml: two names, two ConfigError classes.
        ("from infra.trainingplatform import vm_sizes\n", "imports infra.trainingplatform: import trainingplatform"),
        ("import sys, pathlib\nsys.path.insert(0, str(pathlib.Path('infra')))\n", "uses sys.path"),
        # A payload that needs a data tool or the launcher fails in Azure ML, whose snapshot has payloads/ only.
        ("from datatools import prepare\n", "imports datatools.prepare, which a job's code snapshot does not hold"),
        ("from trainingplatform import vm_sizes\n", "imports trainingplatform.vm_sizes, which a job's code snapshot"),
    ],
)
def test_the_check_catches_what_it_names(source, expected):
    found = violations("payloads.keras.train", source)
    assert any(expected in v for v in found), found
    assert violations("payloads.keras.train", "from ..tensorflow import launch, runtime\nlaunch.main\n") == []


def test_the_tools_beside_the_launcher_stay_beside_it():
    # What azurecheck/cli.py did while it lived in launcher/checks/: the error type from the launcher's own module.
    assert "the checks stand beside the launcher" in " ".join(
        violations("azurecheck.cli", "from launcher.errors import JobError\n")
    )
    assert "depends on none of them" in " ".join(violations("azureaccess.stack", "from azurecheck import arm\n"))
    assert violations("azurecheck.cli", "from azureaccess.errors import JobError\n") == []
    assert violations("launcher.azureml", "from azurecheck import quota\n") == []
