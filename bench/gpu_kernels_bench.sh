#!/usr/bin/env bash
# Kernel benchmarks on one GPU, from prebuilt op-test binaries (tools/pack_prebuilt.sh builds
# cuda_ops_test): the dense FP8 weight GEMM at decode sizes (gemm_fp8w, V4-Flash dense shapes,
# M = 1..128, next to bf16 cuBLASLt on the dequantised weights, both timed in CUDA graphs) and the
# grouped expert GEMM at prefill size (FP4 / FP8, 4096 tokens x 6 experts of 256). With BEFORE set
# to a second binary (the same tests linked against the previous kernels), both run alternately
# in the same call, so "before" and "after" share the card and its state.
#   BIN=pack/cuda_ops_test [BEFORE=pack/cuda_ops_test_before] [REPS=2] bench/gpu_kernels_bench.sh
# Writes kernels_<name>_<rep>.log and a summary to $OUT (or /tmp/di-kernels-bench).
set -uo pipefail
BIN=${BIN:?BIN=path to cuda_ops_test}
BEFORE=${BEFORE:-}
REPS=${REPS:-2}
LOG=${OUT:-/tmp/di-kernels-bench}
mkdir -p "$LOG"
FILTER='CudaGemmFp8w.Timing:CudaGemmFp8w.MultiTiming:CudaGroupedGemm.FlashShapeTiming'
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
for rep in $(seq 1 "$REPS"); do
  for which in after before; do
    bin=$BIN
    if [ "$which" = before ]; then [ -n "$BEFORE" ] || continue; bin=$BEFORE; fi
    "$bin" --gtest_color=no --gtest_filter="$FILTER" >"$LOG/kernels_${which}_${rep}.log" 2>&1
    echo "bench: $which rep $rep rc=$?"
  done
done
# Summary: the fp8w table of the last rep (after, then before) and the grouped GEMM lines.
for which in after before; do
  f="$LOG/kernels_${which}_${REPS}.log"
  [ -f "$f" ] || continue
  echo "== $which: gemm_fp8w (graph-timed per launch) vs bf16 cuBLASLt"
  grep '^DI_FP8W_TABLE' "$f" | cut -d'|' -f2-
  grep -q '^DI_FP8W_SPLITS' "$f" && { echo "== $which: gemm_fp8w with the K split capped"; grep '^DI_FP8W_SPLITS' "$f" | cut -d'|' -f2-; }
  grep -qE '^DI_FP8W_(MULTI|FIXED)' "$f" && { echo "== $which: gemm_fp8w_multi (wq_a + wkv) and a tiny launch"; grep -E '^DI_FP8W_(MULTI|FIXED)' "$f" | cut -d'|' -f2-; }
  echo "== $which: grouped expert GEMM"
  grep -E '^DI_CUDA_TIME\|(grouped_gemm|moe_route)' "$f" | cut -d'|' -f2-
done | tee "$LOG/kernels_summary.txt"
