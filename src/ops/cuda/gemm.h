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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::ops::cuda
