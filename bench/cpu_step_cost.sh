#!/usr/bin/env bash
# CPU time (not wall time) of prefill and decode on the CPU backend, for a shared machine where
# wall clocks mostly measure waiting for a core. Each figure is the best of --reps runs of
# `deepinfer generate` under `perf stat -e task-clock` (or /usr/bin/time when perf is missing):
#   prefill ms  = CPU(prompt P, 1 new token) - CPU(1-word prompt, 1 new token)
#   decode ms   = (CPU(1-word prompt, N+1 new tokens) - CPU(1-word prompt, 1 new token)) / N per step
# so process start-up (tokenizer, weight load and packing) cancels out. Greedy, ignore_eos, no
# speculative decoding (DEEPINFER_USE_NEXTN_DECODE=0) unless --nextn default is given. With more
# than one thread OMP_WAIT_POLICY=passive (unless set): actively waiting OpenMP workers burn CPU
# time while they wait for a core, which would be counted as work.
#
#   bench/cpu_step_cost.sh [--bin PATH] [--model DIR] [--threads "1 2"] [--reps 5] [--decode-steps 128]
#                          [--nextn 0|default]
# Prompts: one of ~512 tokens, and 16 of ~162 tokens (the "16 x 140" batch) in one engine run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/deepinfer
MODEL=${DEEPINFER_HF_MODEL_DIR:-$ROOT/assets/default-model}
THREADS="1 2"
REPS=5
STEPS=128
NEXTN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --decode-steps) STEPS=$2; shift 2 ;;
    --nextn) NEXTN=$2; shift 2 ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "cpu_step_cost.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "cpu_step_cost.sh: $BIN not found" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
WORDS=(the model reads a long prompt about rivers mountains cities numbers 42 and code while it keeps state)
prompts() {  # words per prompt, prompts, file
  : >"$3"
  for ((i = 0; i < $2; i++)); do
    line="request $i:"
    for ((w = 0; w < $1; w++)); do line+=" ${WORDS[$(((i * 7 + w * 3) % ${#WORDS[@]}))]}"; done
    echo "$line" >>"$3"
  done
}
prompts 1 1 "$TMP/p1"
prompts 500 1 "$TMP/p512"
prompts 130 16 "$TMP/p16"
ENV_ARGS=(OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive})
[ "$NEXTN" != default ] && ENV_ARGS+=(DEEPINFER_USE_NEXTN_DECODE=$NEXTN)
cpu_ms() {  # threads, prompt file, new tokens -> best CPU ms
  local best=""
  for ((r = 0; r < REPS; r++)); do
    local v
    if command -v perf >/dev/null; then
      v=$(env "${ENV_ARGS[@]}" OMP_NUM_THREADS=$1 perf stat -x, -e task-clock "$BIN" generate -m "$MODEL" \
            --prompts-file "$2" --max-tokens "$3" --ignore-eos --temperature 0 --max-num-seqs 16 --quiet 2>&1 >/dev/null |
          awk -F, '/task-clock/ {print $1}')
    else
      v=$( { env "${ENV_ARGS[@]}" OMP_NUM_THREADS=$1 /usr/bin/time -f "%U %S" "$BIN" generate -m "$MODEL" \
            --prompts-file "$2" --max-tokens "$3" --ignore-eos --temperature 0 --max-num-seqs 16 --quiet >/dev/null; } 2>&1 |
          tail -1 | awk '{print ($1 + $2) * 1000}')
    fi
    best=$(awk -v a="$v" -v b="$best" 'BEGIN {print (b == "" || a < b) ? a : b}')
  done
  echo "$best"
}
tokens_of() { "$BIN" generate -m "$MODEL" --prompts-file "$1" --max-tokens 1 --ignore-eos --temperature 0 --max-num-seqs 16 \
                --quiet 2>&1 | sed -n 's/.*prompt tokens: \([0-9]*\).*/\1/p' | tail -1; }
echo "binary: $BIN  model: $MODEL  load: $(cut -d' ' -f1-3 /proc/loadavg)  best of $REPS  nextn: $NEXTN  ${ENV_ARGS[0]}"
echo
echo "| OMP threads | prefill ~512 tok: CPU ms | prefill 16 x ~162 tok: CPU ms | decode batch 1: CPU ms/step | start-up CPU ms |"
echo "|---:|---:|---:|---:|---:|"
for t in $THREADS; do
  base=$(cpu_ms "$t" "$TMP/p1" 1)
  p512=$(cpu_ms "$t" "$TMP/p512" 1)
  p16=$(cpu_ms "$t" "$TMP/p16" 1)
  dec=$(cpu_ms "$t" "$TMP/p1" $((STEPS + 1)))
  awk -v t="$t" -v b="$base" -v a="$p512" -v c="$p16" -v d="$dec" -v n="$STEPS" \
    'BEGIN {printf "| %d | %.1f | %.1f | %.3f | %.1f |\n", t, a - b, c - b, (d - b) / n, b}'
done
echo
echo "prompt tokens: $(tokens_of "$TMP/p512") and $(tokens_of "$TMP/p16") (16 prompts)"
