// The batch-invariant fp32 product (gemm.h, GemmKind::kFixedOrder). This file is compiled with
// -ffp-contract=off (CMakeLists.txt): every multiply and add rounds on its own, so no target clone
// can fuse a different subset of them and the bits are the same on every x86 CPU.
#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel_grain.h"
#include "ops/cpu/target_clones.h"

#define DI_FIXED_CLONES DI_TARGET_CLONES

namespace deepinfer::ops::cpu {
namespace {
constexpr int64_t kLanes = 16;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes load(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// The one reduction every element goes through: lanes folded 8+8, 4+4, 2+2, 1+1, then the
// K % 16 tail in increasing k.
[[gnu::always_inline]] inline float finish(Lanes acc, const float* a, const float* b, int64_t k16, int64_t K) {
  float v[kLanes];
  __builtin_memcpy(v, &acc, sizeof(v));
  for (int64_t w = kLanes / 2; w >= 1; w /= 2)
    for (int64_t l = 0; l < w; ++l) v[l] = v[l] + v[l + w];
  float s = v[0];
  for (int64_t k = k16; k < K; ++k) s = s + a[k] * b[k];
  return s;
}

[[gnu::always_inline]] inline void store(float* c, float s, float alpha, float beta) {
  *c = alpha * s + (beta == 0.f ? 0.f : beta * *c);
}

// C[i0:i0+R, j] for columns [j0, j1): R rows x 2 columns per pass share their loads; each of the
// 2R accumulators is one element's lane sums, computed exactly as for any other R.
template <int R>
[[gnu::always_inline]] inline void rows_nt(int64_t i0, int64_t j0, int64_t j1, int64_t K, const float* A, int64_t lda,
                                           const float* B, int64_t ldb, float* C, int64_t ldc, float alpha,
                                           float beta) {
  const int64_t k16 = K - K % kLanes;
  const float* a[R];
  for (int r = 0; r < R; ++r) a[r] = A + (i0 + r) * lda;
  int64_t j = j0;
  for (; j + 2 <= j1; j += 2) {
    const float* b0 = B + j * ldb;
    const float* b1 = b0 + ldb;
    Lanes acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = Lanes{};
    for (int64_t k = 0; k < k16; k += kLanes) {
      const Lanes w0 = load(b0 + k), w1 = load(b1 + k);
      for (int r = 0; r < R; ++r) {
        const Lanes x = load(a[r] + k);
        acc0[r] = acc0[r] + x * w0;
        acc1[r] = acc1[r] + x * w1;
      }
    }
    for (int r = 0; r < R; ++r) {
      store(C + (i0 + r) * ldc + j, finish(acc0[r], a[r], b0, k16, K), alpha, beta);
      store(C + (i0 + r) * ldc + j + 1, finish(acc1[r], a[r], b1, k16, K), alpha, beta);
    }
  }
  if (j < j1) {
    const float* b0 = B + j * ldb;
    Lanes acc0[R];
    for (int r = 0; r < R; ++r) acc0[r] = Lanes{};
    for (int64_t k = 0; k < k16; k += kLanes) {
      const Lanes w0 = load(b0 + k);
      for (int r = 0; r < R; ++r) acc0[r] = acc0[r] + load(a[r] + k) * w0;
    }
    for (int r = 0; r < R; ++r) store(C + (i0 + r) * ldc + j, finish(acc0[r], a[r], b0, k16, K), alpha, beta);
  }
}

// Columns [j0, j1) of every row: blocks of 4 rows, then single rows; the block of B stays in
// cache while all rows pass over it.
DI_FIXED_CLONES
void chunk_nt(int64_t M, int64_t j0, int64_t j1, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
              float* C, int64_t ldc, float alpha, float beta) {
  int64_t i = 0;
  for (; i + 4 <= M; i += 4) rows_nt<4>(i, j0, j1, K, A, lda, B, ldb, C, ldc, alpha, beta);
  for (; i < M; ++i) rows_nt<1>(i, j0, j1, K, A, lda, B, ldb, C, ldc, alpha, beta);
}

// B [K, N]: each element is one in-order sum over k (an axpy per k, vectorised across columns).
DI_FIXED_CLONES
void row_nn(const float* a, int64_t N, int64_t K, const float* B, int64_t ldb, float* c, float alpha, float beta,
            float* acc) {
  std::fill(acc, acc + N, 0.f);
  for (int64_t k = 0; k < K; ++k) {
    const float av = a[k];
    const float* b = B + k * ldb;
    for (int64_t j = 0; j < N; ++j) acc[j] = acc[j] + av * b[j];
  }
  for (int64_t j = 0; j < N; ++j) store(c + j, acc[j], alpha, beta);
}
}  // namespace

void gemm_fixed(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                bool trans_b, float* C, int64_t ldc, float alpha, float beta) {
  DI_CHECK(M >= 0 && N >= 0 && K >= 0 && lda >= K && ldc >= N && ldb >= (trans_b ? K : N), "gemm_fixed M=", M,
           " N=", N, " K=", K, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
  if (M == 0 || N == 0) return;
  if (!trans_b) {
    parallel_for(0, M, [&](int64_t i) {
      std::vector<float> acc(static_cast<size_t>(N));
      row_nn(A + i * lda, N, K, B, ldb, C + i * ldc, alpha, beta, acc.data());
    }, grain_for(2 * N * K));
    return;
  }
  // Chunks of 64 columns (64*K floats of B), split over threads; any split gives the same values.
  constexpr int64_t kChunkCols = 64;
  const int64_t chunks = (N + kChunkCols - 1) / kChunkCols;
  parallel_for(0, chunks, [&](int64_t c) {
    chunk_nt(M, c * kChunkCols, std::min(N, (c + 1) * kChunkCols), K, A, lda, B, ldb, C, ldc, alpha, beta);
  }, grain_for(2 * M * kChunkCols * K));
}

}  // namespace deepinfer::ops::cpu
