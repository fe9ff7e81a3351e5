"""--cache-decoded: a rank's decoded images in one file in --cache-dir, filled by the decode workers themselves.

Each image's place in the file is known before epoch 1 from its header (shardset.index_shard with dims): the file
starts with one status byte per sample (0 not kept, 1 kept, 2 undecodable), then the decoded images in key order.
Its full size is reserved when it is made (posix_fallocate), so the size check before epoch 1 is exact and a
full folder is met then, never as a bus error in a mapping. Every worker writes the images it decodes in the first
whole epoch to their places (pwrite) and maps the file; later epochs shuffle the whole cache and read the images
from the mapping. Named for host, process and
rank and locked while its run lives, removed when its loader goes; a killed run's file (no lock held) is removed by
the next run on that host.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import socket
import tempfile
import weakref

import numpy as np

from ..common.checkpoint import size_text
from ..common.errors import ConfigError
from .shardset import Index, key_order

CACHE_PREFIX = "decoded-"
ABSENT, KEPT, UNDECODABLE = 0, 1, 2
PAGE = 4096


class Layout:
    """Where each sample's decoded image lies in the cache file (offsets by index position), and its order."""

    def __init__(self, index: Index):
        n = len(index)
        self.by_key = key_order(index)
        sizes = index.dims[:, 0] * index.dims[:, 1] * 3
        self.header = -(-n // PAGE) * PAGE
        ordered = sizes[self.by_key]
        self.offsets = np.empty(n, np.int64)
        self.offsets[self.by_key] = self.header + np.concatenate([[0], np.cumsum(ordered)[:-1]]) if n else []
        self.dims = index.dims
        self.nbytes = int(sizes.sum())  # the decoded images

    @property
    def file_bytes(self) -> int:
        return self.header + self.nbytes


class DecodedCache:
    """The parent's handle of the cache file: made with its room reserved (OSError ENOSPC when the folder is
    full), removed when the loader goes. `complete` once a whole epoch has passed every sample through."""

    def __init__(self, folder: pathlib.Path, rank: int, layout: Layout):
        remove_stale(folder)
        name = f"{CACHE_PREFIX}{socket.gethostname()}-{os.getpid()}-rank{rank}-"
        fd, self.path = tempfile.mkstemp(prefix=name, suffix=".u8", dir=folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while the run lives: remove_stale's test
            os.posix_fallocate(fd, 0, max(1, layout.file_bytes))
        except OSError:
            os.close(fd)
            _remove(self.path)
            raise
        weakref.finalize(self, _close_and_remove, fd, self.path)
        self.layout, self.nbytes, self.complete = layout, layout.nbytes, False

    def __len__(self) -> int:
        return len(self.layout.by_key)


class Mapped:
    """A worker's (or the inline loader's) mapping of the cache file: status bytes and images, read and written."""

    def __init__(self, path: str, layout: Layout):
        self.map = np.memmap(path, np.uint8, mode="r+")
        self.fd = os.open(path, os.O_RDWR)
        weakref.finalize(self, os.close, self.fd)
        self.layout = layout
        self.status = self.map[: len(layout.by_key)]

    def image(self, p: int) -> np.ndarray:
        h, w = self.layout.dims[p]
        at = int(self.layout.offsets[p])
        return self.map[at : at + h * w * 3].reshape(h, w, 3)

    def keep(self, p: int, image: np.ndarray) -> None:
        """Writes a decoded image to its place; one whose shape differs from its header's stays out (decoded from
        its shard in every epoch)."""
        if image.shape == (*self.layout.dims[p], 3) and image.dtype == np.uint8:
            # pwrite, not a store through the mapping: no page fault per page of a file not yet in memory
            os.pwrite(self.fd, np.ascontiguousarray(image).data, int(self.layout.offsets[p]))
            self.status[p] = KEPT


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _close_and_remove(fd: int, path: str) -> None:
    os.close(fd)
    _remove(path)


def remove_stale(folder: pathlib.Path) -> None:
    """Cache files of this host that no process holds (a killed or preempted run). Not judged by the process id in
    the name: in a new container the ids start again, and a killed run's id is often a live process's."""
    host = socket.gethostname()
    for f in pathlib.Path(folder).glob(f"{CACHE_PREFIX}{host}-*-rank*.u8"):
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live run's
        finally:
            os.close(fd)
        _remove(str(f))


def check_room(loaders, local_size: int) -> int:
    """Before epoch 1: the decoded cache of every split of this rank (exact, from the images' headers), times the
    processes on this node (one folder per node), must fit the free space of --cache-dir. Returns this rank's
    bytes."""
    wanted = [x for x in loaders if x is not None and x.cache_wanted]
    if not wanted:
        return 0
    folder = wanted[0].cache_dir  # every loader of the run gets the same --cache-dir
    if not folder.is_dir():
        raise ConfigError(f"--cache-dir {folder}: no such folder (create it, or pick a folder on a local disk)")
    per_rank = sum(x.cache_bytes() for x in wanted)
    node = per_rank * local_size
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    if node > free:
        raise ConfigError(
            f"--cache-decoded: the decoded images need {size_text(per_rank)} per process x {local_size} "
            f"process(es) on this node = {size_text(node)} in {folder}, which has {size_text(free)} "
            "free: pass --cache-dir on a local disk with that room (on Azure ML, the node's local NVMe disk), "
            "train more nodes (each keeps only its part), or drop --cache-decoded (every epoch then decodes)"
        )
    return per_rank
