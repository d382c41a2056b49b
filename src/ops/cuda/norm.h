// RMSNorm on the GPU: y = w ⊙ (x / sqrt(mean(x²) + eps)), fp32 accumulation (spec §6).
// CPU twin: ops/cpu/rmsnorm.h (same operation order: x·r first, then ·w).
// Rows up to 1,024 wide take one warp each (8 rows a block), wider ones a 256-thread block with the
// row in registers up to 4,096 (a second pass over x beyond); all in the order of norm_row.cuh.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

struct RmsNormParams {
  const void* x = nullptr;     // [rows, dim] dtype x_dtype, row stride x_stride (elements)
  DType x_dtype = DType::kBF16;
  int64_t x_stride = 0;
  const void* w = nullptr;     // [dim] dtype w_dtype, or null (unweighted: per-head q norm, HC RMS)
  DType w_dtype = DType::kBF16;
  void* y = nullptr;           // [rows, dim] dtype y_dtype, row stride y_stride; may alias x
  DType y_dtype = DType::kBF16;
  int64_t y_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;
  // The two-pass one-block-per-row kernel of sessions <= 14: the bit-identity and timing baseline
  // (CudaRmsNorm.FastKernelsBitIdenticalToLegacy, CudaTiming.RmsNormDecode). Every kernel gives
  // the same bits (the sum of squares in one fixed order, ops/cuda/norm_row.cuh).
  bool legacy = false;
};

// Validates, launches on `stream`; throws InvalidArgument naming the bad field.
void rmsnorm(const RmsNormParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
