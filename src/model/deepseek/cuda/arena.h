// The CUDA backend's per-step workspace: one growable device allocation carved by offsets into
// the shared forward's named buffers (activations.h) and the backend's own scratch (mHC partial
// sums, split-KV partials, indexer scores, MoE permutation and expert activations, the dense FP8
// GEMM's K-split workspace or bf16 scratch). The same function sizes it for a real step and for
// the memory plan's worst case, so the plan and the forward cannot disagree. Pure host code.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/deepseek/activations.h"

namespace deepinfer::model::ds::cuda {

struct ArenaSizes {
  StepSizes step;              // the named buffers' sizes
  int64_t max_cand = 0;        // max candidates of a token (indexer scores)
  int64_t attn_splits = 1;     // split-KV splits of the attention
  int64_t attn_tokens = 0;     // tokens of one attention launch (its workspace); 0 = all T
  size_t act_bytes = 2;        // activation element size (2 bf16, 4 exact)
  // Dense FP8 linears kept FP8: the largest K-split workspace (tokens <= kDenseFp8PrefillM) or
  // bf16 scratch (above) any of them needs at this step size (0: no FP8 linears).
  size_t fp8_ws_bytes = 0, wdq_bytes = 0;
};

struct ArenaLayout {
  std::array<size_t, size_t(Buf::kCount)> buf{};  // byte offsets of the named buffers
  size_t hc_ws, attn_ws, scores;                  // mHC partials (layer sites), split-KV, indexer scores
  size_t block_scores;                            // two-level top-k (V4.1): per-block maxima of the publisher
  size_t xe, gu, act, ye, perm_src, comb_rows, perm_w;  // MoE
  size_t moe_seg, moe_tiles, moe_ntiles;          // device permutation: i32 [E+1], [max tiles], [1]
  size_t head_ws;                                 // mHC partials of the final collapse
  size_t fp8_ws, fp8_ws_bytes, wdq, wdq_bytes;    // dense FP8 linears
  size_t total;
};

ArenaLayout layout_arena(const Dims& g, const ArenaSizes& s);

// Upper bound of a family's per-step device workspace (the memory plan, V4 and V4.1 alike): the
// arena of a worst-case step of `max_tokens` new tokens over `max_seqs` sequences with contexts up
// to `max_context`, the split-KV partials and the engine's device sampler workspace.
// `compress_ratios`: the main layers' ratios (0 = sliding); fp8_ws / wdq: the dense FP8 workspaces
// the family's weight table needs at max_tokens.
struct StepBound {
  size_t act_bytes = 2;
  int64_t max_tokens = 0, max_seqs = 0, max_context = 0;
  int64_t sliding_window = 0, num_heads = 0, head_dim = 0, vocab = 0;
  const std::vector<int64_t>* compress_ratios = nullptr;
  size_t fp8_ws_bytes = 0, wdq_bytes = 0;
};
size_t step_workspace_bound(const Dims& g, const StepBound& b);

}  // namespace deepinfer::model::ds::cuda
