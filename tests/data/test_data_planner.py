"""The data planner: bytes and requests a cluster reads at its speed, against the account's targets."""

from benchmarks import data_planner as dp
from datatools import prepare


def test_bytes_per_image_come_from_a_prepared_sets_manifest(tree, tmp_path):
    prepare.run(tree, tmp_path / "s", shards=2, formats=["webdataset"], progress=False)
    data = dp.from_manifest(tmp_path / "s" / "webdataset" / "manifest.json")
    tars = sorted((tmp_path / "s" / "webdataset").glob("train-*.tar"))
    assert data.images == 18 and data.bytes == sum(p.stat().st_size for p in tars) and data.sharded


def test_mount_while_the_account_keeps_up_else_the_throttled_rate_and_the_download_cost():
    data = dp.DataSet(1_000_000, 100e9, sharded=True)  # 100 KB per image
    ok = dp.plan(1, 20_000, data)  # 2 GB/s
    assert ok.advice.startswith("mount:") and abs(ok.bytes_per_sec - 2e9) < 1
    fast = dp.plan(8, 160_000, data)  # 16 GB/s: more than the account serves
    limit = dp.HEADROOM * dp.EGRESS_BYTES_PER_SEC / 100e3
    assert fast.storage_images_per_sec == limit < 160_000
    assert f"at most {limit:,.0f} images/s" in fast.advice and "download mode copies 8 x 100 GB" in fast.advice
    # A node whose cache cannot hold its part reads storage every epoch.
    assert "every epoch reads storage" in dp.plan(2, 20_000, data, node_cache_bytes=10e9).advice
    assert "later epochs read nothing" in dp.plan(2, 20_000, data, node_cache_bytes=60e9).advice


def test_class_folders_are_flagged_when_one_get_per_image_passes_the_request_target():
    folders = dp.DataSet(1_000_000, 100e9, sharded=False)
    many = dp.plan(4, 50_000, folders)
    assert many.requests_per_sec == 50_000 and "use shards" in many.advice
    assert "use shards" not in dp.plan(4, 50_000, dp.DataSet(1_000_000, 100e9, sharded=True)).advice


def test_the_command_prints_a_row_per_cluster_size(capsys):
    assert dp.main(["--gpu-images-per-sec", "3000"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 2 + 7 and "mount" in out
    assert dp.main(["--vm-size", "Standard_D4s_v5", "--gpu-images-per-sec", "1"]) == 2
