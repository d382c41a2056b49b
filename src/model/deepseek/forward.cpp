#include "model/deepseek/forward.h"

#include <cmath>
#include <vector>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/context_parallel.h"

namespace deepinfer::model::ds {
namespace {

// Normed rows: y = w ⊙ x / rms(x) (w null: unweighted).
void norm(Backend& be, const Dims& g, const void* x, DType xd, int64_t xs, const float* w, void* y, DType yd,
          int64_t ys, int64_t rows, int64_t dim) {
  if (rows == 0) return;
  be.rmsnorm({.x = x, .x_dtype = xd, .x_stride = xs, .w = w, .y = y, .y_dtype = yd, .y_stride = ys, .rows = rows,
              .dim = dim, .eps = g.eps});
}

void rope(Backend& be, const Dims& g, void* x, DType dt, int64_t row_stride, int64_t rows, int64_t heads,
          int64_t head_dim, const int64_t* pos, const float* inv_freq, bool inverse = false) {
  if (rows == 0) return;
  be.rope({.x = x, .dtype = dt, .row_stride = row_stride, .rows = rows, .heads = heads, .head_dim = head_dim,
           .rope_dim = g.rope_dim, .pos = pos, .inv_freq = inv_freq, .inverse = inverse});
}

struct CompressorIo {
  Buf az, stage, ent;       // step buffers
  float* state = nullptr;   // f32 partial ring of the owner [slots*S, 2c]
  void* pool = nullptr;     // act paged pool [blocks*epb, dd]
  RowFormat format = RowFormat::kPlain;
  // Index keys projected from the normed, pre-rope entries (IndexKeyKind::kFromLatent): the
  // layer's wk / k_norm, the key pool and its format. Null: the layer has no such keys.
  const AttentionRef* latent_keys = nullptr;
  void* key_pool = nullptr;
  RowFormat key_format = RowFormat::kPlain;
};

// Index keys of the step's entries from their latent (V4.1): norm(latent·Wkᵀ) -> rope at the
// entry's position -> key format -> the key pool rows of the entries.
void keys_from_latent(Backend& be, const Dims& g, const CompressorIo& io, const float* ent, int64_t dd, int64_t E,
                      const KindIndex& K, const float* inv_freq) {
  const AttentionRef& A = *io.latent_keys;
  const int64_t di = g.index_dim;
  const void* x = ent;
  if (be.act() != DType::kF32) {  // linear inputs are act rows
    be.gather({.src_a = ent, .a_stride = dd, .src_dtype = DType::kF32, .dst = be.buf(Buf::kEntAct), .dst_stride = dd,
               .dst_dtype = be.act(), .rows = E, .width = dd});
    x = be.buf(Buf::kEntAct);
  }
  float* k = be.at<float>(Buf::kIent);
  be.linear(A.index_wk, x, dd, E, k, DType::kF32, di);
  norm(be, g, k, DType::kF32, di, A.index_k_norm.p, k, DType::kF32, di, E, di);
  rope(be, g, k, DType::kF32, di, E, 1, di, K.entry_pos, inv_freq);
  be.round_trip(k, DType::kF32, di, E, di, io.key_format);
  be.gather({.src_a = k, .a_stride = di, .src_dtype = DType::kF32, .dst = io.key_pool, .dst_stride = di,
             .dst_dtype = be.act(), .dst_index = K.entry_dst, .rows = E, .width = di});
}

// az = h·[Wkv;Wgate]ᵀ (+ape on the gate half); pooled blocks -> norm -> (index keys from the
// latent) -> rope -> cache format -> paged pool rows; the newest rows go to the slot's partial ring.
// kProject (ratio 1, no gate): every token completes its own entry and the step lists stage nothing
// (no partial ring): entry i is projection row i.
void run_compressor(Backend& be, const Dims& g, const CompressorRef& C, CompressorKind kind, const KindIndex& K,
                    const CompressorIo& io, const int64_t* pos, const float* inv_freq) {
  const StepPlan& P = be.plan();
  const bool overlap = kind == CompressorKind::kOverlap;
  const int64_t T = P.T, D = g.hidden, cw = C.width, w2 = 2 * cw, m = C.ratio;
  const int64_t dd = overlap ? cw / 2 : cw;
  const CompressPlan& H = *K.host;
  float* az = be.at<float>(io.az);
  be.linear(C.wkv_gate, be.buf(Buf::kH), D, T, az, DType::kF32, w2);
  if (C.ape.defined() && T > 0) be.add_position_bias(az + cw, w2, C.ape.p, pos, m, T, cw);
  const int64_t E = int64_t(H.entry_pos.size());
  if (E > 0) {
    float* stage = be.at<float>(io.stage);
    float* ent = be.at<float>(io.ent);
    if (kind == CompressorKind::kProject) {
      DI_CHECK(E == T, "ratio-1 compressor: ", E, " entries for ", T, " tokens");
      be.gather({.src_a = az, .a_stride = w2, .src_dtype = DType::kF32, .dst = ent, .dst_stride = dd,
                 .dst_dtype = DType::kF32, .rows = E, .width = cw});
    } else {
      be.gather({.src_a = io.state, .a_stride = w2, .src_b = az, .b_stride = w2, .src_dtype = DType::kF32,
                 .src_index = K.stage_src, .dst = stage, .dst_stride = w2, .dst_dtype = DType::kF32,
                 .dst_index = K.stage_dst, .rows = int64_t(H.stage_src.size()), .width = w2});
      if (P.fixed)  // one block per token at most; which block is read from the index lists
        be.decode_pool({.stage = stage, .ld = w2, .block = K.block, .tokens = T, .rows_per_token = H.rows_per_token,
                        .width = cw, .ratio = m, .overlap = overlap, .out = ent});
      for (const auto& l : H.launches) {
        const float* a = stage + l.stage_row0 * w2;
        be.compressor_pool({.a = a, .z = a + cw, .row0 = l.lo, .n_rows = l.n_rows, .width = cw, .row_stride = w2,
                            .ratio = m, .overlap = overlap, .first_block = l.first_block, .n_blocks = l.n_blocks,
                            .out = ent + l.entry0 * dd});
      }
    }
    norm(be, g, ent, DType::kF32, dd, C.norm.p, ent, DType::kF32, dd, E, dd);
    if (io.latent_keys) keys_from_latent(be, g, io, ent, dd, E, K, inv_freq);
    rope(be, g, ent, DType::kF32, dd, E, 1, dd, K.entry_pos, inv_freq);
    be.round_trip(ent, DType::kF32, dd, E, dd, io.format);
    be.gather({.src_a = ent, .a_stride = dd, .src_dtype = DType::kF32, .dst = io.pool, .dst_stride = dd,
               .dst_dtype = be.act(), .dst_index = K.entry_dst, .rows = E, .width = dd});
  }
  be.gather({.src_a = az, .a_stride = w2, .src_dtype = DType::kF32, .src_index = K.state_src, .dst = io.state,
             .dst_stride = w2, .dst_dtype = DType::kF32, .dst_index = K.state_dst,
             .rows = int64_t(H.state_src.size()), .width = w2});
}

const KindIndex& kind_index(const Backend& be, int64_t ratio, bool overlap) {
  const int64_t k = be.plan().kind_index(ratio, overlap);
  if (k < 0) DI_THROW(InternalError, "forward: no step lists for compress ratio ", ratio, overlap ? " (overlapping)" : "");
  return be.index().kinds[size_t(k)];
}

// The step rows whose attention core this rank computes: its spans of a split context-parallel
// step (`cp` non-null and active), else every row. Each query row's indexer scores and attention do
// not depend on the other rows of the call, so a split gives the rows one rank computes bit for bit.
std::vector<parallel::CpSpan> own_rows(const ContextParallel* cp, int64_t T) {
  if (cp && cp->active()) return cp->own_rows();
  if (T == 0) return {};
  return {{0, T}};
}

// The compressed entries a layer attends, filled into the attention arguments (none when no
// token of the step has a finished entry yet).
void compressed_keys(Backend& be, const Dims& g, const ModelPlan& plan, const LayerPlan& p, const AttentionRef& A,
                     AttentionArgs& sp, const ContextParallel* cp) {
  const int64_t T = be.plan().T, D = g.hidden, r = g.q_lora;
  const LayerPlan& kv_src = plan.layer(p.kv_source);  // entries live in the owner's cache
  const KindIndex& K = kind_index(be, p.ratio, kv_src.compressor == CompressorKind::kOverlap);
  if (K.host->max_count <= 0) return;
  sp.cmp_kv = be.cache(p.kv_source).entries;
  switch (p.select) {
    case SelectKind::kAll:  // every finished entry
      sp.cmp_rows = K.cand_rows;
      sp.cmp_offset = K.cand_offset;
      sp.cmp_count = K.cand_count;
      return;
    case SelectKind::kScore: {
      const int64_t Hi = g.index_heads, di = g.index_dim;
      const StepIndex& ix = be.index();
      void* qi = be.buf(Buf::kQi);
      be.linear(A.index_wq_b, be.buf(Buf::kQaN), r, T, qi, be.act(), Hi * di);
      rope(be, g, qi, be.act(), Hi * di, T, Hi, di, ix.pos, A.inv_freq);
      be.round_trip(qi, be.act(), di, T * Hi, di, p.key_format);
      be.linear(A.index_weights, be.buf(Buf::kH), D, T, be.buf(Buf::kIw), DType::kF32, Hi);
      IndexerArgs ia{.q = qi, .w = be.at<float>(Buf::kIw), .k_pool = be.cache(p.key_source).keys,
                     .cand_rows = K.cand_rows, .cand_offset = K.cand_offset, .cand_count = K.cand_count,
                     .num_tokens = T, .num_heads = Hi, .head_dim = di,
                     .qk_scale = 1.0f / std::sqrt(float(di)), .w_scale = 1.0f / std::sqrt(float(Hi)),
                     .topk = g.index_topk, .max_candidates = K.host->max_count,
                     .out_rows = be.at<int32_t>(Buf::kSelRows), .out_count = be.at<int32_t>(Buf::kSelCount)};
      // Two-level top-k: the candidate source publishes its blocks, later index sources score inside them.
      if (g.candidate_block_size > 0 && (p.candidate_source || p.uses_candidates)) {
        ia.block_size = g.candidate_block_size;
        ia.topk_blocks = g.candidate_topk_blocks;
        if (p.candidate_source) ia.out_blocks = be.at<int32_t>(Buf::kCandBlocks);
        else ia.in_blocks = be.at<int32_t>(Buf::kCandBlocks);
      }
      // Top-k of this rank's query rows only (a split step); kReuse layers and the attention read
      // the same rows.
      const size_t qe = dtype_nbytes(be.act(), Hi * di);
      for (const parallel::CpSpan& s : own_rows(cp, T)) {
        IndexerArgs part = ia;
        const int64_t b = s.begin;
        part.q = static_cast<const uint8_t*>(qi) + b * int64_t(qe);
        part.w = ia.w + b * Hi;
        part.cand_offset = ia.cand_offset + b;
        part.cand_count = ia.cand_count + b;
        part.num_tokens = s.size();
        part.out_rows = ia.out_rows + b * ia.topk;
        part.out_count = ia.out_count + b;
        if (ia.out_blocks) part.out_blocks = ia.out_blocks + b * ia.topk_blocks;
        if (ia.in_blocks) part.in_blocks = ia.in_blocks + b * ia.topk_blocks;
        be.indexer_topk(part);
      }
      [[fallthrough]];
    }
    case SelectKind::kReuse:  // the selection of the most recent scoring layer is still in kSel*
      sp.cmp_rows = be.at<int32_t>(Buf::kSelRows);
      sp.cmp_offset = be.index().sel_offset;
      sp.cmp_count = be.at<int32_t>(Buf::kSelCount);
      return;
    case SelectKind::kNone: return;
  }
}

// h [T, D] act (Buf::kH) -> y [T, D] f32 (Buf::kY).
// cp: the context-parallel group of a main-layer step (null for MTP blocks): a split step computes
// the attention core of this rank's rows and all-gathers the attention output rows.
void attention_block(Backend& be, const Dims& g, const ModelPlan& plan, const LayerPlan& p, const AttentionRef& A,
                     ContextParallel* cp) {
  const StepPlan& M = be.plan();
  const StepIndex& ix = be.index();
  const int64_t T = M.T, D = g.hidden, H = g.heads, d = g.head_dim, r = g.q_lora;
  const DType act = be.act();
  void* h = be.buf(Buf::kH);

  // wq_a and wkv both read h: one linear_many (one launch on the GPU for FP8 weights). The wkv
  // output (kKvf) is not read before its norm below, so running it first changes no bit. The
  // compressors' wkv_gate and the indexer's weights_proj read h too, but stay plain `linear`s:
  // they are not FP8 (LinearRole::kPlain, bf16 on the GPU), which gemm_fp8w_multi does not take.
  const LinearJob qkv[] = {{.W = &A.wq_a, .y = be.buf(Buf::kQa), .y_dtype = DType::kF32, .ldy = r},
                           {.W = &A.wkv, .y = be.buf(Buf::kKvf), .y_dtype = DType::kF32, .ldy = d}};
  be.linear_many(h, D, T, qkv);
  norm(be, g, be.buf(Buf::kQa), DType::kF32, r, A.q_norm.p, be.buf(Buf::kQaN), act, r, T, r);
  be.linear(A.wq_b, be.buf(Buf::kQaN), r, T, be.buf(Buf::kQf), DType::kF32, H * d);
  if (p.q_head_norm)
    norm(be, g, be.buf(Buf::kQf), DType::kF32, d, nullptr, be.buf(Buf::kQ), act, d, T * H, d);  // per head
  else
    be.gather({.src_a = be.buf(Buf::kQf), .a_stride = H * d, .src_dtype = DType::kF32, .dst = be.buf(Buf::kQ),
               .dst_stride = H * d, .dst_dtype = act, .rows = T, .width = H * d});
  rope(be, g, be.buf(Buf::kQ), act, H * d, T, H, d, ix.pos, A.inv_freq);
  norm(be, g, be.buf(Buf::kKvf), DType::kF32, d, A.kv_norm.p, be.buf(Buf::kKv), act, d, T, d);
  rope(be, g, be.buf(Buf::kKv), act, d, T, 1, d, ix.pos, A.inv_freq);
  be.round_trip(be.buf(Buf::kKv), act, d, T, d, p.window_format);

  // Bounded replay: a tail layer's window starts no earlier than its sequence's tail.
  const bool tail = p.replay_tail && ix.tail_win_begin;
  AttentionArgs sp{.q = be.buf(Buf::kQ), .q_stride = H * d, .win_kv = be.buf(Buf::kWin), .kv_stride = d,
                   .win_begin = tail ? ix.tail_win_begin : ix.win_begin,
                   .win_count = tail ? ix.tail_win_count : ix.win_count, .sink = A.sink.p,
                   .scale = 1.0f / std::sqrt(float(d)), .out = be.buf(Buf::kO), .out_stride = H * d,
                   .num_tokens = T, .num_heads = H, .head_dim = d};
  const LayerCacheRef own = be.cache(p.index);
  if (p.owns_entries()) {
    DI_CHECK(A.comp.has_value(), "layer ", p.index, " compresses without compressor weights");
    const bool overlap = p.compressor == CompressorKind::kOverlap;
    const bool latent = p.index_keys == IndexKeyKind::kFromLatent;
    DI_CHECK(!latent || A.index_wk.defined(), "layer ", p.index, " projects index keys without indexer.wk");
    run_compressor(be, g, *A.comp, p.compressor, kind_index(be, p.ratio, overlap),
                   {.az = Buf::kAz, .stage = Buf::kStage, .ent = Buf::kEnt, .state = own.state, .pool = own.entries,
                    .format = p.entry_format, .latent_keys = latent ? &A : nullptr, .key_pool = own.keys,
                    .key_format = p.key_format},
                   ix.pos, A.inv_freq);
  }
  if (p.index_keys == IndexKeyKind::kOwnCompressor) {
    DI_CHECK(A.icomp.has_value(), "layer ", p.index, " owns index keys without a key compressor");
    run_compressor(be, g, *A.icomp, CompressorKind::kOverlap, kind_index(be, p.ratio, true),
                   {.az = Buf::kIaz, .stage = Buf::kIstage, .ent = Buf::kIent, .state = own.index_state,
                    .pool = own.keys, .format = p.key_format},
                   ix.pos, A.inv_freq);
  }
  if (p.attends_compressed()) compressed_keys(be, g, plan, p, A, sp, cp);
  // Window keys: ring rows of earlier positions + this step's kv, one contiguous run per token.
  be.gather({.src_a = own.window, .a_stride = d, .src_b = be.buf(Buf::kKv), .b_stride = d, .src_dtype = act,
             .src_index = ix.win_src, .dst = be.buf(Buf::kWin), .dst_stride = d, .dst_dtype = act,
             .dst_index = ix.win_dst, .rows = int64_t(M.win_src.size()), .width = d});
  const size_t qrow = dtype_nbytes(act, H * d);
  for (const parallel::CpSpan& s : own_rows(cp, T)) {
    AttentionArgs part = sp;
    const int64_t b = s.begin;
    part.q = static_cast<const uint8_t*>(sp.q) + b * int64_t(qrow);
    part.out = static_cast<uint8_t*>(sp.out) + b * int64_t(qrow);
    part.win_begin = sp.win_begin + b;
    part.win_count = sp.win_count + b;
    if (sp.cmp_offset) part.cmp_offset = sp.cmp_offset + b;  // cmp_rows stays: the offsets are absolute
    if (sp.cmp_count) part.cmp_count = sp.cmp_count + b;
    part.num_tokens = s.size();
    be.sparse_attention(part);
  }
  if (cp && cp->active()) be.gather_cp_rows(*cp, be.buf(Buf::kO), T, int64_t(qrow));
  be.gather({.src_a = be.buf(Buf::kKv), .a_stride = d, .src_dtype = act, .src_index = ix.win_store_src,
             .dst = own.window, .dst_stride = d, .dst_dtype = act, .dst_index = ix.win_store_dst,
             .rows = int64_t(M.win_store_src.size()), .width = d});
  rope(be, g, be.buf(Buf::kO), act, H * d, T, H, d, ix.pos, A.inv_freq, /*inverse=*/true);
  // Grouped output projection: group gi of every token through wo_a[gi], then wo_b.
  const int64_t G = g.o_groups, R = g.o_lora;
  be.linear_grouped(A.wo_a, G, be.buf(Buf::kO), H * d, T, be.buf(Buf::kZo), G * R);
  be.linear(A.wo_b, be.buf(Buf::kZo), G * R, T, be.buf(Buf::kY), DType::kF32, D);
}

// h [T, D] act -> y [T, D] f32 = Σ_k w_k E_k(h) + shared(h).
void moe_block(Backend& be, const Dims& g, const MoeRef& M) {
  const int64_t T = be.plan().T;
  float* logits = be.at<float>(Buf::kRouterLogits);
  be.linear(M.gate, be.buf(Buf::kH), g.hidden, T, logits, DType::kF32, g.experts);  // router logits in fp32
  be.moe_route(M, logits, be.at<int32_t>(Buf::kIds), be.at<float>(Buf::kWts));
  be.moe_dispatch(M);
  be.moe_experts(M);
  be.moe_shared(M);
  be.moe_combine(M);
}

// mHC site: the site's mixes into `mix`, the streams collapsed into the block input (Buf::kU) and
// its normed copy h (Buf::kH). Per-site wiring (V4) collapses with the site's own pre weights; the
// single pass (V4.1) with the previous site's, kept in `prev_mix` (null: stream 0, the start).
void hc_site(Backend& be, const Dims& g, HcWiring wiring, const HcRef& hc, const float* X, const VecRef& norm_w,
             Buf mix, const float* prev_mix) {
  const int64_t T = be.plan().T, D = g.hidden;
  if (wiring == HcWiring::kPerSite) {
    const bool fused = norm_w.p && be.hc_site_norms(T, be.act());  // the backend norms u into h itself
    be.hc_site({.x = X, .w = &hc, .u = be.at<float>(Buf::kU), .mix = be.at<float>(mix), .tokens = T,
                .norm_w = fused ? norm_w.p : nullptr, .h = fused ? be.buf(Buf::kH) : nullptr, .h_dtype = be.act(),
                .norm_eps = g.eps});
    if (fused) return;
  } else {
    be.hc_site({.x = X, .w = &hc, .u = nullptr, .mix = be.at<float>(mix), .tokens = T});
    be.hc_collapse(X, prev_mix, be.at<float>(Buf::kU), T);
  }
  norm(be, g, be.buf(Buf::kU), DType::kF32, D, norm_w.p, be.buf(Buf::kH), be.act(), D, T, D);
}

void hc_merge(Backend& be, const float* X, float* out, Buf mix) {
  be.hc_post({.x = X, .y = be.at<float>(Buf::kY), .mix = be.at<float>(mix), .out = out, .tokens = be.plan().T});
}

// Engram (V4.1) before the layer's block: the step's table rows of this layer through wkv, then
// the gated per-stream injection into X.
void engram_block(Backend& be, const Dims& g, const LayerPlan& p, const EngramRef& E, float* X) {
  const int64_t T = be.plan().T, n = g.streams, D = g.hidden;
  DI_CHECK(E.wkv.defined() && E.w.defined(), "layer ", p.index, " injects Engram without its weights");
  float* kv = be.at<float>(Buf::kEngramKv);
  be.linear(E.wkv, be.engram_rows(p.index), E.wkv.in, T, kv, DType::kF32, (n + 1) * D);
  be.engram_inject(X, kv, E.w.p, T);
}

// One decoder layer on the f32 streams X in place (X2 as scratch). The attention site's mixes go to
// kMix, the FFN site's to kMix2 in the single pass (per site: kMix, reused): each site then
// collapses with the previous one's (`prev_mix`: the last FFN site's, null at the first layer).
void decoder_layer(Backend& be, const Dims& g, const ModelPlan& plan, const LayerPlan& p, const LayerRef& L, float* X,
                   float* X2, const float* prev_mix, ContextParallel* cp) {
  const HcWiring w = plan.hc;
  const Buf ffn_mix = w == HcWiring::kPerSite ? Buf::kMix : Buf::kMix2;
  if (p.engram) engram_block(be, g, p, L.engram, X);
  if (p.tap >= 0) be.stream_mean(X, be.at<float>(Buf::kTaps) + p.tap * g.hidden, g.taps * g.hidden, be.plan().T);
  hc_site(be, g, w, L.hc_attn, X, L.attn_norm, Buf::kMix, prev_mix);
  attention_block(be, g, plan, p, L.attn, cp);
  hc_merge(be, X, X2, Buf::kMix);
  hc_site(be, g, w, L.hc_ffn, X2, L.ffn_norm, ffn_mix, be.at<float>(Buf::kMix));
  moe_block(be, g, L.ffn);
  hc_merge(be, X2, X, ffn_mix);
}

// Final collapse of `rows` rows of X (gathered by `row_index`) -> norm -> head logits. Per-site
// wiring: hc_head's own weights on the gathered rows; single pass: every row collapsed with the
// last FFN site's pre weights (`last_mix`), then the rows gathered.
void head(Backend& be, const Dims& g, HcWiring wiring, const HcRef& hc, const VecRef& norm_w, const LinearRef& head_w,
          const float* X, const int64_t* row_index, int64_t rows, const float* last_mix) {
  if (rows == 0) return;
  const int64_t D = g.hidden, n = g.streams;
  if (wiring == HcWiring::kPerSite) {
    float* sel = be.at<float>(Buf::kSel);
    be.gather({.src_a = X, .a_stride = n * D, .src_dtype = DType::kF32, .src_index = row_index, .dst = sel,
               .dst_stride = n * D, .dst_dtype = DType::kF32, .rows = rows, .width = n * D});
    be.hc_site({.x = sel, .w = &hc, .u = be.at<float>(Buf::kHu), .mix = nullptr, .tokens = rows, .head = true});
  } else {
    be.hc_collapse(X, last_mix, be.at<float>(Buf::kU), be.plan().T);
    be.gather({.src_a = be.buf(Buf::kU), .a_stride = D, .src_dtype = DType::kF32, .src_index = row_index,
               .dst = be.buf(Buf::kHu), .dst_stride = D, .dst_dtype = DType::kF32, .rows = rows, .width = D});
  }
  norm(be, g, be.buf(Buf::kHu), DType::kF32, D, norm_w.p, be.buf(Buf::kHh), be.act(), D, rows, D);
  be.linear(head_w, be.buf(Buf::kHh), D, rows, be.buf(Buf::kLogits), DType::kF32, g.vocab);
}

// The hidden rows a drafter reads: the final streams (V4 MTP) or the DSpark taps (V4.1).
void gather_hidden(Backend& be, const Dims& g, int64_t rows) {
  if (rows == 0) return;
  const int64_t e = g.hidden_elems();
  be.gather({.src_a = be.buf(g.taps > 0 ? Buf::kTaps : Buf::kX), .a_stride = e, .src_dtype = DType::kF32, .src_index = be.index().hidden_rows,
             .dst = be.buf(Buf::kHidden), .dst_stride = e, .dst_dtype = DType::kF32, .rows = rows, .width = e});
}
}  // namespace

namespace {
// Embedding, then the main layers [0, end).
void trunk(Backend& be, const Arch& arch, const ModelRef& w, int64_t end) {
  const Dims& g = arch.dims;
  const int64_t T = be.plan().T, D = g.hidden, n = g.streams;
  float* X = be.at<float>(Buf::kX);
  be.gather({.src_a = w.embed.w, .a_stride = D, .src_dtype = w.embed.dtype, .src_index = be.index().embed_src, .dst = X,
             .dst_stride = D, .dst_dtype = DType::kF32, .rows = T * n, .width = D});
  DI_CHECK(int64_t(w.layers.size()) == arch.plan.num_layers(), "weights of ", w.layers.size(), " layers for ",
           arch.plan.num_layers(), " layer plans");
  const float* last_ffn_mix = be.at<float>(Buf::kMix2);  // single pass: the previous layer's FFN site
  for (int64_t l = 0; l < end; ++l)
    decoder_layer(be, g, arch.plan, arch.plan.layers[size_t(l)], w.layers[size_t(l)], X, be.at<float>(Buf::kX2),
                  l == 0 ? nullptr : last_ffn_mix, be.context_parallel());
}
}  // namespace

void forward_step(Backend& be, const Arch& arch, const ModelRef& w, int64_t rows, int64_t hidden_rows) {
  trunk(be, arch, w, arch.plan.num_layers());
  gather_hidden(be, arch.dims, hidden_rows);
  head(be, arch.dims, arch.plan.hc, w.hc_head, w.norm, w.head, be.at<float>(Buf::kX), be.index().logits_rows, rows,
       be.at<float>(Buf::kMix2));
}

int64_t replay_encoder_layers(const ModelPlan& plan) {
  int64_t end = 0;
  while (end < plan.num_layers() && !plan.layers[size_t(end)].replay_tail) ++end;
  return end;
}

void encoder_step(Backend& be, const Arch& arch, const ModelRef& w) {
  trunk(be, arch, w, replay_encoder_layers(arch.plan));
}

void collectives_step(Backend& be, const Arch& arch, const ModelRef& w) {
  DI_CHECK(be.plan().T == 0, "collectives_step on a plan of ", be.plan().T, " tokens");
  for (int64_t l = 0; l < arch.plan.num_layers(); ++l) {
    const MoeRef& M = w.layers[size_t(l)].ffn;
    if (M.ep_layer < 0) continue;
    be.moe_dispatch(M);
    be.moe_experts(M);
    be.moe_combine(M);
  }
}

void mtp_step(Backend& be, const Arch& arch, const ModelRef& w, int64_t k, const float* main_hidden, int64_t rows,
              int64_t hidden_rows) {
  const Dims& g = arch.dims;
  if (k < 0 || k >= int64_t(w.mtp.size()) || k >= int64_t(arch.plan.drafter.size()))
    DI_THROW(InvalidArgument, "mtp_step: block ", k, " but the model has ", w.mtp.size(), " MTP blocks");
  const MtpRef& M = w.mtp[size_t(k)];
  const int64_t T = be.plan().T, D = g.hidden, n = g.streams;
  const DType act = be.act();
  // e = e_proj(enorm(embed[tok])); hs_j = h_proj(hnorm(stream j)); X_j = hs_j + e. The embedding
  // goes to every stream of X2 (the plan's embedding rows); the norm reads stream 0 of each token.
  float* e = be.at<float>(Buf::kX2);
  be.gather({.src_a = w.embed.w, .a_stride = D, .src_dtype = w.embed.dtype, .src_index = be.index().embed_src,
             .dst = e, .dst_stride = D, .dst_dtype = DType::kF32, .rows = T * n, .width = D});
  norm(be, g, e, DType::kF32, n * D, M.enorm.p, be.buf(Buf::kH), act, D, T, D);
  be.linear(M.e_proj, be.buf(Buf::kH), D, T, be.buf(Buf::kY), DType::kF32, D);
  norm(be, g, main_hidden, DType::kF32, D, M.hnorm.p, be.buf(Buf::kHs), act, D, T * n, D);
  float* X = be.at<float>(Buf::kX);
  be.linear(M.h_proj, be.buf(Buf::kHs), D, T * n, X, DType::kF32, D);
  be.add_streams(X, be.at<float>(Buf::kY), T, n, D);
  DI_CHECK(arch.plan.hc == HcWiring::kPerSite, "mtp_step: the V4 MTP block needs per-site mHC wiring");
  decoder_layer(be, g, arch.plan, arch.plan.drafter[size_t(k)], M.block, X, be.at<float>(Buf::kX2), nullptr,
                /*cp=*/nullptr);
  gather_hidden(be, g, hidden_rows);
  head(be, g, HcWiring::kPerSite, M.hc_head, M.norm, w.head, X, be.index().logits_rows, rows, nullptr);
}

}  // namespace deepinfer::model::ds
