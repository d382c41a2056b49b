// Mean and standard deviation of an f32 tensor (the bench stacks' value scales).
#pragma once
#include <cmath>
#include <utility>

#include "core/tensor.h"

namespace deepinfer::flash_stack_test {
inline std::pair<double, double> moments(const Tensor& t) {
  const float* p = t.data<float>();
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += p[i], s2 += double(p[i]) * p[i];
  const double m = s / double(t.numel());
  return {m, std::sqrt(s2 / double(t.numel()) - m * m)};
}
}  // namespace deepinfer::flash_stack_test
