#include "ops/cpu/engram.h"

#include <gtest/gtest.h>

#include <cmath>

#include "deepinfer/error.h"
#include "test_util.h"

namespace deepinfer::ops::cpu {
namespace {
using testing::randn;

// The injection of V41-REFERENCE-NOTES.md §5 / the reference's DeepseekV41Engram.forward, in double.
std::vector<double> naive(const std::vector<float>& X, const std::vector<float>& kv, const std::vector<float>& w,
                          const std::vector<uint8_t>& dead, int64_t T, int64_t n, int64_t D, double eps,
                          std::vector<double>* gates) {
  std::vector<double> out(X.begin(), X.end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < n; ++k) {
      double hh = 0, kk = 0, dot = 0;
      for (int64_t c = 0; c < D; ++c) {
        const double h = X[(t * n + k) * D + c], key = kv[t * (n + 1) * D + k * D + c];
        hh += h * h;
        kk += key * key;
        dot += h * w[k * D + c] * key;
      }
      dot *= 1 / std::sqrt(hh / D + eps) / std::sqrt(kk / D + eps) / std::sqrt(double(D));
      double g = 1 / (1 + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6)), dot)));
      if (!dead.empty() && dead[size_t(t)]) g = 0;
      if (gates) gates->push_back(g);
      for (int64_t c = 0; c < D; ++c) out[(t * n + k) * D + c] += g * kv[t * (n + 1) * D + n * D + c];
    }
  return out;
}

TEST(Engram, InjectionMatchesNaive) {
  const int64_t T = 7, n = 4, D = 37;
  auto X = randn(T * n * D, 41), kv = randn(T * (n + 1) * D, 42), w = randn(n * D, 43, 0.3f, 1.0f);
  // Token 2 stream 1: a zero key, so dot = +0 and the gate is sigmoid(+sqrt(1e-6)) (the clamp and
  // copysign of the reference; sign(0) = +).
  for (int64_t c = 0; c < D; ++c) kv[2 * (n + 1) * D + 1 * D + c] = 0.f;
  std::vector<uint8_t> dead(size_t(T), 0);
  dead[5] = 1;
  for (bool with_dead : {false, true}) {
    std::vector<float> x = X;
    engram_inject({.x = x.data(), .kv = kv.data(), .w = w.data(), .dead = with_dead ? dead.data() : nullptr,
                   .tokens = T, .n = n, .dim = D, .eps = 1e-20f});
    std::vector<double> gates;
    const auto ref = naive(X, kv, w, with_dead ? dead : std::vector<uint8_t>{}, T, n, D, 1e-20, &gates);
    double err = 0;
    for (size_t i = 0; i < x.size(); ++i) err = std::max(err, std::abs(x[i] - ref[i]));
    EXPECT_LT(err, 2e-5) << "dead=" << with_dead;
    if (with_dead) {
      for (int64_t i = 0; i < n * D; ++i) EXPECT_EQ(x[size_t(5 * n * D + i)], X[size_t(5 * n * D + i)]);
    }
    EXPECT_NEAR(gates[size_t(2 * n + 1)], 1 / (1 + std::exp(-1e-3)), 1e-7);  // sign(0) = +
  }
  EXPECT_THROW(engram_inject({.x = nullptr, .kv = kv.data(), .w = w.data(), .tokens = T, .n = n, .dim = D}),
               InternalError);
}

}  // namespace
}  // namespace deepinfer::ops::cpu
