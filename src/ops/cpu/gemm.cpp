#include "ops/cpu/gemm.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

#if defined(DEEPINFER_HAVE_BLAS)
#include <cblas.h>
#endif

namespace deepinfer::ops::cpu {

// Blocked fallback: rows of C in parallel; for trans_b the inner loop is a dot product over
// contiguous rows of A and B, otherwise an axpy over contiguous rows of B and C.
void gemm_blocked(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                   bool trans_b, float* C, int64_t ldc, float alpha, float beta) {
  parallel_for(0, M, [&](int64_t i) {
    const float* a = A + i * lda;
    float* c = C + i * ldc;
    if (trans_b) {
      for (int64_t j = 0; j < N; ++j) {
        const float* b = B + j * ldb;
        float acc = 0.f;
        for (int64_t k = 0; k < K; ++k) acc += a[k] * b[k];
        c[j] = alpha * acc + (beta == 0.f ? 0.f : beta * c[j]);
      }
    } else {
      std::vector<float> row(size_t(N), 0.f);
      for (int64_t k = 0; k < K; ++k) {
        const float av = a[k];
        const float* b = B + k * ldb;
        for (int64_t j = 0; j < N; ++j) row[j] += av * b[j];
      }
      for (int64_t j = 0; j < N; ++j) c[j] = alpha * row[j] + (beta == 0.f ? 0.f : beta * c[j]);
    }
  }, grain_for(2 * N * K));
}

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          bool trans_b, float* C, int64_t ldc, float alpha, float beta) {
  DI_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm sizes M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
#if defined(DEEPINFER_HAVE_BLAS)
  if (beta == 0.f) {  // BLAS may read C when beta == 0 only to multiply by zero; keep NaN out
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha, A,
              int(lda), B, int(ldb), beta, C, int(ldc));
#else
  gemm_blocked(M, N, K, A, lda, B, ldb, trans_b, C, ldc, alpha, beta);
#endif
}

void linear(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y) {
  gemm(M, N, K, x, K, W, K, /*trans_b=*/true, y, N);
}

}  // namespace deepinfer::ops::cpu
