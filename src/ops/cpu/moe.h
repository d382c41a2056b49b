// Experts of the DeepSeek-V4 MoE (MODEL-DEEPSEEK-V4.md §5), fp32.
//   E(x) = W2( silu(min(W1 x, L)) ⊙ clamp(W3 x, -L, L) )   (L = swiglu_limit; L <= 0: no clamp)
// Routed tokens are grouped per expert so each expert runs one GEMM over its tokens.
#pragma once
#include <cstdint>

#include "ops/cpu/gemm.h"

namespace deepinfer::ops::cpu {

struct ExpertF32 {
  const float* w1 = nullptr;  // gate [I, D]
  const float* w3 = nullptr;  // up   [I, D]
  const float* w2 = nullptr;  // down [D, I]
};

// out [n, D] = E(x [n, D]); g, u are [n, I] scratch. `kind`: the products' kernel (gemm.h).
// `row_scale` [n] (optional): row r's SwiGLU output is multiplied by row_scale[r] before w2 (the
// routed weight where the reference applies it: DeepSeek-V4.1, V41-REFERENCE-NOTES.md §7).
void expert_forward(const float* x, int64_t n, int64_t D, int64_t I, const ExpertF32& e, float swiglu_limit, float* g,
                    float* u, float* out, GemmKind kind = GemmKind::kFast, const float* row_scale = nullptr);
// The same expert with packed weights (the CPU backend's fast path): w13 [2I, D] (W1 rows then
// W3 rows) as ONE product into gu [n, 2I] (scratch), the SwiGLU into act [n, I] (scratch), then
// w2 [D, I]. Same arithmetic as expert_forward; each output is an in-order sum (linear_packed), so
// a row's result does not depend on n.
void expert_forward_packed(const float* x, int64_t n, int64_t D, int64_t I, const PackedWeight& w13,
                           const PackedWeight& w2, float swiglu_limit, float* gu, float* act, float* out,
                           const float* row_scale = nullptr);
// y[t] (+)= E(x[t]) for all T tokens (the shared expert). x [T, D], y [T, D].
void swiglu_mlp(const float* x, int64_t T, int64_t D, int64_t I, const ExpertF32& e, float swiglu_limit, float* y,
                bool accumulate);

// y[t] += Σ_j weights[t,j] · E_{ids[t,j]}(x[t]). experts [E]; ids/weights [T, k]. Duplicate ids
// in a row add up. y must be initialised by the caller.
void moe_experts(const float* x, int64_t T, int64_t D, int64_t I, const ExpertF32* experts, int64_t E,
                 const int32_t* ids, const float* weights, int64_t k, float swiglu_limit, float* y);

}  // namespace deepinfer::ops::cpu
