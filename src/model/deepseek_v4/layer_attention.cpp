// Attention block of one layer for a packed batch (MODEL-DEEPSEEK-V4.md §3): q/kv projections,
// the layer's compressor (+ indexer on CSA layers) updating paged entries, sparse attention over
// window + compressed entries + sink, inverse rope, grouped output projection.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "model/deepseek_v4/model_internal.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/compressor.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/indexer.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/rope.h"

namespace deepinfer::model::v4 {
namespace {
using namespace ops::cpu;

// Pool row of compressed entry `i` of a sequence (paged through its block table).
int32_t entry_row(const SeqView& s, int64_t i, int64_t epb) {
  return int32_t(int64_t((*s.block_table)[size_t(i / epb)]) * epb + i % epb);
}

// Feeds one sequence's new (a|z) rows [n, 2c] (ape added) through a compressor: emits the blocks
// they complete into `pool` rows (normed, roped at m*i) and keeps the pending rows in the slot's
// ring `state` [S, 2c]. Stage = ring rows for tokens [lo, pos0) followed by the new rows.
void compress_seq(const SeqView& s, const CpuCompressor& C, bool overlap, const float* az, Tensor& state,
                  float* pool, int64_t epb, int64_t d, int64_t rope_dim, const std::vector<float>& inv_freq,
                  float eps, Workspace& ws) {
  const int64_t m = C.ratio, c = C.width, w2 = 2 * c, S = state.size(1);
  float* ring = state.data<float>() + int64_t(s.slot) * S * w2;
  const int64_t i0 = s.pos0 / m, i1 = (s.pos0 + s.n) / m;
  if (i1 > i0) {
    const int64_t lo = std::max<int64_t>(0, overlap ? m * (i0 - 1) : m * i0);
    const int64_t rows = s.pos0 + s.n - lo;
    float* stage = grow(ws.stage, size_t(rows * w2));
    for (int64_t p = lo; p < s.pos0; ++p) std::memcpy(stage + (p - lo) * w2, ring + (p % S) * w2, w2 * sizeof(float));
    std::memcpy(stage + (s.pos0 - lo) * w2, az, size_t(s.n * w2) * sizeof(float));
    const int64_t nb = i1 - i0;
    float* ent = grow(ws.ent, size_t(nb * d));
    compressor_pool({.a = stage, .z = stage + c, .row0 = lo, .n_rows = rows, .width = c, .row_stride = w2,
                     .ratio = m, .overlap = overlap, .first_block = i0, .n_blocks = nb, .out = ent});
    rmsnorm(ent, d, C.norm.data<float>(), ent, d, nb, d, eps);
    int64_t* epos = grow(ws.ent_pos, size_t(nb));
    for (int64_t b = 0; b < nb; ++b) epos[b] = m * (i0 + b);
    rope_apply(ent, nb, 1, d, rope_dim, epos, inv_freq.data(), false);
    for (int64_t b = 0; b < nb; ++b)
      std::memcpy(pool + int64_t(entry_row(s, i0 + b, epb)) * d, ent + b * d, size_t(d) * sizeof(float));
  }
  for (int64_t p = std::max(s.pos0, s.pos0 + s.n - S); p < s.pos0 + s.n; ++p)
    std::memcpy(ring + (p % S) * w2, az + (p - s.pos0) * w2, w2 * sizeof(float));
}

// az [T, 2c] = h Wkv|Wgate, + ape[pos mod m] on the gate half; then per-sequence compression.
void run_compressor(const CpuCompressor& C, bool overlap, const BatchPlan& plan, const float* h, int64_t D,
                    std::vector<float>& az_buf, Tensor& state, Tensor& pool_t, int64_t epb, int64_t d,
                    const DeepseekV4Config& cfg, const std::vector<float>& inv_freq, Workspace& ws) {
  const int64_t T = plan.T, c = C.width, m = C.ratio;
  float* az = grow(az_buf, size_t(T * 2 * c));
  linear(h, T, D, C.wkv_gate.data(), 2 * c, az);
  const float* ape = C.ape.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    float* z = az + t * 2 * c + c;
    const float* ap = ape + (plan.pos[t] % m) * c;
    for (int64_t e = 0; e < c; ++e) z[e] += ap[e];
  }
  for (const SeqView& s : plan.seqs)
    compress_seq(s, C, overlap, az + s.tok0 * 2 * c, state, pool_t.data<float>(), epb, d, cfg.rope_head_dim,
                 inv_freq, float(cfg.rms_norm_eps), ws);
}

// Candidate lists: all finished entries of each sequence (pool rows), token t sees floor((p+1)/m).
void candidate_lists(const BatchPlan& plan, int64_t m, int64_t epb, Workspace& ws) {
  ws.cand_rows.clear();
  grow(ws.cand_offset, size_t(plan.T));
  grow(ws.cmp_count, size_t(plan.T));
  for (const SeqView& s : plan.seqs) {
    const int64_t off = int64_t(ws.cand_rows.size()), total = (s.pos0 + s.n) / m;
    for (int64_t i = 0; i < total; ++i) ws.cand_rows.push_back(entry_row(s, i, epb));
    for (int64_t j = 0; j < s.n; ++j) {
      ws.cand_offset[s.tok0 + j] = off;
      ws.cmp_count[s.tok0 + j] = int32_t((s.pos0 + j + 1) / m);
    }
  }
}

// Window keys: per sequence, the ring rows of the previous min(W-1, pos0) positions followed by
// the chunk's own kv, so each token's window is one contiguous run of ws.win.
void stage_window(const BatchPlan& plan, const float* kv, const Tensor& ring_t, int64_t W, int64_t d, Workspace& ws) {
  int64_t total = 0;
  for (const SeqView& s : plan.seqs) total += std::min(W - 1, s.pos0) + s.n;
  float* win = grow(ws.win, size_t(total * d));
  grow(ws.win_begin, size_t(plan.T));
  grow(ws.win_count, size_t(plan.T));
  int64_t off = 0;
  for (const SeqView& s : plan.seqs) {
    const int64_t prev = std::min(W - 1, s.pos0), first = s.pos0 - prev;
    const float* ring = ring_t.data<float>() + int64_t(s.slot) * W * d;
    for (int64_t p = first; p < s.pos0; ++p)
      std::memcpy(win + (off + p - first) * d, ring + (p % W) * d, size_t(d) * sizeof(float));
    std::memcpy(win + (off + prev) * d, kv + s.tok0 * d, size_t(s.n * d) * sizeof(float));
    for (int64_t j = 0; j < s.n; ++j) {
      const int64_t p = s.pos0 + j, lo = std::max<int64_t>(0, p - W + 1);
      ws.win_begin[s.tok0 + j] = int32_t(off + lo - first);
      ws.win_count[s.tok0 + j] = int32_t(p - lo + 1);
    }
    off += prev + s.n;
  }
}

void store_window(const BatchPlan& plan, const float* kv, Tensor& ring_t, int64_t W, int64_t d) {
  for (const SeqView& s : plan.seqs) {
    float* ring = ring_t.data<float>() + int64_t(s.slot) * W * d;
    for (int64_t p = std::max(s.pos0, s.pos0 + s.n - W); p < s.pos0 + s.n; ++p)
      std::memcpy(ring + (p % W) * d, kv + (p - s.pos0 + s.tok0) * d, size_t(d) * sizeof(float));
  }
}
}  // namespace

void attention_block(const CpuAttention& A, const DeepseekV4Config& cfg, kv::LayerCache& cache, const BatchPlan& plan,
                     const float* h, float* out, Workspace& ws) {
  const int64_t T = plan.T, D = cfg.hidden_size, H = cfg.num_heads, d = cfg.head_dim, r = cfg.q_lora_rank;
  const int64_t rd = cfg.rope_head_dim, W = cache.spec.window;
  const float eps = float(cfg.rms_norm_eps);
  const std::vector<float>& inv = *A.inv_freq;

  float* qa = grow(ws.qa, size_t(T * r));
  linear(h, T, D, A.wq_a.data(), r, qa);
  rmsnorm(qa, r, A.q_norm.data<float>(), qa, r, T, r, eps);
  float* q = grow(ws.q, size_t(T * H * d));
  linear(qa, T, r, A.wq_b.data(), H * d, q);
  rmsnorm(q, d, nullptr, q, d, T * H, d, eps);  // per-head, unweighted
  rope_apply(q, T, H, d, rd, plan.pos.data(), inv.data(), false);
  float* kv = grow(ws.kv, size_t(T * d));
  linear(h, T, D, A.wkv.data(), d, kv);
  rmsnorm(kv, d, A.kv_norm.data<float>(), kv, d, T, d, eps);
  rope_apply(kv, T, 1, d, rd, plan.pos.data(), inv.data(), false);

  SparseAttnArgs args{.q = q, .num_tokens = T, .num_heads = H, .head_dim = d, .sink = A.sink.data<float>(),
                      .scale = 1.0f / std::sqrt(float(d))};
  if (A.compressor) {
    const bool csa = A.kind == AttnKind::kCSA;
    const int64_t m = A.ratio, epb = cache.entries_per_block;
    run_compressor(*A.compressor, csa, plan, h, D, ws.az, cache.comp_state, cache.comp, epb, d, cfg, inv, ws);
    candidate_lists(plan, m, epb, ws);
    args.cmp_kv = cache.comp.data<float>();
    if (!csa) {  // HCA: every finished entry is visible
      args.cmp_rows = ws.cand_rows.data();
      args.cmp_offset = ws.cand_offset.data();
      args.cmp_count = ws.cmp_count.data();
    } else {
      const int64_t Hi = cfg.index_n_heads, di = cfg.index_head_dim, K = cfg.index_topk;
      run_compressor(*A.index_compressor, true, plan, h, D, ws.iaz, cache.index_state, cache.index_keys, epb, di,
                     cfg, inv, ws);
      float* qi = grow(ws.qi, size_t(T * Hi * di));
      linear(qa, T, r, A.index_wq_b.data(), Hi * di, qi);
      rope_apply(qi, T, Hi, di, rd, plan.pos.data(), inv.data(), false);
      float* iw = grow(ws.iw, size_t(T * Hi));
      linear(h, T, D, A.index_weights.data(), Hi, iw);
      int32_t* sel = grow(ws.sel_rows, size_t(T * std::max<int64_t>(K, 1)));
      int32_t* sel_n = grow(ws.sel_count, size_t(T));
      indexer_topk({.q = qi, .w = iw, .num_tokens = T, .num_heads = Hi, .head_dim = di,
                    .k_pool = cache.index_keys.data<float>(), .cand_rows = ws.cand_rows.data(),
                    .cand_offset = ws.cand_offset.data(), .cand_count = ws.cmp_count.data(),
                    .qk_scale = 1.0f / std::sqrt(float(di)), .w_scale = 1.0f / std::sqrt(float(Hi)), .topk = K,
                    .out_rows = sel, .out_count = sel_n});
      int64_t* off = grow(ws.cmp_offset, size_t(T));
      for (int64_t t = 0; t < T; ++t) off[t] = t * K;
      args.cmp_rows = sel;
      args.cmp_offset = off;
      args.cmp_count = sel_n;
    }
  }
  stage_window(plan, kv, cache.window, W, d, ws);
  args.win_kv = ws.win.data();
  args.win_begin = ws.win_begin.data();
  args.win_count = ws.win_count.data();
  float* o = grow(ws.o, size_t(T * H * d));
  args.out = o;
  sparse_attention(args);
  store_window(plan, kv, cache.window, W, d);
  rope_apply(o, T, H, d, rd, plan.pos.data(), inv.data(), /*inverse=*/true);

  // Grouped output projection: group g (heads g*H/G ..) of every token through Wo_a[g] [R, gin].
  const int64_t G = cfg.o_groups, R = cfg.o_lora_rank, gin = H * d / G;
  float* zo = grow(ws.z_o, size_t(T * G * R));
  for (int64_t g = 0; g < G; ++g)
    gemm(T, R, gin, o + g * gin, H * d, A.wo_a.data() + g * R * gin, gin, true, zo + g * R, G * R);
  linear(zo, T, G * R, A.wo_b.data(), D, out);
}

}  // namespace deepinfer::model::v4
