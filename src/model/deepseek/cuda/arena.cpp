#include "model/deepseek/cuda/arena.h"

#include <algorithm>

#include "ops/cuda/attention.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/moe_route.h"

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
  L.moe_tiles = a.take(ops::cuda::moe_route_max_tiles(TK, E, ops::cuda::kGroupedTileM), 4);
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

}  // namespace deepinfer::model::ds::cuda
