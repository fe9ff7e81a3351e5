"""Submission to Azure ML: bad launcher input, prices per region, the code snapshot, resuming, data modes,
and every way a submission can end, with azure-ai-ml replaced only where it would reach the network."""
import json
import pathlib
import subprocess

import pytest
import yaml

from launcher import __main__ as cli
from launcher import prices, stack

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYNTHETIC = ROOT / "payloads/jobs/pytorch-resnet50-synthetic.yaml"
IMAGENET = ROOT / "payloads/jobs/pytorch-resnet50-imagenet.yaml"


def outputs_with(dev_outputs, tmp_path, **changes) -> pathlib.Path:
    values = json.loads(dev_outputs.read_text())
    for key, value in changes.items():
        values[key] = value
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(values))
    return path


# ---- item 12: launcher input gaps ----------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--nodes", "0"], "--nodes 0: a job needs at least 1 node"),
    (["--nodes", "-2"], "--nodes -2: a job needs at least 1 node"),
    (["--processes-per-node", "0"], "--processes-per-node 0: at least 1 process per node"),
    (["--processes-per-node", "-1"], "--processes-per-node -1: at least 1 process per node"),
])
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
    values["clusters"]["gpu-ib"]["vm_size"] = "Standard_NC24rs_v3"     # retired 2025-09-30 (vm_sizes.py)
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
    table = write_table(tmp_path, "eastus,Standard_ND96asr_v4,27.197,5.439\nwesteurope,Standard_ND96asr_v4,30.000,6.000\n")
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

    def fetch(region, size):      # the Retail Prices API's item shape
        asked.append((region, size))
        if size == "Standard_D4s_v5":
            return [
                {"productName": "Virtual Machines Dsv5 Series", "skuName": "D4s v5", "retailPrice": 0.21,
                 "type": "Consumption"},
                {"productName": "Virtual Machines Dsv5 Series", "skuName": "D4s v5 Spot", "retailPrice": 0.04,
                 "type": "Consumption"},
                {"productName": "Virtual Machines Dsv5 Series Windows", "skuName": "D4s v5", "retailPrice": 0.39,
                 "type": "Consumption"},
            ]
        return []       # not offered in that region

    table.write_text(prices.refresh("westeurope", table, fetch))
    _, got = prices.table(table)
    assert sorted(asked) == [("westeurope", "Standard_D4s_v5"), ("westeurope", "Standard_ND96asr_v4")]
    assert got[("westeurope", "Standard_D4s_v5")] == (0.21, 0.04)
    assert ("westeurope", "Standard_ND96asr_v4") not in got
    assert got[("eastus", "Standard_ND96asr_v4")] == (27.197, 5.439)
    table.write_text(prices.refresh("westeurope", table, fetch))      # idempotent, header included
    assert table.read_text().count("westeurope: fetched") == 1


# ---- item 10: the code snapshot ------------------------------------------------------------------------

def ignore_file():
    from azure.ai.ml._utils._asset_utils import get_ignore_file

    return get_ignore_file(ROOT)


def snapshot() -> tuple[object, set[str]]:
    """The files azure-ai-ml uploads for `code: ../..`, computed by its own functions (the ones
    create_or_update uses to hash and upload a local code folder)."""
    from azure.ai.ml._utils._asset_utils import get_upload_files_from_folder

    ignore = ignore_file()
    return ignore, {remote for _, remote in get_upload_files_from_folder(ROOT, ignore_file=ignore)}


def test_code_snapshot_holds_what_jobs_run_and_nothing_else():
    import ast

    ignore, files = snapshot()
    assert pathlib.Path(ignore.path).name == ".amlignore"       # it, not .gitignore, governs the upload
    for job in (ROOT / "payloads/jobs").glob("*.yaml"):
        command = yaml.safe_load(job.read_text())["command"]
        module = command.split("python -m ", 1)[1].split()[0]
        assert module.replace(".", "/") + ".py" in files, (job.name, module)
    assert files and all(f.startswith("payloads/") for f in files), sorted(f for f in files if not f.startswith("payloads/"))
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    # Every checkout-local package an uploaded module imports must travel with it.
    local = {p.name for p in ROOT.iterdir() if p.is_dir() or p.suffix == ".py"}
    for f in (f for f in files if f.endswith(".py")):
        for node in ast.walk(ast.parse((ROOT / f).read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                top = name.split(".")[0]
                assert top not in local or top == "payloads", f"{f} imports {name}, which the snapshot leaves out"


@pytest.mark.parametrize("path", [
    ".git", ".git/HEAD", ".venv/bin/python", "outputs.dev.json", "runs/job-1/metrics.json", "tests/conftest.py",
    "benchmarks/scaling.py", "infra/trainingplatform/program.py", "launcher/azureml.py", "README.md",
    "payloads/__pycache__/config.cpython-311.pyc", "payloads/pytorch/train.pyc",
])
def test_code_snapshot_leaves_out(path):
    ignore = ignore_file()
    assert ignore.is_file_excluded((ROOT / path).as_posix())


def test_stack_outputs_files_are_not_committed():
    proc = subprocess.run(["git", "check-ignore", "-q", "outputs.dev.json"], cwd=ROOT)
    assert proc.returncode == 0, "outputs.*.json must be in .gitignore"
