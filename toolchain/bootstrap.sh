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

STAMP="$VENV/.bootstrap-stamp"
WANT=$(cat "$ROOT/requirements.txt" "$ROOT/payloads/requirements.txt" "$ROOT/constraints.txt" "$ROOT/infra/requirements.txt" "$ROOT/policy/requirements.txt" "$ROOT/launcher/requirements.txt" "$ROOT/benchmarks/requirements.txt" "$ROOT/toolchain/build_horovod.sh" "$ROOT/toolchain/patch_horovod.py" \
            "$ROOT/toolchain/bootstrap.sh" | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/horovodrun" ]; then
    exit 0
fi

start=$(date +%s)
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null ||
    log "warning: $("$PY" --version) found; the pins are tested on Python 3.11"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PY" -m venv "$VENV"
fi
log "installing requirements.txt (torch is a large download on a machine without a local copy)"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.txt" -c "$ROOT/constraints.txt" 2>&1 | quiet

WHEEL=$(PYTHON="$VENV/bin/python" "$ROOT/toolchain/build_horovod.sh" | tail -1)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$WHEEL" 2>&1 | quiet

# Refuse an environment that would train without working collectives.
CHECK=$("$VENV/bin/horovodrun" --check-build)
for need in "PyTorch" "Gloo"; do
    grep -q "\[X\] $need" <<<"$CHECK" || { echo "$CHECK" >&2; log "Horovod was built without $need"; exit 1; }
done
echo "$WANT" >"$STAMP"
log "environment ready in $(( $(date +%s) - start ))s: $VENV"
