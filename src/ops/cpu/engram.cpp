#include "ops/cpu/engram.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/numeric.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"
#include "deepinfer/error.h"

namespace deepinfer::ops::cpu {

void engram_inject(const EngramArgs& a) {
  const int64_t n = a.n, D = a.dim;
  DI_CHECK(a.x && a.kv && a.w && n > 0 && D > 0 && a.tokens >= 0, "engram_inject: bad arguments");
  parallel_for(0, a.tokens * n, [&](int64_t i) {
    const int64_t t = i / n, k = i % n;
    float* h = a.x + (t * n + k) * D;
    const float* key = a.kv + t * (n + 1) * D + k * D;
    const float* value = a.kv + t * (n + 1) * D + n * D;
    const float* w = a.w + k * D;
    float hh = 0.f, kk = 0.f, dot = 0.f;
    for (int64_t c = 0; c < D; ++c) {
      hh += h[c] * h[c];
      kk += key[c] * key[c];
      dot += h[c] * w[c] * key[c];
    }
    const float rstd = (1.0f / std::sqrt(hh / float(D) + a.eps)) * (1.0f / std::sqrt(kk / float(D) + a.eps));
    dot = dot * rstd * (1.0f / std::sqrt(float(D)));
    float gate = 1.0f / (1.0f + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6f)), dot)));
    if (a.dead && a.dead[t]) gate = 0.f;
    for (int64_t c = 0; c < D; ++c) h[c] += gate * value[c];
  }, grain_for(6 * D));
}

void engram_widen_row(DType dtype, const void* row, const uint8_t* row_scales, int64_t dim, float* out) {
  switch (dtype) {
    case DType::kF8E4M3: {
      if (dim % 32 != 0 || !row_scales) DI_THROW(InvalidArgument, "engram_widen_row: FP8 row of ", dim, " values needs an E8M0 scale per 32");
      const auto* c = static_cast<const uint8_t*>(row);
      for (int64_t j = 0; j < dim; ++j) out[j] = fp8e4m3_to_f32(c[j]) * e8m0_to_f32(row_scales[j / 32]);
      return;
    }
    case DType::kBF16: {
      const auto* b = static_cast<const uint16_t*>(row);
      for (int64_t j = 0; j < dim; ++j) out[j] = bf16_to_f32(b[j]);
      return;
    }
    case DType::kF32: std::memcpy(out, row, size_t(dim) * sizeof(float)); return;
    default: DI_THROW(InvalidArgument, "engram_widen_row: table dtype ", dtype_name(dtype));
  }
}

}  // namespace deepinfer::ops::cpu
