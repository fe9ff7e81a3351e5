"""Decode worker processes and the shared batch slots they fill.

`Slots`: a ring of fixed-size batch slots in one file in /dev/shm, mapped by the training process and by every
worker. Its room is reserved when it is made (posix_fallocate), so a full /dev/shm is one clear error at start,
never a bus error in the middle of an epoch; on a GPU the training process registers the mapping as pinned memory
(cudaHostRegister), so a slot is copied to the device without a staging copy.

`Workers`: the process's decode workers (forkserver: forking after Horovod's thread and Gloo's sockets exist is
unsafe), one pipe each. The training process sends each worker a loader's `Decoder` once, then per step only
(loader, epoch, step, slot, mode); the worker derives the step's samples itself, writes the batch into the slot
and answers with the count. No pixels, task objects or descriptors cross a pipe, and no pool thread runs in the
training process. A worker's death is noticed at the next wait on it (its process sentinel) and ends the run with
one line naming it.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import errno
import logging
import mmap
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import traceback
import weakref
from dataclasses import dataclass

import numpy as np

from ..common import watchdog
from ..common.errors import ConfigError, InputFault

log = logging.getLogger(__name__)

ALIGN = 4096  # each field of a slot starts on a page: registration and DMA like page-aligned buffers


def shm_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


@dataclass(frozen=True)
class Layout:
    """The fields of one slot: (name, dtype, shape) each, laid out page-aligned."""

    fields: tuple[tuple[str, str, tuple[int, ...]], ...]

    @property
    def offsets(self) -> dict[str, int]:
        out, at = {}, 0
        for name, dtype, shape in self.fields:
            out[name] = at
            at += _aligned(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        return out

    @property
    def nbytes(self) -> int:
        name, dtype, shape = self.fields[-1]
        return self.offsets[name] + _aligned(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Slots:
    """`count` slots of `layout` in one shared file. The maker creates and reserves it; workers attach by path."""

    def __init__(self, path: str, layout: Layout, count: int, create: bool = False):
        self.path, self.layout, self.count = path, layout, count
        size = layout.nbytes * count
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    os.unlink(path)
                    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    st = os.statvfs(os.path.dirname(path))
                    raise ConfigError(
                        f"the loader's {count} shared batch slots need {size / 2**20:.0f} MiB in "
                        f"{os.path.dirname(path)}, which has {st.f_bavail * st.f_frsize / 2**20:.0f} MiB free: give "
                        "the container more shared memory (the job's resources.shm_size, docker --shm-size), or "
                        "lower --batch-size or --workers"
                    ) from None
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.pinned = False

    def view(self, slot: int) -> dict[str, np.ndarray]:
        base = slot * self.layout.nbytes
        offsets = self.layout.offsets
        return {
            name: np.frombuffer(self.map, dtype, int(np.prod(shape, dtype=np.int64)), base + offsets[name]).reshape(
                shape
            )
            for name, dtype, shape in self.layout.fields
        }

    def pin(self) -> None:
        """Registers the mapping with CUDA as page-locked host memory (the training process on a GPU) through the
        runtime torch loaded. A failed registration leaves its error pending in that runtime, where the next kernel
        launch would raise it as its own (vLLM #50070): it is read off there, and batches are copied from pageable
        memory."""
        rt = cuda_runtime()
        self._buf = ctypes.c_char.from_buffer(self.map)
        address = ctypes.addressof(self._buf)
        err = rt.cudaHostRegister(address, len(self.map), 0) if rt else "torch's CUDA runtime not found"
        if err:
            if rt:
                rt.cudaGetLastError()
            log.warning("cudaHostRegister of %s failed (%s): batches are copied from pageable memory", self.path, err)
            return
        self.pinned = True
        weakref.finalize(self, rt.cudaHostUnregister, address)  # before the mapping goes with this object

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def cuda_runtime():
    """libcudart as torch's CUDA library links it (symbols looked up from libtorch_cuda.so, whose dependencies
    include it): registration, the drain of a failed one's error and unregistration go through this one handle.
    None for a torch without that library."""
    import torch

    try:
        rt = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so"))
        rt.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        rt.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        rt.cudaGetLastError.argtypes = []
    except (OSError, AttributeError):
        return None
    return rt


TMPFS_MAGIC = 0x01021994  # linux/magic.h


def on_tmpfs(path: str) -> bool:
    """Whether `path` lies on a tmpfs (statfs's f_type, the first field of struct statfs)."""
    buf = ctypes.create_string_buffer(256)
    if ctypes.CDLL(None, use_errno=True).statfs(os.fsencode(path), buf):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), path)
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF == TMPFS_MAGIC


def make_slots(layout: Layout, count: int, tag: str, pin: bool = False) -> Slots:
    """The ring's file in /dev/shm; `pin` (a GPU): registered with CUDA, which needs the file on a tmpfs. Pinning a
    file of a disk file system (the /tmp fallback) holds pages the kernel tracks for writeback: refused here."""
    folder = shm_folder()
    if pin and not on_tmpfs(folder):
        raise ConfigError(
            f"the loader's shared batch slots would be a file in {folder}, which is not a tmpfs: CUDA pins them, and "
            "a disk file system's pages are tracked for writeback; give the container a /dev/shm (the job's "
            "resources.shm_size, docker --shm-size)"
        )
    fd, path = tempfile.mkstemp(prefix=f"batches-{os.getpid()}-{tag}-", dir=folder)
    os.close(fd)
    os.unlink(path)
    slots = Slots(path, layout, count, create=True)
    if pin:
        slots.pin()
    return slots


# ------------------------------------------------------------------------------------------------ workers


def _worker_main(conn, number: int) -> None:
    # One intra-op thread: the worker count is the parallelism (DataLoader workers do the same). SIGTERM is the
    # job's stop, which the training process agrees on and ends; the workers end with it (killed at its exit).
    watchdog.die_with_parent()
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    loaders: dict[int, object] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        except Exception:  # noqa: BLE001 - a message it cannot read: said, not a bare closed pipe
            conn.send(("crash", None, traceback.format_exc()))
            return
        kind, tag = msg[0], msg[1]
        try:
            if kind == "step":
                _, _, epoch, step, slot, mode = msg
                conn.send(("done", tag, *loaders[tag].run(epoch, step, slot, mode)))
            elif kind == "call":
                conn.send(("done", tag, msg[2](*msg[3])))
            elif kind == "open":
                loaders[tag] = msg[2]
                msg[2].attach()
                conn.send(("done", tag))
            elif kind == "close":
                loaders.pop(tag, None)
        except ConfigError as e:
            conn.send(("error", tag, str(e)))
        except Exception:  # noqa: BLE001 - sent to the training process, which ends the run with it
            conn.send(("crash", tag, traceback.format_exc()))


TRAINER_CPUS = "TRAINING_TRAINER_CPUS"


def separate(pids: list[int], environ=None) -> dict | None:
    """TRAINING_TRAINER_CPUS=n: the training process keeps the first n of its CPUs, the decode workers get the
    rest, so that decoding never takes the core that launches the GPU's work (a GPU benchmark row measures it).
    Unset or 0: all share the process's CPUs. Returns {"trainer": cpus, "workers": cpus} when it split them."""
    from .affinity import threads

    n = int((os.environ if environ is None else environ).get(TRAINER_CPUS, "0") or 0)
    if n <= 0:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) <= n:
        log.warning(
            "%s=%d: this process has %d CPUs, none left for the workers; left shared", TRAINER_CPUS, n, len(cpus)
        )
        return None
    mine, theirs = set(cpus[:n]), set(cpus[n:])
    for pid in pids:
        os.sched_setaffinity(pid, theirs)
    for tid in [0, *threads()]:
        try:
            os.sched_setaffinity(tid, mine)
        except OSError:  # a thread that ended meanwhile
            pass
    return {"trainer": mine, "workers": theirs}


class Workers:
    """`n` decode processes, each with its own pipe. Every message names its sender (a loader's id, or "call"), and
    each sender's messages to one worker are answered in order; answers for another sender met while waiting are
    kept for it (the training and validation loaders share the workers)."""

    def __init__(self, n: int):
        ctx = multiprocessing.get_context("forkserver")
        self.conns, self.procs = [], []
        for i in range(n):
            here, there = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(there, i), daemon=True, name=f"decode-{i}")
            p.start()
            there.close()
            self.conns.append(here)
            self.procs.append(p)
        self.kept: dict[tuple[int, object], collections.deque] = collections.defaultdict(collections.deque)
        self.closed: set = set()
        separate(self.pids)

    def __len__(self) -> int:
        return len(self.procs)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, w: int, msg) -> None:
        try:
            self.conns[w].send(msg)
        except (BrokenPipeError, ConnectionResetError):
            raise self._died(w) from None

    def recv(self, w: int, tag):
        """The next answer of worker `w` to `tag`; InputFault if it died, the ConfigError it met, or its crash."""
        kept = self.kept[(w, tag)]
        while not kept:
            answer = self._next(w)
            if answer[1] not in self.closed:
                self.kept[(w, answer[1])].append(answer)
        answer = kept.popleft()
        if answer[0] == "error":
            raise ConfigError(answer[2])
        if answer[0] == "crash":
            raise InputFault(f"decode worker {w} (pid {self.procs[w].pid}) failed:\n{answer[2]}")
        return answer[2:]

    def _next(self, w: int):
        conn, proc = self.conns[w], self.procs[w]
        while True:
            ready = multiprocessing.connection.wait([conn, proc.sentinel])
            if conn in ready:
                try:
                    answer = conn.recv()
                except (EOFError, ConnectionResetError):
                    raise self._died(w) from None
                if answer[0] == "crash" and answer[1] is None:  # it could not read a message: it has ended
                    raise InputFault(f"decode worker {w} (pid {proc.pid}) could not read a message:\n{answer[2]}")
                return answer
            if proc.sentinel in ready:
                raise self._died(w)

    def close(self, tag) -> None:
        """`tag` sends nothing more: its workers' copies go, and its answers still to come are dropped."""
        self.closed.add(tag)
        for w in range(len(self)):
            self.kept.pop((w, tag), None)
            try:
                self.conns[w].send(("close", tag))
            except OSError:
                pass  # gone at exit

    def call(self, fn, args_per_worker: list[tuple]) -> list:
        """fn(*args) for each entry, spread over the workers in turn; the results in the entries' order."""
        n, todo = len(self), list(args_per_worker)
        window = 2 * n  # two calls in flight per worker: answers (an index of a tar file) can fill a pipe
        for i in range(min(window, len(todo))):
            self.send(i % n, ("call", "call", fn, todo[i]))
        out = []
        try:
            for i in range(len(todo)):
                out.append(self.recv(i % n, "call")[0])
                if i + window < len(todo):
                    self.send((i + window) % n, ("call", "call", fn, todo[i + window]))
        except ConfigError:
            for j in range(len(out) + 1, min(len(todo), len(out) + window)):  # the calls still in flight
                try:
                    self.recv(j % n, "call")
                except ConfigError:
                    pass
            raise
        return out

    def open(self, tag, coder) -> None:
        """Gives every worker its copy of a loader's decoder, which maps the slots, before the first step."""
        for w in range(len(self)):
            self.send(w, ("open", tag, coder))
        for w in range(len(self)):
            self.recv(w, tag)

    def _died(self, w: int) -> InputFault:
        p = self.procs[w]
        p.join(timeout=10)  # reaped, so that its exit code is known (its forkserver reports it: slow when loaded)
        code = p.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited ({code})"
        hint = " (the node's memory ran out?)" if code == -signal.SIGKILL else ""
        return InputFault(f"decode worker {w} (pid {p.pid}) {how}{hint}: the run stops; see the node's log")

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5)
        for c in self.conns:
            c.close()


_groups: dict[int, Workers] = {}


def workers(n: int) -> Workers:
    """The process's `n` decode workers, started once and shared by its loaders (training and validation)."""
    group = _groups.get(n)
    if group is None or not all(p.is_alive() for p in group.procs):
        if group is not None:
            group.kill()  # the rest of a set one of which died: they ignore SIGTERM, so they go now
        group = _groups[n] = Workers(n)
    return group


@atexit.register
def _end_workers() -> None:
    # They ignore SIGTERM (the stop is the training process's), so they are killed, not asked.
    for group in _groups.values():
        group.kill()
    _groups.clear()
