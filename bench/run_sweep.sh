#!/usr/bin/env bash
# Throughput sweep of `deepinfer generate` over batch sizes and prompt lengths.
# Prints a markdown table (batch, prompt tokens, output tokens, TTFT, TPOT, output tok/s, total tok/s).
#
#   bench/run_sweep.sh [--model DIR] [--accelerator cpu|nvidia] [--batches "1 4 16"]
#                      [--prompt-words "16 128"] [--max-tokens N] [--nextn "0 5"] [--varlen 0|1]
#                      [--temperature T] [--bin PATH]
#   bench/run_sweep.sh --flash-grid [...]   the GPU grid on a V4-Flash-shaped stack: decode step time at
#                      batch 1..256 x context 4K/32K/128K, prefill TTFT, transformers in the same run,
#                      CSV + PNG plots (bench/flash_grid.sh --help)
# Defaults: the bundled default model, batches "1 4 16", prompt words "16 128", 32 new tokens,
# the engine's default draft length (DEEPINFER_USE_NEXTN_DECODE unset), fixed draft lengths.
# --nextn sweeps the maximum draft length (0 = no speculative decoding); --varlen 1 turns on
# variable-length verification. Greedy (--temperature 0) with ignore_eos so every request
# produces exactly --max-tokens tokens. The acceptance length column is the mean tokens committed
# per verify step ("-" without drafts).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --flash-grid ]; then shift; exec "$ROOT/bench/flash_grid.sh" "$@"; fi
BIN=$ROOT/build/deepinfer
MODEL=${DEEPINFER_HF_MODEL_DIR:-$ROOT/assets/default-model}
ACCEL=${DEEPINFER_ACCELERATOR:-}
BATCHES="1 4 16"
WORDS="16 128"
MAX_TOKENS=32
NEXTN=default
VARLEN=0
TEMP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --accelerator) ACCEL=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --prompt-words) WORDS=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --nextn) NEXTN=$2; shift 2 ;;
    --varlen) VARLEN=$2; shift 2 ;;
    --temperature) TEMP=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    -h|--help) sed -n 2,17p "$0"; exit 0 ;;
    *) echo "run_sweep.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "run_sweep.sh: $BIN not found; run ./build.sh first" >&2; exit 1; }
[ -d "$MODEL" ] || { echo "run_sweep.sh: model folder $MODEL not found" >&2; exit 1; }
ACCEL_ARGS=()
[ -n "$ACCEL" ] && ACCEL_ARGS=(--accelerator "$ACCEL")

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
WORDLIST=(the model reads a long prompt about rivers mountains cities numbers 42 and code while it keeps state)

echo "model: $MODEL  accelerator: ${ACCEL:-auto}  new tokens per request: $MAX_TOKENS  varlen: $VARLEN  temperature: $TEMP"
echo
echo "| draft len | batch | prompt words | prompt tok | output tok | TTFT ms | TPOT ms | output tok/s | total tok/s | accept len |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for nextn in $NEXTN; do
 ENV_ARGS=(DEEPINFER_ENABLE_MTP_VARLEN=$VARLEN)
 [ "$nextn" != default ] && ENV_ARGS+=(DEEPINFER_USE_NEXTN_DECODE=$nextn)
 for words in $WORDS; do
  for b in $BATCHES; do
    : >"$TMP/prompts.txt"
    for ((i = 0; i < b; i++)); do
      line="request $i:"
      for ((w = 0; w < words; w++)); do line+=" ${WORDLIST[$(((i * 7 + w * 3) % ${#WORDLIST[@]}))]}"; done
      echo "$line" >>"$TMP/prompts.txt"
    done
    out=$(env "${ENV_ARGS[@]}" "$BIN" generate -m "$MODEL" "${ACCEL_ARGS[@]}" --prompts-file "$TMP/prompts.txt" \
          --max-tokens "$MAX_TOKENS" --ignore-eos --temperature "$TEMP" --seed 1 --max-num-seqs "$b" --quiet 2>&1) \
      || { echo "$out" >&2; exit 1; }
    ptok=$(sed -n 's/.*prompt tokens: \([0-9]*\).*/\1/p' <<<"$out" | tail -1)
    otok=$(sed -n 's/.*output tokens: \([0-9]*\).*/\1/p' <<<"$out" | tail -1)
    ttft=$(sed -n 's/.*TTFT: \([0-9.]*\) ms.*/\1/p' <<<"$out" | tail -1)
    tpot=$(sed -n 's/.*TPOT: \([0-9.]*\) ms.*/\1/p' <<<"$out" | tail -1)
    otps=$(sed -n 's/.*throughput: \([0-9.]*\) output.*/\1/p' <<<"$out" | tail -1)
    ttps=$(sed -n 's/.*, \([0-9.]*\) total tok\/s.*/\1/p' <<<"$out" | tail -1)
    alen=$(sed -n 's/.*acceptance length \([0-9.]*\) tokens.*/\1/p' <<<"$out" | tail -1)
    echo "| $nextn | $b | $words | $ptok | $otok | $ttft | $tpot | $otps | $ttps | ${alen:--} |"
  done
 done
done
