#!/usr/bin/env bash
# The test suite: C++ tests (ctest) and Python tests (pytest). Run ./build.sh first.
set -euo pipefail
cd "$(dirname "$0")"
BUILD_DIR=${BUILD_DIR:-build}
# The OpenBLAS kernels the tests pin (tools/openblas_coretype.sh says why); ctest's own
# environment carries the same value.
OPENBLAS_CORETYPE=$(tools/openblas_coretype.sh)
[ -n "$OPENBLAS_CORETYPE" ] && export OPENBLAS_CORETYPE || unset OPENBLAS_CORETYPE
ctest --test-dir "$BUILD_DIR" -j "$(nproc)" --output-on-failure --timeout 900
if ls tests/python/test_*.py >/dev/null 2>&1; then
  python3 -m pytest -q tests/python
fi
