// Engram injection (V4.1, MODEL-DEEPSEEK-V41.md §5; V41-REFERENCE-NOTES.md §5): a gated per-stream
// update of the residual streams from the n-gram table rows' projection. With kv = rows · Wkvᵀ
// split into key [n, D] and value [D] per token, w = q_weight ⊙ k_weight [n, D], and h = X[t, k]:
//   dot_k  = Σ_c h[c]·w_k[c]·key_k[c] · rsqrt(mean h² + eps) · rsqrt(mean key_k² + eps) · D^-½
//   gate_k = sigmoid(copysign(sqrt(max(|dot_k|, 1e-6)), dot_k))      (the reference's copysign)
//   X[t, k] += gate_k · value                                        (gate 0 for DEAD tokens)
// eps is rms_norm_eps. All fp32, in place.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cpu {

struct EngramArgs {
  float* x = nullptr;           // [T, n, D] streams, updated in place
  const float* kv = nullptr;    // [T, (n+1)·D]: key (n·D) then value (D)
  const float* w = nullptr;     // [n, D] q_weight ⊙ k_weight
  const uint8_t* dead = nullptr;  // optional [T]: 1 = DEAD (image span / pad), gate 0
  int64_t tokens = 0, n = 0, dim = 0;
  float eps = 1e-20f;
};

void engram_inject(const EngramArgs& args);

// One Engram table row in its stored form -> f32, exactly: FP8 e4m3 codes times their E8M0 scale
// (one per 32 values, product rounded to f32 once), or bf16/f32 values. The host widen of the CPU
// path, and the twin of the GPU's ops/cuda engram_widen. Throws on another dtype (or FP8 with
// dim % 32 != 0).
void engram_widen_row(DType dtype, const void* row, const uint8_t* row_scales, int64_t dim, float* out);

}  // namespace deepinfer::ops::cpu
