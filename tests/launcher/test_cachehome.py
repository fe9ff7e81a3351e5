"""Issue 43, item 2: the decoded cache's home on the node is chosen before submitting (launcher/cachehome.py), so
that no job meets the payload's room check (before epoch 1) after its queue."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import shlex

import fake_arm
import pytest
import yaml

from azureaccess import stack
from azureaccess.errors import JobError
from launcher import __main__ as cli
from launcher import cachehome, jobspec, target

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARDS = ROOT / "jobs/pytorch-resnet50-imagenet-shards.yaml"


def dry_run(dev_outputs, capsys, *args) -> tuple[dict, str]:
    code = cli.main([str(SHARDS), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--dry-run", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    return yaml.safe_load(out.split("\n# ")[0]), out


def test_the_cache_goes_to_dev_shm_sized_by_the_node_count_where_the_nodes_memory_holds_it(dev_outputs, capsys):
    """dev's gpu-ib is a Standard_ND96asr_v4 (900 GiB): ImageNet at --resize 256 is 326 GiB of decoded images, all
    on one node or half on each of two; shm_size grows by that over the loaders' 64g, within half the memory."""
    per_image = 3 * 256 * 342
    total = (1_281_167 + 50_000) * per_image
    job, out = dry_run(dev_outputs, capsys, "--nodes", "1")
    assert job["resources"]["shm_size"] == f"{64 + -(-total // 2**30)}g" == "390g"
    assert shlex.split(job["command"])[-2:] == ["--cache-dir", "/dev/shm"] and "--cache-decoded" in job["command"]
    assert "# decoded cache: 326 GiB per node (1,281,167 + 50,000 images at --resize 256 over 1 node(s)" in out
    assert "shm_size 64g -> 390g (the loaders' 64 GiB and the cache), within half of a Standard_ND96asr_v4" in out
    job, out = dry_run(dev_outputs, capsys, "--nodes", "2")
    half = (-(-1_281_167 // 2) + 25_000) * per_image  # each node's share of each split
    assert job["resources"]["shm_size"] == f"{64 + -(-half // 2**30)}g" == "227g" and "163 GiB per node" in out
    job, out = dry_run(dev_outputs, capsys, "--nodes", "1", "--", "--cache-dir", "/mnt/nvme/cache")
    assert job["resources"]["shm_size"] == "64g" and "--cache-dir /mnt/nvme/cache: yours" in out


def test_a_job_without_shm_size_counts_azure_mls_default_of_2g_for_its_loaders(dev_outputs):
    outs = stack.load_file(dev_outputs)
    job = jobspec.fill(jobspec.read_template(SHARDS), outs, target.resolve(outs, "gpu-ib", 1, None), [])
    del job["resources"]["shm_size"]
    out, line = cachehome.place(job, 900, "Standard_ND96asr_v4", 1, cachehome.imagenet("assumed"))
    assert out["resources"]["shm_size"] == "328g"  # the loaders' 2 GiB and the cache's 326
    assert "shm_size Azure ML default 2g -> 328g (the loaders' 2 GiB and the cache)" in line


def test_a_node_too_small_for_the_cache_trains_without_it_and_says_so_before_submitting(dev_outputs):
    template = jobspec.read_template(SHARDS)
    outs = stack.load_file(dev_outputs)
    job = jobspec.fill(template, outs, target.resolve(outs, "gpu-ib", 1, None), [])
    imagenet = cachehome.Counts(dict(cachehome.IMAGENET), 256, "assumed")
    out, line = cachehome.place(job, 220, "Standard_NC24ads_A100_v4", 1, imagenet)  # 220 GiB of memory
    assert "--cache-decoded" not in out["command"] and out["resources"]["shm_size"] == "64g"
    assert "not cached, more than half of a Standard_NC24ads_A100_v4 node's 220 GiB" in line
    assert "every epoch decodes" in line
    mine = jobspec.fill(template, outs, target.resolve(outs, "gpu-ib", 1, None), ["--cache-dir", "/dev/shm/x"])
    with pytest.raises(JobError, match="--cache-dir /dev/shm/x: decoded cache: 326 GiB per node"):
        cachehome.place(mine, 220, "Standard_NC24ads_A100_v4", 1, imagenet)
    same, line = cachehome.place(mine, 900, "Standard_ND96asr_v4", 1, imagenet)
    assert same["command"].count("--cache-dir") == 1 and same["resources"]["shm_size"] == "390g"


def test_the_counts_come_from_the_shard_sets_manifest_in_the_data_container(dev_outputs, monkeypatch):
    """datatools.prepare's manifest.json beside the shards, read with azure-storage-blob (Get Blob, faked at HTTP):
    its samples per split and --resize size the cache; without one, ImageNet's figures, said so."""
    fake = fake_arm.install(monkeypatch)
    outputs = stack.load_file(dev_outputs)
    job = jobspec.fill(jobspec.read_template(SHARDS), outputs, target.resolve(outputs, "gpu-ib", 1, None), [])
    data = outputs["datastores"]["data"]
    manifest = {
        "format": "webdataset",
        "plan": {"resize": 160},
        "splits": {
            "train": {"inputs": 3, "shards": [{"name": "a.tar", "samples": 600_000}, {"name": "b", "samples": 400}]},
            "validation": {"inputs": 1, "shards": [{"name": "v.tar", "samples": 1_000}]},
        },
    }
    where = f"{data['account']}.blob.core.windows.net/{data['container']}/imagenet-shards/webdataset/manifest.json"
    fake.on(
        "GET", where.replace(".", r"\."), fake_arm.blob_content(json.dumps(manifest).encode(), dt.datetime.now(dt.UTC))
    )
    counts = cachehome.counts_from_manifest(outputs, job, fake_arm.Credential())
    assert counts.images == {"train": 600_400, "validation": 1_000} and counts.resize == 160
    assert counts.source == f"{data['container']}/imagenet-shards/webdataset/manifest.json"
    fake.routes.clear()
    missing = cachehome.counts_from_manifest(outputs, job, fake_arm.Credential())
    assert (
        missing.images == cachehome.IMAGENET and "imagenet-shards/webdataset/manifest.json not read" in missing.source
    )
