// Rotary position embedding as DeepSeek-V4 uses it (MODEL-DEEPSEEK-V4.md §3.1): interleaved
// pairs (2i, 2i+1) on the TRAILING rope_dim channels of each head, fp32 angles pos*inv_freq[i].
#pragma once
#include <cstdint>
#include <vector>

namespace deepinfer::ops::cpu {

struct YarnScaling {
  double factor = 1.0;
  double original_max_position = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
};

// inv_freq [rope_dim/2]: theta^(-2i/rope_dim), optionally YaRN-interpolated (HF's
// _compute_yarn_parameters with truncate=true; no attention mscale). Computed in fp32 in the
// same order as transformers so the tables agree bit for bit.
std::vector<float> rope_inv_freq(double theta, int64_t rope_dim, const YarnScaling* yarn);

// In place on x [rows, heads, head_dim] (row stride = heads*head_dim): rotates channels
// [head_dim-rope_dim, head_dim) of every head of row r by angle pos[r]*inv_freq[i]
// (inverse = rotate by the negative angle, used on attention outputs).
void rope_apply(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* pos,
                const float* inv_freq, bool inverse);

}  // namespace deepinfer::ops::cpu
