"""The launcher's input before anything is submitted: bad counts and outputs files, prices per region, and how
jobs read their data (mount with the block cache, download, the job file's own settings)."""

import json
import pathlib

import pytest
import yaml
from fake_azureml import IMAGENET, ROOT, SYNTHETIC

from azureaccess import stack
from launcher import __main__ as cli
from launcher import prices


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


# ---- item 11: how jobs read their data ---------------------------------------------------------------

IMAGENET_JOBS = [IMAGENET, ROOT / "jobs/tensorflow-resnet50-imagenet.yaml"]


def resolved(dev_outputs, job, *args):
    from launcher import jobspec, target

    outs = stack.load_file(dev_outputs)
    mode = args[0] if args else None
    filled = jobspec.fill(jobspec.read_template(job), outs, target.resolve(outs, "gpu-ib", 1, None), [], mode, job)
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
    from launcher import jobspec, target

    template = yaml.safe_load(IMAGENET.read_text())
    template["environment_variables"] = {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"}
    outs = stack.load_file(dev_outputs)
    filled = jobspec.fill(template, outs, target.resolve(outs, "gpu-ib", 1, None), [], None, IMAGENET)
    assert filled["environment_variables"]["DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED"] == "false"
