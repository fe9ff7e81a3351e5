"""The code snapshot a job uploads (`code: ..`, the repository root through .amlignore): what jobs run and nothing
else, staged without walking what the ignore file leaves out (launcher/snapshot.py), as azure-ai-ml would upload it,
and the workspace image builds' contexts from the same root."""

from __future__ import annotations

import fnmatch
import functools
import json
import pathlib
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---- item 10: the code snapshot ------------------------------------------------------------------------


def ignore_file():
    from azure.ai.ml._utils._asset_utils import get_ignore_file

    return get_ignore_file(ROOT)


@functools.cache
def walked(folder: pathlib.Path) -> tuple[object, tuple[tuple[str, str], ...]]:
    """(ignore file, (local path, remote name) of each file) azure-ai-ml uploads from a local folder, computed by
    its own functions: the ones create_or_update uses to hash and upload a job's code and an environment's build
    context (_artifact_utilities._upload_to_datastore: get_ignore_file(path), then get_upload_files_from_folder).
    Cached: it walks .venv (azure-ai-ml follows links), seconds per call."""
    from azure.ai.ml._utils._asset_utils import get_ignore_file, get_upload_files_from_folder

    ignore = get_ignore_file(folder)
    return ignore, tuple(get_upload_files_from_folder(folder, ignore_file=ignore))


def uploaded(folder: pathlib.Path) -> tuple[object, frozenset[str]]:
    """The files azure-ai-ml uploads from a local folder (`walked`), by their remote names."""
    ignore, files = walked(folder)
    return ignore, frozenset(remote for _, remote in files)


def snapshot() -> tuple[object, frozenset[str]]:
    """The files azure-ai-ml uploads for `code: ..` in jobs/*.yaml (the repository root)."""
    return uploaded(ROOT)


ENVIRONMENTS = sorted((ROOT / "images").glob("*/environment.yaml"))
# The tests reading `walked(ROOT)` (11-26 s on 2 cores: .venv's files) run on one xdist worker, so the
# checkout is walked once per test run instead of once per worker.
WALKS_THE_CHECKOUT = pytest.mark.xdist_group("walks_the_checkout")


def copy_sources(dockerfile: pathlib.Path) -> list[str]:
    """The build-context paths a Dockerfile's COPY/ADD instructions read (stage copies, --from=, read none)."""
    import shlex

    logical, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        if raw.lstrip().startswith("#") or (not current and not raw.strip()):
            continue  # comments (inside a continued instruction too) and blank lines
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        logical.append(current.strip())
        current = ""
    sources = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        if instruction.upper() not in ("COPY", "ADD"):
            continue
        args = json.loads(rest) if rest.lstrip().startswith("[") else shlex.split(rest)
        if any(a.startswith("--from=") for a in args):
            continue
        args = [a for a in args if not a.startswith("--")]
        sources += args[:-1]  # the last argument is the destination in the image
    return sources


def build_context(environment: pathlib.Path) -> tuple[pathlib.Path, str, frozenset[str]]:
    """(context folder, dockerfile path in it, files uploaded) for `az ml environment create -f environment`."""
    from azure.ai.ml import load_environment

    env = load_environment(environment)
    # _check_and_upload_env_build_context uploads environment.path: build.path resolved against the YAML
    context = pathlib.Path(env.path).resolve()
    return context, env.build.dockerfile_path, uploaded(context)[1]


def module_file(name: str) -> str | None:
    """The checkout file that `import name` loads, if the checkout has one."""
    base = name.replace(".", "/")
    return next((f for f in (base + ".py", base + "/__init__.py") if (ROOT / f).is_file()), None)


def imports(file: str) -> set[str]:
    """Every module name a checkout file may import (any depth, lazy imports included): for `from a import b`
    both a and a.b (b may be a submodule); relative imports made absolute."""
    import ast

    module = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    package = module if file.endswith("__init__.py") else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse((ROOT / file).read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {n for n in names if n}


@WALKS_THE_CHECKOUT
def test_code_snapshot_holds_what_jobs_run_and_nothing_else():
    ignore, files = snapshot()
    assert pathlib.Path(ignore.path).name == ".amlignore"  # it, not .gitignore, governs the upload
    todo = []
    for job in (ROOT / "jobs").glob("*.yaml"):
        command = yaml.safe_load(job.read_text())["command"]
        module = command.split("python -m ", 1)[1].split()[0]
        path = module.replace(".", "/")
        assert path + ".py" in files or path + "/__main__.py" in files, (job.name, module)
        todo.append(module if path + ".py" in files else module + ".__main__")  # a package runs its __main__
    # payloads/, plus exactly what the workspace image builds read from the same root (.amlignore serves both)
    image_build = set()
    for environment in ENVIRONMENTS:
        context, dockerfile, _ = build_context(environment)
        assert context == ROOT
        image_build |= {dockerfile, *copy_sources(context / dockerfile)}
    outside = {f for f in files if not f.startswith("payloads/")}
    # The PyTorch image copies payloads/ whole for its build check (toolchain/check_training_path.py).
    assert outside == {f for f in image_build if f != "payloads" and not f.startswith("payloads/")}, sorted(outside)
    assert len(files) > len(outside)
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    # Every checkout module a job can import (from its entry module on, parent packages included) must travel
    # with it. Modules uploaded but run only on a workstation (datatools.transfer) may import the launcher.
    seen = set()
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for prefix in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            file = module_file(prefix)
            if file is None or file in seen:
                continue
            seen.add(file)
            assert file in files, f"a job imports {prefix} ({file}), which the snapshot leaves out: .amlignore"
            todo += imports(file)
    assert "payloads/common/config.py" in seen and "payloads/tensorflow/train.py" in seen  # the walk walked


@WALKS_THE_CHECKOUT
def test_the_staged_snapshot_is_what_azure_ml_uploads_from_the_checkout():
    """submit() hands azure-ai-ml the files launcher/snapshot.py keeps, linked into a temporary folder, instead of
    the checkout it would walk whole (.venv included, twice per submission): the same files under the same names,
    the same bytes, and so the same content hash, the code asset's identity."""
    from azure.ai.ml._utils._asset_utils import _get_file_list_content_hash, get_content_hash, get_ignore_file

    from launcher import snapshot

    _, whole = walked(ROOT)
    with snapshot.staged(ROOT) as folder:
        _, staged = walked(pathlib.Path(folder))
        assert {remote for _, remote in staged} == {remote for _, remote in whole}
        assert get_content_hash(folder, get_ignore_file(folder)) == _get_file_list_content_hash(list(whole))
        assert len(staged) > 20 and all(pathlib.Path(folder, r).is_symlink() for _, r in staged)
        # The upload opens each file at the local path azure-ai-ml resolves the link to: the checkout's own file.
        assert all(pathlib.Path(local) == ROOT.resolve() / remote for local, remote in staged)
    assert not pathlib.Path(folder).exists()


def test_the_snapshot_walk_skips_ignored_folders_and_keeps_what_a_negation_brings_back(tmp_path):
    """The staged walk skips a folder only where no `!` line can reach inside it; what it keeps equals azure-ai-ml's
    walk of every file, on a tree with anchored, wildcard and bare-name negations."""
    from launcher import snapshot

    (tmp_path / ".amlignore").write_text(
        "/*\n!/src/\n!/img/*/Dockerfile\n__pycache__/\n*.pyc\n!keep.pyc\n/deep/*\n!/deep/a/b/c.txt\n"
    )
    files = [
        "src/main.py", "src/__pycache__/main.cpython-311.pyc", "src/x.pyc", "src/keep.pyc",
        "img/py/Dockerfile", "img/py/other.txt", "big/lib/site.py", "big/lib/keep.pyc", "deep/a/b/c.txt",
        "deep/a/b/d.txt", "top.txt",
    ]  # fmt: skip
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text(f)
    real_walk = snapshot.os.walk

    def kept_and_walked() -> tuple[set[str], list[str]]:
        """What the staged walk keeps, and the folders it entered."""
        entered = []

        def recording_walk(top, **kw):
            for folder, subfolders, names in real_walk(top, **kw):
                entered.append(pathlib.Path(folder).relative_to(tmp_path).as_posix())
                yield folder, subfolders, names

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(snapshot.os, "walk", recording_walk)
            return {p.as_posix() for p in snapshot.kept_files(tmp_path)}, entered

    kept, walked_folders = kept_and_walked()
    _, whole = uploaded(tmp_path)
    assert kept == set(whole) == {"src/main.py", "src/keep.pyc", "img/py/Dockerfile", "big/lib/keep.pyc",
                                  "deep/a/b/c.txt"}  # fmt: skip
    # `!keep.pyc` (a bare name) reaches every folder, so this tree is walked whole ...
    assert "big/lib" in walked_folders
    (tmp_path / ".amlignore").write_text("/*\n!/src/\n!/img/*/Dockerfile\n__pycache__/\n")
    kept, walked_folders = kept_and_walked()
    # ... and without it, the folders no line brings anything back from are never entered.
    assert kept == {"src/main.py", "src/x.pyc", "src/keep.pyc", "img/py/Dockerfile"}
    assert sorted(walked_folders) == [".", "img", "img/py", "src", "src/__pycache__"]


def test_what_azure_ml_uploads_from_the_staged_folder_is_what_it_uploads_from_the_original(tmp_path):
    """Through azure-ai-ml's own walk of both: a .gitignore that keeps itself (a link to it would move its base back
    to the original folder: nothing uploaded), and the cases the pruned walk cannot judge (a linked folder, which
    azure-ai-ml matches by its resolved path; an escape in a `!` line), where the original folder is handed over."""
    from launcher import snapshot

    def tree(name: str, ignore: str, files: list[str]) -> pathlib.Path:
        root = tmp_path / name
        for f in files:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text(f)
        (root / ".gitignore").write_text(ignore)
        return root

    keeps_itself = tree("own", "/*\n!/src/\n!/.gitignore\n", ["src/a.py", "other/b.py"])
    with snapshot.staged(keeps_itself) as folder:
        assert pathlib.Path(folder).name == "own"  # the upload's blob folder keeps the checkout's name
        assert uploaded(pathlib.Path(folder))[1] == uploaded(keeps_itself)[1] == {".gitignore", "src/a.py"}
    linked = tree("linked", "/*\n!/payloads/\n", ["payloads/x.py", "common/y.py"])
    (linked / "link").symlink_to(linked / "payloads")
    (linked / "payloads" / "sh").symlink_to(linked / "common")
    escaped = tree("escaped", "/*\n!/\\[a\\]/k\n", ["[a]/k", "b/k"])
    for original in (linked, escaped):
        with snapshot.staged(original) as folder:
            assert folder == str(original.resolve())

    # Where no link can be made (Windows without the right to), the folder itself too.
    def no_links(*args):
        raise OSError(1, "A required privilege is not held by the client")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(snapshot.os, "symlink", no_links)
        with snapshot.staged(keeps_itself) as folder:
            assert folder == str(keeps_itself.resolve())
    assert uploaded(escaped)[1] == {"[a]/k"}


@pytest.mark.parametrize(
    "path",
    [
        ".git",
        ".git/HEAD",
        ".venv/bin/python",
        "outputs.dev.json",
        "runs/job-1/metrics.json",
        "tests/conftest.py",
        "benchmarks/scaling.py",
        "infra/trainingplatform/program.py",
        "launcher/azureml.py",
        "README.md",
        "payloads/__pycache__/config.cpython-311.pyc",
        "payloads/pytorch/train.pyc",
        "toolchain/bootstrap.sh",
        "toolchain/__pycache__/patch_horovod.cpython-311.pyc",
        "toolchain/lint-requirements.txt",
        "images/pytorch/environment.yaml",
        "datatools/prepare.py",
        "jobs/pytorch-resnet50-synthetic.yaml",
    ],
)
def test_code_snapshot_leaves_out(path):
    ignore = ignore_file()
    assert ignore.is_file_excluded((ROOT / path).as_posix())


@WALKS_THE_CHECKOUT
@pytest.mark.parametrize("environment", ENVIRONMENTS, ids=lambda p: p.parent.name)
def test_workspace_image_build_gets_its_dockerfile_and_every_copy_source(environment):
    """`az ml environment create -f images/<x>/environment.yaml` uploads build.path filtered by the ignore file
    found there (for ../.., the job snapshot's .amlignore: azure-ai-ml _check_and_upload_env_build_context ->
    _upload_to_datastore -> get_ignore_file), and the workspace builds from that upload alone (build.contextUri,
    a blob URI; Azure/azure-cli-extensions#5560: .amlignore decides what of --build-context is sent). A COPY
    whose source was filtered out fails the image build in the workspace."""
    context, dockerfile, files = build_context(environment)
    assert dockerfile in files, f"{dockerfile} is not uploaded from {context}: re-include it in .amlignore"
    sources = copy_sources(context / dockerfile)
    assert sources, "the Dockerfile copies something from the context (the parser found no COPY)"
    for source in sources:
        source = source.removeprefix("./").rstrip("/")
        found = [f for f in files if fnmatch.fnmatchcase(f, source) or f.startswith(source + "/")]
        assert found, f"COPY {source}: not in the build context uploaded from {context}: re-include it in .amlignore"


def test_copy_parser_reads_continuations_flags_and_skips_stage_copies(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM x AS build\n# COPY commented/out /x\nCOPY a.txt \\\n    b/c.sh /src/\n"
        "COPY --chown=1:1 d /d\nCOPY --from=build /opt/venv /opt/venv\n"
        'ADD ["e f", "/g"]\nRUN echo COPY nothing\n'
    )
    assert copy_sources(dockerfile) == ["a.txt", "b/c.sh", "d", "e f"]


def test_stack_outputs_files_are_not_committed():
    proc = subprocess.run(["git", "check-ignore", "-q", "outputs.dev.json"], cwd=ROOT)
    assert proc.returncode == 0, "outputs.*.json must be in .gitignore"
