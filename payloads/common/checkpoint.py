"""Checkpoint files: one per epoch, written by rank 0, found again on resume; no rename anywhere.

Framework-neutral: the payload passes a `save(path)` function that writes its own format. Checkpoints go to the
logs account through a blob mount, where rename is a copy and a delete at best (see durable.py), so a checkpoint
is not written under a temporary name and renamed. Instead:

    1. save(path) writes to a local temporary file (the framework may seek; local disk handles that);
    2. the completion marker of the final name, if any (a re-save of the same epoch), is deleted;
    3. the file is copied sequentially to its final name, checkpoint-epoch-NNNN<suffix>, and synced;
    4. the marker .checkpoint-epoch-NNNN<suffix>.complete is written: {"file", "bytes", "sha256"}.

Only a file whose marker names it, with its size (and, for the one resumed from, its SHA-256), counts as a
checkpoint. A crash anywhere before step 4 ends leaves no valid marker for the new file, so the previous complete
checkpoint stays the newest resumable one; after it, the new one is. A truncated file is never chosen.
"""

from __future__ import annotations

import json
import logging
import pathlib
import re
import tempfile
from collections.abc import Callable

from . import durable

_NAME = re.compile(r"^checkpoint-epoch-(\d{4,})(\.[A-Za-z0-9]+)$")
MARKER = ".complete"
log = logging.getLogger("payloads.checkpoint")


def path_for(directory: pathlib.Path, epoch: int, suffix: str) -> pathlib.Path:
    """The file for the state *after* `epoch` epochs (1-based count of finished epochs)."""
    return directory / f"checkpoint-epoch-{epoch:04d}{suffix}"


def marker_for(path: pathlib.Path) -> pathlib.Path:
    """A hidden name next to the checkpoint: listings of the folder still show only checkpoints."""
    return path.with_name(f".{path.name}{MARKER}")


def _record(path: pathlib.Path) -> dict | None:
    """The marker's record when it vouches for `path` as it is now (same name and size), else None."""
    try:
        record = json.loads(marker_for(path).read_text())
        ok = (
            isinstance(record, dict)
            and record.get("file") == path.name
            and isinstance(record.get("sha256"), str)
            and record.get("bytes") == path.stat().st_size
        )
    except (OSError, ValueError):  # no marker, a torn one, or no data file
        return None
    return record if ok else None


def _files(directory: pathlib.Path, suffix: str) -> list[tuple[int, pathlib.Path]]:
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        m = _NAME.match(entry.name)
        if m and m.group(2) == suffix and entry.is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


def list_checkpoints(directory: pathlib.Path, suffix: str) -> list[tuple[int, pathlib.Path]]:
    """(epochs finished, path) of the complete checkpoints, oldest first; unfinished and foreign files are ignored."""
    return [(epoch, path) for epoch, path in _files(directory, suffix) if _record(path) is not None]


def incomplete(directory: pathlib.Path, suffix: str) -> list[tuple[int, pathlib.Path]]:
    """Checkpoint-named files no marker vouches for: a write cut short (or a file from before markers existed)."""
    return [(epoch, path) for epoch, path in _files(directory, suffix) if _record(path) is None]


def latest(directory: pathlib.Path, suffix: str) -> tuple[int, pathlib.Path] | None:
    """The newest complete checkpoint whose content matches its marker's SHA-256 (older ones are tried after it)."""
    unfinished = incomplete(directory, suffix)
    for epoch, path in reversed(list_checkpoints(directory, suffix)):
        record = _record(path)
        if record is not None and durable.sha256(path) == record["sha256"]:
            newer = [p.name for e, p in unfinished if e > epoch]
            if newer:
                log.warning(
                    "skipped %s: no completion marker (a write cut short); resuming from %s",
                    ", ".join(newer),
                    path.name,
                )
            return epoch, path
        log.warning("skipped %s: its content does not match the SHA-256 its marker records", path)
    if unfinished:
        log.warning(
            "no complete checkpoint in %s: %s have no completion marker (a write cut short, or written "
            "before markers existed), so training starts over",
            directory,
            ", ".join(p.name for _, p in unfinished),
        )
    return None


def write(path: pathlib.Path, save: Callable[[pathlib.Path], None]) -> None:
    """Write a checkpoint with `save(local_path)` under `path`, then its completion marker (see the module doc)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    marker = marker_for(path)
    with tempfile.TemporaryDirectory(prefix="checkpoint-") as tmp:
        local = pathlib.Path(tmp) / path.name
        save(local)  # a failure here leaves the output folder untouched
        marker.unlink(missing_ok=True)  # an old marker must never vouch for bytes being replaced
        try:
            size, digest = durable.copy(local, path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    durable.write_bytes(marker, json.dumps({"file": path.name, "bytes": size, "sha256": digest}).encode())
    durable.sync_dir(path.parent)


# The name callers used when this renamed a temporary file; it is the rename-free write now.
write_atomically = write


def prune(directory: pathlib.Path, suffix: str, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints (0 keeps all), and drop unfinished files older than the newest.
    The marker goes first: a prune cut short leaves an unvouched file, never a marker without its file."""
    if keep <= 0:
        return
    complete = list_checkpoints(directory, suffix)
    for _, old in complete[:-keep]:
        marker_for(old).unlink(missing_ok=True)
        old.unlink(missing_ok=True)
    if complete:
        newest = complete[-1][0]
        for epoch, leftover in incomplete(directory, suffix):
            if epoch < newest:
                marker_for(leftover).unlink(missing_ok=True)
                leftover.unlink(missing_ok=True)
