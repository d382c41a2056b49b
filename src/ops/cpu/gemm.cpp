#include "ops/cpu/gemm.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"
#include "ops/cpu/target_clones.h"

#if defined(DEEPINFER_HAVE_BLAS)
#include <cblas.h>
#endif

// The packed kernel is compiled for AVX-512, AVX2+FMA and baseline x86-64 and picked at load
// time (GCC/Clang ifunc), so one binary runs anywhere and uses the wide units where present.
#define DI_CPU_CLONES DI_TARGET_CLONES

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
// 16 floats as one GCC/Clang vector (loaded with memcpy: unaligned, no aliasing issue). Each
// target clone lowers it to one zmm, two ymm or four xmm registers.
typedef float Vec16 __attribute__((vector_size(kPanelCols * sizeof(float))));

// c_r[0:ncols] = alpha * Σ_k a_r[k]·panel[k, 0:ncols] (+ beta·c_r) for R rows: R independent
// vector accumulators, each element summed over k in order (so the value does not depend on R).
template <int R>
[[gnu::always_inline]] inline void panel_rows(const float* const* a, const float* panel, int64_t K, float* const* c, int64_t ncols,
                       float alpha, float beta) {
  Vec16 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = Vec16{};
  for (int64_t k = 0; k < K; ++k) {
    Vec16 bv;
    __builtin_memcpy(&bv, panel + k * kPanelCols, sizeof(bv));
    for (int r = 0; r < R; ++r) acc[r] += a[r][k] * bv;
  }
  for (int r = 0; r < R; ++r) {
    float v[kPanelCols];
    __builtin_memcpy(v, &acc[r], sizeof(v));
    for (int64_t j = 0; j < ncols; ++j) c[r][j] = alpha * v[j] + (beta == 0.f ? 0.f : beta * c[r][j]);
  }
}

// Inlined into each target clone of packed_chunk (a called template would be compiled for the
// baseline ISA only).
template <int R>
[[gnu::always_inline]] inline void row_block(int64_t i0, const float* A, int64_t lda, const float* panels, int64_t p0, int64_t p1, int64_t N,
               int64_t K, float* C, int64_t ldc, float alpha, float beta) {
  const float* a[R];
  float* c[R];
  for (int r = 0; r < R; ++r) a[r] = A + (i0 + r) * lda;
  for (int64_t p = p0; p < p1; ++p) {
    for (int r = 0; r < R; ++r) c[r] = C + (i0 + r) * ldc + p * kPanelCols;
    panel_rows<R>(a, panels + p * K * kPanelCols, K, c, std::min(kPanelCols, N - p * kPanelCols), alpha, beta);
  }
}

// Panels [p0, p1) for all M rows: blocks of 8, 4, 2, 1 rows; the chunk of panels stays in L2
// while every row block passes over it.
DI_CPU_CLONES
void packed_chunk(int64_t M, const float* A, int64_t lda, const float* panels, int64_t p0, int64_t p1, int64_t N,
                  int64_t K, float* C, int64_t ldc, float alpha, float beta) {
  int64_t i = 0;
  for (; i + 8 <= M; i += 8) row_block<8>(i, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta);
  if (i + 4 <= M) row_block<4>(i, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta), i += 4;
  if (i + 2 <= M) row_block<2>(i, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta), i += 2;
  if (i < M) row_block<1>(i, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta);
}

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

PackedWeight pack_weight(const float* W, int64_t N, int64_t K, int64_t ldw) {
  DI_CHECK(N >= 0 && K >= 0 && ldw >= K, "pack_weight N=", N, " K=", K, " ldw=", ldw);
  PackedWeight p;
  p.n = N;
  p.k = K;
  const int64_t np = (N + kPanelCols - 1) / kPanelCols;
  p.panels.assign(size_t(np * K * kPanelCols), 0.f);
  for (int64_t j = 0; j < N; ++j) {
    float* dst = p.panels.data() + (j / kPanelCols) * K * kPanelCols + j % kPanelCols;
    const float* src = W + j * ldw;
    for (int64_t k = 0; k < K; ++k) dst[k * kPanelCols] = src[k];
  }
  return p;
}

void linear_packed(const float* x, int64_t M, int64_t ldx, const PackedWeight& W, float* y, int64_t ldy, float alpha,
                   float beta) {
  const int64_t N = W.n, K = W.k;
  DI_CHECK(M >= 0 && ldx >= K && ldy >= N, "linear_packed M=", M, " ldx=", ldx, " ldy=", ldy, " weight [", N, ",", K, "]");
  if (M == 0 || N == 0) return;
  // Chunks of 16 panels (256 columns, K*4 KiB of weight); dynamic scheduling so a thread that
  // is descheduled on a shared machine does not hold the step back (any split gives the same
  // values: each element is one in-order sum).
  constexpr int64_t kChunkPanels = 16;
  const int64_t np = (N + kPanelCols - 1) / kPanelCols, n_chunks = (np + kChunkPanels - 1) / kChunkPanels;
  auto run = [&](int64_t c) {
    packed_chunk(M, x, ldx, W.panels.data(), c * kChunkPanels, std::min(np, (c + 1) * kChunkPanels), N, K, y, ldy,
                 alpha, beta);
  };
#if defined(_OPENMP)
  if (n_chunks > 1 && 2 * M * N * K >= 2 * kMinParallelWork && num_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < n_chunks; ++c) run(c);
    return;
  }
#endif
  for (int64_t c = 0; c < n_chunks; ++c) run(c);
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
