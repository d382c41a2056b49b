// Dense fp32 matrix products for the CPU backend (OpenBLAS sgemm when available, else a
// blocked loop). All matrices are row-major with explicit leading dimensions (elements).
// Callers batch tokens into M so each weight matrix is streamed once per forward.
#pragma once
#include <cstdint>

namespace deepinfer::ops::cpu {

// C[M,N] = alpha * A[M,K] * op(B) + beta * C, op(B) = B[K,N] (trans_b=false, ldb >= N) or
// B[N,K]^T (trans_b=true, ldb >= K). beta = 0 ignores C's prior contents (NaN-safe).
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          bool trans_b, float* C, int64_t ldc, float alpha = 1.0f, float beta = 0.0f);

// The portable loop behind gemm() when BLAS is absent; also the slow twin in tests.
void gemm_blocked(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                  bool trans_b, float* C, int64_t ldc, float alpha = 1.0f, float beta = 0.0f);

// y[M,N] = x[M,K] * W[N,K]^T  (a torch nn.Linear without bias), all contiguous.
void linear(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y);

}  // namespace deepinfer::ops::cpu
