"""A job's code snapshot, found without walking what .amlignore leaves out.

azure-ai-ml lists a job's `code` folder by walking every file under it, links followed, and testing each against
the folder's .amlignore (azure/ai/ml/_utils/_asset_utils.py get_upload_files_from_folder: os.walk with no pruning,
since a `!` line may bring back a file under an ignored folder); create_or_update walks it several times (content
hashes, size, upload). A checkout holding the README's .venv has about 390,000 files, about 37 s of a 2-core
machine per submission before anything is sent. `staged` walks the folder skipping every folder the ignore file
leaves out and no `!` line can reach, and links the files it keeps into a temporary folder of the checkout's name,
with a copy of the ignore file: azure-ai-ml then hashes and uploads the same files under the same names (the same
content hash, so the same code asset), reading them through the links. Where the walk could disagree with
azure-ai-ml's (a linked folder, which it matches by its resolved path; an escaped character in a `!` line), the
folder is handed over as it is.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator


class _Unsure(Exception):
    """The pruned walk might not list what azure-ai-ml's would: hand it the folder itself."""


# File names no pattern of a real ignore file singles out (a NUL cannot be in a file name): a folder in which both
# are ignored is one whose every file is, unless a `!` line reaches in.
_PROBES = ("\x00probe", "\x01x.y")


def _reachable(folder: tuple[str, ...], negations: list[str]) -> bool:
    """Whether a `!` line can match a path at or under `folder` (its parts, relative to the ignore file)."""
    for line in negations:
        pattern = line[1:].rstrip("/")
        if "\\" in pattern:
            raise _Unsure(f"an escape in {line!r}")  # gitignore's escapes are not fnmatch's
        if "**" in pattern or "/" not in pattern:
            return True  # `**`, or a bare name (gitignore matches those at any depth)
        parts = pattern.lstrip("/").split("/")
        if all(fnmatch.fnmatchcase(name, part) for name, part in zip(folder, parts)):
            return True
    return False


def kept_files(root: pathlib.Path, ignore=None) -> Iterator[pathlib.Path]:
    """The files under `root` that azure-ai-ml uploads as a job's code (relative paths), by its own ignore file and
    matching (get_ignore_file: .amlignore before .gitignore; `ignore`, that file's IgnoreFile, where the caller
    has it), skipping the folders no file of which can be kept."""
    if ignore is None:
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
            if os.path.islink(os.path.join(folder, name)):
                raise _Unsure(f"{'/'.join(parts)} is a link")  # azure-ai-ml matches its resolved path
            probes = [(root / pathlib.Path(*parts) / p).as_posix() for p in _PROBES]
            if all(ignore.is_file_excluded(p) for p in probes) and not _reachable(parts, negations):
                continue
            keep.append(name)
        subfolders[:] = keep
        for name in sorted(files):
            if not ignore.is_file_excluded((pathlib.Path(folder) / name).as_posix()):
                yield rel / name


@contextlib.contextmanager
def staged(root: str | os.PathLike) -> Iterator[str]:
    """A temporary folder of `root`'s name linking the files of `root` that a job's code snapshot holds, under their
    relative names, with a copy of its ignore file (a link to it would move the ignore file's base back to `root`
    in azure-ai-ml, which resolves it); `root` itself where the pruned walk might disagree with azure-ai-ml's.
    Removed on exit: the links and the copy only, the checkout is never touched."""
    from azure.ai.ml._utils._asset_utils import get_ignore_file

    root = pathlib.Path(root).resolve()
    ignore = get_ignore_file(root)
    try:
        kept = list(kept_files(root, ignore))
    except _Unsure:
        yield str(root)
        return
    ignore_path = getattr(ignore, "path", None)
    with tempfile.TemporaryDirectory(prefix="code-snapshot-") as parent:
        # The checkout's name, as the upload's blob folder had it (LocalUpload/<hash>/<folder name>/).
        folder = pathlib.Path(parent) / root.name
        folder.mkdir()
        try:
            if ignore_path and os.path.isfile(ignore_path):
                shutil.copyfile(ignore_path, folder / os.path.basename(ignore_path))
            for rel in kept:
                link = folder / rel
                if link.exists():
                    continue  # the ignore file, copied above
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(root / rel, link)
        except OSError:
            # No links here (Windows without the right to create them, say): the slow way, the same upload.
            yield str(root)
            return
        yield str(folder)
