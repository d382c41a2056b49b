// FP8 weight-only GEMM for small M (decode): y[M, N] = x[M, K] · Wᵀ with bf16 activations and the
// release checkpoint's FP8 weight as stored — e4m3 bytes [N, K] plus one e8m0 scale per block of
// scale_rows × scale_k (V4: 128×128; V4.1: 32×32) — dequantised exactly in registers (e4m3 · 2^e is a bf16 value) and fed to bf16 tensor
// cores with fp32 accumulation. Memory-bound: it reads 1 byte per weight instead of bf16's 2.
// The same kernel also takes plain bf16 weights (Fp8wGemmParams::w_bf16): identical k order and
// reduction order, so FP8 weights give bit-for-bit the output of their bf16 dequantisation
// (dequant_fp8w_bf16) through that path — the test of the in-register dequantisation.
// Order of the reduction: fixed by (N, K, batch, SM count), never by M, so results are
// deterministic run to run and every token's output is bit-identical whatever the batch size (the
// model's chunked-vs-full and batch-vs-alone checks rely on it). K is split over the blocks of a
// thread-block cluster (<= 8) when N alone does not fill the GPU; the partial sums meet in
// distributed shared memory and are added in split order inside the kernel. `workspace` is no
// longer used (fp8w_workspace_bytes() is 0); the fields stay for callers that still size one.
// For large M dequantise once (dequant_fp8w_bf16, to a bf16 scratch) and use the cuBLASLt GEMM.
// CPU twin: ops/cpu/gemm.h linear over the dequantised weight (tests/cpp/cuda/gemm_fp8w_test.cc).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

// Largest exponent byte the in-register dequantisation takes: scale 2^(e-127) ≤ 2^7 (weights'
// scales are amax/448 ≤ 1 in practice). Larger scales: dequantise at upload instead.
constexpr int kFp8wMaxScaleExp = 134;

struct Fp8wGemmParams {
  const void* x = nullptr;        // bf16 [batch][M, K]; row stride ldx, batch b at x + b*batch_stride_x
  int64_t ldx = 0;
  const uint8_t* w = nullptr;     // e4m3 [batch*N, K] contiguous (batch b = rows b*N ..)
  const uint8_t* scale = nullptr; // e8m0 [ceil(batch*N/scale_rows), ceil(K/scale_k)] of the whole [batch*N, K] matrix
  int64_t scale_rows = 128;       // rows per scale row: 128 (checkpoint grid), or a divisor of 128 for
                                  // stacked linears whose parts are not 128-row aligned (W1|W3)
  int64_t scale_k = 128;          // inputs per scale column: 128 (V4's 128x128 blocks), 64 or 32 (V4.1's 32x32)
  const void* w_bf16 = nullptr;   // instead of w/scale: bf16 [batch*N, K] contiguous (same kernel, no scales)
  void* y = nullptr;              // [batch][M, N] out_dtype; row stride ldy, batch b at y + b*batch_stride_y
  int64_t ldy = 0;
  DType out_dtype = DType::kBF16; // bf16 or f32
  int64_t M = 0, N = 0, K = 0;    // K % 16 == 0; ldx % 8 == 0 and x 16-byte aligned
  int64_t batch = 1;
  int64_t batch_stride_x = 0, batch_stride_y = 0;  // elements
  float* workspace = nullptr;     // f32, >= fp8w_workspace_bytes(M, N, K, batch, num_sms) (may be 0 bytes)
  size_t workspace_bytes = 0;
  int num_sms = 132;              // the device's SM count (sets the K split)
  int max_splits = 0;             // 0: the default split rule; 1..8 caps it (benchmarks of the rule)
};

// Rows of one kernel launch at most (8 token tiles of 8); larger M runs in chunks of this many.
constexpr int64_t kFp8wMaxM = 64;
// Splits of K the kernel uses for this shape (1: no workspace).
int fp8w_splits(int64_t M, int64_t N, int64_t K, int64_t batch, int num_sms, int max_splits = 0);
// Workspace bytes for the shape (0 when K is not split). Grows with num_sms; an upper bound for
// any GPU up to `num_sms` SMs.
size_t fp8w_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t batch, int num_sms);

// Validates (InvalidArgument naming the field), then launches on `stream`. Graph-capturable.
void gemm_fp8w(const Fp8wGemmParams& p, cudaStream_t stream);
// Several FP8 linears that read the same x (V4: wq_a and wkv on the attention-normed h):
// y_i[M, N_i] = x · W_iᵀ for i < num_parts, in ONE launch when their K splits agree (the split of
// each (N_i, K) alone; small matrices all take the cluster's 8), else one launch each. Either way
// every y_i is bit-identical to gemm_fp8w of that part alone (same split, same k order), so fusing
// saves a launch's fixed cost without changing a bit. FP8 weights only, batch 1.
constexpr int kFp8wMaxParts = 4;
struct Fp8wPart {
  const uint8_t* w = nullptr;      // e4m3 [N, K]
  const uint8_t* scale = nullptr;  // e8m0 [ceil(N/scale_rows), ceil(K/scale_k)]
  void* y = nullptr;               // [M, N] out_dtype, row stride ldy >= N
  int64_t ldy = 0, N = 0;
};
struct Fp8wMultiParams {
  const void* x = nullptr;         // bf16 [M, K], row stride ldx (shared by every part)
  int64_t ldx = 0;
  int64_t M = 0, K = 0;
  const Fp8wPart* parts = nullptr; // num_parts in 1..kFp8wMaxParts
  int num_parts = 0;
  int64_t scale_rows = 128, scale_k = 128;  // as Fp8wGemmParams, for every part
  DType out_dtype = DType::kBF16;
  int num_sms = 132;
};
// Validates every part (InvalidArgument naming it); true when the parts run as one launch.
bool gemm_fp8w_multi_fuses(const Fp8wMultiParams& p);
void gemm_fp8w_multi(const Fp8wMultiParams& p, cudaStream_t stream);



// FP8 [N, K] + e8m0 scales -> bf16 [N, K] (K % 16 == 0), the values the GEMM
// uses; one pass, 16 weights per thread (3 bytes of traffic per weight).
struct Fp8wDequantParams {
  const uint8_t* w = nullptr;
  const uint8_t* scale = nullptr; // [ceil(N/scale_rows), ceil(K/scale_k)]
  void* out = nullptr;
  int64_t N = 0, K = 0;
  int64_t scale_rows = 128;
  int64_t scale_k = 128;          // 128, 64 or 32
};
void dequant_fp8w_bf16(const Fp8wDequantParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
