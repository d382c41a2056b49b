// The arithmetic of ops/cuda engram_widen, as host/device functions (no CUDA headers), so the CPU
// tests check it against the host widen (ops/cpu engram_widen_row) on every code and exponent:
// 4 consecutive values of a stored row (dim % 4 == 0; FP8 rows have dim % 32 == 0, so a quad
// never straddles two scales). One f32 product per FP8 value, as on the host: a lone
// multiply that nvcc cannot contract (no add follows) and rounds to nearest without FTZ (the
// library is built without fast math).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/numeric.h"

namespace deepinfer::ops::cuda {

// quad: the 4 stored values from index i (i % 4 == 0) of the [rows, dim] block; scales: the
// block's [rows, dim / 32] E8M0 scales (FP8 only).
template <DType In>
DI_HD void engram_widen_quad(const void* quad, const uint8_t* scales, int64_t dim, int64_t i, float v[4]) {
  if constexpr (In == DType::kF8E4M3) {
    const uint8_t* c = static_cast<const uint8_t*>(quad);
    const float s = e8m0_to_f32(scales[(i / dim) * (dim / 32) + (i % dim) / 32]);
    for (int k = 0; k < 4; ++k) v[k] = fp8e4m3_to_f32(c[k]) * s;
  } else if constexpr (In == DType::kBF16) {
    const uint16_t* b = static_cast<const uint16_t*>(quad);
    for (int k = 0; k < 4; ++k) v[k] = bf16_to_f32(b[k]);
  } else {
    const float* f = static_cast<const float*>(quad);
    for (int k = 0; k < 4; ++k) v[k] = f[k];
  }
}

}  // namespace deepinfer::ops::cuda
