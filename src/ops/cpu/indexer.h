// Lightning indexer of CSA layers (MODEL-DEEPSEEK-V4.md §3.4): scores each candidate compressed
// block for each query token and keeps the top-k.
//   score_t(j) = Σ_h (relu(q[t,h]·K[j]) · qk_scale) · (w[t,h] · w_scale)
// Candidates of token t: cand_count[t] row ids of k_pool at cand_rows[cand_offset[t] ...]
// (tokens of one sequence usually share one list with growing counts). The selection is a set:
// out_rows[t*topk ...] gets the min(topk, count) best rows (ties: earlier candidate wins),
// padded with -1; out_count[t] says how many are valid.
//
// Two-level top-k (V4.1, MODEL-DEEPSEEK-V41.md §3.5; V41-REFERENCE-NOTES.md §3). Candidate j of a
// token is then entry j of its sequence (V4.1 lists every finished entry in order), and entries
// are grouped in blocks of `block_size`:
//  - publish (out_blocks): the candidate source scores every candidate (its own top-k is
//    unfiltered) and keeps, per token, the best min(topk_blocks, ceil(count / block_size))
//    blocks by their max score, the block of the newest visible entry (count-1) always kept
//    (ties: lower block first); out_blocks[t*topk_blocks ...] lists them ascending, -1 padded;
//  - consume (in_blocks): a later index source scores only the entries of the token's listed
//    blocks; the others are not candidates (the reference's -inf), so fewer than topk may be kept.
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
  int64_t block_size = 0;               // candidate block size (two-level top-k; 0: none)
  int64_t topk_blocks = 0;              // blocks kept per token
  int32_t* out_blocks = nullptr;        // publish: [T, topk_blocks] kept blocks, ascending, -1 padded
  const int32_t* in_blocks = nullptr;   // consume: [T, topk_blocks] as published (-1 entries ignored)
};

void indexer_topk(const IndexerArgs& args);

}  // namespace deepinfer::ops::cpu
