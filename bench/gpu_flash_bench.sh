#!/usr/bin/env bash
# First timing of a V4-Flash-shaped stack on one GPU: writes a random full-width checkpoint
# (deepinfer make-flash-stack: hidden 4096, 64 heads x 512, 256 experts top-6 of width 2048, vocab
# 129280, layers 0..N-1 of the Flash schedule, release FP8/FP4 formats), then times the engine
# (deepinfer bench-flash, DEEPINFER_ACCELERATOR=nvidia): prefill of a 4096-token prompt (TTFT,
# tokens/s) and decode steps at batch 1, 8, 32 with ~4K context (TPOT), each against its floor
# (bytes / 4.3 TB/s, FLOPs / 790 TFLOP/s, scaled to the layers present) and per layer next to the
# transformers eager numbers of ANCHORS.md. The table is printed last.
#   bench/gpu_flash_bench.sh [--layers N] [--small] [--jobs N] [--clean] [-- extra bench-flash args]
#     --layers N   layers of the stack (default 6: S S C H C H = sliding, CSA, HCA, hash and biased MoE).
#                  Routed experts stay FP4 on the device (~3.5 GiB per layer with bf16 dense linears,
#                  ~34 layers fit the H200); the stack takes 3.7 GB per layer on disk, so the 64 GB
#                  disk of the one-GPU machine holds about 13 (--layers 13: 48.6 GB, written in 35 s).
#                  bench-flash's floor still counts routed experts in bf16 ("as uploaded").
#     --small      reduced widths, prompt 512, 8 decode steps, batches 1,2: tests this script in
#                  seconds, e.g. DEEPINFER_ACCELERATOR=cpu BUILD_DIR=build bench/gpu_flash_bench.sh --small
#     --clean      delete the stack afterwards
#     --also-graphs  then time decode again in a second process with DEEPINFER_CUDA_GRAPHS=1 (the
#                  fixed-shape decode path with CUDA graphs; one more weight upload, ~1-1.5 min)
# Environment: BUILD_DIR (default /tmp/di-gpu-model-build, the full-tree build that
# tools/gpu_check.sh -> tools/gpu_model_check.sh leaves; the deepinfer target is built there if
# the binary lacks the bench commands, or the tree is configured there from scratch), STACK_DIR
# (default /tmp/di-flash-stack), DEEPINFER_ACCELERATOR (default nvidia), BENCH_TIMEOUT (s, 480).
# Device example (one call, ~4-5 min after gpu_check has built the tree):
#   run: tools/gpu_check.sh && bench/gpu_flash_bench.sh     carry: [".gpudeps"]
# Logs and flash_bench.jsonl go to $OUT (when set) so they come back with the call.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LAYERS=6; SMALL=0; JOBS=$(nproc); CLEAN=0; GRAPHS=0; EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) LAYERS=$2; shift ;;
    --small) SMALL=1 ;;
    --jobs) JOBS=$2; shift ;;
    --clean) CLEAN=1 ;;
    --also-graphs) GRAPHS=1 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n 2,23p "$0"; exit 0 ;;
    *) echo "gpu_flash_bench: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
LOG_DIR=${OUT:-/tmp/di-flash-bench-logs}
mkdir -p "$LOG_DIR"
export PATH=/usr/local/cuda/bin:$PATH
export DEEPINFER_ACCELERATOR=${DEEPINFER_ACCELERATOR:-nvidia}
T0=$(date +%s)
step() { echo "== gpu_flash_bench [$(( $(date +%s) - T0 ))s] $*"; }

# ---- dependencies: the carried .debs (tools/gpu_deps.sh) ----
source "$ROOT/tools/gpu_deps.sh"
di_use_gpu_deps || exit 1

# ---- the deepinfer binary: reuse, build the target in an existing tree, or configure one ----
BUILD=${BUILD_DIR:-/tmp/di-gpu-model-build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
BIN=$BUILD/deepinfer
has_cmds() { [ -x "$BIN" ] && "$BIN" bench-flash --help >/dev/null 2>&1 && "$BIN" make-flash-stack --help >/dev/null 2>&1; }
# gpu_check.sh --scope full builds every target in /tmp/di-gpu-build: take that binary when it is current.
if [ -z "${BUILD_DIR:-}" ] && ! has_cmds && [ -x /tmp/di-gpu-build/deepinfer ]; then
  BIN=/tmp/di-gpu-build/deepinfer
  has_cmds || BIN=$BUILD/deepinfer
fi
if has_cmds; then
  step "using $BIN"
else
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
    CUDA_ARGS=(-DDEEPINFER_CUDA_SM90_ONLY=ON)
    [ "$DEEPINFER_ACCELERATOR" = cpu ] && CUDA_ARGS=(-DDEEPINFER_ENABLE_CUDA=OFF)
    step "configure $BUILD (full tree)"
    cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_BUILD_PYTHON=OFF \
      -DDEEPINFER_BUILD_TESTS=OFF "${CUDA_ARGS[@]}" "${CMAKE_DEP_ARGS[@]}" >"$LOG_DIR/flash_configure.log" 2>&1 \
      || { tail -30 "$LOG_DIR/flash_configure.log"; exit 1; }
  fi
  step "build deepinfer in $BUILD (-j$JOBS)"
  cmake --build "$BUILD" -j "$JOBS" --target deepinfer >"$LOG_DIR/flash_build.log" 2>&1 \
    || { grep -E "error|Error" "$LOG_DIR/flash_build.log" | head -40; tail -20 "$LOG_DIR/flash_build.log"; exit 1; }
  has_cmds || { echo "gpu_flash_bench: $BIN lacks make-flash-stack/bench-flash"; exit 1; }
fi

# ---- the stack ----
STACK=${STACK_DIR:-/tmp/di-flash-stack}
BENCH_ARGS=(--prompt-len 4096 --decode-steps 64 --warmup-steps 4 --batches 1,8,32 --kv-cache-gib 4); REPS=2
MAKE_ARGS=(--out "$STACK" --layers "$LAYERS")
if [ "$SMALL" = 1 ]; then
  STACK=${STACK_DIR:-/tmp/di-flash-stack-small}
  MAKE_ARGS=(--out "$STACK" --layers "$LAYERS" --small)
  BENCH_ARGS=(--prompt-len 512 --decode-steps 8 --warmup-steps 2 --batches 1,2 --kv-cache-gib 1); REPS=1
fi
mkdir -p "$(dirname "$STACK")"
df -h "$(dirname "$STACK")" | tail -1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm \
  --format=csv,noheader 2>/dev/null
step "make-flash-stack ${MAKE_ARGS[*]}"
"$BIN" make-flash-stack "${MAKE_ARGS[@]}" --quiet 2>"$LOG_DIR/flash_stack.err" || { tail -20 "$LOG_DIR/flash_stack.err"; exit 1; }
"$BIN" bench-flash -m "$STACK" "${BENCH_ARGS[@]}" "${EXTRA[@]}" --floors-only

# ---- the timing run ----
step "bench-flash (DEEPINFER_ACCELERATOR=$DEEPINFER_ACCELERATOR, timeout ${BENCH_TIMEOUT:-480}s)"
timeout "${BENCH_TIMEOUT:-480}" "$BIN" bench-flash -m "$STACK" "${BENCH_ARGS[@]}" --prefill-reps "$REPS" "${EXTRA[@]}" \
  --json "$LOG_DIR/flash_bench.jsonl" >"$LOG_DIR/flash_bench.out" 2>"$LOG_DIR/flash_bench.err"
RC=$?
grep -E "^bench-flash:|deepseek_v4 cuda:|rror|OutOfMemory" "$LOG_DIR/flash_bench.err" | tr '\r' '\n' | grep -v uploading | head -30
[ "$RC" = 0 ] || { echo "gpu_flash_bench: bench-flash rc=$RC (124 = timeout)"; tail -5 "$LOG_DIR/flash_bench.err" | tr '\r' '\n' | tail -5; }
RC2=0
if [ "$GRAPHS" = 1 ] && [ "$RC" = 0 ]; then
  step "bench-flash decode again with DEEPINFER_CUDA_GRAPHS=1"
  DEEPINFER_CUDA_GRAPHS=1 timeout "${BENCH_TIMEOUT:-480}" "$BIN" bench-flash -m "$STACK" "${BENCH_ARGS[@]}" "${EXTRA[@]}" \
    --prefill-reps 0 --json "$LOG_DIR/flash_bench_graphs.jsonl" >"$LOG_DIR/flash_bench_graphs.out" \
    2>"$LOG_DIR/flash_bench_graphs.err"
  RC2=$?
  grep -E "^bench-flash:|rror|OutOfMemory" "$LOG_DIR/flash_bench_graphs.err" | tr '\r' '\n' | grep -v uploading | head -20
  [ "$RC2" = 0 ] || echo "gpu_flash_bench: graphs run rc=$RC2 (124 = timeout)"
fi
[ "$CLEAN" = 1 ] && rm -rf "$STACK"
cat "$LOG_DIR/flash_bench.out"
[ "$GRAPHS" = 1 ] && [ -s "$LOG_DIR/flash_bench_graphs.out" ] && { echo; echo "--- DEEPINFER_CUDA_GRAPHS=1:"; cat "$LOG_DIR/flash_bench_graphs.out"; }
echo "gpu_flash_bench: rc=$RC graphs_rc=$RC2 total $(( $(date +%s) - T0 ))s"
[ "$RC" = 0 ] && [ "$RC2" = 0 ]
