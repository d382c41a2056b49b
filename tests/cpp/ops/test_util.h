// Helpers for CPU op tests: seeded random non-zero inputs and max-abs-difference checks.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace deepinfer::ops::cpu::testing {

inline std::vector<float> randn(size_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = dist(gen); while (x == 0.0f);
  }
  return v;
}

inline double max_abs_diff(const float* a, const double* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}
inline double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  return max_abs_diff(a.data(), b.data(), std::min(a.size(), b.size()));
}

}  // namespace deepinfer::ops::cpu::testing
