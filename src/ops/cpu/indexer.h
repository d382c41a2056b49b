// Lightning indexer of CSA layers (MODEL-DEEPSEEK-V4.md §3.4): scores each candidate compressed
// block for each query token and keeps the top-k.
//   score_t(j) = Σ_h (relu(q[t,h]·K[j]) · qk_scale) · (w[t,h] · w_scale)
// Candidates of token t: cand_count[t] row ids of k_pool at cand_rows[cand_offset[t] ...]
// (tokens of one sequence usually share one list with growing counts). The selection is a set:
// out_rows[t*topk ...] gets the min(topk, count) best rows (ties: earlier candidate wins),
// padded with -1; out_count[t] says how many are valid.
#pragma once
#include <cstdint>

namespace deepinfer::ops::cpu {

struct IndexerArgs {
  const float* q = nullptr;             // [T, Hi, di]  roped indexer queries
  const float* w = nullptr;             // [T, Hi]      weights_proj output (unscaled)
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;
  const float* k_pool = nullptr;        // [rows, di]   compressed indexer keys
  const int32_t* cand_rows = nullptr;
  const int64_t* cand_offset = nullptr; // [T]
  const int32_t* cand_count = nullptr;  // [T]
  float qk_scale = 1.0f;                // di^-1/2
  float w_scale = 1.0f;                 // Hi^-1/2
  int64_t topk = 0;
  int32_t* out_rows = nullptr;          // [T, topk]
  int32_t* out_count = nullptr;         // [T]
  float* out_scores = nullptr;          // optional [T, max count] scratch for tests (may be null)
  int64_t scores_stride = 0;            // row stride of out_scores
};

void indexer_topk(const IndexerArgs& args);

}  // namespace deepinfer::ops::cpu
