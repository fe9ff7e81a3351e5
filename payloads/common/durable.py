"""Writing output files without rename: correct on a blob-storage mount where rename is not atomic or absent.

Jobs write checkpoints and metrics to the logs account through Azure ML's read-write mount (blob storage with a
flat namespace). BlobFuse documents that "Azure Blob Storage doesn't support atomic rename operations. Single-file
renames are actually two operations: a copy followed by deletion of the original"
(learn.microsoft.com/azure/storage/blobs/blobfuse2-compare-linux-file-system, "Non-atomic renames"), and Azure ML
documents rw_mount outputs without saying what rename does there (learn.microsoft.com/azure/machine-learning/
how-to-read-write-data-v2). So nothing here renames: files are written in place under their final names, and
what makes a file count as finished is decided by the caller (a completion marker written after it, see
checkpoint.py; a second copy, see metrics.py).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import pathlib
from typing import BinaryIO

log = logging.getLogger("payloads.durable")

# fsync answers these where a file system does not implement it: Linux returns EINVAL for a file system with no
# fsync (fsync(2)); FUSE file systems may not implement fsyncdir (the BlobFuse2 wiki's "Blobfuse2 Limitations":
# its fsyncdir only invalidates cached metadata), and opening a folder for it can be refused. Correctness never
# depends on a folder fsync (a lost marker just means the previous checkpoint is chosen), so these are skipped.
_UNSUPPORTED = {
    errno.EINVAL,
    errno.ENOTSUP,
    errno.EOPNOTSUPP,
    errno.ENOSYS,
    errno.EBADF,
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
}


def sync(f: BinaryIO) -> None:
    """Flush `f` and fsync it where the file system supports fsync."""
    f.flush()
    try:
        os.fsync(f.fileno())
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise
        log.debug("fsync of %s not supported (%s); close() flushes it", f.name, e)


def sync_dir(folder: pathlib.Path) -> None:
    """Make new names in `folder` durable where the file system can; skipped where it cannot (see above)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise
        log.debug("fsync of folder %s not supported (%s)", folder, e)
    finally:
        os.close(fd)


def write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write `data` under `path` itself (truncating it) and sync it: no temporary name, no rename."""
    with open(path, "wb") as f:
        f.write(data)
        sync(f)


def copy(src: pathlib.Path, dst: pathlib.Path, chunk: int = 8 << 20) -> tuple[int, str]:
    """Copy `src` to `dst` sequentially (what a blob mount handles best) and sync it; returns (bytes, sha256)."""
    h = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while block := fin.read(chunk):
            fout.write(block)
            h.update(block)
            size += len(block)
        sync(fout)
    return size, h.hexdigest()


def sha256(path: pathlib.Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
