// Dense fp32 matrix products for the CPU backend (OpenBLAS sgemm when available, else a
// blocked loop; a pre-packed kernel for the lm head). All matrices are
// row-major with explicit leading dimensions (elements). Callers batch tokens into M so each
// weight matrix is streamed once per forward. Threads: OpenMP only (BLAS is kept at one thread).
#pragma once
#include <cstdint>
#include <vector>

namespace deepinfer::ops::cpu {

// C[M,N] = alpha * A[M,K] * op(B) + beta * C, op(B) = B[K,N] (trans_b=false, ldb >= N) or
// B[N,K]^T (trans_b=true, ldb >= K). beta = 0 ignores C's prior contents (NaN-safe).
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          bool trans_b, float* C, int64_t ldc, float alpha = 1.0f, float beta = 0.0f);

// A weight W [N, K] (used as x * W^T) repacked once into panels of kPanelCols columns:
// panels [ceil(N/16), K, 16], zero-padded past N. A product then streams the weight in order
// and keeps 16 outputs per vector register: no per-call packing (BLAS packs the whole weight
// on every call, which for the lm head at decode costs more than the product) and no
// horizontal sums. The CPU backend packs every linear this way (gemm_packed.cpp).
inline constexpr int64_t kPanelCols = 16;
struct PackedWeight {
  int64_t n = 0;              // N: output features
  int64_t k = 0;              // K: input features
  std::vector<float> panels;  // [ceil(n/16), k, 16]
  bool empty() const { return panels.empty(); }
};
PackedWeight pack_weight(const float* W, int64_t N, int64_t K, int64_t ldw);

// y[M, N] = alpha * x[M, K] * W^T + beta * y (beta = 0 ignores y's contents), split over threads
// by (column chunk, row block) for large products. On AVX-512 machines a 12 x 32 register tile,
// elsewhere an 8 x 16 vector loop (one kernel per machine). Each element is one in-order sum over
// k (fused multiply-adds where the CPU has them): the same bits for any M, row position, tile or
// thread split.
void linear_packed(const float* x, int64_t M, int64_t ldx, const PackedWeight& W, float* y, int64_t ldy,
                   float alpha = 1.0f, float beta = 0.0f);
// Outputs [col0, col0 + ncols) only (col0 a multiple of 16): y[M, ncols] = x[M, K] * W[col0:, :]^T.
// A grouped linear's group, or one half of a stacked weight; same sums as linear_packed.
void linear_packed_cols(const float* x, int64_t M, int64_t ldx, const PackedWeight& W, int64_t col0, int64_t ncols,
                        float* y, int64_t ldy);
// Whether linear_packed runs its AVX-512 tile on this machine (for benchmarks and logs).
bool packed_kernel_is_avx512();

// The portable loop behind gemm() when BLAS is absent; also the slow twin in tests.
void gemm_blocked(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                  bool trans_b, float* C, int64_t ldc, float alpha = 1.0f, float beta = 0.0f);

// The batch-invariant product (gemm_fixed.cpp), same contract as gemm(). Every element of C is
// one fixed-order sum that does not depend on M, its row, the thread split or the CPU: for
// trans_b, 16 lane partial sums (lane l adds the k = l mod 16 terms in increasing k), folded
// 8+8, 4+4, 2+2, 1+1, then the K % 16 tail in order; otherwise one in-order sum over k. No FMA.
// OpenBLAS (gemm) picks kernels and blockings by M, so one row's result moves with its batch
// (~6e-6 between a chunked and a whole prefill); DEEPINFER_BATCH_INVARIANT=1 runs this instead.
void gemm_fixed(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                bool trans_b, float* C, int64_t ldc, float alpha = 1.0f, float beta = 0.0f);

// Which kernel a product runs on (the CPU backend's choice, passed down to the ops that multiply).
enum class GemmKind : uint8_t {
  kFast,        // gemm(): OpenBLAS, its summation order depends on M
  kFixedOrder,  // gemm_fixed(): batch-invariant
};
inline void gemm(GemmKind kind, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                 int64_t ldb, bool trans_b, float* C, int64_t ldc, float alpha = 1.0f, float beta = 0.0f) {
  if (kind == GemmKind::kFixedOrder) gemm_fixed(M, N, K, A, lda, B, ldb, trans_b, C, ldc, alpha, beta);
  else gemm(M, N, K, A, lda, B, ldb, trans_b, C, ldc, alpha, beta);
}

// y[M,N] = x[M,K] * W[N,K]^T  (a torch nn.Linear without bias), all contiguous.
void linear(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y,
            GemmKind kind = GemmKind::kFast);

}  // namespace deepinfer::ops::cpu
