// Lightning indexer of CSA layers on the GPU (spec §3.4): scores every candidate compressed block
// for each query token, then keeps the top-k as a set.
//   score_t(j) = Σ_h (relu(q[t,h]·K[j]) · qk_scale) · (w[t,h] · w_scale)     (fp32)
// Candidates of token t: cand_count[t] row ids of k_pool at cand_rows[cand_offset[t] ...].
// Selection: the min(topk, count) best candidates, ties to the earlier candidate (as the CPU twin),
// found exactly by an 8-pass radix select on the 64-bit key (ordered score, ~candidate index);
// out_rows lists them in candidate order (the CPU twin lists them by score; compare as sets),
// padded with -1. CPU twin: ops/cpu/indexer.h indexer_topk.
// In production numerics q and k_pool have been through fp4_round_trip (Hadamard + FP4) first.
//
// Two-level top-k (V4.1; CPU twin's header says the rule): candidate j is then entry j, grouped
// in blocks of block_size. Publish (out_blocks): the best min(topk_blocks, ceil(count/block_size))
// blocks by max score, the newest block pinned, listed ascending and -1 padded (block_scores is the
// workspace [T, indexer_max_blocks(...)]); the own top-k is unfiltered. Consume (in_blocks): only
// the entries of the listed blocks are candidates (others score -inf and are never picked), so
// fewer than topk may be kept; out_count says how many.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

struct IndexerParams {
  const void* q = nullptr;              // [T, Hi, di] dtype (roped, contiguous)
  const float* w = nullptr;             // [T, Hi] f32 weights_proj output (unscaled)
  const void* k_pool = nullptr;         // [rows, di] dtype
  DType dtype = DType::kBF16;           // of q and k_pool
  const int32_t* cand_rows = nullptr;
  const int64_t* cand_offset = nullptr; // [T]
  const int32_t* cand_count = nullptr;  // [T], each <= max_candidates
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;  // Hi <= 128, di multiple of 32, <= 256
  float qk_scale = 1.0f;
  float w_scale = 1.0f;
  int64_t topk = 0;
  int64_t max_candidates = 0;           // upper bound of cand_count (host-known, e.g. ctx/4)
  float* scores = nullptr;              // workspace [T, max_candidates] f32 (kept: tests read it)
  int32_t* out_rows = nullptr;          // [T, topk]
  int32_t* out_count = nullptr;         // [T]
  int64_t block_size = 0;               // two-level top-k: entries per candidate block (0: off)
  int64_t topk_blocks = 0;              // blocks kept per token (<= 1024 * 16)
  int32_t* out_blocks = nullptr;        // publish: [T, topk_blocks]
  const int32_t* in_blocks = nullptr;   // consume: [T, topk_blocks] as published
  float* block_scores = nullptr;        // publish workspace [T, indexer_max_blocks(max_candidates, block_size)]
};

int64_t indexer_max_blocks(int64_t max_candidates, int64_t block_size);
void indexer_topk(const IndexerParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
