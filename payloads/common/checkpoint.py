"""Checkpoint files: one per epoch, written atomically by rank 0, found again on resume.

Framework-neutral: the payload passes a `save(path)` function that writes its own format. A file is
written under a temporary name in the same folder, flushed to disk and renamed, so a crash or a killed
job never leaves a truncated `checkpoint-epoch-N` behind: the newest complete one is always resumable.
"""
from __future__ import annotations

import os
import pathlib
import re
from typing import Callable

_NAME = re.compile(r"^checkpoint-epoch-(\d{4,})(\.[A-Za-z0-9]+)$")


def path_for(directory: pathlib.Path, epoch: int, suffix: str) -> pathlib.Path:
    """The file for the state *after* `epoch` epochs (1-based count of finished epochs)."""
    return directory / f"checkpoint-epoch-{epoch:04d}{suffix}"


def list_checkpoints(directory: pathlib.Path, suffix: str) -> list[tuple[int, pathlib.Path]]:
    """(epochs finished, path), oldest first; temporary and foreign files are ignored."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        m = _NAME.match(entry.name)
        if m and m.group(2) == suffix and entry.is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


def latest(directory: pathlib.Path, suffix: str) -> tuple[int, pathlib.Path] | None:
    found = list_checkpoints(directory, suffix)
    return found[-1] if found else None


def write_atomically(path: pathlib.Path, save: Callable[[pathlib.Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    # Make the rename itself durable.
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune(directory: pathlib.Path, suffix: str, keep: int) -> None:
    """Keep the newest `keep` checkpoints (0 keeps all)."""
    if keep <= 0:
        return
    for _, old in list_checkpoints(directory, suffix)[:-keep]:
        old.unlink(missing_ok=True)
