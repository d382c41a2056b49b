// Clamped SwiGLU (spec §5): out = silu(min(gate, limit)) · clamp(up, -limit, limit) [· row_weight],
// computed in fp32, cast to out's dtype. limit <= 0 disables both clamps. The optional per-row
// weight is the routed-expert weight, applied before the down projection as the reference does.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

struct SwigluParams {
  const void* gate = nullptr;  // [rows, inter] row stride gate_stride (W1 x)
  int64_t gate_stride = 0;
  const void* up = nullptr;    // [rows, inter] row stride up_stride (W3 x); may be gate + inter (fused [W1;W3])
  int64_t up_stride = 0;
  DType in_dtype = DType::kBF16;
  const float* row_weight = nullptr;  // [rows] f32 or null
  void* out = nullptr;         // [rows, inter] row stride out_stride
  int64_t out_stride = 0;
  DType out_dtype = DType::kBF16;
  int64_t rows = 0, inter = 0;
  float limit = 10.0f;
};

void swiglu(const SwigluParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
