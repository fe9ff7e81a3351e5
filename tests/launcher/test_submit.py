"""Submission to Azure ML: bad launcher input, prices per region, the code snapshot, resuming, data modes,
and every way a submission can end, with azure-ai-ml replaced only where it would reach the network."""

import fnmatch
import functools
import json
import pathlib
import subprocess

import pytest
import yaml

from launcher import __main__ as cli
from launcher import prices, stack

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYNTHETIC = ROOT / "jobs/pytorch-resnet50-synthetic.yaml"
IMAGENET = ROOT / "jobs/pytorch-resnet50-imagenet.yaml"


def outputs_with(dev_outputs, tmp_path, **changes) -> pathlib.Path:
    values = json.loads(dev_outputs.read_text())
    for key, value in changes.items():
        values[key] = value
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(values))
    return path


# ---- item 12: launcher input gaps ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args,message",
    [
        (["--nodes", "0"], "--nodes 0: a job needs at least 1 node"),
        (["--nodes", "-2"], "--nodes -2: a job needs at least 1 node"),
        (["--processes-per-node", "0"], "--processes-per-node 0: at least 1 process per node"),
        (["--processes-per-node", "-1"], "--processes-per-node -1: at least 1 process per node"),
    ],
)
@pytest.mark.parametrize("cluster", ["cpu-smoke", "gpu-ib"])
def test_zero_and_negative_counts_are_refused(dev_outputs, capsys, args, message, cluster):
    """0 used to fall back to the job file's value and negatives passed; both are errors, before validation."""
    code = cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", cluster, "--dry-run", *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_missing_outputs_file_message_names_the_path(tmp_path, capsys):
    missing = tmp_path / "outputs.prod.json"
    assert cli.main([str(SYNTHETIC), "--stack-outputs", str(missing), "--cluster", "x"]) == 2
    err = capsys.readouterr().err
    assert f"> {missing}`" in err and "{path}" not in err


def test_pulumi_output_that_is_not_json_is_a_clear_error(monkeypatch, capsys):
    class Proc:
        returncode, stderr = 0, ""
        stdout = "warning: A new version of Pulumi is available.\n{\"clusters\": {}}"

    monkeypatch.setattr(stack.subprocess, "run", lambda *a, **kw: Proc)
    assert cli.main([str(SYNTHETIC), "--stack", "dev", "--cluster", "gpu-ib"]) == 2
    err = capsys.readouterr().err
    assert "`pulumi stack output --json --stack dev` did not print JSON" in err
    assert "'warning: A new version" in err and "--stack-outputs FILE" in err


def test_retired_size_in_old_outputs_names_its_successors(dev_outputs, tmp_path, capsys):
    values = json.loads(dev_outputs.read_text())
    values["clusters"]["gpu-ib"]["vm_size"] = "Standard_NC24rs_v3"  # retired 2025-09-30 (vm_sizes.py)
    old = outputs_with(dev_outputs, tmp_path, clusters=values["clusters"])
    for extra in ([], ["--dry-run"]):
        assert cli.main([str(SYNTHETIC), "--stack-outputs", str(old), "--cluster", "gpu-ib", *extra]) == 2
        err = capsys.readouterr().err
        assert "Standard_NC24rs_v3, which Azure retired on 2025-09-30" in err
        assert "Standard_ND96asr_v4 or Standard_ND96amsr_A100_v4" in err and "pulumi up" in err


def write_table(tmp_path, rows: str) -> pathlib.Path:
    path = tmp_path / "prices.csv"
    path.write_text("# Test prices, USD per node-hour.\nregion,vm_size,dedicated,low_priority\n" + rows)
    return path


def test_prices_come_from_the_stacks_region(tmp_path):
    table = write_table(
        tmp_path, "eastus,Standard_ND96asr_v4,27.197,5.439\nwesteurope,Standard_ND96asr_v4,30.000,6.000\n"
    )
    cost, how = prices.hourly("Standard_ND96asr_v4", 2, True, "westeurope", table)
    assert cost == pytest.approx(12.0) and "in westeurope" in how and "NOT" not in how
    cost, how = prices.hourly("Standard_ND96asr_v4", 2, False, "eastus", table)
    assert cost == pytest.approx(54.394)


def test_price_from_another_region_says_so(tmp_path):
    table = write_table(tmp_path, "eastus,Standard_ND96asr_v4,27.197,5.439\n")
    cost, how = prices.hourly("Standard_ND96asr_v4", 1, False, "westeurope", table)
    assert cost == pytest.approx(27.197)
    assert "in eastus" in how and "NOT the stack's region (westeurope)" in how
    assert "--refresh westeurope" in how
    cost, how = prices.hourly("Standard_ND96asr_v4", 1, False, None, table)
    assert "NOT the stack's region (unknown: the stack outputs have no location)" in how


def test_size_missing_from_the_table(tmp_path):
    table = write_table(tmp_path, "eastus,Standard_ND96asr_v4,27.197,5.439\n")
    cost, how = prices.hourly("Standard_ND96isr_H200_v5", 1, False, "westeurope", table)
    assert cost is None and "no price for Standard_ND96isr_H200_v5" in how and "--refresh westeurope" in how


def test_dry_run_prices_the_dev_stack_in_west_europe(dev_outputs, capsys):
    """The dev stack is in westeurope and the shipped table has eastus rows only: the line must say so."""
    assert json.loads(dev_outputs.read_text())["location"] == "westeurope"
    assert cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--dry-run"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("# cost of one hour")][0]
    _, shipped = prices.table()
    if ("westeurope", "Standard_ND96asr_v4") in shipped:
        assert "in westeurope" in line and "NOT" not in line
    else:
        assert "in eastus" in line and "NOT the stack's region (westeurope)" in line


def test_refresh_replaces_one_region_and_keeps_the_others(tmp_path):
    table = write_table(tmp_path, "eastus,Standard_D4s_v5,0.192,0.038\neastus,Standard_ND96asr_v4,27.197,5.439\n")
    asked = []

    def fetch(region, size):  # the Retail Prices API's item shape
        asked.append((region, size))
        if size == "Standard_D4s_v5":
            return [
                {
                    "productName": "Virtual Machines Dsv5 Series",
                    "skuName": "D4s v5",
                    "retailPrice": 0.21,
                    "type": "Consumption",
                },
                {
                    "productName": "Virtual Machines Dsv5 Series",
                    "skuName": "D4s v5 Spot",
                    "retailPrice": 0.04,
                    "type": "Consumption",
                },
                {
                    "productName": "Virtual Machines Dsv5 Series Windows",
                    "skuName": "D4s v5",
                    "retailPrice": 0.39,
                    "type": "Consumption",
                },
            ]
        return []  # not offered in that region

    table.write_text(prices.refresh("westeurope", table, fetch))
    _, got = prices.table(table)
    assert sorted(asked) == [("westeurope", "Standard_D4s_v5"), ("westeurope", "Standard_ND96asr_v4")]
    assert got[("westeurope", "Standard_D4s_v5")] == (0.21, 0.04)
    assert ("westeurope", "Standard_ND96asr_v4") not in got
    assert got[("eastus", "Standard_ND96asr_v4")] == (27.197, 5.439)
    table.write_text(prices.refresh("westeurope", table, fetch))  # idempotent, header included
    assert table.read_text().count("westeurope: fetched") == 1


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


# ---- item 4: how a submission ends ---------------------------------------------------------------------
# azure-ai-ml runs for real, down to the HTTP layer: requests' adapter answers as Azure Resource Manager,
# the workspace's run history and its storage would. The exceptions are the ones the SDK itself raises
# from those answers (HttpResponseError, ClientAuthenticationError, ResourceNotFoundError, JobException).

WS = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/hvd-dev475c-rg/providers/"
    "Microsoft.MachineLearningServices/workspaces/hvd-dev475c-mlwx7k2q5b8e"
)
API = "https://westeurope.api.azureml.ms"


class FakeAzure:
    """Just enough of ARM, run history and Blob Storage for create_or_update, stream and get."""

    def __init__(self):
        self.calls = []
        self.jobs = {}
        self.run_statuses = ["Completed"]  # what run history answers, one per poll (the last repeats)
        self.run_error = None  # the run's error when it Failed
        self.job_status = "Completed"  # what GET job answers once the job exists
        self.upload_code = False  # False: the code snapshot is already there (hash match)
        self.fail = None  # (predicate(method, url), status, body, headers) to inject
        self.resolve_name = False  # True: record output paths with ${{name}} replaced by the job name

    @staticmethod
    def response(request, status, body=None, headers=None, raw=None):
        import io

        import requests
        import urllib3

        r = requests.Response()
        r.status_code, r.reason, r.request, r.url = status, "fake", request, request.url
        r._content = raw if raw is not None else json.dumps(body or {}).encode()
        r.headers.update({"Content-Type": "application/json", **(headers or {})})
        r.raw = urllib3.response.HTTPResponse(
            body=io.BytesIO(r._content), headers=r.headers, status=status, preload_content=False
        )
        return r

    def __call__(self, request):
        import re

        method, url = request.method, request.url
        path = url.split("?")[0].replace("https://management.azure.com", "")
        self.calls.append((method, path))
        if self.fail and self.fail[0](method, url):
            status, body, headers = self.fail[1:]
            if isinstance(body, BaseException):
                raise body
            raw = body.encode() if isinstance(body, str) else None
            return self.response(request, status, body, headers, raw)
        code = "https://hvddevmlws5b3f81.blob.core.windows.net/azureml-blobstore/LocalUpload/abc"
        if re.search(r"/codes/[^/]+/versions$", path) and method == "GET":
            found = [] if self.upload_code else [{"id": f"{path}/1", "name": "1", "properties": {"codeUri": code}}]
            return self.response(request, 200, {"value": found})
        if re.search(r"/codes/[^/]+/versions/1$", path):
            return self.response(request, 200, {"id": path, "name": "1", "properties": {"codeUri": code}})
        if path.endswith("/startPendingUpload"):
            return self.response(
                request,
                200,
                {
                    "blobReferenceForConsumption": {
                        "blobUri": code,
                        "credential": {"credentialType": "SAS", "sasUri": code + "?sv=2021-08-06&sig=x"},
                    },
                    "pendingUploadId": "abc",
                    "pendingUploadType": "TemporaryBlobReference",
                },
            )
        if re.search(r"/environments/[^/]+/versions/[^/]+$", path) and method == "PUT":
            body = json.loads(request.body)
            return self.response(request, 200, {**body, "id": path, "name": path.rsplit("/", 1)[1]})
        m = re.search(r"/jobs/([^/]+)$", path)
        if m and method == "PUT":
            body = json.loads(request.body)
            body.update(id=path, name=m[1])
            if self.resolve_name:
                body = json.loads(json.dumps(body).replace("${{name}}", m[1]))
            body["properties"]["services"] = {"Studio": {"endpoint": f"https://ml.azure.com/runs/{m[1]}"}}
            body["properties"]["status"] = "Queued"
            self.jobs[m[1]] = body
            return self.response(request, 201, body)
        if m and method == "GET" and m[1] in self.jobs:
            body = json.loads(json.dumps(self.jobs[m[1]]))
            body["properties"]["status"] = self.job_status
            return self.response(request, 200, body)
        if path == WS:
            return self.response(
                request,
                200,
                {
                    "id": WS,
                    "name": "hvd-dev475c-mlwx7k2q5b8e",
                    "location": "westeurope",
                    "properties": {"discoveryUrl": f"{API}/discovery"},
                },
            )
        if url.startswith(f"{API}/discovery"):
            return self.response(request, 200, {"api": API, "history": API})
        m = re.search(r"/runs/([^/]+)/details$", path)
        if m:
            status = self.run_statuses.pop(0) if len(self.run_statuses) > 1 else self.run_statuses[0]
            if status == "Ctrl-C":
                raise KeyboardInterrupt
            details = {"runId": m[1], "status": status, "logFiles": {}, "warnings": []}
            if status == "Failed" and self.run_error:
                details["error"] = {"error": self.run_error}
            return self.response(request, 200, details)
        return self.response(request, 404, {"error": {"code": "NotFound", "message": f"fake Azure has no {path}"}})


@pytest.fixture
def azure(monkeypatch):
    import time

    import requests.adapters
    from azure.core.credentials import AccessToken, AccessTokenInfo

    class Credential:  # what `az login` gives DefaultAzureCredential
        def get_token(self, *scopes, **kw):
            return AccessToken("token", int(time.time()) + 3600)

        def get_token_info(self, *scopes, **kw):
            return AccessTokenInfo("token", int(time.time()) + 3600)

    fake = FakeAzure()
    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", lambda self, request, **kw: fake(request))
    monkeypatch.setattr("azure.identity.DefaultAzureCredential", lambda **kw: Credential())
    # stream() sleeps between polls of run history
    monkeypatch.setattr("azure.ai.ml.operations._job_ops_helper._wait_before_polling", lambda seconds: 0)
    return fake


@pytest.fixture(scope="module")
def small_job(tmp_path_factory):
    """The synthetic job for the dev stack, with a one-file code folder: hashing the real checkout walks
    .venv (azure-ai-ml follows links), seconds per test that these tests do not need."""
    return tmp_path_factory.mktemp("code")


def submit(dev_outputs, code_dir, stream=True):
    from launcher import azureml, jobspec

    outs = stack.load_file(dev_outputs)
    job = jobspec.validate(jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), SYNTHETIC)
    (code_dir / "train.py").write_text("print('hello')\n")
    job.code = str(code_dir)
    try:
        return azureml.submit(job, outs, stream=stream)
    except Exception as e:  # noqa: BLE001 - asserted below: what __main__ prints for a JobError
        from launcher.errors import JobError

        assert isinstance(e, JobError), e
        return f"error: {e}"


def test_completed_job_end_to_end(azure, dev_outputs, capsys):
    azure.run_statuses = ["Queued", "Running", "Completed"]
    code = cli.main([str(SYNTHETIC), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--nodes", "2"])
    out = capsys.readouterr().out
    name = next(iter(azure.jobs))
    assert code == 0 and f"job {name} ended: Completed" in out
    sent = azure.jobs[name]["properties"]
    compute_name = stack.load_file(dev_outputs).cluster("gpu-ib")["compute_name"]  # the Azure ML name, hashed
    assert sent["computeId"].endswith(f"/computes/{compute_name}") and sent["resources"]["instanceCount"] == 2


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


def arm(method, url):
    return url.startswith("https://management.azure.com")


def blob(method, url):
    return ".blob.core.windows.net" in url


def storage_error(code, message):
    xml = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}\n'
        'RequestId:0\nTime:2026-11-23T11:00:00Z</Message></Error>'
    )
    return xml, {"x-ms-error-code": code, "Content-Type": "application/xml"}


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


# ---- item 9: --resume-from ---------------------------------------------------------------------------


def test_resume_dry_run_writes_to_the_earlier_jobs_folder(dev_outputs, capsys):
    code = cli.main(
        [
            str(SYNTHETIC),
            "--stack-outputs",
            str(dev_outputs),
            "--cluster",
            "gpu-ib",
            "--dry-run",
            "--resume-from",
            "witty_jackal_3d4kq79d3v",
        ]
    )
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

    from launcher import azureml, jobspec

    outs = stack.load_file(dev_outputs)
    filled = jobspec.resume(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), earlier, SYNTHETIC
    )
    job = jobspec.validate(filled, SYNTHETIC)
    job.code = str(small_job)
    azure.run_statuses, azure.job_status = ["Running", "Completed"], "Completed"
    assert azureml.submit(job, outs, resume_from=earlier) == 0
    new = [name for name in azure.jobs if name != earlier][0]
    sent = azure.jobs[new]["properties"]
    assert sent["outputs"]["run"]["uri"] == earlier_path
    assert earlier_path.endswith(f"/runs/pytorch-resnet50-synthetic/{earlier}/")
    assert sent["tags"]["resumed_from"] == earlier


@pytest.mark.parametrize("name", ["bad name", "-leading-dash", "x" * 300, "a.b"])
def test_resume_from_an_ill_formed_name(dev_outputs, capsys, name):
    code = cli.main(
        [
            str(SYNTHETIC),
            "--stack-outputs",
            str(dev_outputs),
            "--cluster",
            "gpu-ib",
            "--dry-run",
            f"--resume-from={name}",
        ]
    )
    assert code == 2
    assert "is not an Azure ML job name" in capsys.readouterr().err


def resubmit(dev_outputs, code_dir, earlier):
    from launcher import azureml, jobspec
    from launcher.errors import JobError

    outs = stack.load_file(dev_outputs)
    filled = jobspec.resume(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), earlier, SYNTHETIC
    )
    job = jobspec.validate(filled, SYNTHETIC)
    job.code = str(code_dir)
    with pytest.raises(JobError) as e:
        azureml.submit(job, outs, resume_from=earlier)
    return str(e.value)


def resume_job(azure, dev_outputs, code_dir, earlier):
    """Submit the synthetic job with --resume-from `earlier` as __main__ does; (exit status, its new name)."""
    from launcher import azureml, jobspec

    outs = stack.load_file(dev_outputs)
    filled = jobspec.resume(
        jobspec.fill(jobspec.read_template(SYNTHETIC), outs, "gpu-ib", 2, None, []), earlier, SYNTHETIC
    )
    job = jobspec.validate(filled, SYNTHETIC)
    job.code = str(code_dir)
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


# ---- item 11: how jobs read their data ---------------------------------------------------------------

IMAGENET_JOBS = [IMAGENET, ROOT / "jobs/tensorflow-resnet50-imagenet.yaml"]


def resolved(dev_outputs, job, *args):
    from launcher import jobspec

    outs = stack.load_file(dev_outputs)
    mode = args[0] if args else None
    filled = jobspec.fill(jobspec.read_template(job), outs, "gpu-ib", 1, None, [], mode, job)
    return jobspec.validate(filled, job)


@pytest.mark.parametrize("job", IMAGENET_JOBS, ids=lambda p: p.stem)
def test_imagenet_jobs_mount_with_the_block_cache(dev_outputs, job):
    """Azure ML's default mount caches whole files (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false); its
    documented setting for many small files over several epochs, and for large sequential files, is the
    block-based cache. The job must ask for it: leaving it out means whole-file caching."""
    sdk_job = resolved(dev_outputs, job)
    assert sdk_job.inputs["imagenet"].mode == "ro_mount"
    assert sdk_job.environment_variables["DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED"] == "true"
    template = yaml.safe_load(job.read_text())
    assert "false" not in str(
        (template.get("environment_variables") or {}).get("DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED")
    )


@pytest.mark.parametrize("job", IMAGENET_JOBS, ids=lambda p: p.stem)
def test_download_mode_copies_the_data_first(dev_outputs, job, capsys):
    sdk_job = resolved(dev_outputs, job, "download")
    assert sdk_job.inputs["imagenet"].mode == "download"
    assert not [k for k in sdk_job.environment_variables if k.startswith("DATASET_MOUNT_")]
    assert (
        cli.main(
            [
                str(job),
                "--stack-outputs",
                str(dev_outputs),
                "--cluster",
                "gpu-ib",
                "--dry-run",
                "--input-mode",
                "download",
            ]
        )
        == 0
    )
    assert yaml.safe_load(capsys.readouterr().out)["inputs"]["imagenet"]["mode"] == "download"


@pytest.mark.parametrize(
    "job,mode,message",
    [
        (IMAGENET, "mount", "--input-mode 'mount': choose ro_mount (stream"),
        (IMAGENET, "rw_mount", "--input-mode 'rw_mount': choose ro_mount"),
        (SYNTHETIC, "download", "--input-mode download: pytorch-resnet50-synthetic.yaml declares no inputs"),
    ],
)
def test_bad_input_modes(dev_outputs, capsys, job, mode, message):
    assert (
        cli.main(
            [str(job), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--dry-run", "--input-mode", mode]
        )
        == 2
    )
    assert message in capsys.readouterr().err


def test_job_file_mount_settings_win(dev_outputs, tmp_path):
    """Whole-file caching stays available to a job that reads large files at random (the docs' case for it)."""
    from launcher import jobspec

    template = yaml.safe_load(IMAGENET.read_text())
    template["environment_variables"] = {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"}
    filled = jobspec.fill(template, stack.load_file(dev_outputs), "gpu-ib", 1, None, [], None, IMAGENET)
    assert filled["environment_variables"]["DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED"] == "false"
