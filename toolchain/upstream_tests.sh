#!/usr/bin/env bash
# Horovod 0.28.1's own parallel tests, run against the patched build in .venv: the fork judged by upstream's judge.
#
#   toolchain/upstream_tests.sh [torch] [tensorflow] [keras]      (default: all three)
#
# Each suite runs as upstream's CI runs it on CPUs: two processes under `horovodrun -np 2 --gloo`, pytest in each
# (test/parallel/test_torch.py, test_tensorflow.py, test_tensorflow2_keras.py). The PyPI sdist carries no tests: they
# come from Horovod's repository at tag v0.28.1, downloaded from GitHub, or HOROVOD_TESTS=<a checkout's test/ folder>
# (`git -C horovod archive v0.28.1 test | tar -x`). What fails and why: docs/toolchain.md#the-horovod-fork.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || { echo "upstream_tests: no $PY: run toolchain/bootstrap.sh first" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/horovod-0.28.1"
if [ -n "${HOROVOD_TESTS:-}" ]; then
    cp -r "$HOROVOD_TESTS" "$WORK/horovod-0.28.1/test"
else
    curl -fsSL https://github.com/horovod/horovod/archive/refs/tags/v0.28.1.tar.gz \
        | tar -xz -C "$WORK" horovod-0.28.1/test \
        || { echo "upstream_tests: cannot download Horovod's v0.28.1 sources: set HOROVOD_TESTS" >&2; exit 2; }
fi
# Upstream's tests import `mock` (test/utils/common.py) and `parameterized` (the Keras suite): beside the tests, not in .venv.
"$PY" -m pip install --quiet --target "$WORK/deps" mock parameterized 2>&1 | { grep -v "is neither a file" || true; } >&2
declare -A FILES=([torch]=test_torch.py [tensorflow]=test_tensorflow.py [keras]=test_tensorflow2_keras.py)
status=0
for suite in "${@:-torch tensorflow keras}"; do
    for one in $suite; do
        file=${FILES[$one]:?"upstream_tests: $one: choose torch, tensorflow or keras"}
        echo "== $one: horovodrun -np 2 --gloo pytest $file" >&2
        (cd "$WORK/horovod-0.28.1/test/parallel" && \
            PATH="$ROOT/.venv/bin:$PATH" PYTHONPATH="$WORK/deps${PYTHONPATH:+:$PYTHONPATH}" "$ROOT/.venv/bin/horovodrun" -np 2 -H localhost:2 --gloo \
            "$PY" -m pytest -q -p no:cacheprovider "$file") || status=1
    done
done
exit $status
