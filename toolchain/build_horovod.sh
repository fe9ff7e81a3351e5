#!/usr/bin/env bash
# Build (or take from the cache) a Horovod 0.28.1 wheel for the frameworks installed in $PYTHON.
#
#   PYTHON=.venv/bin/python toolchain/build_horovod.sh        -> prints the wheel's path on its last line
#
# Horovod 0.28.1 is a source-only release that today's PyTorch breaks (see README, "Why Horovod is
# built here"); patch_horovod.py holds the fixes. The same script builds the GPU images: set
# HOROVOD_GPU_OPERATIONS=NCCL there. Frameworks are taken from what $PYTHON can import, MPI from
# whether mpicxx is on PATH; all of that is part of the cache key, so a change rebuilds.
#
# Offline (a GPU machine without internet): HOROVOD_SDIST=path/to/horovod-0.28.1.tar.gz, downloaded elsewhere with
#   python3 -m pip download --no-deps --no-binary :all: horovod==0.28.1 -d wheels
# then, on the GPU machine (CUDA's nvcc and CMake there; NCCL from torch's nvidia-nccl wheel):
#   HOROVOD_SDIST=wheels/horovod-0.28.1.tar.gz HOROVOD_GPU_OPERATIONS=NCCL PYTHON=python3 toolchain/build_horovod.sh
# HOROVOD_CUDA_HOME defaults to /usr/local/cuda where it has nvcc, else the toolkit of the nvcc on PATH.
set -euo pipefail

HOROVOD_VERSION=0.28.1
BUILD_REVISION=1   # bump when a change here changes what gets built (it is part of the cache key)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
CACHE=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/azure-horovod-training/wheels}
log() { echo "[build_horovod] $*" >&2; }

# Parallel compile jobs when HOROVOD_BUILD_JOBS is unset: one per core, and no more than the memory the
# build may use holds at GIB_PER_JOB each: the less of MemAvailable and the cgroup's limit (a container
# build sees the host's /proc/meminfo; its own limit is in the cgroup). 3 GiB a job leaves room for the largest
# unit's peak beside others, which use far less (measured: docs/benchmarks.md#horovods-compile-memory).
# `build_horovod.sh --jobs` prints the number. HOROVOD_BUILD_MEMINFO, HOROVOD_BUILD_CGROUP_ROOT
# and HOROVOD_BUILD_NPROC replace /proc/meminfo, /sys/fs/cgroup and nproc (tests, unusual machines).
GIB_PER_JOB=${HOROVOD_BUILD_GIB_PER_JOB:-3}
build_jobs() {
    local cores mem_kib limit root=${HOROVOD_BUILD_CGROUP_ROOT:-/sys/fs/cgroup} jobs
    cores=${HOROVOD_BUILD_NPROC:-$(nproc)}
    mem_kib=$(awk '/^MemAvailable:/ {print $2}' "${HOROVOD_BUILD_MEMINFO:-/proc/meminfo}")
    [[ $mem_kib =~ ^[0-9]+$ ]] || { log "no MemAvailable in ${HOROVOD_BUILD_MEMINFO:-/proc/meminfo}: one job per core"; echo "$cores"; return; }
    for f in "$root/memory.max" "$root/memory/memory.limit_in_bytes"; do   # cgroup v2, v1 ("max": none)
        limit=$(cat "$f" 2>/dev/null || true)
        if [[ $limit =~ ^[0-9]+$ ]] && (( limit / 1024 < mem_kib )); then mem_kib=$(( limit / 1024 )); fi
    done
    jobs=$(( mem_kib / (GIB_PER_JOB * 1048576) ))
    (( jobs > cores )) && jobs=$cores
    (( jobs < 1 )) && jobs=1
    echo "$jobs"
}
if [ "${1:-}" = "--jobs" ]; then build_jobs; exit 0; fi

has() { "$PYTHON" -c "import $1" >/dev/null 2>&1; }
ver() { "$PYTHON" -c "import $1; print($1.__version__)" 2>/dev/null || echo none; }

TORCH=$(ver torch)
TF=none; has tensorflow && TF=$(ver tensorflow)
[ "$TORCH" != none ] || [ "$TF" != none ] || { log "neither torch nor tensorflow imports in $PYTHON: install requirements first"; exit 2; }
MPI=none; command -v mpicxx >/dev/null 2>&1 && MPI=$(mpirun --version 2>/dev/null | head -1 | tr ' ' _)
GPU_OPS=${HOROVOD_GPU_OPERATIONS:-}
SDIST=${HOROVOD_SDIST:-}
if [ -n "$SDIST" ] && [ ! -f "$SDIST" ]; then
    log "HOROVOD_SDIST=$SDIST: no such file. Download it where there is internet: python3 -m pip download --no-deps --no-binary :all: horovod==$HOROVOD_VERSION -d wheels"
    exit 2
fi
if [ -n "$SDIST" ] && [ "$(basename "$SDIST")" != "horovod-$HOROVOD_VERSION.tar.gz" ]; then
    log "HOROVOD_SDIST=$SDIST: expected horovod-$HOROVOD_VERSION.tar.gz (the version patch_horovod.py patches)"
    exit 2
fi
if [ -n "$SDIST" ]; then
    # Horovod's setup.py hands its install requirements to setuptools as setup_requires for a build (cffi with
    # PyTorch); setuptools fetches each one the Python lacks, and offline it can only take them from the sdist's
    # folder (cffi's own requirement, pycparser, with it). Seen on an H100 machine without internet: "Command
    # 'pip wheel ... cffi>=1.4.0' returned non-zero exit status 1" after the configure step.
    WHEELS=$(cd "$(dirname "$SDIST")" && pwd)
    in_wheels() { find "$WHEELS" -maxdepth 1 -iname "$1-*" | grep -q .; }
    NEEDS=(cloudpickle:cloudpickle psutil:psutil yaml:pyyaml packaging:packaging)   # import name:distribution
    if [ "$TORCH" != none ]; then NEEDS+=(cffi:cffi); has cffi || NEEDS+=(pycparser:pycparser); fi
    MISSING=()
    for need in "${NEEDS[@]}"; do
        has "${need%%:*}" || in_wheels "${need#*:}" || MISSING+=("${need#*:}")
    done
    if [ ${#MISSING[@]} -gt 0 ]; then
        log "Horovod's build needs ${MISSING[*]}: not importable in $PYTHON and no wheel of it in $WHEELS. Download where there is internet, into the sdist's folder: python3 -m pip download --no-deps --only-binary=:all: --python-version $("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d wheels ${MISSING[*]}"
        exit 2
    fi
    export PIP_FIND_LINKS="$WHEELS" PIP_NO_INDEX=1   # what setuptools' fetch (a `pip wheel`) reads
fi
# CMake looks for c++ or g++; a CUDA image may carry only the versioned compiler nvcc uses (g++-13), and Open MPI's
# mpicxx wraps plain g++ unless OMPI_CXX names another. Seen on an H100 machine: "CMAKE_CXX_COMPILER not set".
if [ -z "${CXX:-}" ] && ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
    GXX=$(compgen -c g++- | grep -E '^g\+\+-[0-9]+$' | sort -u -t- -k2 -n | tail -1 || true)
    [ -n "$GXX" ] || { log "no C++ compiler: neither c++, g++ nor g++-N is on PATH. Install one (apt-get install g++) or set CXX"; exit 2; }
    export CXX=$GXX OMPI_CXX=$GXX
    if command -v "gcc-${GXX#g++-}" >/dev/null 2>&1; then export CC=gcc-${GXX#g++-} OMPI_CC=gcc-${GXX#g++-}; fi
    log "C++ compiler: $CXX (no c++ or g++ on PATH)"
fi
# torch >= 2.14 headers need C++20, older 2.x C++17; TensorFlow's part keeps its own C++17.
CXX_STD=17
if [ "$TORCH" != none ] && "$PYTHON" - "$TORCH" <<'PY'
import sys
major, minor = (int(x) for x in sys.argv[1].split("+")[0].split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 14) else 1)
PY
then CXX_STD=20; fi

PYTAG=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# Each framework's extension is built on its own and cached under a key of what went into it (its framework's
# version, MPI, GPU operations, the C++ standard, the patches): the PyTorch part the local job needs is built
# first and alone, and adding TensorFlow later compiles only TensorFlow's part. Horovod links its common code into
# each extension (horovod/torch/mpi_lib_v2*.so, horovod/tensorflow/mpi_lib*.so), so two one-framework wheels of
# the same sources merge into the wheel a two-framework build makes.
PARTS=()
[ "$TORCH" = none ] || PARTS+=(torch)
[ "$TF" = none ] || PARTS+=(tf)
if [ -n "${HOROVOD_FRAMEWORKS:-}" ]; then   # a subset of what imports: "torch", "tf" or "torch tf"
    PARTS=()
    for part in $HOROVOD_FRAMEWORKS; do
        case $part in
            torch) [ "$TORCH" != none ] || { log "HOROVOD_FRAMEWORKS=$HOROVOD_FRAMEWORKS: torch does not import in $PYTHON"; exit 2; } ;;
            tf) [ "$TF" != none ] || { log "HOROVOD_FRAMEWORKS=$HOROVOD_FRAMEWORKS: tensorflow does not import in $PYTHON"; exit 2; } ;;
            *) log "HOROVOD_FRAMEWORKS=$HOROVOD_FRAMEWORKS: each word is torch or tf"; exit 2 ;;
        esac
        PARTS+=("$part")
    done
fi
# HOROVOD_PATCH_SPEED=0: patch_horovod.py's build and correctness edits only, its speed edits left out (a check of
# the fork against upstream's behaviour, docs/toolchain.md#the-horovod-fork).
NO_SPEED=; [ "${HOROVOD_PATCH_SPEED:-1}" = 0 ] && NO_SPEED=--no-speed
part_line() {   # what one framework's part is built from (its cache folder's key.txt: bootstrap.sh reads it)
    local version=$TORCH; [ "$1" = tf ] && version=$TF
    echo "$HOROVOD_VERSION r$BUILD_REVISION $PYTAG $1=$version mpi=$MPI gpu=$GPU_OPS cxx=$CXX_STD${NO_SPEED:+ speed=off}"
}
part_key() { { part_line "$1"; cat "$HERE/patch_horovod.py"; } | sha256sum | cut -c1-16; }
patch_sum() { sha256sum "$HERE/patch_horovod.py" | cut -c1-16; }   # in key.txt: bootstrap.sh's plan reads it
# `build_horovod.sh --plan`: the parts a build would compile (not cached), one per line; bootstrap.sh says so first.
if [ "${1:-}" = "--plan" ]; then
    for part in "${PARTS[@]}"; do ls "$CACHE/$(part_key "$part")"/horovod-*.whl >/dev/null 2>&1 || echo "$part"; done
    exit 0
fi

JOBS=${HOROVOD_BUILD_JOBS:-$(build_jobs)}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ -n "$SDIST" ]; then
    cp "$SDIST" "$WORK/"
fi

# Horovod compiles its CUDA kernels for each capability in HOROVOD_BUILD_CUDA_CC_LIST and adds PTX for the highest
# (cmake/build_utils.py, get_nvcc_flags): a GPU newer than the list compiles that PTX when the library loads, so an
# image outlives its list. Checked in the sdist being built, not assumed.
ptx_for_the_newest() {
    "$PYTHON" - "$1/cmake/build_utils.py" <<'PY' || { log "$1/cmake/build_utils.py builds no PTX for the highest capability of HOROVOD_BUILD_CUDA_CC_LIST: a GPU newer than the list would find no kernel; this is not the Horovod 0.28.1 the build was written for"; exit 2; }
import sys
try:
    text = open(sys.argv[1]).read()
except OSError:
    sys.exit(1)
sys.exit(0 if r"""'arch=compute_{cc},code=\\"sm_{cc},compute_{cc}\\"'.format(cc=cc_list[-1])""" in text else 1)
PY
    log "CUDA kernels for compute capabilities $CUDA_CC_LIST, with PTX for the highest (newer GPUs compile it at load)"
}

build_part() {   # build_part torch|tf: prints the part's cached wheel
    local part=$1 out with_torch=none with_tf=none src
    out="$CACHE/$(part_key "$part")"
    if ls "$out"/horovod-*.whl >/dev/null 2>&1; then
        log "cached $part part for torch=$TORCH tf=$TF mpi=$MPI gpu=${GPU_OPS:-off} ($out)"
        ls "$out"/horovod-*.whl
        return
    fi
    if [ "$part" = torch ]; then with_torch=$TORCH; else with_tf=$TF; fi
    log "building Horovod $HOROVOD_VERSION's $part part (torch=$with_torch tf=$with_tf mpi=$MPI gpu=${GPU_OPS:-off}), C++$CXX_STD, $JOBS parallel jobs (about 5 minutes on 2 cores)"
    if [ ! -f "$WORK/horovod-$HOROVOD_VERSION.tar.gz" ]; then
        "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$WORK" 2>&1 | { grep -v "is neither a file nor a directory" || true; } >&2
    elif [ -n "$SDIST" ]; then
        log "from $SDIST (no download)"
    fi
    src="$WORK/$part/horovod-$HOROVOD_VERSION"
    mkdir -p "$WORK/$part"
    tar -xzf "$WORK/horovod-$HOROVOD_VERSION.tar.gz" -C "$WORK/$part"
    local cpu_only=()
    [ -n "$GPU_OPS" ] || cpu_only=(--cpu-only)
    if [ -n "$GPU_OPS" ]; then ptx_for_the_newest "$src"; fi
    "$PYTHON" "$HERE/patch_horovod.py" "$src" --cxx-standard "$CXX_STD" "${cpu_only[@]}" $NO_SPEED >&2
    local build_env=(
        "$(flag PYTORCH "$with_torch")" "$(flag TENSORFLOW "$with_tf")" "$(flag MPI "$MPI")"
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
        CMAKE_POLICY_VERSION_MINIMUM=3.5                # CMake 4 refuses the bundled third_party's old minimums
        MAKEFLAGS="-j$JOBS"
        "${GPU_ENV[@]}"
    )
    log "env: ${build_env[*]}"
    # --no-build-isolation: Horovod must compile against the torch/tensorflow already installed in $PYTHON.
    env "${build_env[@]}" "$PYTHON" -m pip wheel --no-deps --no-build-isolation -w "$WORK/$part/dist" "$src" >"$WORK/$part/build.log" 2>&1 || {
        # The first error (CMake's configure, a compiler's) is often far above the traceback that ends the log.
        { grep -n -m1 -B3 -A25 "CMake Error" "$WORK/$part/build.log" || grep -n -m1 -B3 -A12 -E "[^-]error:|Error [0-9]+" "$WORK/$part/build.log"; } >&2 || true
        log "... the log's end:"
        tail -40 "$WORK/$part/build.log" >&2
        cp "$WORK/$part/build.log" "${TMPDIR:-/tmp}/horovod-build-$part.log"
        log "build failed; the full log is ${TMPDIR:-/tmp}/horovod-build-$part.log"
        exit 1
    }
    mkdir -p "$out"
    cp "$WORK/$part"/dist/horovod-*.whl "$out/"
    { part_line "$part"; echo "patch $(patch_sum)"; } >"$out/key.txt"
    log "built $(ls "$out"/horovod-*.whl)"
    ls "$out"/horovod-*.whl
}

flag() { if [ "$2" != none ]; then echo "HOROVOD_WITH_$1=1"; else echo "HOROVOD_WITHOUT_$1=1"; fi; }
CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-75,80,86,90}   # CUDA 13 builds sm_75 and newer only: T4, A100, A10, H100/H200
GPU_ENV=()
if [ -n "$GPU_OPS" ] && [ -z "${HOROVOD_CUDA_HOME:-}" ]; then
    # A CUDA runtime image has /usr/local/cuda without the compiler; /usr/bin/nvcc is often a link into the toolkit.
    CUDA_DEFAULT=${HOROVOD_CUDA_DEFAULT:-/usr/local/cuda}   # replaced by the tests
    if [ -x "$CUDA_DEFAULT/bin/nvcc" ]; then HOROVOD_CUDA_HOME=$CUDA_DEFAULT
    elif command -v nvcc >/dev/null 2>&1; then HOROVOD_CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    else log "HOROVOD_GPU_OPERATIONS=$GPU_OPS needs CUDA's toolkit (nvcc): none at /usr/local/cuda or on PATH; set HOROVOD_CUDA_HOME"; exit 2
    fi
fi
if [ -n "$GPU_OPS" ]; then
    # CUDA_HOME too: torch otherwise guesses it from `which nvcc` and hands Horovod a path without cudart.
    GPU_ENV+=(HOROVOD_GPU_OPERATIONS="$GPU_OPS" HOROVOD_CUDA_HOME="${HOROVOD_CUDA_HOME:-/usr/local/cuda}"
              CUDA_HOME="${HOROVOD_CUDA_HOME:-/usr/local/cuda}"
              HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_CC_LIST")
    if [ "$GPU_OPS" = NCCL ] && [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}" ]; then
        # Link against the NCCL that torch's wheel brings (nvidia-nccl-*), so both load the same library.
        NCCL_DIR=$("$PYTHON" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
        [ -e "$NCCL_DIR/lib/libnccl.so" ] || ln -s libnccl.so.2 "$NCCL_DIR/lib/libnccl.so"
        GPU_ENV+=(HOROVOD_NCCL_INCLUDE="$NCCL_DIR/include" HOROVOD_NCCL_LIB="$NCCL_DIR/lib" HOROVOD_NCCL_LINK=SHARED)
    fi
fi

WHEELS_BUILT=()
for part in "${PARTS[@]}"; do
    WHEELS_BUILT+=("$(build_part "$part" | tail -1)")
done
if [ ${#WHEELS_BUILT[@]} -eq 1 ]; then
    echo "${WHEELS_BUILT[0]}"
    exit 0
fi
# Two parts: one wheel holding both extensions (the same sources; only the .so files differ), its RECORD rewritten.
OUT="$CACHE/$( { for part in "${PARTS[@]}"; do part_key "$part"; done; } | sha256sum | cut -c1-16)"
if ! ls "$OUT"/horovod-*.whl >/dev/null 2>&1; then
    mkdir -p "$OUT"
    "$PYTHON" - "$OUT" "${WHEELS_BUILT[@]}" <<'PY' >&2
import base64, hashlib, os, sys, zipfile

out, first, *rest = sys.argv[1:]
names, entries = set(), []
for wheel in (first, *rest):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.filename not in names and not info.filename.endswith(".dist-info/RECORD"):
                names.add(info.filename)
                entries.append((info, z.read(info)))
record = next(i.filename for i in zipfile.ZipFile(first).infolist() if i.filename.endswith(".dist-info/RECORD"))
lines = []
for info, data in entries:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    lines.append(f"{info.filename},sha256={digest},{len(data)}")
lines.append(f"{record},,")
target = os.path.join(out, os.path.basename(first))
with zipfile.ZipFile(target + ".part", "w", zipfile.ZIP_DEFLATED) as z:
    for info, data in entries:
        z.writestr(info, data)
    z.writestr(record, "\n".join(lines) + "\n")
os.replace(target + ".part", target)
print(f"[build_horovod] merged {len(sys.argv) - 2} parts into {target}")
PY
fi
ls "$OUT"/horovod-*.whl
