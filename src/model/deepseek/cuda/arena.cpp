#include "model/deepseek/cuda/arena.h"

#include <algorithm>

#include "model/deepseek/cuda/moe_decode.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/moe_route.h"
#include "ops/cuda/sampling.h"

namespace deepinfer::model::ds::cuda {
namespace {
struct Carver {
  size_t off = 0;
  size_t take(int64_t count, size_t elem) {
    off = (off + 255) / 256 * 256;
    const size_t o = off;
    off += size_t(std::max<int64_t>(count, 1)) * elem;  // never zero-sized: distinct, valid pointers
    return o;
  }
};
}  // namespace

ArenaLayout layout_arena(const Dims& g, const ArenaSizes& s) {
  const int64_t T = s.step.T, R = s.step.R, D = g.hidden, n = g.streams, H = g.heads, d = g.head_dim;
  const int64_t E = g.experts, K = g.topk, I = g.moe_inter, TK = T * K;
  const size_t A = s.act_bytes;
  Carver a;
  ArenaLayout L{};
  for (size_t b = 0; b < size_t(Buf::kCount); ++b) {
    const BufferSize bs = buffer_size(Buf(b), g, s.step, A);
    L.buf[b] = a.take(bs.elems, bs.elem_bytes);
  }
  L.hc_ws = a.take(int64_t(ops::cuda::hc_pre_workspace_bytes(std::max<int64_t>(T, 1), int(n), D, ops::cuda::HcMode::kLayer)), 1);
  L.attn_ws = a.take(
      s.attn_splits > 1 ? int64_t(ops::cuda::sparse_attention_workspace_bytes(s.attn_tokens > 0 ? std::min(T, s.attn_tokens) : T, H, d,
                                                                               int(s.attn_splits)))
                        : 1,
      1);
  L.scores = a.take(T * std::max<int64_t>(s.max_cand, 1), 4);
  L.block_scores = a.take(g.candidate_block_size > 0
                              ? T * ops::cuda::indexer_max_blocks(std::max<int64_t>(s.max_cand, 1), g.candidate_block_size)
                              : 1,
                          4);
  L.xe = a.take(TK * D, A);
  L.gu = a.take(std::max(TK, T) * 2 * I, A);
  L.act = a.take(std::max(TK, T) * I, A);
  L.ye = a.take(TK * D, 4);
  L.perm_src = a.take(TK, 8);
  L.comb_rows = a.take(TK, 8);
  L.perm_w = a.take(TK, 4);
  L.moe_seg = a.take(E + 1, 4);
  L.moe_tiles = a.take(std::max(ops::cuda::moe_route_max_tiles(TK, E, ops::cuda::kGroupedTileM),
                                ops::cuda::moe_route_max_tiles(TK, E, kMoeDecodeTileM)),  // moe_decode_grouped's tiles
                       4);
  L.moe_ntiles = a.take(1, 4);
  L.head_ws = a.take(
      int64_t(ops::cuda::hc_pre_workspace_bytes(std::max<int64_t>(R, 1), int(n), D, ops::cuda::HcMode::kHead)), 1);
  L.fp8_ws_bytes = s.fp8_ws_bytes;
  L.fp8_ws = a.take(int64_t(s.fp8_ws_bytes), 1);
  L.wdq_bytes = s.wdq_bytes;
  L.wdq = a.take(int64_t(s.wdq_bytes), 1);
  L.total = (a.off + 255) / 256 * 256;
  return L;
}

size_t step_workspace_bound(const Dims& g, const StepBound& b) {
  ArenaSizes s;
  s.act_bytes = b.act_bytes;
  s.step.T = b.max_tokens;
  s.step.win_rows = b.max_tokens + b.max_seqs * (b.sliding_window - 1);
  int64_t min_ratio = 0;
  if (b.compress_ratios)
    for (int64_t m : *b.compress_ratios)
      if (m > 0) min_ratio = min_ratio ? std::min(min_ratio, m) : m;
  s.step.stage_rows = b.max_tokens + b.max_seqs * 2 * std::max<int64_t>(min_ratio, 128);
  s.step.entries = min_ratio ? b.max_tokens / min_ratio + b.max_seqs : 0;
  s.max_cand = min_ratio ? b.max_context / min_ratio : 0;
  s.step.R = std::min<int64_t>(b.max_tokens, 1024);
  s.step.Rh = 0;
  // Split-KV partials (f32 [T, H, splits, d+2]) exist only while T·ceil(H/heads-per-block) < 4·SMs
  // (choose_attention_split), so T·splits < 8·SMs whatever max_tokens is: bound them by 2048
  // token-splits (up to 256 SMs) instead of max_tokens x 64.
  s.attn_splits = 1;
  s.fp8_ws_bytes = b.fp8_ws_bytes;
  s.wdq_bytes = b.wdq_bytes;
  return layout_arena(g, s).total + size_t(2048) * size_t(b.num_heads) * size_t(b.head_dim + 2) * sizeof(float) +
         ops::cuda::sampling_workspace_bytes(b.max_seqs, b.vocab);
}

}  // namespace deepinfer::model::ds::cuda
