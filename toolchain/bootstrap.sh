#!/usr/bin/env bash
# Create or refresh the project's environment in .venv: pinned requirements, then Horovod built for them.
# Idempotent and quick once done (a stamp records what was installed); the README's commands call it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PY=${PYTHON_BIN:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
log() { echo "[bootstrap] $*" >&2; }
# pip on some machines warns about every missing local index entry; keep real messages only.
quiet() { { grep -v "is neither a file nor a directory" || true; } >&2; }

# Azurite (npm), the Azure Storage emulator the data transfer tests run against: pinned in
# toolchain/package-lock.json, installed into toolchain/node_modules (gitignored). Checked on every run, apart
# from the Python stamp below; without npm the tests that need it skip and say why.
if [ "${1:-all}" = local ]; then
    :   # the local job needs no Azurite
elif command -v npm >/dev/null 2>&1; then
    if ! cmp -s "$ROOT/toolchain/package-lock.json" "$ROOT/toolchain/node_modules/.installed-lock" 2>/dev/null; then
        log "installing Azurite (npm ci in toolchain/)"
        (cd "$ROOT/toolchain" && npm ci --no-audit --no-fund --loglevel=error >&2) ||
            { log "error: npm ci in toolchain/ failed (see above): the data transfer tests need Azurite"; exit 1; }
        cp "$ROOT/toolchain/package-lock.json" "$ROOT/toolchain/node_modules/.installed-lock"
    fi
else
    log "npm not found: Azurite is not installed and the data transfer tests will skip (install Node.js and npm to run them)"
fi

# Two parts, each with a stamp of what went into it:
#   local: what the local job needs (scripts/train-local, train-landcover): the payloads' and the launcher's pins,
#          Horovod's PyTorch part. A bare machine trains first; nothing else is downloaded or compiled for it.
#   all:   everything .venv holds (requirements.txt: TensorFlow, Pulumi, the tests' tools) and Horovod's
#          TensorFlow part beside the PyTorch one (scripts/test, review-infra). A complete install covers local.
PART=${1:-all}
case $PART in local|all) ;; *) log "usage: toolchain/bootstrap.sh [local|all]"; exit 2 ;; esac
LOCAL_REQS=("$ROOT/payloads/requirements.txt" "$ROOT/launcher/requirements.txt")
digest() { cat "$@" "$ROOT/constraints.txt" "$ROOT/toolchain/build_horovod.sh" "$ROOT/toolchain/patch_horovod.py" \
               "$ROOT/toolchain/bootstrap.sh" "$ROOT/infra/pyproject.toml" | sha256sum | cut -d' ' -f1; }
STAMP="$VENV/.bootstrap-stamp"
WANT=$(digest "$ROOT/requirements.txt" "$ROOT/payloads/requirements.txt" \
              "$ROOT/payloads/requirements-tensorflow.txt" "$ROOT/infra/requirements.txt" "$ROOT/policy/requirements.txt" \
              "$ROOT/launcher/requirements.txt" "$ROOT/benchmarks/requirements.txt")
STAMP_LOCAL="$VENV/.bootstrap-stamp-local"
WANT_LOCAL=$(digest "${LOCAL_REQS[@]}")
done_already() {
    [ -x "$VENV/bin/horovodrun" ] || return 1
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && return 0
    [ "$PART" = local ] && [ -f "$STAMP_LOCAL" ] && [ "$(cat "$STAMP_LOCAL")" = "$WANT_LOCAL" ]
}

# `trainingplatform` is installed editable (infra/pyproject.toml): from this checkout, not from another clone
# that shares the venv (a linked .venv, as the disk-space message suggests).
install_platform() {
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e "$ROOT/infra" 2>&1 | quiet
}
platform_is_ours() {
    "$VENV/bin/python" - "$ROOT/infra/trainingplatform" <<'PY' 2>/dev/null
import importlib.util, os, sys
spec = importlib.util.find_spec("trainingplatform")
ours = os.path.realpath(sys.argv[1])
sys.exit(0 if spec and spec.origin and os.path.dirname(os.path.realpath(spec.origin)) == ours else 1)
PY
}

if done_already; then
    platform_is_ours || { log "installing trainingplatform from $ROOT/infra"; install_platform; }
    exit 0
fi

start=$(date +%s)
# ---- what this run will do, and how long that takes, said before it starts
torch_pin=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' "$ROOT/payloads/requirements.txt")
tf_pin=$(sed -n 's/^tensorflow-cpu==\([^ ]*\).*/\1/p' "$ROOT/payloads/requirements-tensorflow.txt")
has_module() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
# A framework's Horovod part is compiled unless the wheel cache has one for its pinned version (build_horovod.sh
# writes key.txt beside each part; Open MPI's version is left out of this guess).
# A part is cached when a key.txt names its framework's version and the patch as it is now (a changed patch_horovod.py
# means a new build, under a new key: build_horovod.sh).
PATCH_SUM=$(sha256sum "$ROOT/toolchain/patch_horovod.py" | cut -c1-16)
part_cached() {
    local key
    for key in "${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/azure-horovod-training/wheels}"/*/key.txt; do
        grep -qs -- " $1=$2[+ ]" "$key" && grep -qsx -- "patch $PATCH_SUM" "$key" && return 0
    done
    return 1
}
jobs=$("$ROOT/toolchain/build_horovod.sh" --jobs 2>/dev/null || echo 1)
# A bare 2-core machine's set-up times, rounded up (docs/benchmarks.md#the-set-up-estimate): the local part's
# downloads and installs, the rest's; each Horovod part's compile with 2 jobs (PyTorch's overlapping the local
# part's second half), scaled by the jobs this machine runs. The network sets the first two.
DOWNLOAD_LOCAL_S=90 DOWNLOAD_REST_S=60
COMPILE_TORCH_S=160 COMPILE_TF_S=130
plan=() seconds=0
if ! has_module torch; then plan+=("download and install the local job's packages"); seconds=$(( seconds + DOWNLOAD_LOCAL_S )); fi
if [ "$PART" = all ] && ! has_module tensorflow; then plan+=("download and install the rest (TensorFlow, Pulumi, the test tools)"); seconds=$(( seconds + DOWNLOAD_REST_S )); fi
if ! part_cached torch "$torch_pin"; then plan+=("compile Horovod's PyTorch part"); seconds=$(( seconds + COMPILE_TORCH_S * 2 / jobs )); fi
if [ "$PART" = all ] && ! part_cached tf "$tf_pin"; then plan+=("compile Horovod's TensorFlow part"); seconds=$(( seconds + COMPILE_TF_S * 2 / jobs )); fi
if [ ${#plan[@]} -eq 0 ]; then plan=("install the pinned packages and the cached Horovod wheel"); seconds=60; fi
minutes=$(( (seconds + 59) / 60 )) unit=minutes
[ "$minutes" = 1 ] && unit=minute
log "setting up $VENV ($PART): about $minutes $unit on $(nproc) cores: $(IFS=';'; echo "${plan[*]}" | sed 's/;/; /g')"

# A first install needs about 8 GB (torch's CUDA build 5.5 GB, TensorFlow 1.5 GB, the Horovod build): say so
# before pip fails half-way with "No space left on device", and before anything is created.
if ! compgen -G "$VENV/lib/python3*/site-packages/torch" >/dev/null; then
    need_gb=${BOOTSTRAP_MIN_FREE_GB:-9}
    where=$VENV
    while [ ! -e "$where" ]; do where=$(dirname "$where"); done  # before .venv exists: the disk it will be on
    free_gb=$(( $(df -Pk "$where" | awk 'NR==2 {print $4}') / 1048576 ))
    if [ "$free_gb" -lt "$need_gb" ]; then
        log "error: $free_gb GB free on the disk holding $VENV; a first install needs about $need_gb GB."
        log "Free space there (old clones' .venv folders are 7-8 GB each), or make .venv a link to a folder on a"
        log "larger disk (ln -s /big/disk/venv .venv); BOOTSTRAP_MIN_FREE_GB=N changes the threshold."
        exit 1
    fi
fi

"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null ||
    log "warning: $("$PY" --version) found; the pins are tested on Python 3.11"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PY" -m venv "$VENV"
fi
# Open MPI: Horovod's faster CPU transport (benchmarks/allreduce.py measures it against Gloo). build_horovod.sh
# enables MPI when mpicxx is on PATH; without a way to install it, Horovod is built with Gloo only.
if ! command -v mpicxx >/dev/null 2>&1 && [ "${HOROVOD_WITHOUT_MPI:-0}" != 1 ]; then
    SUDO=(); [ "$(id -u)" = 0 ] || SUDO=(sudo -n)
    if command -v apt-get >/dev/null 2>&1 && "${SUDO[@]}" true 2>/dev/null; then
        log "installing Open MPI (Debian packages libopenmpi-dev, openmpi-bin)"
        { "${SUDO[@]}" apt-get install -y -q --no-install-recommends libopenmpi-dev openmpi-bin ||
          { "${SUDO[@]}" apt-get update -q && "${SUDO[@]}" apt-get install -y -q --no-install-recommends libopenmpi-dev openmpi-bin; }; } >/dev/null
    else
        log "warning: no mpicxx and no root/apt to install Open MPI: Horovod gets Gloo only (slower allreduce; see docs/benchmarks.md#what-the-benchmarks-changed)"
    fi
fi
quiet_pip() { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 | quiet; }
# pip byte-compiles what it installs, and that stays: where PYTHONDONTWRITEBYTECODE is set (this workplace's
# machines) Python never writes a .pyc itself, so with --no-compile every process compiled every module it
# imported, every time: set-up a little faster, the tests much slower (docs/benchmarks.md#byte-compiled-packages).
# torch first (with what importing it may touch), so that Horovod's PyTorch part compiles while pip fetches the rest.
has_module torch || log "installing torch $torch_pin (a large download: its CUDA libraries come with it)"
quiet_pip torch torchvision numpy -c "$ROOT/constraints.txt"
BUILD_LOG=$(mktemp)
PYTHON="$VENV/bin/python" HOROVOD_FRAMEWORKS=torch "$ROOT/toolchain/build_horovod.sh" >"$BUILD_LOG.out" 2>"$BUILD_LOG" &
build=$!
log "installing the local job's packages (payloads/, launcher/)"
quiet_pip "${LOCAL_REQS[@]/#/-r}" -c "$ROOT/constraints.txt"
if [ "$PART" = all ]; then
    log "installing the rest of requirements.txt (TensorFlow, Pulumi, the test tools)"
    quiet_pip -r "$ROOT/requirements.txt" -c "$ROOT/constraints.txt"
fi
# The platform's library (infra/pyproject.toml): `import trainingplatform` for the launcher, policy and tests.
install_platform
log "waiting for Horovod's PyTorch part (log: $BUILD_LOG)"
wait "$build" || { cat "$BUILD_LOG" >&2; log "Horovod's PyTorch part failed to build"; exit 1; }
FRAMEWORKS=torch
[ "$PART" = all ] && has_module tensorflow && FRAMEWORKS="torch tf"
WHEEL=$(PYTHON="$VENV/bin/python" HOROVOD_FRAMEWORKS=$FRAMEWORKS "$ROOT/toolchain/build_horovod.sh" | tail -1)
rm -f "$BUILD_LOG" "$BUILD_LOG.out"
quiet_pip --no-deps --force-reinstall "$WHEEL"

# Refuse an environment that would train without working collectives.
CHECK=$(TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/horovodrun" --check-build)
NEED=("PyTorch" "Gloo")
[ "$FRAMEWORKS" = "torch tf" ] && NEED+=("TensorFlow")
command -v mpicxx >/dev/null 2>&1 && NEED+=("MPI")
for need in "${NEED[@]}"; do
    grep -q "\[X\] $need" <<<"$CHECK" || { echo "$CHECK" >&2; log "Horovod was built without $need"; exit 1; }
done
echo "$WANT_LOCAL" >"$STAMP_LOCAL"
[ "$PART" = all ] && echo "$WANT" >"$STAMP"
log "environment ready in $(( $(date +%s) - start ))s: $VENV ($PART)"
