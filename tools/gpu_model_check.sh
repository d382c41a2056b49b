#!/usr/bin/env bash
# Builds and runs the GPU model tests (tests/cpp/cuda_model: glue kernels vs host twins, the
# host-side plan, the golden fixtures through DeepseekV4CudaModel, greedy chain vs the CPU model)
# on the GPU machine. Called by tools/gpu_check.sh at its end; also runs alone:
#   tools/gpu_model_check.sh [--build-only] [--sanitize] [--jobs N] [--prebuilt DIR]
#   (--prebuilt: run DIR/cuda_model_test made here by tools/pack_prebuilt.sh instead of building)
# Device example (one call):  run: tools/gpu_model_check.sh --sanitize   carry: [".gpudeps"]
# Needs the carried .gpudeps (tools/fetch_gpu_deps.sh) on the GPU image, like gpu_check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_ONLY=0; SANITIZE=0; JOBS=$(nproc); PREBUILT=
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) BUILD_ONLY=1 ;;
    --sanitize) SANITIZE=1 ;;
    --jobs) JOBS=$2; shift ;;
    --prebuilt) PREBUILT=$(cd "$2" && pwd); shift ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "gpu_model_check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
LOG_DIR=${OUT:-/tmp/di-gpu-check-logs}
mkdir -p "$LOG_DIR"
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
step() { echo "== gpu_model_check [$(( $(date +%s) - T0 ))s] $*"; }

# ---- dependencies: the carried .debs (tools/gpu_deps.sh) ----
source "$ROOT/tools/gpu_deps.sh"
di_use_gpu_deps || exit 1
# The CPU references (CPU twins, golden comparisons) run with the OpenBLAS kernels the test
# suite pins (tools/openblas_coretype.sh says why).
OPENBLAS_CORETYPE=$("$ROOT/tools/openblas_coretype.sh")
[ -n "$OPENBLAS_CORETYPE" ] && export OPENBLAS_CORETYPE && echo "gpu_model_check: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
if [ -n "$PREBUILT" ]; then
  TEST_BIN=$PREBUILT/cuda_model_test
  export LD_LIBRARY_PATH=$PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [ -x "$TEST_BIN" ] || { echo "gpu_model_check: $TEST_BIN missing (tools/pack_prebuilt.sh)"; exit 1; }
else
  BUILD=${MODEL_BUILD_DIR:-/tmp/di-gpu-model-build}
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  step "configure (full tree, sm_90a only)"
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_BUILD_PYTHON=OFF \
    -DDEEPINFER_CUDA_SM90_ONLY=ON "${CMAKE_DEP_ARGS[@]}" >"$LOG_DIR/model_configure.log" 2>&1 \
    || { tail -30 "$LOG_DIR/model_configure.log"; exit 1; }
  step "build cuda_model_test (-j$JOBS)"
  cmake --build "$BUILD" -j "$JOBS" --target cuda_model_test >"$LOG_DIR/model_build.log" 2>&1 \
    || { grep -E "error|Error" "$LOG_DIR/model_build.log" | head -40; tail -20 "$LOG_DIR/model_build.log"; exit 1; }
  TEST_BIN=$(find "$BUILD" -name cuda_model_test -type f -perm -u+x | head -1)
  [ -n "$TEST_BIN" ] || { echo "gpu_model_check: cuda_model_test was not built (CUDA off?)"; exit 1; }
fi
[ "$BUILD_ONLY" = 1 ] && { step "build only: done"; exit 0; }

export DEEPINFER_SOURCE_DIR=$ROOT DEEPINFER_SHARED_DIR=$ROOT/../shared
step "GPU model tests"
"$TEST_BIN" --gtest_color=no >"$LOG_DIR/cuda_model_tests.log" 2>&1
TEST_RC=$?
grep -E "^\[gpu-|^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \]|Failure|Which is|Expected|error" \
  "$LOG_DIR/cuda_model_tests.log" | head -200
SAN_RC=skipped
if [ "$SANITIZE" = 1 ] && command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer memcheck (glue kernels + tiny fixture full/chunked/decode, exact and bf16)"
  timeout 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$TEST_BIN" \
    --gtest_filter='GlueKernels.*:Fixtures/GpuGolden.FullChunkedDecodeMatchTransformers/tiny_exact:Fixtures/GpuGolden.FullChunkedDecodeMatchTransformers/tiny_bf16' \
    >"$LOG_DIR/model_sanitizer.log" 2>&1
  SAN_RC=$?
  grep -E "ERROR SUMMARY|Invalid|out of bounds" "$LOG_DIR/model_sanitizer.log" | head -10
fi
echo "gpu_model_check: tests rc=$TEST_RC sanitizer=$SAN_RC total $(( $(date +%s) - T0 ))s"
[ "$TEST_RC" = 0 ] && { [ "$SAN_RC" = skipped ] || [ "$SAN_RC" = 0 ]; }
