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
if command -v npm >/dev/null 2>&1; then
    if ! cmp -s "$ROOT/toolchain/package-lock.json" "$ROOT/toolchain/node_modules/.installed-lock" 2>/dev/null; then
        log "installing Azurite (npm ci in toolchain/)"
        (cd "$ROOT/toolchain" && npm ci --no-audit --no-fund --loglevel=error >&2) ||
            { log "error: npm ci in toolchain/ failed (see above): the data transfer tests need Azurite"; exit 1; }
        cp "$ROOT/toolchain/package-lock.json" "$ROOT/toolchain/node_modules/.installed-lock"
    fi
else
    log "npm not found: Azurite is not installed and the data transfer tests will skip (install Node.js and npm to run them)"
fi

STAMP="$VENV/.bootstrap-stamp"
WANT=$(cat "$ROOT/requirements.txt" "$ROOT/payloads/requirements.txt" "$ROOT/payloads/gpu-requirements.txt" "$ROOT/payloads/requirements-tensorflow.txt" "$ROOT/constraints.txt" "$ROOT/infra/requirements.txt" "$ROOT/policy/requirements.txt" "$ROOT/launcher/requirements.txt" "$ROOT/benchmarks/requirements.txt" "$ROOT/toolchain/build_horovod.sh" "$ROOT/toolchain/patch_horovod.py" \
            "$ROOT/toolchain/bootstrap.sh" "$ROOT/infra/pyproject.toml" | sha256sum | cut -d' ' -f1)

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

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/horovodrun" ]; then
    platform_is_ours || { log "installing trainingplatform from $ROOT/infra"; install_platform; }
    exit 0
fi

start=$(date +%s)
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
# A first install needs about 8 GB (torch's CUDA build 5.5 GB, TensorFlow 1.5 GB, the Horovod build): say so
# before pip fails half-way with "No space left on device".
if ! compgen -G "$VENV/lib/python3*/site-packages/torch" >/dev/null; then
    need_gb=${BOOTSTRAP_MIN_FREE_GB:-9}
    free_gb=$(( $(df -Pk "$VENV" | awk 'NR==2 {print $4}') / 1048576 ))
    if [ "$free_gb" -lt "$need_gb" ]; then
        log "error: $free_gb GB free on the disk holding $VENV; a first install needs about $need_gb GB."
        log "Free space there (old clones' .venv folders are 7-8 GB each), or make .venv a link to a folder on a"
        log "larger disk (ln -s /big/disk/venv .venv); BOOTSTRAP_MIN_FREE_GB=N changes the threshold."
        exit 1
    fi
fi
log "installing requirements.txt (torch is a large download on a machine without a local copy)"
# pip byte-compiles what it installs, and that stays: where PYTHONDONTWRITEBYTECODE is set (this workplace's
# machines) Python never writes a .pyc itself, so with --no-compile every process compiled every module it
# imported, every time (tried: set-up 226 -> 191 s, the tests 1.7 times slower).
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.txt" -c "$ROOT/constraints.txt" 2>&1 | quiet
# The platform's library (infra/pyproject.toml): `import trainingplatform` for the launcher, policy and tests.
install_platform

WHEEL=$(PYTHON="$VENV/bin/python" "$ROOT/toolchain/build_horovod.sh" | tail -1)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$WHEEL" 2>&1 | quiet

# Refuse an environment that would train without working collectives.
CHECK=$(TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/horovodrun" --check-build)
NEED=("PyTorch" "Gloo")
"$VENV/bin/python" -c "import tensorflow" 2>/dev/null && NEED+=("TensorFlow")
command -v mpicxx >/dev/null 2>&1 && NEED+=("MPI")
for need in "${NEED[@]}"; do
    grep -q "\[X\] $need" <<<"$CHECK" || { echo "$CHECK" >&2; log "Horovod was built without $need"; exit 1; }
done
echo "$WANT" >"$STAMP"
log "environment ready in $(( $(date +%s) - start ))s: $VENV"
