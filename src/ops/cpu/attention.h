// Sparse attention of DeepSeek-V4 (MODEL-DEEPSEEK-V4.md §3.2) for a varlen batch of query
// tokens. One shared K=V head: every key row is also the value row. Each query token t attends,
// with one softmax per head, over
//   (a) win_count[t] consecutive rows of win_kv starting at row win_begin[t] (its sliding window),
//   (b) cmp_count[t] rows of cmp_kv listed at cmp_rows[cmp_offset[t] ...] (compressed entries;
//       a negative row id is skipped),
// plus a per-head sink logit that enters only the denominator:
//   o_h = Σ_j e^{s_hj} K_j / (Σ_j e^{s_hj} + e^{sink_h}),  s_hj = scale · q_h·K_j.
// Tokens with no keys at all get o = 0.
#pragma once
#include <cstdint>

namespace deepinfer::ops::cpu {

struct SparseAttnArgs {
  const float* q = nullptr;            // [T, H, d]
  int64_t num_tokens = 0;              // T
  int64_t num_heads = 0;               // H
  int64_t head_dim = 0;                // d
  const float* win_kv = nullptr;       // [rows, d]
  const int32_t* win_begin = nullptr;  // [T]
  const int32_t* win_count = nullptr;  // [T]
  const float* cmp_kv = nullptr;       // [rows, d] (may be null when every cmp_count is 0)
  const int32_t* cmp_rows = nullptr;   // row ids into cmp_kv, per-token lists
  const int64_t* cmp_offset = nullptr; // [T] start of token t's list in cmp_rows
  const int32_t* cmp_count = nullptr;  // [T] (null = no compressed keys)
  const float* sink = nullptr;         // [H]
  float scale = 1.0f;                  // d^-1/2
  float* out = nullptr;                // [T, H, d]
};

void sparse_attention(const SparseAttnArgs& args);

}  // namespace deepinfer::ops::cpu
