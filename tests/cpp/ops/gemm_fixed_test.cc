// The batch-invariant GEMM (gemm_fixed): matches a double-precision product on random non-zero
// inputs of odd sizes, both layouts, padded leading dims, alpha/beta; and every row's bits are the
// same alone, inside any batch, at any row offset and whatever the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "deepinfer/error.h"
#include "ops/cpu/gemm.h"
#include "test_util.h"

namespace deepinfer::ops::cpu {
namespace {
using testing::randn;

// C[i, j] = sum_k A[i, k] op(B)[k, j] in double, with padded leading dims.
double ref_at(const std::vector<float>& A, int64_t lda, const std::vector<float>& B, int64_t ldb, bool tb, int64_t i,
              int64_t j, int64_t K) {
  double s = 0;
  for (int64_t k = 0; k < K; ++k) s += double(A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
  return s;
}

TEST(GemmFixed, MatchesDoubleProductOddSizes) {
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {19, 111, 7}, {5, 33, 130}, {9, 129, 300}}) {
    for (bool tb : {true, false}) {
      const int64_t lda = K + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
      auto A = randn(size_t(M * lda), 1), B = randn(size_t((tb ? N : K) * ldb), 2), C0 = randn(size_t(M * ldc), 3);
      auto C = C0;
      gemm_fixed(M, N, K, A.data(), lda, B.data(), ldb, tb, C.data(), ldc, 0.5f, 2.0f);
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j)
          ASSERT_NEAR(C[i * ldc + j], 0.5 * ref_at(A, lda, B, ldb, tb, i, j, K) + 2.0 * C0[i * ldc + j],
                      1e-4 * (1 + std::sqrt(double(K))))
              << M << "x" << N << "x" << K << " tb=" << tb << " at " << i << "," << j;
        EXPECT_EQ(C[i * ldc + N], C0[i * ldc + N]);  // padding untouched
      }
      std::vector<float> Z(size_t(M * ldc), NAN);  // beta = 0 ignores NaN in C
      gemm_fixed(M, N, K, A.data(), lda, B.data(), ldb, tb, Z.data(), ldc);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) ASSERT_FALSE(std::isnan(Z[i * ldc + j]));
    }
  }
}

// Row r of a batch of M rows has the bits of row r computed alone (and of any sub-batch that
// contains it at another offset), for every M, with 1 thread and with all of them.
TEST(GemmFixed, RowBitsIndependentOfBatchAndThreads) {
  const int64_t N = 77, K = 203, Mmax = 23;
  auto A = randn(size_t(Mmax * K), 7), B = randn(size_t(N * K), 8);
  std::vector<float> alone(size_t(Mmax * N));
  for (int64_t i = 0; i < Mmax; ++i) gemm_fixed(1, N, K, A.data() + i * K, K, B.data(), K, true, alone.data() + i * N, N);
  for (int64_t M : {2, 3, 4, 5, 8, 13, 23})
    for (int64_t off : {int64_t(0), Mmax - M}) {
      std::vector<float> C(size_t(M * N));
      gemm_fixed(M, N, K, A.data() + off * K, K, B.data(), K, true, C.data(), N);
      EXPECT_EQ(std::memcmp(C.data(), alone.data() + off * N, C.size() * 4), 0) << "M=" << M << " offset " << off;
    }
#if defined(_OPENMP)
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> one(size_t(Mmax * N));
  gemm_fixed(Mmax, N, K, A.data(), K, B.data(), K, true, one.data(), N);
  omp_set_num_threads(threads);
  EXPECT_EQ(std::memcmp(one.data(), alone.data(), one.size() * 4), 0);
#endif
  // The dispatcher picks the kernel by kind.
  std::vector<float> C(size_t(Mmax * N));
  gemm(GemmKind::kFixedOrder, Mmax, N, K, A.data(), K, B.data(), K, true, C.data(), N);
  EXPECT_EQ(std::memcmp(C.data(), alone.data(), C.size() * 4), 0);
}

TEST(GemmFixed, BadShapesAreRefused) {
  std::vector<float> a(4), b(4), c(4);
  EXPECT_THROW(gemm_fixed(2, 2, 2, a.data(), 1, b.data(), 2, true, c.data(), 2), Error);  // lda < K
  EXPECT_THROW(gemm_fixed(-1, 2, 2, a.data(), 2, b.data(), 2, true, c.data(), 2), Error);
}
}  // namespace
}  // namespace deepinfer::ops::cpu
