#include "ops/cpu/engram.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ops/cuda/engram_widen_values.h"
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

// ---- the Engram row widen: the host widen (engram_widen_row) against the GPU kernel's arithmetic
// (ops/cuda/engram_widen_values.h, compiled here for the host), bit for bit ----

// 256 rows x 256 FP8 codes, code j at column j, row r's scale k = (r + 37k) mod 256: every
// (code, E8M0 exponent) pair once, NaN codes and the NaN scale included (NaN checked as NaN).
TEST(CpuEngramWiden, DeviceArithmeticEqualsHostWidenOnEveryCodeAndExponent) {
  const int64_t rows = 256, dim = 256;
  std::vector<uint8_t> codes(size_t(rows * dim)), scales(size_t(rows * dim / 32));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < dim; ++j) codes[size_t(r * dim + j)] = uint8_t(j);
    for (int64_t k = 0; k < dim / 32; ++k) scales[size_t(r * (dim / 32) + k)] = uint8_t((r + 37 * k) % 256);
  }
  std::vector<float> host(static_cast<size_t>(dim));
  int64_t checked = 0, nan = 0, inf = 0, subnormal = 0;
  for (int64_t r = 0; r < rows; ++r) {
    engram_widen_row(DType::kF8E4M3, codes.data() + r * dim, scales.data() + r * (dim / 32), dim, host.data());
    for (int64_t j = 0; j < dim; j += 4) {
      float v[4];
      ops::cuda::engram_widen_quad<DType::kF8E4M3>(codes.data() + r * dim + j, scales.data(), dim, r * dim + j, v);
      for (int k = 0; k < 4; ++k) {
        const float h = host[size_t(j + k)];
        if (std::isnan(h)) {  // NaN x NaN: which operand's sign survives is the compiler's choice
          ASSERT_TRUE(std::isnan(v[k]) && std::isnan(bf16_to_f32(f32_to_bf16(v[k])))) << "row " << r << " code " << j + k;
        } else {
          ASSERT_EQ(f32_to_bits(v[k]), f32_to_bits(h)) << "row " << r << " code " << j + k;
          ASSERT_EQ(f32_to_bf16(v[k]), f32_to_bf16(h));
        }
        ++checked;
        nan += std::isnan(h), inf += std::isinf(h), subnormal += std::fpclassify(h) == FP_SUBNORMAL;
      }
    }
  }
  EXPECT_EQ(checked, 256 * 256);
  EXPECT_GT(nan, 0);  // the cases the grid must reach: NaN, overflow to inf, f32 subnormals
  EXPECT_GT(inf, 0);
  EXPECT_GT(subnormal, 0);
}

TEST(CpuEngramWiden, DeviceArithmeticEqualsHostWidenOnFloatTables) {
  const int64_t rows = 7, dim = 36;
  const std::vector<float> f = randn(size_t(rows * dim), 77, 3.0f);
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
  std::vector<float> host(static_cast<size_t>(dim));
  for (int64_t r = 0; r < rows; ++r) {
    for (const DType dt : {DType::kBF16, DType::kF32}) {
      const void* row = dt == DType::kBF16 ? static_cast<const void*>(b.data() + r * dim) : f.data() + r * dim;
      engram_widen_row(dt, row, nullptr, dim, host.data());
      for (int64_t j = 0; j < dim; j += 4) {
        float v[4];
        if (dt == DType::kBF16)
          ops::cuda::engram_widen_quad<DType::kBF16>(b.data() + r * dim + j, nullptr, dim, r * dim + j, v);
        else
          ops::cuda::engram_widen_quad<DType::kF32>(f.data() + r * dim + j, nullptr, dim, r * dim + j, v);
        for (int k = 0; k < 4; ++k) EXPECT_EQ(f32_to_bits(v[k]), f32_to_bits(host[size_t(j + k)]));
      }
    }
  }
  float out[32];
  EXPECT_THROW(engram_widen_row(DType::kF8E4M3, b.data(), nullptr, 32, out), InvalidArgument);  // no scales
  EXPECT_THROW(engram_widen_row(DType::kF16, b.data(), nullptr, 32, out), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::ops::cpu
