// The packed kernel (gemm_packed.cpp) every linear of the CPU backend runs: vs a double-precision
// product on random non-zero inputs with M, N, K off the 12 x 32 tile and the 16-column panel;
// each row's bits the same alone, inside any batch, at any offset, in a column slice and whatever
// the thread count; the packed expert vs the unpacked one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "core/parallel.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/moe.h"
#include "test_util.h"

namespace deepinfer::ops::cpu {
namespace {
using testing::randn;

double ref_at(const std::vector<float>& A, int64_t lda, const std::vector<float>& W, int64_t ldw, int64_t i, int64_t j,
              int64_t K) {
  double s = 0;
  for (int64_t k = 0; k < K; ++k) s += double(A[i * lda + k]) * W[j * ldw + k];
  return s;
}

TEST(GemmPacked, MatchesDoubleProductOffTileSizes) {
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {11, 15, 7}, {12, 32, 96}, {13, 33, 193},
                         {25, 47, 64}, {49, 17, 130}, {100, 200, 19}, {37, 8, 768}}) {
    const int64_t lda = K + 3, ldw = K + 1, ldc = N + 2;
    auto A = randn(size_t(M * lda), 21), W = randn(size_t(N * ldw), 22), C0 = randn(size_t(M * ldc), 23);
    const PackedWeight P = pack_weight(W.data(), N, K, ldw);
    auto C = C0;
    linear_packed(A.data(), M, lda, P, C.data(), ldc, 0.5f, 2.0f);
    auto Z = std::vector<float>(size_t(M * ldc), NAN);  // beta = 0 ignores NaN in y
    linear_packed(A.data(), M, lda, P, Z.data(), ldc);
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        const double r = ref_at(A, lda, W, ldw, i, j, K), tol = 1e-5 * (1 + std::sqrt(double(K)) * 4);
        ASSERT_NEAR(C[i * ldc + j], 0.5 * r + 2.0 * C0[i * ldc + j], 2 * tol) << M << "x" << N << "x" << K << " at " << i << "," << j;
        ASSERT_NEAR(Z[i * ldc + j], r, tol) << M << "x" << N << "x" << K << " at " << i << "," << j;
      }
      EXPECT_EQ(C[i * ldc + N], C0[i * ldc + N]);  // padding past N untouched
      EXPECT_TRUE(std::isnan(Z[i * ldc + N]));
    }
  }
}

// Every row alone, inside sub-batches at every offset, and with 1 or 2 threads: the same bits.
TEST(GemmPacked, RowBitsIndependentOfBatchOffsetAndThreads) {
  const int64_t M = 61, N = 200, K = 193;
  auto A = randn(size_t(M * K), 31), W = randn(size_t(N * K), 32);
  const PackedWeight P = pack_weight(W.data(), N, K, K);
  std::vector<float> full(size_t(M * N));
  linear_packed(A.data(), M, K, P, full.data(), N);
  for (int64_t m : {1, 5, 12, 13, 24, 30}) {
    for (int64_t i0 = 0; i0 + m <= M; i0 += 7) {
      std::vector<float> part(size_t(m * N), NAN);
      linear_packed(A.data() + i0 * K, m, K, P, part.data(), N);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < N; ++j)
          ASSERT_EQ(part[i * N + j], full[(i0 + i) * N + j]) << "m=" << m << " row " << i0 + i << " col " << j;
    }
  }
  // A product large enough to be split over threads (>= 2 x kMinParallelWork flops).
  const int64_t Mb = 700, Nb = 192, Kb = 192;
  auto Ab = randn(size_t(Mb * Kb), 33), Wb = randn(size_t(Nb * Kb), 34);
  const PackedWeight Pb = pack_weight(Wb.data(), Nb, Kb, Kb);
  std::vector<float> one(size_t(Mb * Nb)), many(size_t(Mb * Nb)), row(static_cast<size_t>(Nb));
#if defined(_OPENMP)
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  linear_packed(Ab.data(), Mb, Kb, Pb, one.data(), Nb);
#if defined(_OPENMP)
  omp_set_num_threads(std::max(2, threads));
#endif
  linear_packed(Ab.data(), Mb, Kb, Pb, many.data(), Nb);
#if defined(_OPENMP)
  omp_set_num_threads(threads);
#endif
  ASSERT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)));
  for (int64_t i : {int64_t(0), int64_t(353), Mb - 1}) {
    linear_packed(Ab.data() + i * Kb, 1, Kb, Pb, row.data(), Nb);
    ASSERT_EQ(0, std::memcmp(row.data(), one.data() + i * Nb, row.size() * sizeof(float))) << "row " << i;
  }
}

// Column slices (a grouped linear's groups, a stacked weight's halves) give the full product's bits.
TEST(GemmPacked, ColumnSliceMatchesFullProduct) {
  const int64_t M = 29, N = 144, K = 70;
  auto A = randn(size_t(M * K), 41), W = randn(size_t(N * K), 42);
  const PackedWeight P = pack_weight(W.data(), N, K, K);
  std::vector<float> full(size_t(M * N));
  linear_packed(A.data(), M, K, P, full.data(), N);
  for (auto [c0, nc] : {std::pair<int64_t, int64_t>{0, 64}, {64, 80}, {16, 7}, {128, 16}}) {
    std::vector<float> y(size_t(M * nc));
    linear_packed_cols(A.data(), M, K, P, c0, nc, y.data(), nc);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < nc; ++j) ASSERT_EQ(y[i * nc + j], full[i * N + c0 + j]) << c0 << "+" << nc;
  }
  std::vector<float> y(size_t(M * 16));
  EXPECT_ANY_THROW(linear_packed_cols(A.data(), M, K, P, 8, 16, y.data(), 16));   // not a panel boundary
  EXPECT_ANY_THROW(linear_packed_cols(A.data(), M, K, P, 144, 16, y.data(), 16));  // past N
}

// The packed expert (one w13 product) vs the unpacked one, route weight before w2 included; a row
// alone gives the batch's bits.
TEST(GemmPacked, PackedExpertMatchesUnpacked) {
  const int64_t n = 27, D = 48, I = 40;
  auto x = randn(size_t(n * D), 51), w13 = randn(size_t(2 * I * D), 52, 0.2f), w2 = randn(size_t(D * I), 53, 0.2f);
  auto scale = randn(size_t(n), 54);
  const PackedWeight p13 = pack_weight(w13.data(), 2 * I, D, D), p2 = pack_weight(w2.data(), D, I, I);
  std::vector<float> g(size_t(n * I)), u(size_t(n * I)), want(size_t(n * D)), gu(size_t(n * 2 * I)), act(size_t(n * I)),
      got(size_t(n * D)), one(static_cast<size_t>(D));
  expert_forward(x.data(), n, D, I, {w13.data(), w13.data() + I * D, w2.data()}, 1.5f, g.data(), u.data(), want.data(),
                 GemmKind::kFixedOrder, scale.data());
  expert_forward_packed(x.data(), n, D, I, p13, p2, 1.5f, gu.data(), act.data(), got.data(), scale.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << i;
  for (int64_t r : {int64_t(0), int64_t(13), n - 1}) {
    expert_forward_packed(x.data() + r * D, 1, D, I, p13, p2, 1.5f, gu.data(), act.data(), one.data(), scale.data() + r);
    ASSERT_EQ(0, std::memcmp(one.data(), got.data() + r * D, size_t(D) * sizeof(float))) << "row " << r;
  }
}

}  // namespace
}  // namespace deepinfer::ops::cpu
