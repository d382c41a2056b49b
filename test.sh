#!/usr/bin/env bash
# The test suite: C++ tests (ctest) and Python tests (pytest). Run ./build.sh first.
set -euo pipefail
cd "$(dirname "$0")"
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" -j "$(nproc)" --output-on-failure --timeout 900
if ls tests/python/test_*.py >/dev/null 2>&1; then
  python3 -m pytest -q tests/python
fi
