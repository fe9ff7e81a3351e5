"""Transfer against Azurite, a real Azure Storage blob server with OAuth (Entra ID tokens) over HTTPS:
round trip, resume of interrupted uploads and downloads, corrupted blobs, missing container, bad credential."""

import json

import pytest
from conftest import FakeEntraToken

from datatools import prepare, transfer
from payloads.common import manifest
from payloads.common.errors import ConfigError

PREFIX = "imagenet/webdataset"


@pytest.fixture
def shard_set(tree, tmp_path):
    prepare.run(tree, tmp_path / "prepared", shards=3, formats=["webdataset"], progress=False)
    return tmp_path / "prepared" / "webdataset"


def _blobs(client) -> dict:
    return {b.name: b for b in client.list_blobs(name_starts_with=PREFIX + "/")}


def test_round_trip_keeps_every_byte_and_reruns_transfer_nothing(storage, shard_set, tmp_path):
    make, name = storage
    client = make(name)
    m = manifest.load_complete(shard_set, "webdataset")
    up = transfer.upload(shard_set, client, PREFIX, workers=3, progress=False)
    assert sorted(up.transferred) == sorted(s.name for s in m.files()) and not up.skipped
    blobs = _blobs(client)
    # Each blob carries its file's MD5 as Content-MD5 (what a later run and a download compare against).
    for s in m.files():
        assert manifest.hex_of(blobs[f"{PREFIX}/{s.name}"].content_settings.content_md5) == s.md5
    assert f"{PREFIX}/manifest.json" in blobs

    down = tmp_path / "downloaded"
    got = transfer.download(client, PREFIX, down, workers=3, progress=False)
    assert sorted(got.transferred) == sorted(s.name for s in m.files())
    assert manifest.load_complete(down, "webdataset").complete
    for s in m.files():
        assert (down / s.name).read_bytes() == (shard_set / s.name).read_bytes()

    again_up = transfer.upload(shard_set, client, PREFIX, progress=False)
    again_down = transfer.download(client, PREFIX, down, progress=False)
    assert again_up.transferred == [] and len(again_up.skipped) == len(m.files())
    assert again_down.transferred == [] and len(again_down.skipped) == len(m.files())


def test_interrupted_upload_resumes_and_the_set_is_not_visible_meanwhile(storage, shard_set, tmp_path, monkeypatch):
    make, name = storage
    client = make(name)
    real, calls = transfer._put, []

    def drops_on_third(c, blob, path, md5, progress):
        calls.append(blob)
        if len(calls) == 3:
            raise ConnectionError("network gone")
        return real(c, blob, path, md5, progress)

    monkeypatch.setattr(transfer, "_put", drops_on_third)
    files = [s.name for s in manifest.load_complete(shard_set, "webdataset").files()]
    with pytest.raises(ConnectionError):
        transfer.upload(shard_set, client, PREFIX, workers=1, progress=False)
    done = {n: b.etag for n, b in _blobs(client).items()}
    assert len(done) == 2 and f"{PREFIX}/manifest.json" not in done
    with pytest.raises(transfer.TransferError, match="no manifest.json at .*upload has not finished"):
        transfer.download(client, PREFIX, tmp_path / "early", progress=False)

    monkeypatch.setattr(transfer, "_put", real)
    stats = transfer.upload(shard_set, client, PREFIX, workers=1, progress=False)
    assert sorted(stats.skipped) == sorted(n.split("/")[-1] for n in done)
    assert sorted(stats.skipped + stats.transferred) == sorted(files)
    assert all(_blobs(client)[n].etag == etag for n, etag in done.items())  # not rewritten


def test_interrupted_download_resumes_and_is_incomplete_until_then(storage, shard_set, tmp_path, monkeypatch):
    make, name = storage
    client = make(name)
    transfer.upload(shard_set, client, PREFIX, progress=False)
    real, calls = transfer._get, []

    def drops_on_second(c, blob, dest, progress):
        calls.append(blob)
        if len(calls) == 2:
            raise ConnectionError("network gone")
        return real(c, blob, dest, progress)

    monkeypatch.setattr(transfer, "_get", drops_on_second)
    down = tmp_path / "down"
    with pytest.raises(ConnectionError):
        transfer.download(client, PREFIX, down, workers=1, progress=False)
    with pytest.raises(ConfigError, match="incomplete"):
        manifest.load_complete(down, "webdataset")
    monkeypatch.setattr(transfer, "_get", real)
    stats = transfer.download(client, PREFIX, down, workers=1, progress=False)
    assert stats.skipped == [calls[0].split("/")[-1]] and len(stats.transferred) == 5  # 6 shards in all
    assert manifest.load_complete(down, "webdataset").complete


def test_a_corrupted_blob_is_detected_on_download_and_fixed_by_a_forced_upload(storage, shard_set, tmp_path):
    from azure.storage.blob import BlobBlock, ContentSettings

    make, name = storage
    client = make(name)
    transfer.upload(shard_set, client, PREFIX, progress=False)
    victim = manifest.load_complete(shard_set, "webdataset").files()[1]
    blob = client.get_blob_client(f"{PREFIX}/{victim.name}")
    # Bit rot or a stray writer: same size, one byte flipped, the old Content-MD5 property kept
    # (Put Block List stores x-ms-blob-content-md5 without checking it).
    data = bytearray((shard_set / victim.name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.stage_block("YmxvY2sx", bytes(data))
    blob.commit_block_list(
        [BlobBlock("YmxvY2sx")],
        content_settings=ContentSettings(content_type="application/x-tar", content_md5=manifest.md5_raw(victim.md5)),
    )

    down = tmp_path / "down"
    with pytest.raises(transfer.TransferError, match=f"checksum mismatch for {PREFIX}/{victim.name}.*--force"):
        transfer.download(client, PREFIX, down, workers=1, progress=False)
    assert not (down / victim.name).exists() and not list(down.glob(".*.tmp"))
    with pytest.raises(ConfigError, match="incomplete"):
        manifest.load_complete(down, "webdataset")
    # A plain upload trusts the matching properties; --force rewrites, and the download then passes.
    assert victim.name in transfer.upload(shard_set, client, PREFIX, progress=False).skipped
    transfer.upload(shard_set, client, PREFIX, progress=False, force=True)
    transfer.download(client, PREFIX, down, progress=False)
    assert (down / victim.name).read_bytes() == (shard_set / victim.name).read_bytes()


def test_missing_container_and_refused_credential_fail_with_the_fix(storage, shard_set, tmp_path):
    make, name = storage
    with pytest.raises(
        transfer.TransferError, match="'nosuchcontainer' .* does not exist: check datastores.data.container"
    ):
        transfer.upload(shard_set, make("nosuchcontainer"), PREFIX, progress=False)
    with pytest.raises(transfer.TransferError, match="does not exist"):
        transfer.download(make("nosuchcontainer"), PREFIX, tmp_path / "d", progress=False)
    wrong = make(name, FakeEntraToken(audience="https://management.azure.com"))  # a token for another service
    with pytest.raises(transfer.TransferError, match="refused the credential.*Storage Blob Data Contributor"):
        transfer.upload(shard_set, wrong, PREFIX, progress=False)
    with pytest.raises(transfer.TransferError, match="refused the credential"):
        transfer.download(wrong, PREFIX, tmp_path / "d", progress=False)
    assert not list(make(name).list_blobs())  # nothing was written


def test_an_unfinished_preparation_is_not_uploaded(storage, shard_set):
    make, name = storage
    m = manifest.read(shard_set)
    m.complete = False
    manifest.write(shard_set, m)
    with pytest.raises(ConfigError, match="no finished shard set.*run python -m datatools.prepare to the end"):
        transfer.upload(shard_set, make(name), PREFIX, progress=False)


def test_target_comes_from_the_stack_outputs(tmp_path, capsys):
    outputs = tmp_path / "outputs.json"
    values = {
        "subscription_id": "s",
        "resource_group": "rg",
        "workspace_name": "w",
        "registry_login_server": "r",
        "clusters": {"gpu": {}},
        "datastores": {
            "data": {"name": "training_data", "account": "trndevdata1", "container": "training-data"},
            "logs": {"name": "training_logs", "account": "a", "container": "c"},
        },
    }
    outputs.write_text(json.dumps(values))

    class Args:
        account_url = container = None
        stack_outputs = outputs

    assert transfer._target(Args) == ("https://trndevdata1.blob.core.windows.net", "training-data")
    assert transfer.main(["upload", str(tmp_path), "--prefix", "x"]) == 2
    assert "--stack-outputs" in capsys.readouterr().err


def test_tfrecord_set_travels_with_its_class_list(storage, tree, tmp_path):
    from payloads.tensorflow import tfrecords

    make, name = storage
    client = make(name)
    prepare.run(tree, tmp_path / "p", shards=2, formats=["tfrecord"], progress=False)
    src = tmp_path / "p" / "tfrecord"
    transfer.upload(src, client, "imagenet/tfrecord", progress=False)
    down = tmp_path / "d"
    transfer.download(client, "imagenet/tfrecord", down, progress=False)
    assert sorted(p.name for p in down.iterdir()) == sorted(p.name for p in src.iterdir())
    for p in src.iterdir():
        assert (down / p.name).read_bytes() == p.read_bytes(), p.name
    train, val = tfrecords.find(down)  # what the TensorFlow payload opens
    assert len(train) == 2 and len(val) == 2
