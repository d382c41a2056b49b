#!/usr/bin/env bash
# Builds deepinfer with CUDA and runs the CUDA op tests (each kernel vs its CPU twin or formula),
# then prints a short table: op, worst max-rel-error over its cases, tolerance, pass; and the
# kernel timings. Meant for the GPU machine (device tool), where the image has CUDA, cmake and
# ninja but none of the Debian -dev packages: run tools/fetch_gpu_deps.sh here first and carry
# .gpudeps; this script unpacks the .debs with dpkg -x into a private prefix.
#   tools/gpu_check.sh [--build-only] [--scope ops|full] [--no-sanitize] [--sanitize-model] [--jobs N]
#     --build-only  configure + build, run nothing on the GPU (also works on a machine without one)
#     --scope ops   (default) build a staged copy holding only core/ops/cli + their tests, so
#                   half-finished modules elsewhere in the working tree cannot break the check
#     --scope full  build the tree as it is
#     (default)     after the op tests, compute-sanitizer over them (tools/cuda_sanitize.sh): memcheck
#                   on every suite (one process each), racecheck on each test of the suites whose
#                   kernels use shared memory, SAN_BUDGET seconds in all (default 100, half of it
#                   kept for racecheck: RACECHECK_SHARE), a table of errors per suite / test
#                   (also in $OUT/sanitizer_summary.txt)
#     --no-sanitize skip compute-sanitizer (--sanitize, its old opt-in, is accepted and the default)
#     --sanitize-model  also memcheck the GPU model tests (tools/gpu_model_check.sh --sanitize, up to 400 s)
#     --prebuilt D  run the test binaries in D (made here by tools/pack_prebuilt.sh; carry D) instead
#                   of configuring and building on the GPU machine: saves the device minutes a build costs
# Device example (one call):
#   run: tools/gpu_check.sh   carry: [".gpudeps"]
# Logs go to $OUT (when set) so they come back with the call.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_ONLY=0; SCOPE=ops; SANITIZE=1; SANITIZE_MODEL=0; JOBS=$(nproc); PREBUILT=
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) BUILD_ONLY=1 ;;
    --scope) SCOPE=$2; shift ;;
    --sanitize) SANITIZE=1 ;;
    --no-sanitize) SANITIZE=0 ;;
    --sanitize-model) SANITIZE_MODEL=1 ;;
    --jobs) JOBS=$2; shift ;;
    --prebuilt) PREBUILT=$(cd "$2" && pwd); shift ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
LOG_DIR=${OUT:-/tmp/di-gpu-check-logs}
mkdir -p "$LOG_DIR"
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
step() { echo "== gpu_check [$(( $(date +%s) - T0 ))s] $*"; }

# ---- dependencies: the carried .debs (tools/gpu_deps.sh) ----
source "$ROOT/tools/gpu_deps.sh"
di_use_gpu_deps || exit 1
# The CPU references (CPU twins, golden comparisons) run with the OpenBLAS kernels the test
# suite pins (tools/openblas_coretype.sh says why).
OPENBLAS_CORETYPE=$("$ROOT/tools/openblas_coretype.sh")
[ -n "$OPENBLAS_CORETYPE" ] && export OPENBLAS_CORETYPE && echo "gpu_check: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"

SRC=$ROOT
if [ -n "$PREBUILT" ]; then
  TEST_BIN=$PREBUILT/cuda_ops_test
  export LD_LIBRARY_PATH=$PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [ -x "$TEST_BIN" ] || { echo "gpu_check: $TEST_BIN missing (tools/pack_prebuilt.sh)"; exit 1; }
  step "prebuilt binaries from $PREBUILT"
else
  # ---- source tree: the whole checkout, or a staged copy of what the op tests need ----
  SRC=$ROOT
  if [ "$SCOPE" = ops ]; then
    SRC=/tmp/di-gpu-stage
    rm -rf "$SRC" && mkdir -p "$SRC"
    paths=(CMakeLists.txt include src/core src/cli src/ops tests/cpp/CMakeLists.txt tests/cpp/core tests/cpp/ops tests/cpp/cuda
           src/engine/sampler.h src/engine/sampler.cpp src/engine/philox.h)  # the sampler test's CPU reference
    existing=()
    for p in "${paths[@]}"; do [ -e "$p" ] && existing+=("$p"); done
    tar cf - "${existing[@]}" | tar xf - -C "$SRC"
    step "staged ${existing[*]} into $SRC"
  fi
  BUILD=${BUILD_DIR:-/tmp/di-gpu-build}
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)

  step "configure ($SCOPE scope, sm_90a only)"
  cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_BUILD_PYTHON=OFF \
    -DDEEPINFER_CUDA_SM90_ONLY=ON "${CMAKE_DEP_ARGS[@]}" >"$LOG_DIR/configure.log" 2>&1 \
    || { tail -30 "$LOG_DIR/configure.log"; exit 1; }
  grep -E "deepinfer:" "$LOG_DIR/configure.log"
  TARGETS=(cuda_ops_test)
  [ "$SCOPE" = full ] && TARGETS=(all)
  step "build ${TARGETS[*]} (-j$JOBS)"
  cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >"$LOG_DIR/build.log" 2>&1 \
    || { grep -E "error|Error" "$LOG_DIR/build.log" | head -40; tail -20 "$LOG_DIR/build.log"; exit 1; }
  TEST_BIN=$(find "$BUILD" -name cuda_ops_test -type f -perm -u+x | head -1)
  [ -n "$TEST_BIN" ] || { echo "gpu_check: cuda_ops_test was not built (CUDA off?)"; exit 1; }
fi
[ "$BUILD_ONLY" = 1 ] && { step "build only: done"; exit 0; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader 2>/dev/null
export DEEPINFER_SOURCE_DIR=$SRC DEEPINFER_SHARED_DIR=$ROOT/../shared
step "CUDA op tests"
"$TEST_BIN" --gtest_color=no >"$LOG_DIR/cuda_tests.log" 2>&1
TEST_RC=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[  FAILED  \]|Failure|expected|Which is" "$LOG_DIR/cuda_tests.log" | head -40

SAN_RC=skipped
if [ "$SANITIZE" = 1 ]; then
  step "compute-sanitizer: memcheck on every op-test suite, racecheck on the shared-memory ones (budget ${SAN_BUDGET:-100}s, ${RACECHECK_SHARE:-50}% kept for racecheck)"
  tools/cuda_sanitize.sh "$TEST_BIN" "$LOG_DIR"
  SAN_RC=$?
fi

# ---- golden checks (model level) run here once tools/golden_check.sh exists ----
GOLD=skipped
if [ -x tools/golden_check.sh ]; then
  step "golden checks"; tools/golden_check.sh >"$LOG_DIR/golden.log" 2>&1 && GOLD=pass || GOLD=FAIL
fi

# ---- GPU model checks (DeepseekV4CudaModel, tests/cpp/cuda_model) ----
MODEL=skipped
if [ -x tools/gpu_model_check.sh ] && [ "$BUILD_ONLY" = 0 ]; then
  step "GPU model checks (tools/gpu_model_check.sh)"
  SAN_ARG=(); [ "$SANITIZE_MODEL" = 1 ] && SAN_ARG=(--sanitize)
  [ -n "$PREBUILT" ] && SAN_ARG+=(--prebuilt "$PREBUILT")
  tools/gpu_model_check.sh --jobs "$JOBS" "${SAN_ARG[@]}" >"$LOG_DIR/gpu_model.log" 2>&1 && MODEL=pass || MODEL=FAIL
  grep -E "^\[gpu-|FAILED|gpu_model_check:|ERROR SUMMARY|error" "$LOG_DIR/gpu_model.log" | head -60
fi

# ---- engine smoke: the main job (generate on the bundled default model) through the GPU ----
SMOKE=skipped
CLI=""
if [ -n "$PREBUILT" ] && [ -x "$PREBUILT/deepinfer" ]; then CLI=$PREBUILT/deepinfer
elif [ -n "${BUILD:-}" ] && [ -x "$BUILD/deepinfer" ]; then CLI=$BUILD/deepinfer; fi
if [ -n "$CLI" ] && [ "$BUILD_ONLY" = 0 ]; then
  step "engine smoke: deepinfer generate on the default model, DEEPINFER_ACCELERATOR=nvidia"
  M=/tmp/di-default-model
  { [ -f "$M/config.json" ] || "$CLI" make-default-model --out "$M" >"$LOG_DIR/smoke.log" 2>&1; } &&
    DEEPINFER_ACCELERATOR=nvidia timeout 120 "$CLI" generate -m "$M" --max-tokens 64 --ignore-eos --max-num-seqs 16 \
      -p "Hello" -p "The capital of France is" -p "def fib(n):" -p "1, 2, 3," >>"$LOG_DIR/smoke.log" 2>&1 \
    && SMOKE=pass || SMOKE=FAIL
  grep -vE "^\s*$" "$LOG_DIR/smoke.log" | grep -iE "tok/s|tokens/s|backend|error|cuda" | tail -6
fi

# A test binary of the stages below: the prebuilt pack's, else the build folder's ("" when neither has it).
test_bin() {
  if [ -n "$PREBUILT" ] && [ -x "$PREBUILT/$1" ]; then echo "$PREBUILT/$1"
  elif [ -n "${BUILD:-}" ]; then find "$BUILD" -name "$1" -type f -perm -u+x 2>/dev/null | head -1; fi
}

# ---- data-parallel ranks on the GPU (processes sharing it; experts sharded): tokens == one rank ----
DP=skipped
# The test starts its worker ranks as `deepinfer rank-worker`; its baked-in CLI path is this
# machine's build folder, so a prebuilt pack points it at the pack's CLI.
DP_BIN=$(test_bin engine_dp_test)
if [ -n "$PREBUILT" ] && [ "$DP_BIN" = "$PREBUILT/engine_dp_test" ]; then export DEEPINFER_CLI=$PREBUILT/deepinfer; fi
if [ -n "$DP_BIN" ] && [ "$BUILD_ONLY" = 0 ]; then
  step "data-parallel / expert-parallel / context-parallel GPU ranks (engine_dp_test, DEEPINFER_TEST_ACCELERATOR=nvidia)"
  # Batch-invariant: a request's batch differs between the layouts (dp_llm_test.cc says so), and
  # production numerics round a row differently in another batch (a seeded draw can flip).
  DEEPINFER_TEST_ACCELERATOR=nvidia DEEPINFER_BATCH_INVARIANT=1 timeout 300 "$DP_BIN" --gtest_filter='*DataParallel*:*ContextParallelLLM*' \
    >"$LOG_DIR/dp_gpu.log" 2>&1 \
    && DP=pass || DP=FAIL
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$LOG_DIR/dp_gpu.log" | head -10
fi

# ---- the engine's bit-identity checks on the GPU (issues #12, #16): the CPU suites' cases, run
# with DEEPINFER_TEST_ACCELERATOR=nvidia (batch invariance vs 1..255 neighbours, prefix-cache hits,
# eviction, host tier, chunking, drafting and grammars: tokens and logprob bits) ----
INV=skipped
INV_BIN=$(test_bin engine_test)
if [ -n "$INV_BIN" ] && [ "$BUILD_ONLY" = 0 ]; then
  step "engine bit-identity on the GPU (engine_test PrefixCacheInvariance.*, BatchInvariance.*)"
  DEEPINFER_TEST_ACCELERATOR=nvidia timeout 300 "$INV_BIN" --gtest_filter='PrefixCacheInvariance.*:BatchInvariance.*' \
    >"$LOG_DIR/invariance_gpu.log" 2>&1 && INV=pass || INV=FAIL
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK |^\[  FAILED  \]" "$LOG_DIR/invariance_gpu.log" | head -20
fi

# ---- the KV hand-off between two processes over CUDA IPC (issue #18): 7 bundles, bit-identical ----
IPC=skipped
IPC_BIN=$(test_bin server_kv_ipc_gpu_test)
if [ -n "$IPC_BIN" ] && [ "$BUILD_ONLY" = 0 ]; then
  step "KV hand-off over CUDA IPC between two processes (server_kv_ipc_gpu_test)"
  timeout 120 "$IPC_BIN" --gtest_filter='KvIpcGpu.TwoProcessesHandOffBitIdentical' >"$LOG_DIR/kv_ipc_gpu.log" 2>&1 \
    && IPC=pass || IPC=FAIL
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$LOG_DIR/kv_ipc_gpu.log" | head -5
fi

# ---- the device-side expert-parallel exchange (issue #14): kernels vs twins, loopback ranks, and
# the backend's MoE through an NCCL group of one, bit for bit against one rank ----
EP=skipped
EP_BINS=()
for t in ep_device_test ep_backend_gpu_test; do
  b=$(test_bin "$t"); [ -n "$b" ] && EP_BINS+=("$b")
done
if [ ${#EP_BINS[@]} -gt 0 ] && [ "$BUILD_ONLY" = 0 ]; then
  step "expert-parallel device exchange (${EP_BINS[*]##*/})"
  EP=pass
  for b in "${EP_BINS[@]}"; do
    timeout 180 "$b" --gtest_color=no >"$LOG_DIR/$(basename "$b").log" 2>&1 || EP=FAIL
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]" "$LOG_DIR/$(basename "$b").log" | head -5
  done
fi

echo
echo "op                   cases  max_rel_err  tolerance  result"
grep '^DI_CUDA_ERR|' "$LOG_DIR/cuda_tests.log" | awk -F'|' '
  { op=$2; n[op]++; if (!(op in worst) || $4+0 > worst[op]+0 || $4=="inf") { worst[op]=$4; tol[op]=$5 }
    if ($6 != "PASS") bad[op]++; order[op] = order[op] ? order[op] : ++k }
  END { for (op in order) idx[order[op]] = op
        for (i = 1; i <= k; i++) { op = idx[i]
          printf "%-20s %5d  %11s  %9s  %s\n", op, n[op], worst[op], tol[op], (bad[op] ? "FAIL(" bad[op] ")" : "pass") } }'
echo
echo "kernel          shape                     median_us  rate"
grep '^DI_CUDA_TIME|' "$LOG_DIR/cuda_tests.log" | awk -F'|' '{ printf "%-15s %-25s %9s  %s\n", $2, $3, $4, $5 }'
echo
echo "tests rc=$TEST_RC  sanitizer=$SAN_RC  golden=$GOLD  model=$MODEL  smoke=$SMOKE  dp=$DP  invariance=$INV  ipc=$IPC  ep=$EP  total $(( $(date +%s) - T0 ))s"
[ "$TEST_RC" = 0 ] && { [ "$SAN_RC" = skipped ] || [ "$SAN_RC" = 0 ]; } && [ "$MODEL" != FAIL ] && [ "$SMOKE" != FAIL ] && [ "$DP" != FAIL ] && [ "$INV" != FAIL ] && [ "$IPC" != FAIL ] && [ "$EP" != FAIL ]
