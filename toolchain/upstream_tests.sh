#!/usr/bin/env bash
# Horovod 0.28.1's own parallel tests, run against the patched build in .venv: the fork judged by upstream's judge.
#
#   toolchain/upstream_tests.sh [torch] [tensorflow] [keras]      (default: all three)
#
# Each suite runs as upstream's CI runs it on CPUs: two processes under `horovodrun -np 2 --gloo`, pytest in each
# (test/parallel/test_torch.py, test_tensorflow.py, test_tensorflow2_keras.py from the sdist the build patched;
# HOROVOD_SDIST=path/to/horovod-0.28.1.tar.gz offline). What fails and why: docs/toolchain.md#the-horovod-fork.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { echo "upstream_tests: no $PY: run toolchain/bootstrap.sh first" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ -n "${HOROVOD_SDIST:-}" ]; then
    cp "$HOROVOD_SDIST" "$WORK/"
else
    "$PY" -m pip download --quiet --no-deps --no-binary :all: horovod==0.28.1 -d "$WORK" 2>&1 | { grep -v "is neither a file" || true; } >&2
fi
tar -xzf "$WORK"/horovod-0.28.1.tar.gz -C "$WORK" horovod-0.28.1/test
declare -A FILES=([torch]=test_torch.py [tensorflow]=test_tensorflow.py [keras]=test_tensorflow2_keras.py)
status=0
for suite in "${@:-torch tensorflow keras}"; do
    for one in $suite; do
        file=${FILES[$one]:?"upstream_tests: $one: choose torch, tensorflow or keras"}
        echo "== $one: horovodrun -np 2 --gloo pytest $file" >&2
        (cd "$WORK/horovod-0.28.1/test/parallel" && \
            PATH="$ROOT/.venv/bin:$PATH" "$ROOT/.venv/bin/horovodrun" -np 2 -H localhost:2 --gloo \
            "$PY" -m pytest -q -p no:cacheprovider "$file") || status=1
    done
done
exit $status
