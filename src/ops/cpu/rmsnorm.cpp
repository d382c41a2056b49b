#include "ops/cpu/rmsnorm.h"

#include <cmath>

#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

namespace deepinfer::ops::cpu {

void rmsnorm(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride, int64_t rows,
             int64_t dim, float eps) {
  parallel_for(0, rows, [&](int64_t r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    double ss = 0.0;  // double accumulation: order-independent to well below fp32 rounding
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(float(ss / double(dim)) + eps);
    if (w) {
      for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
    } else {
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv;
    }
  }, grain_for(3 * dim));
}

}  // namespace deepinfer::ops::cpu
