#!/usr/bin/env bash
# Sparse attention decode on the GPU (issue #13): correctness, timing next to the CUDA-core kernel
# and FlashMLA's ANCHORS figures, compute-sanitizer, one ncu profile at b=128. Runs a prebuilt
# cuda_ops_test (build it where nvcc is, with -DDEEPINFER_CUDA_SM90_ONLY=ON, carry it stripped):
#   bench/attention_gpu_check.sh BIN [LOG_DIR]        (LOG_DIR defaults to $OUT, else /tmp/attn)
# Prints the timing table last-but-one and the profile summary last; full logs in LOG_DIR.
set -u
BIN=${1:?usage: attention_gpu_check.sh BIN [LOG_DIR]}
O=${2:-${OUT:-/tmp/attn}}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$O/gpu.txt" 2>&1
timeout 70 "$BIN" --gtest_filter='CudaSparseAttention.*' > "$O/correct.log" 2>&1; echo "correct rc=$?"
grep -E "^\[  (PASSED|FAILED) |FAIL" "$O/correct.log" | head -20
timeout 60 "$BIN" --gtest_filter='CudaTiming.SparseAttentionDecode' > "$O/timing.log" 2>&1; echo "timing rc=$?"
grep -vE "^\[|DI_CUDA_TIME|^Note|^Running" "$O/timing.log"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
F='CudaSparseAttention.TensorCoresAgreeWithCudaCores:CudaSparseAttention.TensorCoresBatchInvariant:CudaSparseAttention.SplitKvMatchesCpuTwin'
timeout 45 "$SAN" --tool memcheck "$BIN" --gtest_filter="$F" > "$O/memcheck.log" 2>&1; echo "memcheck rc=$?"
grep -E "ERROR SUMMARY" "$O/memcheck.log"
timeout 55 "$SAN" --tool racecheck --kernel-name kernel_substring=deepinfer "$BIN" \
  --gtest_filter='CudaSparseAttention.TensorCoresAgreeWithCudaCores' > "$O/racecheck.log" 2>&1; echo "racecheck rc=$?"
grep -E "RACECHECK SUMMARY" "$O/racecheck.log"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || exit 0
DI_ATTN_TIMING_B=128 timeout 60 "$NCU" --clock-control none --kernel-name regex:sparse_attn_mma --launch-skip 30 \
  --launch-count 1 --kill yes --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy "$BIN" --gtest_filter='CudaTiming.SparseAttentionDecode' > "$O/ncu.txt" 2>&1
grep -E "Duration|Throughput|Issue Slot|Warp Cycles" "$O/ncu.txt" | head -12
