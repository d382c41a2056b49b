// RMSNorm over the last dimension, fp32: y = x / sqrt(mean(x^2) + eps) * w.
#pragma once
#include <cstdint>

namespace deepinfer::ops::cpu {

// rows × dim; row r of x starts at x + r*x_stride, of y at y + r*y_stride (strides in elements,
// >= dim). `w` [dim] may be null for the unweighted form (per-head q norm, mHC input RMS).
// In place (x == y with equal strides) is allowed.
void rmsnorm(const float* x, int64_t x_stride, const float* w, float* y, int64_t y_stride, int64_t rows,
             int64_t dim, float eps);

}  // namespace deepinfer::ops::cpu
