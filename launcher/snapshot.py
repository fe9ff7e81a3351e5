"""A job's code snapshot, found without walking what .amlignore leaves out.

azure-ai-ml lists a job's `code` folder by walking every file under it, links followed, and testing each against
the folder's .amlignore (azure/ai/ml/_utils/_asset_utils.py get_upload_files_from_folder: os.walk with no pruning,
since a `!` line may bring back a file under an ignored folder); create_or_update walks it twice, for the content
hash and for the upload. A checkout holding the README's .venv has about 390,000 files, about 37 s of a 2-core
machine per submission before anything is sent. `staged` walks the folder skipping every folder the ignore file
leaves out and no `!` line can reach, and links the files it keeps into a temporary folder with the same relative
names: azure-ai-ml then hashes and uploads the same files under the same names (the same content hash, so the
same code asset), reading their contents through the links.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import pathlib
import tempfile
from collections.abc import Iterator


def _reachable(folder: tuple[str, ...], negations: list[str]) -> bool:
    """Whether a `!` line can match a path at or under `folder` (its parts, relative to the ignore file)."""
    for line in negations:
        pattern = line[1:].rstrip("/")
        if "**" in pattern or "/" not in pattern:
            return True  # `**`, or a bare name (gitignore matches those at any depth)
        parts = pattern.lstrip("/").split("/")
        if all(fnmatch.fnmatchcase(name, part) for name, part in zip(folder, parts)):
            return True
    return False


def kept_files(root: pathlib.Path) -> Iterator[pathlib.Path]:
    """The files under `root` that azure-ai-ml uploads as a job's code (relative paths), by its own ignore file and
    matching (get_ignore_file: .amlignore before .gitignore), skipping the folders no file of which can be kept."""
    from azure.ai.ml._utils._asset_utils import get_ignore_file

    ignore = get_ignore_file(root)
    path = getattr(ignore, "path", None)
    lines = pathlib.Path(path).read_text().splitlines() if path and os.path.isfile(path) else []
    negations = [line.strip() for line in lines if line.strip().startswith("!")]
    for folder, subfolders, files in os.walk(root, followlinks=True):
        rel = pathlib.Path(folder).relative_to(root)
        keep = []
        for name in sorted(subfolders):
            parts = (*rel.parts, name)
            # A folder goes unwalked when a file directly in it is ignored and no `!` line reaches into it.
            probe = (root / pathlib.Path(*parts) / "\x00probe").as_posix()
            if ignore.is_file_excluded(probe) and not _reachable(parts, negations):
                continue
            keep.append(name)
        subfolders[:] = keep
        for name in sorted(files):
            if not ignore.is_file_excluded((pathlib.Path(folder) / name).as_posix()):
                yield rel / name


@contextlib.contextmanager
def staged(root: str | os.PathLike) -> Iterator[str]:
    """A temporary folder linking the files of `root` that a job's code snapshot holds, under their relative
    names; removed on exit (the links only: the checkout is never touched)."""
    root = pathlib.Path(root).resolve()
    with tempfile.TemporaryDirectory(prefix="code-snapshot-") as folder:
        for rel in kept_files(root):
            link = pathlib.Path(folder) / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(root / rel, link)
        yield folder
