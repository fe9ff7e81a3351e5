"""Checkpoint files: one per epoch, and mid-epoch ones (SIGTERM, --checkpoint-every-minutes), written by rank 0,
found again on resume; no rename anywhere.

Names: checkpoint-epoch-NNNN<suffix> holds the state after NNNN whole epochs; checkpoint-epoch-NNNN-step-SSSSSS<suffix>
the state after NNNN whole epochs and SSSSSS steps of the next one (payloads/common/preemption.py). They order by
(NNNN, SSSSSS), an epoch's end after every step inside it; NNNN is the epochs done in both, which is what
launcher/cost reads from the markers (.checkpoint-epoch-NNNN...complete).

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

A full output folder: before step 2, the free space the file system reports for the folder (statvfs) is compared
with the file's size plus a margin (MARGIN_BYTES + MARGIN_FRACTION of it: the marker, metrics.json, heartbeats and
TensorBoard's next lines); too little, or ENOSPC/EDQUOT in steps 1, 3 or 4 (a file system that reports space it
does not have, a quota), raises OutputFull, whose message names the folder, the space needed and free and the fix.
Nothing older is touched and the partial new file is deleted, so every complete checkpoint stays resumable. The
TensorFlow payloads' save() runs write() on rank 0 inside on_root(), which hands the message to every rank: each
ends with the same one line (`error: ...`, exit 2) instead of waiting in the next step's collective until Horovod
shuts down. The PyTorch payloads write in a background thread (pytorch/runtime.py, _Writer): the failure reaches
on_root() at the next save or at the end of training, where every rank waits for it.
"""

from __future__ import annotations

import errno
import json
import logging
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable

from . import durable
from .errors import ConfigError

_NAME = re.compile(r"^checkpoint-epoch-(\d{4,})(?:-step-(\d{6,}))?(\.[A-Za-z0-9]+)$")
MARKER = ".complete"
log = logging.getLogger("payloads.checkpoint")


def path_for(directory: pathlib.Path, epoch: int, suffix: str, step: int = 0) -> pathlib.Path:
    """The file for the state *after* `epoch` epochs (1-based count of finished epochs) and, mid-epoch, `step`
    steps of the next one."""
    middle = f"-step-{step:06d}" if step else ""
    return directory / f"checkpoint-epoch-{epoch:04d}{middle}{suffix}"


def position(path: pathlib.Path) -> tuple[int, int]:
    """(epochs done, steps done in the next epoch) of a checkpoint file's name; (n, 0) at an epoch's end."""
    m = _NAME.match(pathlib.Path(path).name)
    if not m:
        raise ValueError(f"{path} is not a checkpoint name")
    return int(m.group(1)), int(m.group(2) or 0)


def marked(name: str) -> tuple[int, int] | None:
    """The position (as `position`) of the checkpoint whose completion marker is `name`, a file or blob name ending
    in .checkpoint-...<suffix>.complete (a folder before it allowed); None for any other name."""
    base = name.rsplit("/", 1)[-1]
    if not (base.startswith(".") and base.endswith(MARKER)):
        return None
    m = _NAME.match(base[1 : -len(MARKER)])
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


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
    """(epochs done, path), ordered by position: (epochs, steps)."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        m = _NAME.match(entry.name)
        if m and m.group(3) == suffix and entry.is_file():
            found.append(((int(m.group(1)), int(m.group(2) or 0)), entry))
    return [(key[0], path) for key, path in sorted(found)]


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
            newer = [p.name for _, p in unfinished if position(p) > position(path)]
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


MARGIN_BYTES = 256 << 10  # beside the checkpoint: its marker, metrics.json and its spare, heartbeats, TensorBoard
MARGIN_FRACTION = 0.05
_FULL = {errno.ENOSPC, errno.EDQUOT}


class OutputFull(ConfigError):
    """No room for a checkpoint: the message names the folder, the space needed and free, and the fix. A
    ConfigError, so that every payload's main() prints it as one line and exits 2."""


def needed_bytes(size: int) -> int:
    return size + MARGIN_BYTES + int(size * MARGIN_FRACTION)


def free_bytes(folder: pathlib.Path) -> int | None:
    """What the file system says is free for this process in `folder` (statvfs f_bavail); None where it says
    nothing usable (no statvfs, or a mount that reports no size at all)."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return None
    return usage.free if usage.total > 0 else None


def size_text(n: float) -> str:
    """A byte count as people read it in an error line: 1.5 GB, 312.0 MB, 4 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.0f} kB"


def full_message(path: pathlib.Path, size: int, free: int | None, keep: int | None = None, failed: str = "") -> str:
    """One line: the folder, the space needed and free, what is kept, the fix. `failed`: the error of a write that
    ran out of space although the check before it passed (a file system whose free figure is not what it has)."""
    kept = list_checkpoints(path.parent, path.suffix)
    fewer = ""
    if keep is not None and keep != 1:
        fewer = f", or keep fewer checkpoints (--keep-checkpoints {keep}{' keeps all' if keep == 0 else ''} now)"
    free_text = f"{size_text(free)} is free" if free is not None else "the file system reports no free figure"
    need = f"{path.name} needs {size_text(needed_bytes(size))} ({size_text(size)} and a margin)"
    problem = (
        f"writing {path.name} ({size_text(size)}) failed: {failed}; now {free_text}"
        if failed
        else f"{need}, {free_text}"
    )
    return (
        f"the output folder {path.parent} is full: {problem}; its {len(kept)} complete checkpoint(s) are kept"
        f"{f', the newest {kept[-1][1].name}' if kept else ''}. Fix: a larger output folder (free space there, or "
        f"--output-dir on a disk with room){fewer}; run again and it resumes from the newest"
    )


def write(path: pathlib.Path, save: Callable[[pathlib.Path], None], keep: int | None = None) -> None:
    """Write a checkpoint with `save(local_path)` under `path`, then its completion marker (see the module doc).
    Raises OutputFull, with the previous checkpoints untouched, where the folder has no room; `keep` (the
    --keep-checkpoints value) only shapes that message."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    marker = marker_for(path)
    with tempfile.TemporaryDirectory(prefix="checkpoint-") as tmp:
        local = pathlib.Path(tmp) / path.name
        try:
            save(local)  # a failure here leaves the output folder untouched
        except OSError as e:
            if e.errno not in _FULL:
                raise
            raise OutputFull(
                f"the temporary folder {tmp} (local disk) is full while the checkpoint is saved there before it is "
                f"copied to {path.parent} ({e.strerror}): set TMPDIR to a folder on a disk with room"
            ) from None
        size = local.stat().st_size
        # A re-save of the same epoch replaces a file: its bytes come back.
        replaced = path.stat().st_size if path.is_file() else 0
        free = free_bytes(path.parent)
        if free is not None and free + replaced < needed_bytes(size):
            raise OutputFull(full_message(path, size, free, keep))
        marker.unlink(missing_ok=True)  # an old marker must never vouch for bytes being replaced
        try:
            size, digest = durable.copy(local, path)
            durable.write_bytes(marker, json.dumps({"file": path.name, "bytes": size, "sha256": digest}).encode())
        except BaseException as e:
            # The partial file (or the whole one its marker could not vouch for) goes: space back, nothing unvouched.
            marker.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            if isinstance(e, OSError) and e.errno in _FULL:
                raise OutputFull(full_message(path, size, free_bytes(path.parent), keep, e.strerror)) from None
            raise
    durable.sync_dir(path.parent)


def on_root(root: bool, attempt: Callable[[], None], share: Callable[[str | None], str | None]) -> None:
    """Every rank calls this where rank 0 writes a checkpoint: rank 0 runs `attempt`; `share` (a broadcast from
    rank 0, one collective) hands its OutputFull message, or None, to every rank, and each raises the same
    OutputFull. The other ranks thus end with rank 0's one line rather than in the next step's collective with
    Horovod's shutdown traceback. Other errors stay rank 0's (a traceback there, as before)."""
    failure = None
    if root:
        try:
            attempt()
        except OutputFull as e:
            failure = str(e)
    failure = share(failure)
    if failure:
        raise OutputFull(failure)


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
        newest = position(complete[-1][1])
        for _, leftover in incomplete(directory, suffix):
            if position(leftover) < newest:
                marker_for(leftover).unlink(missing_ok=True)
                leftover.unlink(missing_ok=True)
