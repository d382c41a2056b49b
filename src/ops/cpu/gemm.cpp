#include "ops/cpu/gemm.h"

#include <algorithm>
#include <mutex>
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

namespace {
#if defined(DEEPINFER_HAVE_BLAS)
// OpenBLAS (the pthread build Debian ships) keeps its own pool of spinning threads; next to
// OpenMP's pool that oversubscribes the cores. We make OpenMP the only pool: BLAS runs
// single-threaded and large products are split over rows by gemm() below.
void blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}
#endif
}  // namespace

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
  blas_single_threaded();
  if (beta == 0.f) {  // BLAS may read C when beta == 0 only to multiply by zero; keep NaN out
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.f);
  }
  // Row blocks in parallel, each a single-threaded sgemm (B is re-packed per block, which is
  // cheap next to the product once each block has >= 64 rows).
  const int64_t rows = std::max<int64_t>(64, (M + 4 * num_threads() - 1) / (4 * num_threads()));
  const int64_t n_blocks = (M + rows - 1) / rows;
  parallel_for(0, n_blocks, [&](int64_t blk) {
    const int64_t i0 = blk * rows, m = std::min(M, i0 + rows) - i0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m), int(N), int(K), alpha,
                A + i0 * lda, int(lda), B, int(ldb), beta, C + i0 * ldc, int(ldc));
  }, grain_for(2 * rows * N * K));
#else
  gemm_blocked(M, N, K, A, lda, B, ldb, trans_b, C, ldc, alpha, beta);
#endif
}

void linear(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y, GemmKind kind) {
  gemm(kind, M, N, K, x, K, W, K, /*trans_b=*/true, y, N);
}

}  // namespace deepinfer::ops::cpu
