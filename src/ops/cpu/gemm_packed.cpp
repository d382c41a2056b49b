// The pre-packed fp32 product (gemm.h: PackedWeight, linear_packed): every weight of the CPU
// backend is repacked once at load into 16-column panels [ceil(N/16), K, 16], and a product
// y = x W^T streams them in order.
//
// Two kernels, one picked per machine (never mixed, so a row's bits do not depend on M):
//  * AVX-512 (x86 with avx512f): a register-blocked tile of up to 12 rows x 32 columns, 24 zmm
//    accumulators, one 64-byte load per panel per k and one broadcast FMA per (row, panel), i.e.
//    24 FMAs per 14 loads. Zen 4 issues one 512-bit FMA per cycle (2 x 256-bit pipes), so the
//    tile is FMA-bound with the B pair in L2 and the A rows in L1.
//  * otherwise: the portable 8-row x 16-column GCC vector loop (AVX2 / baseline target clones).
// In both, each output element is ONE in-order sum over k (acc = acc + a[k] * b[k], k = 0..K-1,
// fused on FMA machines) with no K split, so its value does not depend on M, the row's position,
// the tile it lands in or the thread split: batch invariant on a given machine.
#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/parallel_grain.h"
#include "ops/cpu/target_clones.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define DI_PACKED_AVX512 1
#endif

namespace deepinfer::ops::cpu {
namespace {

// ---- portable kernel (non-AVX-512 machines) ----

typedef float Vec16 __attribute__((vector_size(kPanelCols * sizeof(float))));

template <int R>
[[gnu::always_inline]] inline void panel_rows(const float* const* a, const float* panel, int64_t K, float* const* c,
                                              int64_t ncols, float alpha, float beta) {
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

template <int R>
[[gnu::always_inline]] inline void row_block(int64_t i0, const float* A, int64_t lda, const float* panels, int64_t p0,
                                             int64_t p1, int64_t N, int64_t K, float* C, int64_t ldc, float alpha,
                                             float beta) {
  const float* a[R];
  float* c[R];
  for (int r = 0; r < R; ++r) a[r] = A + (i0 + r) * lda;
  for (int64_t p = p0; p < p1; ++p) {
    for (int r = 0; r < R; ++r) c[r] = C + (i0 + r) * ldc + p * kPanelCols;
    panel_rows<R>(a, panels + p * K * kPanelCols, K, c, std::min(kPanelCols, N - p * kPanelCols), alpha, beta);
  }
}

// Rows [i0, i1) x panels [p0, p1): blocks of 8, 4, 2, 1 rows.
DI_TARGET_CLONES
void portable_block(int64_t i0, int64_t i1, const float* A, int64_t lda, const float* panels, int64_t p0, int64_t p1,
                    int64_t N, int64_t K, float* C, int64_t ldc, float alpha, float beta) {
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) row_block<8>(i, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta);
  if (i + 4 <= i1) row_block<4>(i, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta), i += 4;
  if (i + 2 <= i1) row_block<2>(i, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta), i += 2;
  if (i < i1) row_block<1>(i, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta);
}

// ---- AVX-512 kernel ----
#if defined(DI_PACKED_AVX512)
#define DI_AVX512_FN __attribute__((target("avx512f,fma")))
constexpr int kTileRows = 12;  // MR: 12 rows x 2 panels = 24 accumulators (+2 B, of 32 zmm)

// C[0:MR, 0:min(ncols, NP*16)] = alpha * A[0:MR, :] * panels[0:NP]^T (+ beta C); each element one
// in-order FMA chain over k.
template <int MR, int NP>
[[gnu::always_inline]] DI_AVX512_FN inline void tile(const float* A, int64_t lda, const float* panel, int64_t K,
                                                     float* C, int64_t ldc, int64_t ncols, float alpha, float beta) {
  __m512 acc[MR][NP];
#pragma GCC unroll 12
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  const int64_t pstride = K * kPanelCols;
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NP];
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) b[p] = _mm512_loadu_ps(panel + p * pstride + k * kPanelCols);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(A[r * lda + k]);
#pragma GCC unroll 4
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_fmadd_ps(av, b[p], acc[r][p]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) {
    const int64_t n = std::min<int64_t>(kPanelCols, ncols - p * kPanelCols);
    if (n <= 0) break;
    const __mmask16 m = n == kPanelCols ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      float* c = C + r * ldc + p * kPanelCols;
      __m512 v = _mm512_mul_ps(va, acc[r][p]);
      if (beta != 0.f) v = _mm512_add_ps(v, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m, c)));
      _mm512_mask_storeu_ps(c, m, v);
    }
  }
}

// MR rows x panels [p0, p1): 2 panels per tile, 4 for MR <= 3 (small M, decode: more independent
// accumulator chains and loads in flight), then the remaining panels. Which tile an element lands
// in does not change its sum.
template <int MR>
[[gnu::always_inline]] DI_AVX512_FN inline void rows_avx512(const float* A, int64_t lda, const float* panels,
                                                            int64_t p0, int64_t p1, int64_t N, int64_t K, float* C,
                                                            int64_t ldc, float alpha, float beta) {
  constexpr int NP = MR <= 3 ? 4 : 2;
  auto at = [&](int64_t p) { return panels + p * K * kPanelCols; };
  int64_t p = p0;
  for (; p + NP <= p1; p += NP) tile<MR, NP>(A, lda, at(p), K, C + p * kPanelCols, ldc, N - p * kPanelCols, alpha, beta);
  if (NP == 4 && p + 2 <= p1) {
    tile<MR, 2>(A, lda, at(p), K, C + p * kPanelCols, ldc, N - p * kPanelCols, alpha, beta);
    p += 2;
  }
  if (p < p1) tile<MR, 1>(A, lda, at(p), K, C + p * kPanelCols, ldc, N - p * kPanelCols, alpha, beta);
}

// Rows [i0, i1) x panels [p0, p1): tiles of 12 rows, then one tile of the remaining 1..11.
DI_AVX512_FN void avx512_block(int64_t i0, int64_t i1, const float* A, int64_t lda, const float* panels, int64_t p0,
                               int64_t p1, int64_t N, int64_t K, float* C, int64_t ldc, float alpha, float beta) {
  int64_t i = i0;
  for (; i + kTileRows <= i1; i += kTileRows)
    rows_avx512<kTileRows>(A + i * lda, lda, panels, p0, p1, N, K, C + i * ldc, ldc, alpha, beta);
  const float* a = A + i * lda;
  float* c = C + i * ldc;
  switch (i1 - i) {
#define DI_TAIL(r) \
  case r: rows_avx512<r>(a, lda, panels, p0, p1, N, K, c, ldc, alpha, beta); break;
    DI_TAIL(1) DI_TAIL(2) DI_TAIL(3) DI_TAIL(4) DI_TAIL(5) DI_TAIL(6)
    DI_TAIL(7) DI_TAIL(8) DI_TAIL(9) DI_TAIL(10) DI_TAIL(11)
#undef DI_TAIL
    default: break;
  }
}

bool use_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") != 0;
  return yes;
}
#else
constexpr int kTileRows = 8;
bool use_avx512() { return false; }
#endif

void packed_block(int64_t i0, int64_t i1, const float* A, int64_t lda, const float* panels, int64_t p0, int64_t p1,
                  int64_t N, int64_t K, float* C, int64_t ldc, float alpha, float beta) {
#if defined(DI_PACKED_AVX512)
  if (use_avx512()) return avx512_block(i0, i1, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta);
#endif
  portable_block(i0, i1, A, lda, panels, p0, p1, N, K, C, ldc, alpha, beta);
}

// y[M, N] for the N outputs whose panels start at `panels` (N <= the panels' columns).
void run_packed(const float* x, int64_t M, int64_t ldx, const float* panels, int64_t N, int64_t K, float* y,
                int64_t ldy, float alpha, float beta) {
  if (M == 0 || N == 0) return;
  // Work items: (chunk of panels, block of rows), chunk-major so consecutive items share a chunk
  // (its K x 16 x chunk floats, <= ~256 KiB, stay in L2 while row blocks pass over it).
  const int64_t np = (N + kPanelCols - 1) / kPanelCols;
  const int64_t chunk = std::clamp<int64_t>((4096 / std::max<int64_t>(K, 1)) & ~int64_t(1), 2, 32);
  const int64_t n_chunks = (np + chunk - 1) / chunk;
  const int64_t rows = 4 * kTileRows;  // 48-row blocks: split work on large M, whole tiles
  const int64_t n_rows = (M + rows - 1) / rows, items = n_chunks * n_rows;
  auto run = [&](int64_t it) {
    const int64_t c = it / n_rows, r = it % n_rows;
    packed_block(r * rows, std::min(M, (r + 1) * rows), x, ldx, panels, c * chunk, std::min(np, (c + 1) * chunk), N, K,
                 y, ldy, alpha, beta);
  };
#if defined(_OPENMP)
  // Dynamic scheduling: a thread descheduled on a shared machine does not hold the step back; any
  // split gives the same values.
  if (items > 1 && 2 * M * N * K >= 2 * kMinParallelWork && num_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) run(it);
    return;
  }
#endif
  for (int64_t it = 0; it < items; ++it) run(it);
}
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
  DI_CHECK(M >= 0 && ldx >= W.k && ldy >= W.n, "linear_packed M=", M, " ldx=", ldx, " ldy=", ldy, " weight [", W.n,
           ",", W.k, "]");
  run_packed(x, M, ldx, W.panels.data(), W.n, W.k, y, ldy, alpha, beta);
}

void linear_packed_cols(const float* x, int64_t M, int64_t ldx, const PackedWeight& W, int64_t col0, int64_t ncols,
                        float* y, int64_t ldy) {
  DI_CHECK(M >= 0 && ldx >= W.k && ldy >= ncols && col0 >= 0 && ncols >= 0 && col0 + ncols <= W.n &&
               col0 % kPanelCols == 0,
           "linear_packed_cols M=", M, " ldx=", ldx, " ldy=", ldy, " columns [", col0, ",", col0 + ncols,
           ") of weight [", W.n, ",", W.k, "]");
  run_packed(x, M, ldx, W.panels.data() + (col0 / kPanelCols) * W.k * kPanelCols, ncols, W.k, y, ldy, 1.f, 0.f);
}

bool packed_kernel_is_avx512() { return use_avx512(); }

}  // namespace deepinfer::ops::cpu
