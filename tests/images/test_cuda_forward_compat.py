"""images/cuda_forward_compat.py: on each kind of host (no driver, driver branch 580 or newer, an older branch
that CUDA 13.0's compat package serves, any other older branch) the PyTorch image loads what it should, in the
order it must, or stops naming the driver; and the image build checks the compat folder. Fake compat folders of
generated ELF files and fake /proc/driver/nvidia/version contents; with a C compiler, real libraries loaded by
the real dynamic loader and checked with the real ldd.

The constraint, from NVIDIA's own CUDA 13.0 images: gitlab.com/nvidia/container-images/cuda,
dist/13.0.0/ubuntu2204/base/Dockerfile (read at GitHub mirror pranavmishra90/nvidia-container-images-cuda, commit
7ad4b0af70e5af9fb82ab990df382a0dd7d494dc), `ENV NVIDIA_REQUIRE_CUDA=...` = REQUIRE_CUDA_13_0 below; the
nvidia/cuda:13.0.2 image carries the same value. nvidia-container-toolkit reads it with "space-separated
constraints being ORed together and comma-separated constraints being ANDed together"
(NVIDIA/nvidia-container-toolkit, internal/requirements/constraints/factory.go): CUDA 13.0 natively, or a
driver of branch 535, 550, 565, 570 or 575, which the image's cuda-compat-13-0 then serves.
"""

import importlib.util
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("cuda_forward_compat", ROOT / "images/cuda_forward_compat.py")
compat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compat)

# The 2,165 characters of NVIDIA's value, built from its parts (equal to it character for character): every brand,
# in this order, with driver>=B,driver<B+1 for each of the five branches.
BRANDS = "unknown grid tesla nvidia quadro quadrortx nvidiartx vapps vpc vcs vws cloudgaming".split()
REQUIRE_CUDA_13_0 = "cuda>=13.0 " + " ".join(
    f"brand={brand},driver>={b},driver<{b + 1}" for b in (535, 550, 565, 570, 575) for brand in BRANDS
)
assert REQUIRE_CUDA_13_0.startswith(
    "cuda>=13.0 brand=unknown,driver>=535,driver<536 brand=grid,driver>=535,driver<536 brand=tesla,driver>=535,"
)
assert REQUIRE_CUDA_13_0.endswith("brand=vws,driver>=575,driver<576 brand=cloudgaming,driver>=575,driver<576")
assert len(REQUIRE_CUDA_13_0) == 2165

# /proc/driver/nvidia/version as the proprietary and the open kernel modules write it
PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Fri Mar 14 04:12:31 UTC 2025\n"
    "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n"
)
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@U16)  Sun Aug 31\n"
COMPAT = "580.82.07"  # the driver cuda-compat-13-0 (CUDA 13.0 Update 1) is built from
SUPPORTED = ["535.247.01", "550.163.01", "565.57.01", "570.133.20", "575.57.08"]
UNSUPPORTED = ["470.256.02", "525.147.05", "545.29.06", "560.35.03"]
NATIVE = ["580.65.06", "580.126.16", "590.44.01"]


# ---- fake compat folders


def write_elf(path: pathlib.Path, soname: str | None, needed=(), wide: bool = True, little: bool = True) -> None:
    """A minimal ELF shared object, as far as the dynamic loader's first look goes: a loadable segment mapped at
    0x1000 (so DT_STRTAB, an address, is not its file offset) and a dynamic segment. Not loadable."""
    end = "<" if little else ">"
    strings, offsets = b"\0", {}
    for name in [soname, *needed]:
        if name and name not in offsets:
            offsets[name] = len(strings)
            strings += name.encode() + b"\0"
    ehdr, phdr = (64, 56) if wide else (52, 32)
    strtab = ehdr + 2 * phdr
    dyn = strtab + len(strings) + (-(strtab + len(strings)) % 8)
    base = 0x1000
    entries = [(1, offsets[n]) for n in needed] + ([(14, offsets[soname])] if soname else [])
    dynamic = b"".join(
        struct.pack(end + ("qQ" if wide else "iI"), t, v) for t, v in [*entries, (5, base + strtab), (0, 0)]
    )
    size = dyn + len(dynamic)
    ident = b"\x7fELF" + bytes([2 if wide else 1, 1 if little else 2, 1]) + bytes(9)
    if wide:
        header = struct.pack(end + "HHIQQQIHHHHHH", 3, 62, 1, 0, ehdr, 0, 0, ehdr, phdr, 2, 64, 0, 0)
        load = struct.pack(end + "IIQQQQQQ", 1, 4, 0, base, base, size, size, 0x1000)
        dseg = struct.pack(end + "IIQQQQQQ", 2, 4, dyn, base + dyn, base + dyn, len(dynamic), len(dynamic), 8)
    else:
        header = struct.pack(end + "HHIIIIIHHHHHH", 3, 3, 1, 0, ehdr, 0, 0, ehdr, phdr, 2, 40, 0, 0)
        load = struct.pack(end + "IIIIIIII", 1, 0, base, base, size, size, 4, 0x1000)
        dseg = struct.pack(end + "IIIIIIII", 2, dyn, base + dyn, base + dyn, len(dynamic), len(dynamic), 4, 4)
    data = ident + header + load + dseg + strings
    path.write_bytes(data + bytes(dyn - len(data)) + dynamic)


# The layout of NVIDIA's cuda-compat package (its RPM spec's %files: each library as .so.<driver version> with
# its soname links, libcuda.so for linking). The DT_NEEDED entries between compat libraries are made up to
# exercise the order: the case the issue names (a compat library needing libnvidia-gpucomp), and one needing
# libcuda. NVIDIA's 550 and 555 builds need none of each other (readelf -d of Debian's packages); which 580's do
# is what the image build's check reads.
PACKAGE = {
    # file: (soname, needed, links)
    f"libcuda.so.{COMPAT}": ("libcuda.so.1", ["libc.so.6"], ["libcuda.so.1", "libcuda.so"]),
    f"libcudadebugger.so.{COMPAT}": ("libcudadebugger.so.1", ["libcuda.so.1", "libc.so.6"], ["libcudadebugger.so.1"]),
    f"libnvidia-gpucomp.so.{COMPAT}": (f"libnvidia-gpucomp.so.{COMPAT}", ["libc.so.6"], []),
    f"libnvidia-nvvm.so.{COMPAT}": ("libnvidia-nvvm.so.4", [f"libnvidia-gpucomp.so.{COMPAT}"], ["libnvidia-nvvm.so.4"]),
    "libnvidia-nvvm70.so.4": ("libnvidia-nvvm70.so.4", ["libc.so.6"], []),
    f"libnvidia-ptxjitcompiler.so.{COMPAT}": ("libnvidia-ptxjitcompiler.so.1", [], ["libnvidia-ptxjitcompiler.so.1"]),
    f"libnvidia-pkcs11-openssl3.so.{COMPAT}": (f"libnvidia-pkcs11-openssl3.so.{COMPAT}", ["libcrypto.so.3"], []),
}
# Each library once (not once per link), after the compat libraries it needs; libcuda last among the rest.
EXPECTED_ORDER = [
    f"libnvidia-gpucomp.so.{COMPAT}",
    f"libnvidia-nvvm.so.{COMPAT}",
    "libnvidia-nvvm70.so.4",
    f"libnvidia-pkcs11-openssl3.so.{COMPAT}",
    f"libnvidia-ptxjitcompiler.so.{COMPAT}",
    f"libcuda.so.{COMPAT}",
    f"libcudadebugger.so.{COMPAT}",
]


@pytest.fixture
def compat_dir(tmp_path):
    d = tmp_path / "compat"
    d.mkdir()
    for file, (soname, needed, links) in PACKAGE.items():
        write_elf(d / file, soname, needed)
        target = file
        for link in links:  # libcuda.so -> libcuda.so.1 -> libcuda.so.<version>, as ldconfig and the spec make them
            os.symlink(target, d / link)
            target = link
    (d / compat.REQUIRE_FILE).write_text(REQUIRE_CUDA_13_0 + "\n")
    return d


class Failed(Exception):
    pass


def _fail(message):
    raise Failed(message)


def _activate(tmp_path, compat_dir, proc_text, environ=None):
    version = tmp_path / "version"
    if proc_text is not None:
        version.write_text(proc_text)
    loaded, environ = [], {} if environ is None else environ
    result = compat.activate(str(version), str(compat_dir), environ, loaded.append, _fail)
    return result, [pathlib.Path(p).name for p in loaded], environ


# ---- one test per kind of host


@pytest.mark.parametrize("host", SUPPORTED)
@pytest.mark.parametrize("text", [PROPRIETARY, OPEN], ids=["proprietary", "open"])
def test_an_older_driver_of_a_supported_branch_gets_every_compat_library_in_dependency_order(
    tmp_path, compat_dir, text, host
):
    result, loaded, environ = _activate(tmp_path, compat_dir, text.format(v=host))
    assert loaded == EXPECTED_ORDER
    assert loaded.index(f"libnvidia-gpucomp.so.{COMPAT}") < loaded.index(f"libnvidia-nvvm.so.{COMPAT}")
    assert result == environ[compat.ENV] == f"libcuda {COMPAT} from {compat_dir} (host driver {host})"


@pytest.mark.parametrize("host", NATIVE)
def test_a_driver_of_branch_580_or_newer_keeps_its_own(tmp_path, compat_dir, host):
    """An older compat libcuda on a newer kernel module fails with CUDA error 803 (NVIDIA, CUDA Compatibility,
    forward compatibility: the compat package is for older base drivers only)."""
    result, loaded, environ = _activate(tmp_path, compat_dir, PROPRIETARY.format(v=host))
    assert (result, loaded, environ) == (None, [], {})


@pytest.mark.parametrize("host", UNSUPPORTED)
def test_an_older_driver_of_any_other_branch_fails_fast_naming_it_and_the_supported_branches(
    tmp_path, compat_dir, host
):
    with pytest.raises(Failed) as failed:
        _activate(tmp_path, compat_dir, PROPRIETARY.format(v=host))
    message = str(failed.value)
    assert f"NVIDIA driver {host} (branch {host.split('.')[0]}) cannot run CUDA 13.0" in message
    assert "older branches 535, 550, 565, 570, 575" in message
    assert "Fix: run on nodes whose driver is of branch 580 or newer, or of one of those branches" in message
    assert str(compat_dir / "NVIDIA_REQUIRE_CUDA") in message


def test_no_gpu_no_compat_folder_or_switched_off_loads_nothing_and_fails_nothing(tmp_path, compat_dir):
    assert _activate(tmp_path, compat_dir, None) == (None, [], {})  # CPU node, build machine
    assert _activate(tmp_path, tmp_path / "absent", PROPRIETARY.format(v="535.247.01")) == (None, [], {})
    for host in ("535.247.01", "560.35.03"):
        off = {compat.ENV: "off"}
        assert _activate(tmp_path, compat_dir, PROPRIETARY.format(v=host), off) == (None, [], off)


def test_the_default_failure_is_a_message_and_exit_status_78_before_anything_else_runs(tmp_path, compat_dir):
    """What the .pth hook does on such a host (activate()'s default fail): the message on stderr, no traceback
    (SystemExit from a .pth file is a fatal interpreter error), and the command never runs."""
    (tmp_path / "version").write_text(OPEN.format(v="560.35.03"))
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import cuda_forward_compat as c; "
    probe += "c.activate(sys.argv[2], sys.argv[3]); print('the command ran')"
    out = subprocess.run(
        [sys.executable, "-c", probe, str(ROOT / "images"), str(tmp_path / "version"), str(compat_dir)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == compat.EXIT_STATUS == 78
    assert out.stdout == ""
    assert out.stderr.startswith("cuda_forward_compat (images/cuda_forward_compat.py): the node's NVIDIA driver 560")
    assert "Traceback" not in out.stderr


# ---- what else stops it, and how


def test_a_library_that_does_not_load_fails_fast_naming_it(tmp_path, compat_dir):
    (tmp_path / "version").write_text(PROPRIETARY.format(v="570.133.20"))
    loaded = []

    def load(path):
        if "nvvm.so" in path:
            raise OSError(f"libnvidia-gpucomp.so.{COMPAT}: cannot open shared object file")
        loaded.append(pathlib.Path(path).name)

    environ = {}
    with pytest.raises(
        Failed, match=re.escape(f"loading {compat_dir}/libnvidia-nvvm.so.{COMPAT} failed (libnvidia-gpucomp")
    ):
        compat.activate(str(tmp_path / "version"), str(compat_dir), environ, load, _fail)
    assert loaded == [f"libnvidia-gpucomp.so.{COMPAT}"] and environ == {}


def test_without_the_recorded_nvidia_require_cuda_an_older_host_fails_fast(tmp_path, compat_dir):
    (compat_dir / "NVIDIA_REQUIRE_CUDA").unlink()
    with pytest.raises(Failed, match="does not record which host drivers its forward-compatibility package serves"):
        _activate(tmp_path, compat_dir, PROPRIETARY.format(v="570.133.20"))
    (compat_dir / "NVIDIA_REQUIRE_CUDA").write_text("cuda>=13.0\n")
    with pytest.raises(Failed, match="accepts no older driver branch"):
        _activate(tmp_path, compat_dir, PROPRIETARY.format(v="570.133.20"))


def test_a_bug_in_the_loader_warns_and_leaves_the_host_driver(tmp_path, compat_dir, capsys):
    (tmp_path / "version").write_text(PROPRIETARY.format(v="570.133.20"))

    def broken(path):
        raise RuntimeError("a bug")

    assert compat.activate(str(tmp_path / "version"), str(compat_dir), {}, broken, _fail) is None
    assert "internal error, the host's driver is used: RuntimeError('a bug')" in capsys.readouterr().err


def test_nvidia_require_cuda_of_cuda_13_0_reads_as_its_five_older_branches():
    require = compat.parse_require(REQUIRE_CUDA_13_0)
    assert require.cuda == "13.0"
    assert require.branches() == [535, 550, 565, 570, 575]
    assert all(require.accepts(v) for v in SUPPORTED)
    assert not any(require.accepts(v) for v in UNSUPPORTED + NATIVE)
    assert compat.parse_require("cuda>=13.0").ranges == ()


def test_load_order_refuses_a_cycle(tmp_path):
    d = tmp_path / "compat"
    d.mkdir()
    write_elf(d / "liba.so.1", "liba.so.1", ["libb.so.1"])
    write_elf(d / "libb.so.1", "libb.so.1", ["liba.so.1"])
    with pytest.raises(compat.CompatError, match=r"cycle: \['liba.so.1', 'libb.so.1'\]"):
        compat.load_order(compat.scan(str(d)))


# ---- the ELF reader


@pytest.mark.parametrize("wide,little", [(True, True), (False, True), (True, False), (False, False)])
def test_read_dynamic_reads_soname_and_needed_of_each_elf_class_and_byte_order(tmp_path, wide, little):
    write_elf(tmp_path / "lib.so", "libx.so.1", ["liby.so.2", "libc.so.6"], wide, little)
    assert compat.read_dynamic(str(tmp_path / "lib.so")) == ("libx.so.1", ["liby.so.2", "libc.so.6"])
    write_elf(tmp_path / "nosoname.so", None, ["libc.so.6"], wide, little)
    assert compat.read_dynamic(str(tmp_path / "nosoname.so")) == (None, ["libc.so.6"])


def test_read_dynamic_refuses_what_is_not_a_shared_library(tmp_path):
    (tmp_path / "script.so").write_text("INPUT(libfoo.so.1)\n")  # a linker script, as some lib*.so are
    with pytest.raises(ValueError, match="not an ELF file"):
        compat.read_dynamic(str(tmp_path / "script.so"))


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs binutils' readelf")
def test_read_dynamic_agrees_with_readelf_on_real_libraries():
    import _ctypes  # an extension module: a shared library without a soname

    libs = [pathlib.Path(_ctypes.__file__)]
    libs += [p for d in ("/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64") for p in pathlib.Path(d).glob("lib[cm].so.6")]
    for lib in libs:
        out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
        soname = re.findall(r"\(SONAME\)\s+Library soname: \[(.*)\]", out)
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", out)
        assert compat.read_dynamic(str(lib)) == (soname[0] if soname else None, needed), lib


# ---- real libraries: the dynamic loader and ldd (needs a C compiler)

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("ldd") is None, reason="needs cc and ldd")


def _cc(out: pathlib.Path, source: str, soname: str, *link: str) -> None:
    src = out.with_name(out.name + ".c")
    src.write_text(source)
    cmd = ["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(src), *link]
    subprocess.run(cmd, check=True)
    src.unlink()


@pytest.fixture
def real_compat(tmp_path):
    """A compat folder of real libraries: libnvidia-nvvm needs libnvidia-gpucomp.so.<version> (DT_NEEDED) and
    libcuda answers which() with "compat"; beside it a host folder whose libcuda.so.1 answers "host"."""
    d, host = tmp_path / "compat", tmp_path / "host"
    d.mkdir()
    host.mkdir()
    gpucomp = f"libnvidia-gpucomp.so.{COMPAT}"
    _cc(d / gpucomp, "int gpucomp(void) { return 7; }\n", gpucomp)
    _cc(
        d / f"libnvidia-nvvm.so.{COMPAT}",
        "int gpucomp(void);\nint nvvm(void) { return gpucomp(); }\n",
        "libnvidia-nvvm.so.4",
        f"-L{d}",
        f"-l:{gpucomp}",
    )
    os.symlink(f"libnvidia-nvvm.so.{COMPAT}", d / "libnvidia-nvvm.so.4")
    _cc(d / f"libcuda.so.{COMPAT}", 'const char *which(void) { return "compat"; }\n', "libcuda.so.1")
    os.symlink(f"libcuda.so.{COMPAT}", d / "libcuda.so.1")
    _cc(host / "libcuda.so.1", 'const char *which(void) { return "host"; }\n', "libcuda.so.1")
    (d / compat.REQUIRE_FILE).write_text(REQUIRE_CUDA_13_0 + "\n")
    return d, host


PROBE = """
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import cuda_forward_compat as c
print(c.activate(sys.argv[2], sys.argv[3]))
cuda = ctypes.CDLL("libcuda.so.1")  # by soname, as torch's CUDA runtime opens it
cuda.which.restype = ctypes.c_char_p
print(cuda.which().decode())
if len(sys.argv) > 4:
    print(ctypes.CDLL("libnvidia-nvvm.so.4").nvvm())  # as libcuda opens its companions
"""


def _probe(tmp_path, compat_dir, host_dir, driver, *more):
    (tmp_path / "version").write_text(PROPRIETARY.format(v=driver))
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "images"), str(tmp_path / "version"), str(compat_dir), *more],
        env={"LD_LIBRARY_PATH": str(host_dir), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
    )


@needs_cc
def test_real_libraries_a_compat_library_that_needs_another_loads_only_after_it(tmp_path, real_compat):
    """The issue's failure, with the real dynamic loader: loaded by path on its own, libnvidia-nvvm cannot find
    libnvidia-gpucomp (the compat folder is on no search path); after it, it loads and calls it."""
    d, host = real_compat
    alone = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes, sys; ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)",
            str(d / f"libnvidia-nvvm.so.{COMPAT}"),
        ],
        capture_output=True,
        text=True,
    )
    assert alone.returncode != 0 and f"libnvidia-gpucomp.so.{COMPAT}: cannot open shared object file" in alone.stderr
    out = _probe(tmp_path, d, host, "570.133.20", "nvvm")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"libcuda {COMPAT} from {d} (host driver 570.133.20)", "compat", "7"]


@needs_cc
def test_real_libraries_each_kind_of_host_gets_its_libcuda(tmp_path, real_compat):
    """After activate(), dlopen("libcuda.so.1") by name returns the compat one on an older supported host and the
    one the search path finds (here LD_LIBRARY_PATH, on a node the host's mount) on a newer one; an unsupported
    host never gets that far."""
    d, host = real_compat
    assert _probe(tmp_path, d, host, "580.95.05").stdout.splitlines() == ["None", "host"]
    assert _probe(tmp_path, d, host, "550.163.01").stdout.splitlines()[1] == "compat"
    stopped = _probe(tmp_path, d, host, "545.29.06")
    assert (stopped.returncode, stopped.stdout) == (78, "")
    assert "NVIDIA driver 545.29.06 (branch 545)" in stopped.stderr


# ---- the image build's check


@needs_cc
def test_the_build_check_passes_a_complete_folder_and_names_each_problem(tmp_path, real_compat):
    d, _ = real_compat
    assert compat.check(str(d)) == []
    no_ldd = compat.check(str(d), ldd=str(tmp_path / "no-ldd"))
    assert len(no_ldd) == 3 and all(": ldd failed: " in p for p in no_ldd)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _cc(elsewhere / "libmissing.so.9", "int missing(void) { return 1; }\n", "libmissing.so.9")
    _cc(
        d / f"libextra.so.{COMPAT}",
        "int missing(void);\nint extra(void) { return missing(); }\n",
        "libextra.so.1",
        f"-L{elsewhere}",
        "-l:libmissing.so.9",
    )
    os.symlink("libgone.so.1.0", d / "libgone.so.1")
    (d / compat.REQUIRE_FILE).unlink()
    problems = compat.check(str(d))
    assert f"libextra.so.{COMPAT} needs libmissing.so.9, which is neither in {d} nor in the image" in problems
    assert "libgone.so.1: a link to nothing" in problems
    assert any("does not record which host drivers" in p for p in problems)
    assert len(problems) == 3, problems
    assert compat.check(str(tmp_path / "absent")) == [
        f"{tmp_path / 'absent'} has no libcuda.so.<driver version>: no forward-compatibility package"
    ]


@needs_cc
def test_the_build_check_command_exits_non_zero_on_a_problem(tmp_path, real_compat):
    d, _ = real_compat
    cmd = [sys.executable, "-m", "cuda_forward_compat", "--check", str(d)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "images"))
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == (
        f"cuda_forward_compat --check: ok: loads libnvidia-gpucomp.so.{COMPAT}, libnvidia-nvvm.so.{COMPAT}, "
        f"libcuda.so.{COMPAT}; serves host driver branches 535, 550, 565, 570, 575"
    )
    os.unlink(d / f"libnvidia-gpucomp.so.{COMPAT}")
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert bad.returncode == 1
    assert f"libnvidia-nvvm.so.{COMPAT} needs libnvidia-gpucomp.so.{COMPAT}, which is neither in" in bad.stderr


# ---- the PyTorch image runs it


def _stages(image: str) -> list[list[tuple[str, str]]]:
    """(INSTRUCTION, arguments) per build stage: continuation lines joined, comments dropped."""
    stages, current = [], ""
    for raw in (ROOT / "images" / image / "Dockerfile").read_text().splitlines():
        if raw.lstrip().startswith("#") or not (current or raw.strip()):
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        op, _, args = current.strip().partition(" ")
        if op.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((op.upper(), " ".join(args.split())))
        current = ""
    return stages


def test_the_pytorch_image_records_the_supported_branches_and_checks_the_compat_folder_at_build():
    build, runtime = _stages("pytorch")
    assert build[0][1].startswith("nvidia/cuda:${CUDA_VERSION}-devel"), "NVIDIA_REQUIRE_CUDA comes from this base"
    copy = next(args for op, args in build if op == "RUN" and "/usr/local/cuda/compat/. /opt/cuda-compat/" in args)
    assert "printf '%s\\n' \"${NVIDIA_REQUIRE_CUDA}\" > /opt/cuda-compat/NVIDIA_REQUIRE_CUDA" in copy
    # only the OpenSSL 1.1 wrapper (Ubuntu 22.04 has no libcrypto.so.1.1); the OpenSSL 3 one stays
    assert "rm -f /opt/cuda-compat/libnvidia-pkcs11.so*" in copy and "openssl3" not in copy

    ops = [(op, args) for op, args in runtime]
    site = "/opt/venv/lib/python3.11/site-packages"
    copied = ops.index(("COPY", "--from=build /opt/cuda-compat /usr/local/cuda/compat"))
    module = ops.index(("COPY", f"images/cuda_forward_compat.py {site}/cuda_forward_compat.py"))
    check = next(i for i, (op, args) in enumerate(ops) if op == "RUN" and "cuda_forward_compat --check" in args)
    assert "/opt/venv/bin/python -m cuda_forward_compat --check /usr/local/cuda/compat" in ops[check][1]
    assert copied < module < check, "the check runs in the runtime stage, on the libraries and module it ships"
    assert (
        f'"import cuda_forward_compat; cuda_forward_compat.activate()" > {site}/cuda_forward_compat.pth'
        in ops[check][1]
    )
    apt = next(i for i, (op, args) in enumerate(ops) if op == "RUN" and "apt-get install" in args)
    assert apt < check, "ldd resolves against the runtime stage's packages (libcrypto.so.3 for the pkcs11 wrapper)"
