// Dense GEMMs through cuBLASLt: y[M,N] = alpha · x[M,K] · w[N,K]ᵀ + beta · y  (an nn.Linear),
// row-major with explicit leading dimensions, bf16 operands, fp32 accumulation, bf16 or fp32
// output. Strided batches cover the grouped output projection (wo_a viewed [groups, r, K]).
// FP8 block-scaled checkpoint weights are dequantised to bf16 first (quant.h,
// dequant_fp8_blockwise); the native block-scaled FP8 path is still to do (docs/CUDA.md).
// CPU twin: ops/cpu/gemm.h linear / gemm.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/dtype.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::ops::cuda {

struct GemmParams {
  const void* x = nullptr;  // [batch][M, K] row-major, leading dim ldx (elements)
  int64_t ldx = 0;
  const void* w = nullptr;  // [batch][N, K] row-major, leading dim ldw
  int64_t ldw = 0;
  void* y = nullptr;        // [batch][M, N] row-major, leading dim ldy
  int64_t ldy = 0;
  DType in_dtype = DType::kBF16;   // x and w: bf16 (f32 runs as plain fp32 SGEMM, for tests)
  DType out_dtype = DType::kBF16;  // bf16 or f32
  int64_t M = 0, N = 0, K = 0;
  int64_t batch = 1;               // strided batch (elements between consecutive matrices)
  int64_t batch_stride_x = 0, batch_stride_w = 0, batch_stride_y = 0;
  float alpha = 1.0f, beta = 0.0f; // beta = 0 ignores y's prior contents
};

// Block-scaled FP8 GEMM (DeepSeek layout, Hopper cuBLASLt): y[M,N] = (q_x ⊙ s_x) · (q_w ⊙ s_w)ᵀ
// with 1×128 activation scales (quant.h quantize_fp8_act) and 128×128 weight scales, fp32
// accumulation promoted per 128-block, bf16 or f32 output. K % 128 == 0, N % 16 == 0 and
// M % 4 == 0 (cuBLASLt 13.0 on the H200 refuses M = 1, 2: pad decode batches to 4 rows).
struct Fp8GemmParams {
  const uint8_t* x = nullptr;     // [M, K] e4m3, contiguous
  const float* x_scale = nullptr; // [K/128, M] f32, M contiguous (quantize_fp8_act's layout)
  const uint8_t* w = nullptr;     // [N, K] e4m3, contiguous (the checkpoint tensor)
  const float* w_scale = nullptr; // [ceil(N/128), K/128] f32 (checkpoint e8m0 through e8m0_scales_to_f32)
  void* y = nullptr;              // [M, N], leading dim ldy
  int64_t ldy = 0;
  DType out_dtype = DType::kBF16;
  int64_t M = 0, N = 0, K = 0;
};

// A cuBLASLt handle, its workspace and a cache of chosen algorithms (one heuristic query per
// distinct shape/layout/alignment). Move-only; one per device per thread of launches.
class CublasLt {
 public:
  explicit CublasLt(size_t workspace_bytes = size_t(32) << 20, int device = 0);
  ~CublasLt();
  CublasLt(CublasLt&&) noexcept;
  CublasLt& operator=(CublasLt&&) noexcept;
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  // Validates (InvalidArgument naming the field), then launches on `stream`. Graph-capturable
  // once the shape has been seen (the heuristic query is host-only either way).
  void gemm(const GemmParams& p, cudaStream_t stream);
  // Throws InvalidArgument for unsupported shapes, CudaError when cuBLASLt has no algorithm
  // (pre-Hopper GPUs, cuBLAS < 12.9): then dequantise the weight and use gemm().
  void gemm_fp8_block(const Fp8GemmParams& p, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::ops::cuda
