#!/usr/bin/env bash
# The opt-in GPU paths that wait for a device check (docs/CUDA.md, "Opt-in paths waiting for a device
# check"), in ONE device call with ONE pack of main (tools/pack_prebuilt.sh): each path's GPU tests with
# its switch on, compute-sanitizer on its kernels, then the V4 4-layer and the V4.1 6-layer stacks with
# the switches off and on in the same binary (same card, same call: the only fair comparison).
#   device: tar xJf build-pack/pack.tar.xz -C build-pack && bench/gpu_optin_check.sh build-pack/pack
#   carry:  ["build-pack"]                         (~9-10 min of device time; STAGES= to run a subset)
# Stages (STAGES, default "hc engram moe v4 v41"): hc = DEEPINFER_HC_SINGLE_LAUNCH=1 (hc_pre at 1..8
# tokens in one cluster launch + the fused site norm), engram = DEEPINFER_ENGRAM_WIDEN=device (V4.1
# Engram rows widened on the device), moe = DEEPINFER_MOE_DECODE_VARIANT=17..24 (grouped MoE decode with
# row bands / L2 prefetch). Logs under $OUT (one tar), a short summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
P=$(cd "${1:-build-pack/pack}" && pwd)
OUT=${OUT:-/tmp/optin}; L=$OUT/optin; mkdir -p "$L"
STAGES=${STAGES:-hc engram moe v4 v41}
export LD_LIBRARY_PATH=$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PATH=/usr/local/cuda/bin:$PATH DEEPINFER_SOURCE_DIR=$PWD
OB=$(tools/openblas_coretype.sh 2>/dev/null); [ -n "$OB" ] && export OPENBLAS_CORETYPE=$OB
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$L/gpu.txt"
t() { local name=$1 lim=$2; shift 2; el "$name"; timeout "$lim" "$@" --gtest_color=no > "$L/$name.log" 2>&1; echo "$name rc=$?" >> "$L/rc.txt"; }
san() { local name=$1 lim=$2 tool=$3 kern=$4; shift 4
  el "$name"; timeout "$lim" compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kernel_substring="$kern" "$@" \
    --gtest_color=no > "$L/$name.log" 2>&1; echo "$name rc=$?" >> "$L/rc.txt"; }
if has hc; then
  export DEEPINFER_HC_SINGLE_LAUNCH=1
  t hc_tests 120 "$P/cuda_ops_test" --gtest_filter='CudaHc.*'
  t hc_timing 120 "$P/cuda_ops_test" --gtest_filter='CudaTiming.HcSiteGraph'
  san hc_memcheck 100 memcheck hc_ --launch-count 400 "$P/cuda_ops_test" --gtest_filter='CudaHc.SingleLaunch*:CudaHc.FusedNorm*'
  san hc_racecheck 90 racecheck hc_pre_cluster --launch-count 100 "$P/cuda_ops_test" --gtest_filter='CudaHc.SingleLaunch*'
  t hc_engine 120 "$P/cuda_model_test" --gtest_filter='GpuEngine.*BatchInvariant*:GpuEngine.GraphReplayEqualsEager*:*GpuGraph.ReplayEqualsEager*:*V41GpuGraphs.*:*Greedy64MatchesCpuModel*'
  unset DEEPINFER_HC_SINGLE_LAUNCH
fi
if has engram; then
  t engram_tests 60 "$P/cuda_ops_test" --gtest_filter='CudaEngram*'
  san engram_memcheck 90 memcheck engram "$P/cuda_ops_test" --gtest_filter='CudaEngramWiden.*:-CudaEngramWiden.Timing'
  DEEPINFER_ENGRAM_WIDEN=device t engram_model 240 "$P/cuda_model_test" --gtest_filter='V41*'
fi
if has moe; then
  t moe_tests 120 "$P/cuda_model_test" --gtest_filter='MoeDecodeGrouped.*:MoeFp4Pairs.*:-MoeDecodeGrouped.Timing:MoeDecodeGrouped.TimingKernels'
  t moe_timing 60 "$P/cuda_model_test" --gtest_filter='MoeDecodeGrouped.TimingKernels'
  DI_MOE_GROUPED_TEST_VARIANTS=17,18,19,20,21,22,23,24 san moe_memcheck 70 memcheck v17_ "$P/cuda_model_test" \
    --gtest_filter='MoeDecodeGrouped.MatchesHostTwin:MoeDecodeGrouped.BatchInvariant'
fi
flash() { local tag=$1 m=$2; shift 2; el "bench $tag"
  env "$@" "$P/deepinfer" bench-flash -m "$m" --accelerator nvidia --kv-cache-gib 8 --prompt-len 4096 --decode-steps 16 \
    --warmup-steps 3 --batches 1,8,32 --prefill-reps 2 > "$L/flash-$tag.log" 2>&1; echo "flash-$tag rc=$?" >> "$L/rc.txt"; }
if has v4; then
  el "make v4 stack"; "$P/deepinfer" make-flash-stack --out /tmp/fs4 --layers 4 > "$L/make-fs4.log" 2>&1
  flash v4-off /tmp/fs4 X=0; flash v4-hc /tmp/fs4 DEEPINFER_HC_SINGLE_LAUNCH=1
  flash v4-off2 /tmp/fs4 X=0; flash v4-hc2 /tmp/fs4 DEEPINFER_HC_SINGLE_LAUNCH=1
  rm -rf /tmp/fs4
fi
if has v41; then
  el "make v41 stack"; "$P/deepinfer" make-flash-stack --family v41 --out /tmp/v41 --layers 6 --engram-rows 1048576 > "$L/make-v41.log" 2>&1
  flash v41-off /tmp/v41 X=0; flash v41-engram /tmp/v41 DEEPINFER_ENGRAM_WIDEN=device
  flash v41-moe20 /tmp/v41 DEEPINFER_MOE_DECODE_VARIANT=20; flash v41-moe19 /tmp/v41 DEEPINFER_MOE_DECODE_VARIANT=19
  flash v41-all /tmp/v41 DEEPINFER_ENGRAM_WIDEN=device DEEPINFER_HC_SINGLE_LAUNCH=1 DEEPINFER_MOE_DECODE_VARIANT=20
  rm -rf /tmp/v41
fi
el done
echo "== summary"; cat "$L/rc.txt"
for f in "$L"/*.log; do
  grep -HE "^\[  PASSED|^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY" "$f" | sed "s#$L/##" | head -4
done
grep -hE "DI_HC_GRAPH|DI_CUDA_TIME" "$L"/hc_timing.log "$L"/engram_tests.log 2>/dev/null | head -20
for f in "$L"/flash-*.log; do echo "-- $(basename "$f" .log)"; grep -E "prefill|decode" "$f" | grep -E "ms" | tail -5; done
tar czf "$OUT/optin-logs.tgz" -C "$OUT" optin && rm -rf "$L"
