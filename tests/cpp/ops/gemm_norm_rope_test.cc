#include <gtest/gtest.h>

#include <cmath>

#include "ops/cpu/gemm.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/rope.h"
#include "test_util.h"

namespace deepinfer::ops::cpu {
namespace {
using testing::max_abs_diff;
using testing::randn;

std::vector<double> naive_gemm(int64_t M, int64_t N, int64_t K, const std::vector<float>& A,
                               const std::vector<float>& B, bool trans_b) {
  std::vector<double> C(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k)
        C[i * N + j] += double(A[i * K + k]) * (trans_b ? B[j * K + k] : B[k * N + j]);
  return C;
}

TEST(Gemm, MatchesNaiveOddSizes) {
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {19, 111, 7}, {5, 33, 130}}) {
    auto A = randn(size_t(M * K), 1), B = randn(size_t(N * K), 2);
    for (bool tb : {false, true}) {
      auto ref = naive_gemm(M, N, K, A, B, tb);
      std::vector<float> C(size_t(M * N), NAN), C2(size_t(M * N), NAN);
      gemm(M, N, K, A.data(), K, B.data(), tb ? K : N, tb, C.data(), N);
      gemm_blocked(M, N, K, A.data(), K, B.data(), tb ? K : N, tb, C2.data(), N);
      EXPECT_LT(max_abs_diff(C, ref), 1e-4) << M << "x" << N << "x" << K << " tb=" << tb;
      EXPECT_LT(max_abs_diff(C2, ref), 1e-4);
    }
  }
}

TEST(Gemm, AlphaBetaAndLeadingDims) {
  const int64_t M = 3, N = 5, K = 4, ldc = 9;
  auto A = randn(M * K, 3), B = randn(N * K, 4), C0 = randn(M * ldc, 5);
  auto ref = naive_gemm(M, N, K, A, B, true);
  auto C = C0;
  gemm(M, N, K, A.data(), K, B.data(), K, true, C.data(), ldc, 0.5f, 2.0f);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) EXPECT_NEAR(C[i * ldc + j], 0.5 * ref[i * N + j] + 2.0 * C0[i * ldc + j], 1e-4);
  EXPECT_EQ(C[ldc - 1], C0[ldc - 1]);  // padding untouched
}

// The pre-packed kernel (lm head) vs the naive product and the blocked twin: odd sizes (N not
// a multiple of 16, M hitting every row-block size), padded leading dims, alpha/beta; and each
// row's values independent of M (bit-identical alone and in a batch).
TEST(Gemm, PackedMatchesNaiveAndIsRowStable) {
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {5, 111, 19}, {7, 3000, 130}, {19, 4099, 128}}) {
    const int64_t lda = K + 3, ldb = K + 1, ldc = N + 2;
    auto A = randn(size_t(M * lda), 11), B = randn(size_t(N * ldb), 12), C0 = randn(size_t(M * ldc), 13);
    std::vector<float> Ac(size_t(M * K)), Bc(size_t(N * K));
    for (int64_t i = 0; i < M; ++i) std::copy_n(A.data() + i * lda, K, Ac.data() + i * K);
    for (int64_t j = 0; j < N; ++j) std::copy_n(B.data() + j * ldb, K, Bc.data() + j * K);
    auto ref = naive_gemm(M, N, K, Ac, Bc, true);
    const PackedWeight W = pack_weight(B.data(), N, K, ldb);
    auto C = C0, C2 = C0;
    linear_packed(A.data(), M, lda, W, C.data(), ldc, 0.5f, 2.0f);
    gemm_blocked(M, N, K, A.data(), lda, B.data(), ldb, true, C2.data(), ldc, 0.5f, 2.0f);
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        const double want = 0.5 * ref[i * N + j] + 2.0 * C0[i * ldc + j];
        ASSERT_NEAR(C[i * ldc + j], want, 1e-4) << M << "x" << N << "x" << K << " at " << i << "," << j;
        ASSERT_NEAR(C2[i * ldc + j], want, 1e-4);
      }
      EXPECT_EQ(C[i * ldc + N], C0[i * ldc + N]);  // padding untouched
    }
    linear_packed(A.data(), M, lda, W, C.data(), ldc);
    for (int64_t i = 0; i < M; ++i) {
      std::vector<float> row(size_t(N), NAN);
      linear_packed(A.data() + i * lda, 1, lda, W, row.data(), N);
      for (int64_t j = 0; j < N; ++j) ASSERT_EQ(row[j], C[i * ldc + j]) << i << "," << j;
    }
  }
}

// gemm() routes large-M products through row blocks; the result must not change.
TEST(Gemm, LargeProductsMatchBlocked) {
  const int64_t M = 300, N = 96, K = 80;
  auto A = randn(size_t(M * K), 14), B = randn(size_t(N * K), 15);
  for (bool tb : {false, true}) {
    std::vector<float> C(size_t(M * N), NAN), C2(size_t(M * N), NAN);
    gemm(M, N, K, A.data(), K, B.data(), tb ? K : N, tb, C.data(), N);
    gemm_blocked(M, N, K, A.data(), K, B.data(), tb ? K : N, tb, C2.data(), N);
    for (size_t i = 0; i < C.size(); ++i) ASSERT_NEAR(C[i], C2[i], 1e-4) << "tb=" << tb << " at " << i;
  }
}

TEST(RmsNorm, WeightedUnweightedStrided) {
  const int64_t rows = 7, dim = 19, xs = 23;
  auto x = randn(rows * xs, 6), w = randn(dim, 7, 0.1f, 1.0f);
  for (bool weighted : {false, true}) {
    std::vector<float> y(rows * dim);
    rmsnorm(x.data(), xs, weighted ? w.data() : nullptr, y.data(), dim, rows, dim, 1e-6f);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[r * xs + i]) * x[r * xs + i];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
      for (int64_t i = 0; i < dim; ++i)
        EXPECT_NEAR(y[r * dim + i], x[r * xs + i] * inv * (weighted ? w[i] : 1.0), 1e-5);
    }
  }
}

TEST(Rope, YarnInvFreqMatchesSpecFormula) {
  // MODEL-DEEPSEEK-V4.md §3.1 with the release numbers: lo = 15, hi = 25.
  YarnScaling y{16.0, 65536, 32, 1};
  auto inv = rope_inv_freq(160000.0, 64, &y);
  auto D = [](double r) { return 64 * std::log(65536 / (2 * M_PI * r)) / (2 * std::log(160000.0)); };
  const double lo = std::max(std::floor(D(32)), 0.0), hi = std::min(std::ceil(D(1)), 63.0);
  EXPECT_EQ(lo, 15);
  EXPECT_EQ(hi, 25);
  for (int i = 0; i < 32; ++i) {
    const double b = std::pow(160000.0, -2.0 * i / 64), ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    EXPECT_NEAR(inv[i] / (b * (1 - ramp) + b / 16 * ramp), 1.0, 1e-6) << i;
  }
  auto plain = rope_inv_freq(10000.0, 16, nullptr);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(plain[i] / std::pow(10000.0, -2.0 * i / 16), 1.0, 1e-6);
}

TEST(Rope, InterleavedTailRotationAndInverse) {
  const int64_t rows = 5, heads = 3, hd = 22, rd = 8;
  auto x = randn(rows * heads * hd, 8);
  std::vector<int64_t> pos = {0, 1, 7, 300, 12345};
  auto inv = rope_inv_freq(10000.0, rd, nullptr);
  auto y = x;
  rope_apply(y.data(), rows, heads, hd, rd, pos.data(), inv.data(), false);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = x.data() + (r * heads + h) * hd;
      const float* b = y.data() + (r * heads + h) * hd;
      for (int64_t i = 0; i < hd - rd; ++i) EXPECT_EQ(a[i], b[i]);
      for (int64_t i = 0; i < rd / 2; ++i) {
        const double ang = double(float(pos[r]) * inv[i]);
        const double u = a[hd - rd + 2 * i], v = a[hd - rd + 2 * i + 1];
        EXPECT_NEAR(b[hd - rd + 2 * i], u * std::cos(ang) - v * std::sin(ang), 2e-4);
        EXPECT_NEAR(b[hd - rd + 2 * i + 1], u * std::sin(ang) + v * std::cos(ang), 2e-4);
      }
    }
  rope_apply(y.data(), rows, heads, hd, rd, pos.data(), inv.data(), true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

}  // namespace
}  // namespace deepinfer::ops::cpu
