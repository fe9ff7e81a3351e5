"""CUDA forward compatibility for the PyTorch image: load CUDA 13's user-mode driver on older host drivers.

The image's torch wheels are built for CUDA 13, which needs an NVIDIA driver of branch 580 or newer (NVIDIA,
"CUDA Compatibility": minor version compatibility covers drivers of the same major CUDA only). Azure's GPU
nodes carry what their node image installs (Azure/azhpc-images moved from 570 to 580 in November 2025;
Azure ML does not document its hosts' driver). NVIDIA's forward compatibility package (cuda-compat-13-0,
copied to /usr/local/cuda/compat) holds libcuda and other user-mode libraries of a 580 driver; on data-centre
GPUs it lets CUDA 13 run on the older driver branches that NVIDIA's CUDA 13.0 images accept in their
NVIDIA_REQUIRE_CUDA. The build records that variable of its nvidia/cuda base in the compat folder
(NVIDIA_REQUIRE_CUDA), because the runtime image cannot set it: the container runtime would then refuse the
older drivers itself.

Every Python process decides at interpreter start-up (a .pth file in site-packages calls activate(); Azure ML
runs its own command and mpirun starts the ranks, so no entrypoint can decide for them):
- no NVIDIA driver, or a driver of the compat package's branch or newer: nothing is loaded (a compat libcuda
  older than the host's kernel module fails with CUDA error 803);
- an older driver of a branch NVIDIA_REQUIRE_CUDA accepts: every library the compat folder ships is loaded by
  path with RTLD_GLOBAL, each after the compat libraries it needs (DT_NEEDED); later dlopen()s of their sonames
  (torch's "libcuda.so.1", libcuda's own companions) then get these, as the dynamic loader reuses a loaded
  soname. $CUDA_FORWARD_COMPAT records it;
- an older driver of any other branch, or a compat library that does not load: the process exits with status
  78 (EX_CONFIG) and a message naming the driver, the supported branches and the fix, before anything else
  runs: CUDA would find no usable driver, and every rank would train on nothing or on the CPU.
CUDA_FORWARD_COMPAT=off disables all of it. Standard library only (it runs before anything else).

`python -m cuda_forward_compat --check DIR` is the image build's check: every compat library parses, has a
load order, and needs only libraries that ship beside it or resolve in the image (ldd).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import struct
import sys
from collections.abc import Callable, Iterable
from typing import NamedTuple, NoReturn

COMPAT_DIR = "/usr/local/cuda/compat"
VERSION_FILE = "/proc/driver/nvidia/version"
ENV = "CUDA_FORWARD_COMPAT"
# NVIDIA_REQUIRE_CUDA of the nvidia/cuda image the compat package came from, written there by the build.
REQUIRE_FILE = "NVIDIA_REQUIRE_CUDA"
EXIT_STATUS = 78  # EX_CONFIG (sysexits.h): the node's driver, not the job, is what is wrong
LIBRARY_NAME = re.compile(r"lib.+\.so(\.\d+)*")

Version = tuple[int, ...]


class CompatError(Exception):
    """Forward compatibility cannot serve this host; going on would leave CUDA without a usable driver."""


# ---- versions: the host's driver, the compat package's, and the branches NVIDIA_REQUIRE_CUDA accepts


def version(text: str) -> Version:
    return tuple(int(x) for x in text.split("."))


def branch(text: str) -> int:
    return version(text)[0]


def host_driver(version_file: str = VERSION_FILE) -> str | None:
    """The host's kernel driver version from /proc/driver/nvidia/version (proprietary or open module)."""
    try:
        text = pathlib.Path(version_file).read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def compat_driver(compat_dir: str = COMPAT_DIR) -> str | None:
    """The driver version of the compat package: its libcuda.so.<version> file."""
    try:
        names = os.listdir(compat_dir)
    except OSError:
        return None
    versions = [m.group(1) for n in names if (m := re.fullmatch(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)", n))]
    return max(versions, key=version) if versions else None


class Require(NamedTuple):
    cuda: str | None  # the CUDA the image needs natively (cuda>=13.0)
    ranges: tuple[tuple[Version, Version], ...]  # [driver>=, driver<) of each term that admits an older driver

    def accepts(self, driver: str) -> bool:
        return any(lo <= version(driver) < hi for lo, hi in self.ranges)

    def branches(self) -> list[int]:
        return sorted({lo[0] for lo, _ in self.ranges})


def parse_require(text: str) -> Require:
    """NVIDIA_REQUIRE_CUDA as nvidia-container-toolkit reads it: space-separated terms ORed, comma-separated
    factors ANDed. Brands are not checked: NVIDIA lists the same driver ranges for every brand."""
    cuda, ranges = None, set()
    for term in text.split():
        lo = hi = None
        for factor in term.split(","):
            m = re.fullmatch(r"(\w+)(>=|<=|!=|==|=|<|>)(\S+)", factor)
            key, op, value = m.groups() if m else ("", "", "")
            if key == "cuda" and op == ">=":
                cuda = value
            elif key == "driver" and op == ">=":
                lo = version(value)
            elif key == "driver" and op == "<":
                hi = version(value)
        if lo and hi:
            ranges.add((lo, hi))
    return Require(cuda, tuple(sorted(ranges)))


def read_require(compat_dir: str) -> Require:
    path = os.path.join(compat_dir, REQUIRE_FILE)
    try:
        require = parse_require(pathlib.Path(path).read_text())
    except OSError as e:
        raise CompatError(
            f"{path}: {e.strerror}: the image does not record which host drivers its forward-compatibility "
            "package serves (the build writes its CUDA base's NVIDIA_REQUIRE_CUDA there); rebuild it from "
            "images/pytorch/Dockerfile"
        ) from None
    except ValueError as e:
        raise CompatError(f"{path}: not a NVIDIA_REQUIRE_CUDA value ({e})") from None
    if not require.ranges:
        raise CompatError(f"{path} accepts no older driver branch (no driver>=,driver< term)")
    return require


# ---- ELF: the soname and needed libraries of each compat library, read as the dynamic loader does


_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_SONAME = 0, 1, 5, 14


def _string(f, offset: int) -> str:
    f.seek(offset)
    data = b""
    while b"\0" not in data:
        chunk = f.read(256)
        if not chunk:
            raise ValueError(f"unterminated string at {offset}")
        data += chunk
    return data.split(b"\0", 1)[0].decode()


def read_dynamic(path: str) -> tuple[str | None, list[str]]:
    """(DT_SONAME, [DT_NEEDED...]) of an ELF shared object, from its program headers; ValueError if not one.
    Reads a few hundred bytes, not the file (libcuda is tens of MB and this runs in every process)."""
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ValueError(f"{path}: not an ELF file")
        wide, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
        header_fmt = end + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH")
        header = struct.unpack(header_fmt, f.read(struct.calcsize(header_fmt)))
        phoff, phentsize, phnum = header[4], header[8], header[9]
        phdr_fmt = end + ("IIQQQQQQ" if wide else "IIIIIIII")
        segments = []  # (type, offset, vaddr, filesz)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p = struct.unpack(phdr_fmt, f.read(struct.calcsize(phdr_fmt)))
            segments.append((p[0], p[2], p[3], p[5]) if wide else (p[0], p[1], p[2], p[4]))
        dynamic = next((s for s in segments if s[0] == _PT_DYNAMIC), None)
        if dynamic is None:
            raise ValueError(f"{path}: no dynamic section (not a shared library)")
        entry_fmt = end + ("qQ" if wide else "iI")
        f.seek(dynamic[1])
        raw = f.read(dynamic[3])
        tags: list[tuple[int, int]] = []
        for tag, value in struct.iter_unpack(entry_fmt, raw[: len(raw) - len(raw) % struct.calcsize(entry_fmt)]):
            if tag == _DT_NULL:
                break
            tags.append((tag, value))
        strtab = next((v for t, v in tags if t == _DT_STRTAB), -1)
        # DT_STRTAB is an address: the loadable segment that maps it gives its place in the file
        load = next((s for s in segments if s[0] == _PT_LOAD and s[2] <= strtab < s[2] + s[3]), None)
        if load is None:
            raise ValueError(f"{path}: no string table in a loadable segment")
        base = strtab - load[2] + load[1]
        soname = next((_string(f, base + v) for t, v in tags if t == _DT_SONAME), None)
        return soname, [_string(f, base + v) for t, v in tags if t == _DT_NEEDED]


# ---- the compat folder's libraries and their load order


class Library(NamedTuple):
    path: str  # the file, symlinks resolved: loaded once, whatever its links
    names: frozenset[str]  # its soname and the folder's names for it: what a DT_NEEDED entry may ask for
    needed: tuple[str, ...]

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def library_files(compat_dir: str) -> dict[str, set[str]]:
    """Each library file in the folder (symlinks resolved) with the names the folder gives it."""
    files: dict[str, set[str]] = {}
    for name in sorted(os.listdir(compat_dir)):
        path = os.path.realpath(os.path.join(compat_dir, name))
        if LIBRARY_NAME.fullmatch(name) and os.path.isfile(path):
            files.setdefault(path, set()).add(name)
    return files


def scan(compat_dir: str) -> list[Library]:
    libraries = []
    for path, names in library_files(compat_dir).items():
        soname, needed = read_dynamic(path)
        libraries.append(Library(path, frozenset(names | ({soname} if soname else set())), tuple(needed)))
    return libraries


def _libcuda_last(library: Library) -> tuple[bool, str]:
    # Among libraries free to load, libcuda goes last: it dlopen()s its companions by soname
    # (libnvidia-ptxjitcompiler.so.1, libnvidia-nvvm.so.4, libcudadebugger.so.1, ...), which must be these.
    return "libcuda.so.1" in library.names, library.name


def load_order(libraries: Iterable[Library]) -> list[Library]:
    """Each library after the compat libraries its DT_NEEDED entries name. Loaded by path, a library's needed
    sonames are searched for on the library path, where the compat folder is not: unless loaded before it,
    a needed compat library is not found and the load fails."""
    libraries = list(libraries)
    provider = {name: lib for lib in libraries for name in lib.names}
    waiting = {lib: {provider[n] for n in lib.needed if n in provider} - {lib} for lib in libraries}
    order: list[Library] = []
    while waiting:
        ready = sorted((lib for lib, deps in waiting.items() if not deps), key=_libcuda_last)
        if not ready:
            raise CompatError(f"the compat libraries need each other in a cycle: {sorted(x.name for x in waiting)}")
        order.append(ready[0])
        del waiting[ready[0]]
        for deps in waiting.values():
            deps.discard(ready[0])
    return order


# ---- activate(): the .pth hook of every Python process


def _load(path: str) -> None:
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _exit(message: str) -> NoReturn:
    print(f"cuda_forward_compat (images/cuda_forward_compat.py): {message}", file=sys.stderr, flush=True)
    # Not sys.exit: SystemExit raised in a .pth file is a fatal interpreter error with a traceback.
    os._exit(EXIT_STATUS)


def unsupported(host: str, compat: str, require: Require, compat_dir: str) -> str:
    cuda, native = require.cuda or "of this image", branch(compat)
    branches = ", ".join(str(b) for b in require.branches())
    return (
        f"the node's NVIDIA driver {host} (branch {branch(host)}) cannot run CUDA {cuda}: it is older than "
        f"branch {native}, and CUDA forward compatibility serves only the older branches {branches} (the "
        f"NVIDIA_REQUIRE_CUDA of the image's CUDA base, {os.path.join(compat_dir, REQUIRE_FILE)}). Fix: run on "
        f"nodes whose driver is of branch {native} or newer, or of one of those branches (the cluster's node "
        "image decides it), or use an image built for an older CUDA. Nothing was run. CUDA_FORWARD_COMPAT=off "
        "skips this check, but CUDA will still find no usable driver."
    )


def _activate(version_file: str, compat_dir: str, environ, load: Callable[[str], object]) -> str | None:
    if environ.get(ENV, "").lower() == "off":
        return None
    host, compat = host_driver(version_file), compat_driver(compat_dir)
    if host is None or compat is None or branch(host) >= branch(compat):
        return None  # no GPU, no compat package, or a host driver that runs the image's CUDA itself
    require = read_require(compat_dir)
    if not require.accepts(host):
        raise CompatError(unsupported(host, compat, require, compat_dir))
    try:
        libraries = load_order(scan(compat_dir))
    except (OSError, ValueError) as e:
        raise CompatError(f"{compat_dir}: {e}") from None
    for lib in libraries:
        try:
            load(lib.path)
        except OSError as e:
            raise CompatError(
                f"loading {lib.path} failed ({e}) on a node with driver {host}: with part of the "
                "forward-compatibility driver loaded, CUDA would find no GPU. Fix: rebuild the image; its build "
                f"check (python -m cuda_forward_compat --check {compat_dir}) names what is missing."
            ) from None
    what = f"libcuda {compat} from {compat_dir} (host driver {host})"
    environ[ENV] = what
    return what


def activate(
    version_file: str = VERSION_FILE,
    compat_dir: str = COMPAT_DIR,
    environ=None,
    load: Callable[[str], object] | None = None,
    fail: Callable[[str], object] | None = None,
) -> str | None:
    """Preload the compat driver when the host's is older; returns what was loaded (also in $CUDA_FORWARD_COMPAT).
    On a host it cannot serve, fail(message): by default, print it and exit the process with EXIT_STATUS."""
    environ = os.environ if environ is None else environ
    try:
        return _activate(version_file, compat_dir, environ, load or _load)
    except CompatError as e:
        (fail or _exit)(str(e))
    except Exception as e:  # noqa: BLE001 - a bug here must not stop every Python process in the image
        print(f"cuda_forward_compat: internal error, the host's driver is used: {e!r}", file=sys.stderr, flush=True)
    return None


# ---- the image build's check


def ldd_problems(lib: Library, siblings: set[str], compat_dir: str, ldd: str = "ldd") -> list[str]:
    """The needed libraries of `lib` that neither ship in the compat folder (loaded before it) nor resolve in
    this image, as ldd reports them."""
    import subprocess

    try:
        out = subprocess.run([ldd, lib.path], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"{lib.name}: ldd failed: {e}"]
    missing = re.findall(r"^\s*(\S+) => not found", out.stdout, re.M)
    if out.returncode != 0 and not missing:
        return [f"{lib.name}: ldd failed: {(out.stdout + out.stderr).strip()}"]
    return [
        f"{lib.name} needs {name}, which is neither in {compat_dir} nor in the image"
        for name in missing
        if name not in siblings
    ]


def check(compat_dir: str, ldd: str = "ldd") -> list[str]:
    """What would stop activate() on an older host, found at build time: [] when nothing."""
    if compat_driver(compat_dir) is None:
        return [f"{compat_dir} has no libcuda.so.<driver version>: no forward-compatibility package"]
    problems = []
    try:
        read_require(compat_dir)
    except CompatError as e:
        problems.append(str(e))
    for name in sorted(os.listdir(compat_dir)):
        if LIBRARY_NAME.fullmatch(name) and not os.path.exists(os.path.join(compat_dir, name)):
            problems.append(f"{name}: a link to nothing")
    try:
        libraries = load_order(scan(compat_dir))
    except (CompatError, OSError, ValueError) as e:
        return [*problems, str(e)]
    siblings = {name for lib in libraries for name in lib.names}
    for lib in libraries:
        problems += ldd_problems(lib, siblings, compat_dir, ldd)
    return problems


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m cuda_forward_compat", description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="DIR", required=True, help="the compat folder to check (image build)")
    folder = ap.parse_args(argv).check
    problems = check(folder)
    for p in problems:
        print(f"cuda_forward_compat --check: {p}", file=sys.stderr)
    if problems:
        return 1
    order = ", ".join(lib.name for lib in load_order(scan(folder)))
    branches = ", ".join(str(b) for b in read_require(folder).branches())
    print(f"cuda_forward_compat --check: ok: loads {order}; serves host driver branches {branches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
