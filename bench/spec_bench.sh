#!/usr/bin/env bash
# Speculative decoding on held-out text: acceptance length and decode throughput per draft length
# and batch, against plain decoding (draft length 0). Prompts are the first --prompt-chars
# characters of each line of the default model's held-out sample (text the model never trained
# on), cycled to fill each batch; greedy, ignore_eos, --max-tokens new tokens per request.
#
#   bench/spec_bench.sh [--model DIR] [--accelerator cpu|nvidia] [--nextn "0 1 2 3 4 5"]
#                       [--batches "1 8 32 64"] [--max-tokens N] [--prompt-chars N] [--varlen 0|1]
#                       [--bin PATH]
# Prints a markdown table: draft length, batch, output tok/s, speedup against draft length 0 at
# that batch (when 0 is in --nextn and comes first), acceptance length, per-position acceptance.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/deepinfer
MODEL=$ROOT/assets/default-model
ACCEL=${DEEPINFER_ACCELERATOR:-}
NEXTN="0 1 2 3 4 5"
BATCHES="1 8 32 64"
MAX_TOKENS=64
CHARS=160
VARLEN=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --accelerator) ACCEL=$2; shift 2 ;;
    --nextn) NEXTN=$2; shift 2 ;;
    --batches) BATCHES=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --prompt-chars) CHARS=$2; shift 2 ;;
    --varlen) VARLEN=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    *) echo "spec_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "spec_bench.sh: $BIN not found; run ./build.sh first" >&2; exit 1; }
HELDOUT=$ROOT/tests/data/default_model/heldout_sample.jsonl
[ -f "$HELDOUT" ] || { echo "spec_bench.sh: $HELDOUT not found" >&2; exit 1; }
ACCEL_ARGS=()
[ -n "$ACCEL" ] && ACCEL_ARGS=(--accelerator "$ACCEL")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$HELDOUT" "$CHARS" >"$TMP/all.txt" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    t = " ".join(json.loads(line).split())[: int(sys.argv[2])]
    if len(t) >= 40:
        print(t)
EOF
NPROMPTS=$(wc -l <"$TMP/all.txt")

echo "model: $MODEL  accelerator: ${ACCEL:-auto}  new tokens: $MAX_TOKENS  prompt chars: $CHARS  varlen: $VARLEN"
echo
echo "| draft len | batch | output tok/s | speedup | accept len | per-position acceptance |"
echo "|---:|---:|---:|---:|---:|---|"
declare -A BASE
for nextn in $NEXTN; do
  for b in $BATCHES; do
    : >"$TMP/prompts.txt"
    for ((i = 0; i < b; i++)); do sed -n "$((i % NPROMPTS + 1))p" "$TMP/all.txt" >>"$TMP/prompts.txt"; done
    out=$(env DEEPINFER_USE_NEXTN_DECODE="$nextn" DEEPINFER_ENABLE_MTP_VARLEN="$VARLEN" "$BIN" generate -m "$MODEL" \
          "${ACCEL_ARGS[@]}" --prompts-file "$TMP/prompts.txt" --max-tokens "$MAX_TOKENS" --ignore-eos \
          --temperature 0 --max-num-seqs "$b" --quiet 2>&1) || { echo "$out" >&2; exit 1; }
    otps=$(sed -n 's/.*throughput: \([0-9.]*\) output.*/\1/p' <<<"$out" | tail -1)
    alen=$(sed -n 's/.*acceptance length \([0-9.]*\) tokens.*/\1/p' <<<"$out" | tail -1)
    pos=$(sed -n 's/.*per position: *\(.*\)$/\1/p' <<<"$out" | tail -1)
    [ "$nextn" = 0 ] && BASE[$b]=$otps
    speed=-
    [ -n "${BASE[$b]:-}" ] && speed=$(python3 -c "print(f'{$otps / ${BASE[$b]}:.2f}x')")
    echo "| $nextn | $b | $otps | $speed | ${alen:--} | ${pos:--} |"
  done
done
