"""Where a job's decoded-image cache lives on the node (`--cache-decoded`), decided before submitting.

The payload keeps each rank's decoded images after epoch 1 in a file in --cache-dir and checks the room there
before epoch 1 (payloads/pytorch/decodedcache.py): a refusal then comes after the queue and the start-up. So the
launcher sizes the cache first, from the shard set's manifest (its images per split and `--resize`, read from
the data container with your sign-in; ImageNet's counts where it cannot be read, said so) and the node count
(each node keeps its share), and picks a place that exists on every node of the size:

- /dev/shm, with the job's shm_size raised by the cache: memory the node has (the VM-size catalog's), kept to half
  of it so that the ranks and the page cache keep the rest; the loaders' shared batches keep the shm_size the job
  file gives them;
- or no cache, said before submitting: every epoch decodes (more nodes each keep a smaller share).

A --cache-dir of your own elsewhere is left as it is (the payload checks its room). The node's disks are not
chosen: Azure ML nodes of one size were seen exposing far less disk than the size's local NVMe (an H100 v5 node
with 128 GB, Azure/azureml-examples#3749); the health check prints each node's disks (docs/health-check.md).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import shlex

from azureaccess.errors import JobError

SHM = "/dev/shm"
MEMORY_SHARE = 0.5  # of the node's memory, at most, in /dev/shm
# A job without resources.shm_size gets Azure ML's 2g, not Docker's 64m (azureml-core's environment._DEFAULT_SHM_SIZE)
AML_DEFAULT_SHM = "2g"
IMAGENET = {"train": 1_281_167, "validation": 50_000}  # ILSVRC-2012
ASSUMED_RESIZE = 256  # docs/data.md's --resize for the shard sets
ASPECT = 4 / 3  # ImageNet's common width:height: 256 x 341 x 3 bytes, the 260 KB an image the docs give


@dataclasses.dataclass(frozen=True)
class Counts:
    images: dict[str, int]
    resize: int
    source: str  # where the figures come from, said in the line


def bytes_per_image(resize: int) -> int:
    return 3 * resize * math.ceil(resize * ASPECT)


def _gib(n: float) -> int:
    return math.ceil(n / 2**30)


def _shm_gib(text: str | None) -> int:
    """Azure ML's shm_size ("64g", "512m", a byte count) in whole GiB; Azure ML's default without one."""
    m = re.fullmatch(r"(\d+)\s*([bkmg]?)", (text or AML_DEFAULT_SHM).strip().lower())
    if not m:
        raise JobError(f"resources.shm_size {text!r}: a size such as 64g")
    n, unit = int(m.group(1)), m.group(2) or "b"
    return _gib(n * {"b": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit])


def _cache_dir(tokens: list[str]) -> str | None:
    found = None
    for i, a in enumerate(tokens):
        if a == "--cache-dir" and i + 1 < len(tokens):
            found = tokens[i + 1]
        elif a.startswith("--cache-dir="):
            found = a.split("=", 1)[1]
    return found


def place(job: dict, memory_gib: int | None, vm_size: str, nodes: int, counts: Counts) -> tuple[dict, str | None]:
    """The job with its decoded cache placed, and the line saying where and why (None: no --cache-decoded)."""
    tokens = shlex.split(job["command"])
    if "--cache-decoded" not in tokens:
        return job, None
    chosen = _cache_dir(tokens)
    if chosen and not (chosen.rstrip("/") == SHM or chosen.startswith(SHM + "/")):
        return job, f"decoded cache in --cache-dir {chosen}: yours (the payload checks its room before epoch 1)"
    per_image = bytes_per_image(counts.resize)
    per_node = sum(math.ceil(n / nodes) * per_image for n in counts.images.values())
    what = (
        f"decoded cache: {_gib(per_node)} GiB per node ({' + '.join(f'{n:,}' for n in counts.images.values())} "
        f"images at --resize {counts.resize} over {nodes} node(s), {counts.source})"
    )
    shm = (job.get("resources") or {}).get("shm_size")
    loaders = _shm_gib(shm)
    wanted = loaders + _gib(per_node)
    out = copy.deepcopy(job)
    if memory_gib is not None and wanted <= memory_gib * MEMORY_SHARE:
        out.setdefault("resources", {})["shm_size"] = f"{wanted}g"
        if not chosen:
            out["command"] = job["command"].rstrip() + f" --cache-dir {SHM}"
        return out, (
            f"{what} in {SHM}: shm_size {shm or f'Azure ML default {AML_DEFAULT_SHM}'} -> {wanted}g (the loaders' {loaders} GiB "
            f"and the cache), within half of a {vm_size} node's {memory_gib} GiB"
        )
    room = "unknown memory" if memory_gib is None else f"{memory_gib} GiB"
    if chosen:
        raise JobError(
            f"--cache-dir {chosen}: {what}, with the loaders' {loaders} GiB more than half of a {vm_size} node's "
            f"{room}: leave --cache-dir out (the launcher then drops the cache), or train on more nodes"
        )
    dropped = [t for t in tokens if t != "--cache-decoded"]
    out["command"] = shlex.join(dropped)
    return out, (
        f"{what}: not cached, more than half of a {vm_size} node's {room} with the loaders' {loaders} GiB: every "
        "epoch decodes (more nodes each keep a smaller share)"
    )


def imagenet(source: str) -> Counts:
    """ImageNet's counts at the shard sets' --resize, where no manifest is read (`source` says why)."""
    return Counts(dict(IMAGENET), ASSUMED_RESIZE, source)


def counts_from_manifest(outputs, job: dict, credential=None) -> Counts:
    """The shard set's images per split and --resize, from manifest.json in the data container beside the job's
    input (datatools.prepare writes it); ImageNet's figures where there is none to read, said in `source`."""
    assumed = imagenet(f"ImageNet's counts at --resize {ASSUMED_RESIZE}: assumed")
    head = f"azureml://datastores/{outputs.datastore('data')}/paths/"
    paths = [str((i or {}).get("path", "")) for i in (job.get("inputs") or {}).values()]
    folder = next((p[len(head) :] for p in paths if p.startswith(head)), None)
    data = (outputs.values.get("datastores") or {}).get("data") or {}
    if folder is None or not data.get("account") or not data.get("container"):
        return assumed
    from azure.core.exceptions import AzureError

    if credential is None:
        from azureaccess.credential import azure_credential

        credential = azure_credential()
    client = outputs.blob_container("data", credential)
    name = folder.rstrip("/") + "/manifest.json"
    try:
        manifest = json.loads(client.download_blob(name).readall())
    except (AzureError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        return dataclasses.replace(assumed, source=f"{assumed.source} ({name} not read: {why[:120]})")
    images = {k: sum(s.get("samples", 0) for s in v.get("shards", [])) for k, v in manifest.get("splits", {}).items()}
    resize = (manifest.get("plan") or {}).get("resize")
    source = f"{data['container']}/{name}" + ("" if resize else f" (no --resize recorded: {ASSUMED_RESIZE} assumed)")
    return Counts(images or dict(IMAGENET), int(resize or ASSUMED_RESIZE), source)
