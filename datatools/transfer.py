"""Upload a prepared shard set to the stack's data container, or download one, with checksums; resumable.

    python -m datatools.transfer upload SHARDS/webdataset --stack-outputs outputs.dev.json --prefix imagenet/webdataset
    python -m datatools.transfer download DEST --stack-outputs outputs.dev.json --prefix imagenet/webdataset

The account and container come from the stack outputs (datastores.data.account/.container, written by
`pulumi stack output --json`); --account-url/--container override them. Authentication is Entra ID only
(azureaccess/credential.py: your `az login`; a machine's managed identity only when asked): the stack turns shared keys off.

Every blob carries the file's MD5 as its Content-MD5 property. A rerun skips blobs whose size and MD5
already match, so an interrupted upload or download continues where it stopped. manifest.json goes up
last, so a shard set in the container is whole once its manifest is there; a download writes its local
manifest as incomplete first and marks it complete only after every file's MD5 matched the manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import pathlib
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from payloads.common import manifest
from payloads.common.errors import ConfigError

log = logging.getLogger("datatools.transfer")
CHUNK = 8 << 20


class TransferError(ConfigError):
    """A storage problem (missing container, refused credential, checksum mismatch), with the fix."""


@dataclass
class Stats:
    transferred: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes: int = 0


def account_url(account: str) -> str:
    # Public-cloud blob endpoint of an account (https://learn.microsoft.com/azure/storage/common/storage-account-overview#standard-endpoints).
    return f"https://{account}.blob.core.windows.net"


def container_client(url: str, container: str, credential=None, **kwargs):
    from azure.storage.blob import ContainerClient

    if credential is None:
        from azureaccess.credential import azure_credential  # the person's sign-in, not this machine's identity

        credential = azure_credential()
    return ContainerClient(url, container, credential=credential, **kwargs)


def _explain(e: Exception, client) -> TransferError:
    """Storage errors as what went wrong and what to do."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError

    where = f"container {client.container_name!r} of {client.url.rsplit('/', 1)[0]}"
    code = getattr(e, "error_code", None) or ""
    if isinstance(e, ResourceNotFoundError) and code == "ContainerNotFound":
        return TransferError(
            f"{where} does not exist: check datastores.data.container in the stack outputs "
            "(pulumi stack output --json), or pass --container; `pulumi up` creates it"
        )
    status = getattr(e, "status_code", None)
    if isinstance(e, ClientAuthenticationError) or status in (401, 403) or "Credential" in type(e).__name__:
        return TransferError(
            f"Azure Storage refused the credential for {where} ({code or type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]}): `az login` as a user (or AZURE_TOKEN_CREDENTIALS=ManagedIdentityCredential for a machine's identity) with the Storage Blob "
            "Data Contributor role on the data account (Reader suffices to download); shared keys are off on the "
            "stack's accounts. From outside the VNet, also add your IP to network.allowed_client_ips"
        )
    if isinstance(e, HttpResponseError):
        return TransferError(f"{where}: {code or status}: {str(e).splitlines()[0][:300]}")
    return TransferError(f"{where}: {type(e).__name__}: {e}")


def _storage_call(client, fn: Callable):
    from azure.core.exceptions import AzureError

    try:
        return fn()
    except AzureError as e:
        raise _explain(e, client) from None
    except Exception as e:  # azure-identity raises CredentialUnavailableError (not an AzureError) without a login
        if "Credential" in type(e).__name__:
            raise _explain(e, client) from None
        raise


def _check_container(client) -> None:
    _storage_call(client, client.get_container_properties)


def _blob_md5(client, name: str) -> tuple[int, str | None] | None:
    """(size, hex MD5) of a blob, or None when it is not there."""
    from azure.core.exceptions import ResourceNotFoundError

    def get():
        try:
            return client.get_blob_client(name).get_blob_properties()
        except ResourceNotFoundError:
            return None

    props = _storage_call(client, get)
    return None if props is None else (props.size, manifest.hex_of(props.content_settings.content_md5))


class _Progress:
    def __init__(self, total: int, desc: str, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not enabled)
        self.lock = threading.Lock()

    def hook(self):
        done = [0]

        def update(current: int, total) -> None:
            with self.lock:
                self.bar.update(current - done[0])
                done[0] = current

        return update

    def close(self):
        self.bar.close()


def _extra_files(folder: pathlib.Path) -> list[str]:
    """Companion files that go with the shards (tfrecord's <split>-classes.txt)."""
    return sorted(p.name for p in folder.glob("*-classes.txt"))


# ---------------------------------------------------------------------------------------------- upload


def _put(client, blob: str, path: pathlib.Path, md5: str, progress) -> None:
    from azure.storage.blob import ContentSettings

    kind = "application/x-tar" if path.suffix == ".tar" else "application/octet-stream"
    with open(path, "rb") as f:
        # Content-MD5 is stored with the blob (x-ms-blob-content-md5) and returned by Get Blob Properties;
        # for uploads in blocks Azure stores it without checking, so the local file is hashed just before.
        # validate_content adds a transactional MD5 per request, which the service checks on arrival.
        # (https://learn.microsoft.com/rest/api/storageservices/put-block-list#request-headers)
        _storage_call(
            client,
            lambda: client.get_blob_client(blob).upload_blob(
                f,
                overwrite=True,
                length=path.stat().st_size,
                max_concurrency=4,
                validate_content=True,
                content_settings=ContentSettings(content_type=kind, content_md5=manifest.md5_raw(md5)),
                metadata={"md5": md5},
                progress_hook=progress,
            ),
        )


def _split(items, already_there) -> tuple[Stats, list]:
    """Resume: (name, size, md5) items whose copy at the other end already matches are skipped, the rest
    are to transfer."""
    stats, todo = Stats(), []
    for item in items:
        if already_there(*item):
            stats.skipped.append(item[0])
        else:
            todo.append(item)
    return stats, todo


def _local_matches(path: pathlib.Path, size: int, md5: str | None) -> bool:
    return path.is_file() and path.stat().st_size == size and bool(md5) and manifest.md5_file(path) == md5


def upload(
    folder: pathlib.Path, client, prefix: str, workers: int = 8, progress: bool = True, force: bool = False
) -> Stats:
    folder = pathlib.Path(folder)
    m = manifest.read(folder)
    if m is None or not m.complete:
        raise ConfigError(
            f"{folder} holds no finished shard set ({manifest.NAME} {'missing' if m is None else 'says incomplete'}): "
            "run python -m datatools.prepare to the end first"
        )
    _check_container(client)
    prefix = prefix.strip("/")
    items = [(s.name, s.bytes, s.md5) for s in m.files()]
    for name in _extra_files(folder):
        p = folder / name
        items.append((name, p.stat().st_size, manifest.md5_file(p)))
    stats, todo = _split(
        items, lambda name, size, md5: not force and _blob_md5(client, f"{prefix}/{name}") == (size, md5)
    )
    bar = _Progress(sum(size for _, size, _ in todo), "upload", progress)

    def one(item):
        name, size, md5 = item
        path = folder / name
        if not path.is_file() or path.stat().st_size != size or manifest.md5_file(path) != md5:
            raise TransferError(
                f"local file {path} does not match its manifest entry (changed or damaged after "
                "preparation): prepare the set again; nothing bad was uploaded"
            )
        _put(client, f"{prefix}/{name}", path, md5, bar.hook())
        return name, size

    try:
        _run_all(one, todo, workers, stats)
    finally:
        bar.close()
    # The manifest last: its presence in the container says the set there is whole.
    data = (folder / manifest.NAME).read_bytes()
    md5 = hashlib.md5(data).hexdigest()  # noqa: S324
    mp = folder / manifest.NAME
    _put(client, f"{prefix}/{manifest.NAME}", mp, md5, None)
    return stats


def _run_all(one: Callable, todo: list, workers: int, stats: Stats) -> None:
    """Run `one` over `todo` in threads; after the first failure nothing new starts, and it is raised."""
    failed = threading.Event()

    def guarded(item):
        if failed.is_set():
            return None
        try:
            return one(item)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="transfer") as pool:
        futures = [pool.submit(guarded, item) for item in todo]
        error = None
        for f in futures:
            try:
                result = f.result()
            except BaseException as e:  # noqa: BLE001 - the first one is raised below, after the others end
                error = error or e
                continue
            if result is not None:
                stats.transferred.append(result[0])
                stats.bytes += result[1]
    if error is not None:
        raise error


# ---------------------------------------------------------------------------------------------- download


def _get(client, blob: str, dest: pathlib.Path, progress) -> str:
    """Download to a temporary file beside `dest`; returns the MD5 of the bytes received."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    h = hashlib.md5()  # noqa: S324
    stream = _storage_call(
        client, lambda: client.get_blob_client(blob).download_blob(max_concurrency=4, progress_hook=progress)
    )
    with open(tmp, "wb") as f:
        for chunk in stream.chunks():
            h.update(chunk)
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


def download(client, prefix: str, folder: pathlib.Path, workers: int = 8, progress: bool = True) -> Stats:
    import json

    from azure.core.exceptions import ResourceNotFoundError

    folder, prefix = pathlib.Path(folder), prefix.strip("/")
    _check_container(client)
    try:
        raw = client.get_blob_client(f"{prefix}/{manifest.NAME}").download_blob().readall()
    except ResourceNotFoundError:
        raise TransferError(
            f"no {manifest.NAME} at {prefix}/ in container {client.container_name!r}: the prefix is "
            "wrong, or its upload has not finished (rerun the upload; it resumes)"
        ) from None
    except Exception as e:  # noqa: BLE001 - the same explanations as every other call
        raise _explain(e, client) from None
    m = manifest.Manifest.from_json(json.loads(raw), f"{prefix}/{manifest.NAME}")
    folder.mkdir(parents=True, exist_ok=True)
    local = manifest.read(folder)
    if local is not None and local.plan.get("fingerprint") != m.plan.get("fingerprint"):
        raise TransferError(f"{folder} holds a different shard set: download into an empty folder")
    # Incomplete until every file is verified: a reader refuses the folder meanwhile.
    m.complete = False
    manifest.write(folder, m)

    items = [(s.name, s.bytes, s.md5) for s in m.files()]
    listed = {s.name for s in m.files()} | {manifest.NAME}
    for b in _storage_call(client, lambda: list(client.list_blobs(name_starts_with=f"{prefix}/"))):
        name = b.name[len(prefix) + 1 :]
        if "/" not in name and name not in listed:
            items.append((name, b.size, manifest.hex_of(b.content_settings.content_md5)))
    stats, todo = _split(items, lambda name, size, md5: _local_matches(folder / name, size, md5))
    bar = _Progress(sum(size for _, size, _ in todo), "download", progress)

    def one(item):
        name, size, md5 = item
        dest = folder / name
        got = _get(client, f"{prefix}/{name}", dest, bar.hook())
        tmp = dest.with_name(f".{dest.name}.tmp")
        if md5 is None or got != md5:
            tmp.unlink()
            raise TransferError(
                f"checksum mismatch for {prefix}/{name}: the manifest says MD5 {md5}, the blob's bytes "
                f"hash to {got}. The blob is damaged or was overwritten: upload the set again from the "
                "prepared shards with --force (which rewrites blobs whose properties look right)"
            )
        os.replace(tmp, dest)
        return name, size

    try:
        _run_all(one, todo, workers, stats)
    finally:
        bar.close()
    m.complete = True
    manifest.write(folder, m)
    return stats


# ---------------------------------------------------------------------------------------------- command line


def _target(a) -> tuple[str, str]:
    url, container = a.account_url, a.container
    if a.stack_outputs is not None:
        from azureaccess.errors import JobError
        from azureaccess.stack import load_file

        try:
            data = load_file(a.stack_outputs)["datastores"]["data"]
        except JobError as e:
            raise ConfigError(str(e)) from None
        if not data.get("account") or not data.get("container"):
            raise ConfigError(
                f"{a.stack_outputs}: datastores.data lacks account/container: the stack is older than "
                "this tool; run pulumi up and write the outputs again"
            )
        url = url or account_url(data["account"])
        container = container or data["container"]
    if not (url and container):
        raise ConfigError(
            "say where to: --stack-outputs outputs.<stack>.json (from `pulumi stack output --json`), "
            "or --account-url and --container"
        )
    return url, container


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("azure").setLevel(logging.WARNING)  # no request logs (they would list headers)
    p = argparse.ArgumentParser(prog="python -m datatools.transfer", description=__doc__.splitlines()[0])
    p.add_argument("direction", choices=["upload", "download"])
    p.add_argument(
        "folder",
        type=pathlib.Path,
        help="upload: a prepared format folder (with manifest.json); download: where to put the set",
    )
    p.add_argument("--prefix", required=True, help="folder in the container, e.g. imagenet/webdataset")
    p.add_argument("--stack-outputs", type=pathlib.Path, default=None)
    p.add_argument("--account-url", default=None, help="instead of the stack outputs' data account")
    p.add_argument("--container", default=None, help="instead of the stack outputs' data container")
    p.add_argument("--workers", type=int, default=8, help="files transferred in parallel")
    p.add_argument(
        "--force", action="store_true", help="upload: rewrite every blob, even those whose MD5 property matches"
    )
    p.add_argument("--no-progress", dest="progress", action="store_false")
    a = p.parse_args(argv)
    try:
        url, container = _target(a)
        client = container_client(url, container)
        if a.direction == "upload":
            s = upload(a.folder, client, a.prefix, a.workers, a.progress, a.force)
        else:
            s = download(client, a.prefix, a.folder, a.workers, a.progress)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        f"{a.direction}: {len(s.transferred)} file(s), {s.bytes / 1e6:.1f} MB transferred; "
        f"{len(s.skipped)} already there with the same MD5"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
