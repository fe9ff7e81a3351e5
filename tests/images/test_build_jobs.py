"""toolchain/build_horovod.sh bounds its parallel compile jobs by the machine's cores and memory when
HOROVOD_BUILD_JOBS is unset (issue 19, item 7: 8 C++20 jobs on the 4-vCPU/16-GiB image build cluster)."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "toolchain/build_horovod.sh"
GIB = 1024**3


def jobs(tmp_path, cores, available_gib, cgroup_v2=None, cgroup_v1=None, **extra) -> int:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        f"MemTotal:       {int(available_gib * 1.2 * 1048576)} kB\nMemAvailable:   {int(available_gib * 1048576)} kB\n"
    )
    root = tmp_path / "cgroup"
    (root / "memory").mkdir(parents=True, exist_ok=True)
    for old in (root / "memory.max", root / "memory/memory.limit_in_bytes"):
        old.unlink(missing_ok=True)
    if cgroup_v2 is not None:
        (root / "memory.max").write_text(f"{cgroup_v2}\n")
    if cgroup_v1 is not None:
        (root / "memory/memory.limit_in_bytes").write_text(f"{cgroup_v1}\n")
    env = {
        **os.environ,
        "HOROVOD_BUILD_NPROC": str(cores),
        "HOROVOD_BUILD_MEMINFO": str(meminfo),
        "HOROVOD_BUILD_CGROUP_ROOT": str(root),
        **extra,
    }
    out = subprocess.run(["bash", str(SCRIPT), "--jobs"], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.parametrize(
    "cores, gib, expected",
    [
        (4, 15, 4),  # cpu-smoke (Standard_D4s_v3 class: 4 vCPUs, 16 GiB): one per core, not 8
        (16, 15, 5),  # many cores, little memory: 3 GiB a job
        (2, 64, 2),  # few cores
        (8, 1, 1),  # never below one
    ],
)
def test_jobs_are_bounded_by_cores_and_available_memory(tmp_path, cores, gib, expected):
    assert jobs(tmp_path, cores, gib) == expected


def test_a_container_limit_below_the_hosts_memory_wins(tmp_path):
    """A container build sees the host's /proc/meminfo; its own limit is the cgroup's (v2 memory.max, v1
    memory.limit_in_bytes). "max" and v1's huge number mean no limit."""
    assert jobs(tmp_path, 16, 120, cgroup_v2=9 * GIB) == 3
    assert jobs(tmp_path, 16, 120, cgroup_v1=6 * GIB) == 2
    assert jobs(tmp_path, 16, 120, cgroup_v2="max") == 16
    assert jobs(tmp_path, 16, 120, cgroup_v1=9223372036854771712) == 16


def test_the_memory_per_job_can_be_changed(tmp_path):
    assert jobs(tmp_path, 16, 15, HOROVOD_BUILD_GIB_PER_JOB="5") == 3


def test_an_explicit_job_count_still_wins_and_the_images_leave_it_unset():
    text = SCRIPT.read_text()
    assert 'JOBS=${HOROVOD_BUILD_JOBS:-$(build_jobs)}' in text and 'MAKEFLAGS="-j$JOBS"' in text
    for image in ("pytorch", "tensorflow"):
        assert "HOROVOD_BUILD_JOBS" not in (ROOT / "images" / image / "Dockerfile").read_text(), (
            f"{image}: a fixed job count overrides the bound by the build machine's cores and memory"
        )


def _offline_build(tmp_path, sdist, path=None, missing=(), **extra):
    """build_horovod.sh with PYTHON a shim: `-m pip` and patch_horovod.py recorded (a `pip wheel` leaves a fake
    wheel; a `pip download` fails as it would offline), the framework probes answered, `import M` failing for each
    module in `missing`, the rest the real Python. `path` replaces the PATH searched after the linked nvcc."""
    calls = tmp_path / "calls.log"
    shim = tmp_path / "python"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1 $2" = "-m pip" ]; then echo "pip $3 $(env | grep -E \'^(HOROVOD|CUDA_HOME|CXX|CC|OMPI_|PIP_)\' | sort | tr \'\\n\' \' \')"'
        f' >> {calls}\n'
        '  [ "$3" = download ] && exit 1\n'
        '  if [ "$3" = wheel ]; then for a in "$@"; do [ "$prev" = -w ] && mkdir -p "$a" && '
        'touch "$a/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"; prev=$a; done; fi\n'
        "  exit 0\nfi\n"
        f'case "$1" in *patch_horovod.py) echo "patch $*" >> {calls}; exit 0;; esac\n'
        # The framework probes answered here (torch 2.14.1, no TensorFlow): importing them takes seconds each.
        f'if [ "$1" = -c ]; then for m in {" ".join(missing)}; do [ "$2" = "import $m" ] && exit 1; done\n'
        '  case "$2" in *tensorflow*) exit 1;; *torch.__version__*) echo 2.14.1; exit 0;;\n'
        '  "import torch") exit 0;; esac; fi\n'
        f'exec {ROOT}/.venv/bin/python "$@"\n'
    )
    shim.chmod(0o755)
    cuda = tmp_path / "cuda-13.0"
    (cuda / "bin").mkdir(parents=True, exist_ok=True)
    (cuda / "bin/nvcc").write_text("#!/bin/sh\n")
    (cuda / "bin/nvcc").chmod(0o755)
    linked = tmp_path / "usr-bin"  # nvcc on PATH through a link, as /usr/bin/nvcc often is
    linked.mkdir(exist_ok=True)
    if not (linked / "nvcc").exists():
        (linked / "nvcc").symlink_to(cuda / "bin/nvcc")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")},
        "PATH": f"{linked}:{path or os.environ['PATH']}",
        "HOROVOD_CUDA_DEFAULT": str(tmp_path / "no-cuda-here"),
        "PYTHON": str(shim),
        "HOROVOD_WHEEL_CACHE": str(tmp_path / "cache"),
        "HOROVOD_SDIST": str(sdist),
        "HOROVOD_BUILD_JOBS": "1",
        **extra,
    }
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    return proc, (calls.read_text() if calls.exists() else ""), cuda


# An NCCL build with the include and library folders given: no NCCL lookup in the Python.
NCCL = {"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_NCCL_INCLUDE": "/nccl/include", "HOROVOD_NCCL_LIB": "/x"}


# The end of Horovod 0.28.1's cmake/build_utils.py get_nvcc_flags, as the sdist has it: PTX for the last capability.
NVCC_FLAGS = """    for cc in cc_list[:-1]:
        default_flags += ['-gencode', 'arch=compute_{cc},code=sm_{cc}'.format(cc=cc)]
    # Build PTX for maximum specified compute capability
    default_flags += ['-gencode', 'arch=compute_{cc},code=\\\\"sm_{cc},compute_{cc}\\\\"'.format(cc=cc_list[-1])]
"""


def _sdist(tmp_path, nvcc_flags: str = NVCC_FLAGS) -> pathlib.Path:
    """A stand-in Horovod 0.28.1 sdist in a folder of its own (where the offline build looks for wheels)."""
    import tarfile

    src = tmp_path / "src/horovod-0.28.1"
    (src / "cmake").mkdir(parents=True, exist_ok=True)
    (src / "setup.py").write_text("# stand-in\n")
    (src / "cmake/build_utils.py").write_text(nvcc_flags)
    sdist = tmp_path / "wheels" / "horovod-0.28.1.tar.gz"
    sdist.parent.mkdir(exist_ok=True)
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname="horovod-0.28.1")
    return sdist


def _pip_wheel(calls: str) -> str:
    return next(line for line in calls.splitlines() if line.startswith("pip wheel"))


def test_an_offline_nccl_build_takes_the_given_sdist_and_finds_cuda_from_nvcc(tmp_path):
    """Issue 29 item 3: on a GPU machine without internet, HOROVOD_SDIST replaces the download; the project's patch
    is applied to it and the wheel built with NCCL, CUDA found from the nvcc on PATH (through a link) where
    /usr/local/cuda has no nvcc."""
    sdist = _sdist(tmp_path)
    proc, calls, cuda = _offline_build(tmp_path, sdist, **NCCL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pip download" not in calls and f"from {sdist} (no download)" in proc.stderr
    assert "patch " in calls and "horovod-0.28.1 --cxx-standard" in calls and "--cpu-only" not in calls
    wheel = _pip_wheel(calls)
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in wheel
    assert f"HOROVOD_CUDA_HOME={cuda} " in wheel and f"CUDA_HOME={cuda} " in wheel
    assert proc.stdout.strip().splitlines()[-1].endswith(".whl")


def test_a_missing_or_wrong_sdist_is_refused_before_anything_is_built(tmp_path):
    proc, calls, _ = _offline_build(tmp_path, tmp_path / "nowhere/horovod-0.28.1.tar.gz")
    assert proc.returncode == 2 and "no such file" in proc.stderr and "pip download --no-deps" in proc.stderr
    other = tmp_path / "horovod-0.28.0.tar.gz"
    other.write_bytes(b"")
    proc, calls, _ = _offline_build(tmp_path, other)
    assert proc.returncode == 2 and "expected horovod-0.28.1.tar.gz" in proc.stderr
    assert calls == ""


def test_an_offline_build_takes_horovods_build_requirements_from_the_sdists_folder_or_names_them(tmp_path):
    """Horovod's setup.py hands its install requirements to setuptools as setup_requires for a build, and
    setuptools fetches each one the Python lacks: on an H100 machine without internet the build died there
    ("pip wheel ... cffi>=1.4.0 returned non-zero exit status 1"). The requirements are Horovod's own (the installed
    0.28.1's metadata, not a list copied from the script): each missing one is named before anything is built, with
    the download command; present as wheels beside the sdist, setuptools is pointed at that folder, offline."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    needed = set()
    for line in requires("horovod"):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            needed.add(req.name)
    assert {"cffi", "cloudpickle", "psutil", "pyyaml", "packaging"} <= needed  # a PyTorch build's metadata
    modules = {"pyyaml": "yaml"}
    missing = [modules.get(n, n) for n in sorted(needed)] + ["pycparser"]
    sdist = _sdist(tmp_path)
    proc, calls, _ = _offline_build(tmp_path, sdist, missing=missing, **NCCL)
    assert proc.returncode == 2, proc.stderr[-2000:]
    named = proc.stderr.split("needs ", 1)[1].split(":", 1)[0].split()
    assert set(named) == needed | {"pycparser"}, named  # cffi's own requirement comes with it
    assert "pip download --no-deps --only-binary=:all:" in proc.stderr and str(sdist.parent) in proc.stderr
    assert "pip wheel" not in calls and "patch " not in calls

    for wheel in (
        "cffi-2.1.1-cp311-cp311-manylinux2014_x86_64.whl",
        "pycparser-3.12-py3-none-any.whl",
        "cloudpickle-3.1.1-py3-none-any.whl",
        "psutil-7.0.0-cp36-abi3-manylinux2014_x86_64.whl",
        "PyYAML-6.0.2-cp311-cp311-manylinux2014_x86_64.whl",
        "packaging-26.0-py3-none-any.whl",
    ):
        (sdist.parent / wheel).write_bytes(b"")
    proc, calls, _ = _offline_build(tmp_path, sdist, missing=missing, **NCCL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = _pip_wheel(calls)
    assert f"PIP_FIND_LINKS={sdist.parent} " in wheel and "PIP_NO_INDEX=1 " in wheel


def test_a_cxx_compiler_in_the_environment_reaches_cmake_unchanged(tmp_path):
    """CUDA images export CXX (the H100 machine's: CXX=/opt/gcc/bin/g++). The script once kept the C++ standard in a
    variable named CXX, so an exported CXX became "17" and CMake stopped: "Could not find the compiler specified in
    the environment variable CXX: 17". The standard still reaches the patch (torch 2.14: C++20)."""
    proc, calls, _ = _offline_build(tmp_path, _sdist(tmp_path), CXX="/opt/gcc/bin/g++", CC="/opt/gcc/bin/gcc")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CXX=/opt/gcc/bin/g++ " in _pip_wheel(calls) and "CC=/opt/gcc/bin/gcc " in _pip_wheel(calls)
    assert "--cxx-standard 20" in calls


def _path_without_cxx(tmp_path, versioned=("g++-13", "gcc-13")) -> str:
    """A PATH holding every command of this one but c++ and g++ (CMake's names), with `versioned` stand-ins."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for folder in os.environ["PATH"].split(":"):
        for tool in pathlib.Path(folder).glob("*") if os.path.isdir(folder) else ():
            name = tool.name
            if name in ("c++", "g++", "cc", "gcc") or name.startswith(("g++-", "gcc-", "x86_64-linux-gnu-g")):
                continue
            if not (bin_ / name).exists():
                (bin_ / name).symlink_to(tool)
    for name in versioned:
        (bin_ / name).write_text("#!/bin/sh\n")
        (bin_ / name).chmod(0o755)
    return str(bin_)


def test_a_machine_with_only_a_versioned_gxx_builds_with_it(tmp_path, monkeypatch):
    """CMake looks for c++ and g++ only, and Open MPI's mpicxx wraps plain g++: with only g++-13 on PATH both are
    pointed at it (CXX, OMPI_CXX; CC, OMPI_CC at gcc-13)."""
    monkeypatch.delenv("CXX", raising=False)
    proc, calls, _ = _offline_build(tmp_path, _sdist(tmp_path), path=_path_without_cxx(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = _pip_wheel(calls)
    assert "CXX=g++-13 " in wheel and "OMPI_CXX=g++-13 " in wheel and "CC=gcc-13 " in wheel, wheel
    assert "C++ compiler: g++-13 (no c++ or g++ on PATH)" in proc.stderr


def test_a_machine_without_a_cxx_compiler_is_told_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    proc, calls, _ = _offline_build(tmp_path, _sdist(tmp_path), path=_path_without_cxx(tmp_path, versioned=()))
    assert proc.returncode == 2 and "no C++ compiler" in proc.stderr and "apt-get install g++" in proc.stderr
    assert "pip wheel" not in calls


def test_each_framework_part_is_compiled_once_and_two_parts_merge_into_one_wheel(tmp_path):
    """The local job needs Horovod's PyTorch part alone (bootstrap.sh local); adding TensorFlow later compiles only
    TensorFlow's part, and the wheel installed then holds both extensions with a RECORD that matches its files.
    `pip wheel` is a shim that writes a one-framework wheel as Horovod's build would (the framework's extension and
    the shared Python), by the HOROVOD_WITH_* flags it is given."""
    import base64
    import hashlib
    import zipfile

    calls = tmp_path / "calls.log"
    maker = tmp_path / "make_wheel.py"
    maker.write_text(
        "import os, sys, zipfile\n"
        "out = sys.argv[1]; os.makedirs(out, exist_ok=True)\n"
        "so = {'PYTORCH': 'horovod/torch/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so',\n"
        "      'TENSORFLOW': 'horovod/tensorflow/mpi_lib.cpython-311-x86_64-linux-gnu.so'}\n"
        "with zipfile.ZipFile(os.path.join(out, 'horovod-0.28.1-cp311-cp311-linux_x86_64.whl'), 'w') as z:\n"
        "    z.writestr('horovod/__init__.py', '# shared\\n')\n"
        "    for fw, name in so.items():\n"
        "        if os.environ.get('HOROVOD_WITH_' + fw) == '1':\n"
        "            z.writestr(name, fw * 100)\n"
        "            open(sys.argv[2], 'a').write('compiled ' + fw + '\\n')\n"
        "    z.writestr('horovod-0.28.1.dist-info/RECORD', 'stale\\n')\n"
    )
    shim = tmp_path / "python"
    shim.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1 $2 $3" = "-m pip wheel" ]; then for a in "$@"; do [ "$prev" = -w ] && out=$a; prev=$a; done\n'
        f'  exec {ROOT}/.venv/bin/python {maker} "$out" {calls}; fi\n'
        'case "$1" in *patch_horovod.py) exit 0;; esac\n'
        'if [ "$1" = -c ]; then case "$2" in *tensorflow.__version__*) echo 2.15.1; exit 0;;\n'
        '  *torch.__version__*) echo 2.14.1; exit 0;; "import torch"|"import tensorflow") exit 0;; esac; fi\n'
        f'exec {ROOT}/.venv/bin/python "$@"\n'
    )
    shim.chmod(0o755)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")},
        "PYTHON": str(shim),
        "HOROVOD_WHEEL_CACHE": str(tmp_path / "cache"),
        "HOROVOD_SDIST": str(_sdist(tmp_path)),
        "HOROVOD_BUILD_JOBS": "1",
    }

    def build(*args, **extra):
        proc = subprocess.run(["bash", str(SCRIPT), *args], env={**env, **extra}, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()

    def compiled():
        return calls.read_text().splitlines() if calls.exists() else []

    def members(wheel):
        with zipfile.ZipFile(wheel) as z:
            return {i.filename: z.read(i) for i in z.infolist()}

    assert build("--plan") == ["torch", "tf"]
    torch_only = build(HOROVOD_FRAMEWORKS="torch")[-1]
    assert compiled() == ["compiled PYTORCH"]
    assert not any("tensorflow/" in name for name in members(torch_only))
    assert build("--plan") == ["tf"]  # the PyTorch part is cached

    both = build()[-1]
    assert compiled() == ["compiled PYTORCH", "compiled TENSORFLOW"]  # TensorFlow's part alone was compiled
    assert build("--plan") == [] and build()[-1] == both and len(compiled()) == 2  # and nothing again
    files = members(both)
    assert {"horovod/torch/mpi_lib_v2.cpython-311-x86_64-linux-gnu.so",
            "horovod/tensorflow/mpi_lib.cpython-311-x86_64-linux-gnu.so", "horovod/__init__.py"} < files.keys()  # fmt: skip
    record = dict(line.split(",", 1) for line in files.pop("horovod-0.28.1.dist-info/RECORD").decode().splitlines())
    assert record.pop("horovod-0.28.1.dist-info/RECORD") == ","
    assert record.keys() == files.keys()
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert record[name] == f"sha256={digest},{len(data)}", name


def test_a_gpu_build_names_its_kernels_and_refuses_a_horovod_without_ptx_for_the_newest(tmp_path):
    """Issue 43, item 4: the kernels carry PTX for the list's highest capability (Horovod's get_nvcc_flags), so a GPU
    newer than the list still runs; a source that does not build it is refused before anything is compiled."""
    proc, calls, _ = _offline_build(tmp_path, _sdist(tmp_path), **NCCL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CUDA kernels for compute capabilities 75,80,86,90, with PTX for the highest" in proc.stderr
    assert "HOROVOD_BUILD_CUDA_CC_LIST=75,80,86,90 " in _pip_wheel(calls)

    other = tmp_path / "other"
    other.mkdir()
    without = NVCC_FLAGS.replace("code=\\\\\"sm_{cc},compute_{cc}\\\\\"", "code=sm_{cc}")
    assert without != NVCC_FLAGS
    proc, calls, _ = _offline_build(other, _sdist(other, without), **NCCL)
    assert proc.returncode == 2 and "builds no PTX for the highest capability" in proc.stderr, proc.stderr[-2000:]
    assert "pip wheel" not in calls and "patch " not in calls
