#include "model/deepseek_v4/cuda/arena.h"

#include <algorithm>

#include "model/deepseek_v4/cuda/cuda_plan.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/gemm_fp8w.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/moe_route.h"

namespace deepinfer::model::v4::gpu {
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

ArenaLayout layout_arena(const DeepseekV4Config& c, const ArenaSizes& s) {
  const int64_t T = s.T, D = c.hidden_size, n = c.hc_mult, H = c.num_heads, d = c.head_dim, r = c.q_lora_rank;
  const int64_t GR = c.o_groups * c.o_lora_rank, E = c.n_routed_experts, K = c.num_experts_per_tok;
  const int64_t I = c.moe_intermediate_size, Hi = std::max<int64_t>(c.index_n_heads, 1);
  const int64_t di = std::max<int64_t>(c.index_head_dim, 1), topk = std::max<int64_t>(c.index_topk, 1);
  const int64_t cw = 2 * d, iw = 2 * di;  // widest compressor widths (CSA)
  const int64_t TK = T * K;
  const size_t A = s.act_bytes;  // storage dtype of the activation buffers
  Carver a;
  ArenaLayout L{};
  L.X = a.take(T * n * D, 4);
  L.X2 = a.take(T * n * D, 4);
  L.u = a.take(T * D, 4);
  L.mix = a.take(T * c.hc_mix_dim(), 4);
  L.hc_ws = a.take(int64_t(ops::cuda::hc_pre_workspace_bytes(std::max<int64_t>(T, 1), int(n), D, ops::cuda::HcMode::kLayer)), 1);
  L.h = a.take(T * D, A);
  L.y = a.take(T * D, 4);
  L.qa = a.take(T * r, 4);
  L.qa_bf = a.take(T * r, A);
  L.qf = a.take(T * H * d, 4);
  L.q = a.take(T * H * d, A);
  L.kvf = a.take(T * d, 4);
  L.kv = a.take(T * d, A);
  L.o = a.take(T * H * d, A);
  L.zo = a.take(T * GR, A);
  L.win = a.take(s.win_rows * d, A);
  L.attn_ws = a.take(
      s.attn_splits > 1 ? int64_t(ops::cuda::sparse_attention_workspace_bytes(T, H, d, int(s.attn_splits))) : 1, 1);
  L.az = a.take(T * 2 * cw, 4);
  L.stage = a.take(s.stage_rows * 2 * cw, 4);
  L.ent = a.take(s.entries * d, 4);
  L.iaz = a.take(T * 2 * iw, 4);
  L.istage = a.take(s.stage_rows * 2 * iw, 4);
  L.ient = a.take(s.entries * di, 4);
  L.qi = a.take(T * Hi * di, A);
  L.iw = a.take(T * Hi, 4);
  L.scores = a.take(T * std::max<int64_t>(s.max_cand, 1), 4);
  L.sel_rows = a.take(T * topk, 4);
  L.sel_count = a.take(T, 4);
  L.logits_r = a.take(T * E, 4);
  L.ids = a.take(TK, 4);
  L.wts = a.take(TK, 4);
  L.xe = a.take(TK * D, A);
  L.gu = a.take(std::max(TK, T) * 2 * I, A);
  L.act = a.take(std::max(TK, T) * I, A);
  L.ye = a.take(TK * D, 4);
  L.sh = a.take(T * D, 4);
  L.perm_src = a.take(TK, 8);
  L.comb_rows = a.take(TK, 8);
  L.perm_w = a.take(TK, 4);
  L.moe_seg = a.take(E + 1, 4);
  L.moe_tiles = a.take(ops::cuda::moe_route_max_tiles(TK, E, ops::cuda::kGroupedTileM), 4);
  L.moe_ntiles = a.take(1, 4);
  L.sel = a.take(s.R * n * D, 4);
  L.hu = a.take(s.R * D, 4);
  L.hh = a.take(s.R * D, A);
  L.logits = a.take(s.R * c.vocab_size, 4);
  L.head_ws = a.take(
      int64_t(ops::cuda::hc_pre_workspace_bytes(std::max<int64_t>(s.R, 1), int(n), D, ops::cuda::HcMode::kHead)), 1);
  size_t ws = 0, wdq = 0;
  if (A == 2 && c.dense_format == WeightFormat::kFP8Block && c.fp8_block == 128 && T > 0) {
    for (size_t l = 0; l < c.layer_types.size(); ++l)
      for (const DenseShape& d : dense_fp8_shapes(c, c.layer_types[l])) {
        if (T <= kDenseFp8PrefillM)
          ws = std::max(ws, ops::cuda::fp8w_workspace_bytes(T, d.n, d.k, d.batch, kArenaMaxSms));
        else
          wdq = std::max(wdq, size_t(d.batch * d.n * d.k) * 2);
      }
  }
  L.fp8_ws_bytes = ws;
  L.fp8_ws = a.take(int64_t(ws), 1);
  L.wdq_bytes = wdq;
  L.wdq = a.take(int64_t(wdq), 1);
  L.total = (a.off + 255) / 256 * 256;
  return L;
}

}  // namespace deepinfer::model::v4::gpu
