#!/usr/bin/env bash
# The GPU grid of `bench/run_sweep.sh --flash-grid`: a V4-Flash-shaped stack (deepinfer
# make-flash-stack: full widths, release FP8/FP4 formats, random values) timed by the engine over
# contexts x batch sizes (deepinfer bench-flash --grid: prefill TTFT at each context, decode step
# time at each (context, batch), each against its floor), then transformers' DeepseekV4ForCausalLM
# on the same GPU at the sizes it can do (bench/hf_flash_peer.py, when torch + transformers import),
# then a CSV, a markdown table and PNG plots (bench/sweep_report.py; plots need matplotlib).
#
#   bench/run_sweep.sh --flash-grid [--layers N] [--grid SPEC] [--peer-grid SPEC] [--no-peer]
#                      [--steps N] [--small] [--out DIR] [--bin PATH] [--keep-stack]
#     --layers N      layers of the stack (default 4: S S C H; ~3.7 GB per layer on disk)
#     --grid SPEC     engine points "CTX:B,B,...;CTX:B" (default
#                     "4096:1,8,32,128,256;32768:1,8,32,128,256;131072:1")
#     --peer-grid     transformers points (default "4096:1,8;1024:32": its eager attention runs out
#                     of memory beyond; an out-of-memory point is recorded as such)
#     --steps N       timed decode steps per point (default 16)
#     --small         reduced widths and contexts: tests this script on a CPU in a few minutes
#     --out DIR       results (default $OUT when set, else /tmp/di-flash-grid)
# Decode points whose batch x context exceeds 262,144 tokens share one cached context prefix
# (bench-flash --shared-context-above; marked "shared ctx"), so a 32K context at batch 256 needs one
# long prefill, not 256; --calibrate-shared re-runs the largest distinct batch of each context shared,
# to show how much the shared (cache-resident) context flatters attention.
# Environment: DEEPINFER_ACCELERATOR (default nvidia; cpu with --small), STACK_DIR, PYTHON (python3).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/deepinfer
LAYERS=4; SMALL=0; STEPS=16; PEER=1; KEEP=0
GRID="4096:1,8,32,128,256;32768:1,8,32,128,256;131072:1"
PEER_GRID="4096:1,8;1024:32"
RES=${OUT:-/tmp/di-flash-grid}
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) LAYERS=$2; shift 2 ;;
    --grid) GRID=$2; shift 2 ;;
    --peer-grid) PEER_GRID=$2; shift 2 ;;
    --no-peer) PEER=0; shift ;;
    --steps) STEPS=$2; shift 2 ;;
    --small) SMALL=1; shift ;;
    --out) RES=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --keep-stack) KEEP=1; shift ;;
    -h|--help) sed -n 2,25p "$0"; exit 0 ;;
    *) echo "flash_grid: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "flash_grid: $BIN not found; run ./build.sh first (or pass --bin)" >&2; exit 1; }
PY=${PYTHON:-python3}
MAKE_ARGS=(--layers "$LAYERS"); KV_GIB=16; DEV=cuda
if [ "$SMALL" = 1 ]; then
  MAKE_ARGS+=(--small); KV_GIB=1
  [ "$GRID" = "4096:1,8,32,128,256;32768:1,8,32,128,256;131072:1" ] && GRID="512:1,4;1024:1,8"
  [ "$PEER_GRID" = "4096:1,8;1024:32" ] && PEER_GRID="256:1,2"
  export DEEPINFER_ACCELERATOR=${DEEPINFER_ACCELERATOR:-cpu}
fi
export DEEPINFER_ACCELERATOR=${DEEPINFER_ACCELERATOR:-nvidia}
[ "$DEEPINFER_ACCELERATOR" = cpu ] && DEV=cpu
STACK=${STACK_DIR:-/tmp/di-flash-grid-stack-$LAYERS$([ "$SMALL" = 1 ] && echo -small)}
mkdir -p "$RES"
T0=$(date +%s)
step() { echo "== flash_grid [$(( $(date +%s) - T0 ))s] $*"; }

step "make-flash-stack --out $STACK ${MAKE_ARGS[*]}"
"$BIN" make-flash-stack --out "$STACK" "${MAKE_ARGS[@]}" --quiet || exit 1
rm -f "$RES/engine.jsonl" "$RES/peer.jsonl"
step "bench-flash --grid \"$GRID\" (DEEPINFER_ACCELERATOR=$DEEPINFER_ACCELERATOR)"
"$BIN" bench-flash -m "$STACK" --grid "$GRID" --decode-steps "$STEPS" --warmup-steps 2 --prefill-reps 1 \
  --kv-cache-gib "$KV_GIB" --calibrate-shared --json "$RES/engine.jsonl" >"$RES/engine.txt" 2>"$RES/engine.err"
RC=$?
grep -E "^bench-flash:" "$RES/engine.err" | tr '\r' '\n' | grep -v uploading
[ "$RC" = 0 ] || { echo "flash_grid: bench-flash rc=$RC"; tail -5 "$RES/engine.err"; }
cat "$RES/engine.txt"

PEER_RC=skipped
if [ "$PEER" = 1 ]; then
  if "$PY" -c "import torch, transformers; from transformers import DeepseekV4ForCausalLM" 2>/dev/null; then
    step "transformers peer --grid \"$PEER_GRID\""
    "$PY" "$ROOT/bench/hf_flash_peer.py" --model "$STACK" --grid "$PEER_GRID" --device "$DEV" --steps 8 \
      --json "$RES/peer.jsonl" --time-limit "${PEER_TIME_LIMIT:-150}" 2>"$RES/peer.err" | grep -v "^$"
    PEER_RC=${PIPESTATUS[0]}
    [ "$PEER_RC" = 0 ] || tail -5 "$RES/peer.err"
  else
    echo "flash_grid: no transformers peer ($PY cannot import torch + transformers with DeepseekV4ForCausalLM)"
  fi
fi
step "report"
FILES=("$RES/engine.jsonl"); [ -s "$RES/peer.jsonl" ] && FILES+=("$RES/peer.jsonl")
[ -s "$RES/engine.jsonl" ] && "$PY" "$ROOT/bench/sweep_report.py" --out "$RES" "${FILES[@]}" | tee "$RES/sweep.md"
[ "$KEEP" = 1 ] || rm -rf "$STACK"
step "done: bench-flash rc=$RC, peer rc=$PEER_RC, results in $RES"
[ "$RC" = 0 ]
