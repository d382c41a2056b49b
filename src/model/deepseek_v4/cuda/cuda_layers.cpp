// One decoder layer of the GPU forward (MODEL-DEEPSEEK-V4.md §2, §3, §5): mHC sites around the
// attention block (q/kv projections, compressor + indexer updating the paged device cache,
// sparse attention over window + compressed entries + sink, grouped output projection) and the
// MoE block (router, tokens permuted by expert on the device, grouped expert GEMMs over the
// weights as stored — FP4/FP8/bf16 — or, in exact numerics, per-expert cuBLASLt fp32 GEMMs after a
// routing read-back; clamped SwiGLU, fixed-order combine with the shared expert). Mirrors layer_attention.cpp / layer_moe.cpp.
#include <cmath>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/cuda/cuda_internal.h"
#include "model/deepseek_v4/cuda/glue_kernels.h"
#include "model/deepseek_v4/cuda/moe_decode.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/compressor.h"
#include "ops/cuda/gemm_fp8w.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/moe_route.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/quant.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/router.h"
#include "ops/cuda/swiglu.h"

namespace deepinfer::model::v4::gpu {
namespace oc = ops::cuda;

const DevKind& DevMeta::kind(int64_t ratio, bool overlap) const {
  for (const auto& k : kinds)
    if (k.host->ratio == ratio && k.host->overlap == overlap) return k;
  DI_THROW(InvalidArgument, "forward: no step metadata for compress ratio ", ratio, overlap ? " (CSA)" : " (HCA)");
}

namespace {
// Dense FP8 weight (cuda_weights: e4m3 + e8m0 grid), `batch` row groups of [n, k] (wo_a: groups):
// up to kDenseFp8PrefillM tokens the weight-only GEMM reads the bytes as stored; above, one
// dequantisation to the arena's bf16 scratch and the cuBLASLt GEMM.
void linear_fp8(const StepCtx& c, const DevLinear& W, const void* x, int64_t ldx, int64_t bsx, int64_t M, void* y,
                DType out_dtype, int64_t ldy, int64_t bsy, int64_t n, int64_t k, int64_t batch) {
  namespace oc = ops::cuda;
  DI_CHECK(c.act == DType::kBF16, "linear: FP8 weights need bf16 activations");
  if (M > kDenseFp8PrefillM && c.L.wdq_bytes >= size_t(W.out * W.in) * 2) {
    void* wd = c.at<void>(c.L.wdq);
    oc::dequant_fp8w_bf16({.w = static_cast<const uint8_t*>(W.data()), .scale = W.scale.as<const uint8_t>(),
                           .out = wd, .N = W.out, .K = W.in, .scale_rows = W.scale_rows},
                          c.stream);
    c.blas->gemm({.x = x, .ldx = ldx, .w = wd, .ldw = k, .y = y, .ldy = ldy, .in_dtype = DType::kBF16,
                  .out_dtype = out_dtype, .M = M, .N = n, .K = k, .batch = batch, .batch_stride_x = bsx,
                  .batch_stride_w = n * k, .batch_stride_y = bsy},
                 c.stream);
    return;
  }
  oc::gemm_fp8w({.x = x, .ldx = ldx, .w = static_cast<const uint8_t*>(W.data()), .scale = W.scale.as<const uint8_t>(),
                 .scale_rows = W.scale_rows, .y = y, .ldy = ldy, .out_dtype = out_dtype, .M = M, .N = n, .K = k,
                 .batch = batch, .batch_stride_x = bsx, .batch_stride_y = bsy,
                 .workspace = c.at<float>(c.L.fp8_ws), .workspace_bytes = c.L.fp8_ws_bytes, .num_sms = c.num_sms},
                c.stream);
}
}  // namespace

void linear(const StepCtx& c, const DevLinear& W, const void* x, int64_t ldx, int64_t M, void* y, DType out_dtype,
            int64_t ldy) {
  if (M == 0) return;
  DI_CHECK(W.data() != nullptr && W.out > 0 && W.in > 0, "linear: weight not uploaded");
  if (W.dtype == DType::kF8E4M3) {
    linear_fp8(c, W, x, ldx, 0, M, y, out_dtype, ldy, 0, W.out, W.in, 1);
    return;
  }
  DI_CHECK(W.dtype == DType::kBF16 || out_dtype == DType::kF32, "linear: f32 weights need an f32 output");
  c.blas->gemm({.x = x, .ldx = ldx, .w = W.data(), .ldw = W.in, .y = y, .ldy = ldy, .in_dtype = W.dtype,
                .out_dtype = out_dtype, .M = M, .N = W.out, .K = W.in},
               c.stream);
}

namespace {
void norm(const StepCtx& c, const void* x, DType xd, int64_t xs, const float* w, void* y, DType yd, int64_t ys,
          int64_t rows, int64_t dim) {
  if (rows == 0) return;
  oc::rmsnorm({.x = x, .x_dtype = xd, .x_stride = xs, .w = w, .w_dtype = DType::kF32, .y = y, .y_dtype = yd,
               .y_stride = ys, .rows = rows, .dim = dim, .eps = float(c.cfg->rms_norm_eps)},
              c.stream);
}

void rope(const StepCtx& c, void* x, DType dt, int64_t row_stride, int64_t rows, int64_t heads, int64_t head_dim,
          const int64_t* pos, const float* inv_freq, bool inverse = false) {
  if (rows == 0) return;
  oc::rope({.x = x, .dtype = dt, .row_stride = row_stride, .head_stride = head_dim, .rows = rows, .heads = heads,
            .head_dim = head_dim, .rope_dim = c.cfg->rope_head_dim, .pos = pos, .inv_freq = inv_freq,
            .inverse = inverse},
           c.stream);
}

bool production(const StepCtx& c) { return c.numerics == Numerics::kProduction; }

// FP8 round trip of the non-rope dims (production numerics), when the geometry allows it.
void fp8_kv(const StepCtx& c, void* x, DType dt, int64_t rows, int64_t d) {
  const int64_t qd = d - c.cfg->rope_head_dim;
  if (!production(c) || rows == 0 || qd <= 0 || qd % 64 != 0) return;
  oc::fp8_round_trip({.x = x, .dtype = dt, .row_stride = d, .rows = rows, .quant_dims = qd, .block = 64,
                      .pow2_scale = true},
                     c.stream);
}
void fp4_index(const StepCtx& c, void* x, DType dt, int64_t rows, int64_t dim) {
  if (!production(c) || rows == 0 || dim % 32 != 0) return;
  oc::fp4_round_trip({.x = x, .dtype = dt, .row_stride = dim, .rows = rows, .dim = dim, .hadamard = dim == 128},
                     c.stream);
}

struct CompressorIo {
  size_t az, stage, ent;         // arena offsets
  void* state = nullptr;         // f32 [slots*S, 2c]
  void* pool = nullptr;          // cache dtype [blocks*epb, dd]
  bool index = false;            // indexer keys (FP4) vs main entries (FP8)
};

// az = h·[Wkv;Wgate]ᵀ (+ape on the gate half), pooled blocks -> norm -> rope -> (round trip) ->
// paged pool rows; the newest rows go to the slot ring. Mirrors compress_seq on the CPU.
void run_compressor(const StepCtx& c, const GpuCompressor& C, bool overlap, const DevKind& K, const CompressorIo& io,
                    const float* inv_freq) {
  const int64_t T = c.meta->T, D = c.cfg->hidden_size, cw = C.width, w2 = 2 * cw, m = C.ratio;
  const int64_t dd = overlap ? cw / 2 : cw;
  const CompressMeta& H = *K.host;
  float* az = c.at<float>(io.az);
  linear(c, C.wkv_gate, c.at<void>(c.L.h), D, T, az, DType::kF32, w2);
  add_position_bias({.z = az + cw, .z_stride = w2, .bias = C.ape.data(), .pos = c.dmeta->pos, .m = m, .rows = T,
                     .width = cw},
                    c.stream);
  const int64_t E = int64_t(H.entry_pos.size());
  if (E > 0) {
    float* stage = c.at<float>(io.stage);
    float* ent = c.at<float>(io.ent);
    gather_rows({.src_a = io.state, .a_stride = w2, .src_b = az, .b_stride = w2, .src_dtype = DType::kF32,
                 .src_index = K.stage_src, .dst = stage, .dst_stride = w2, .dst_dtype = DType::kF32,
                 .dst_index = K.stage_dst, .rows = int64_t(H.stage_src.size()), .width = w2},
                c.stream);
    if (c.meta->fixed)  // one block per token at most; which block is read from device memory
      decode_pool({.stage = stage, .ld = w2, .block = K.block, .tokens = T, .rows_per_token = H.rows_per_token,
                   .width = cw, .ratio = m, .overlap = overlap, .out = ent},
                  c.stream);
    for (const auto& l : H.launches) {
      const float* a = stage + l.stage_row0 * w2;
      oc::compressor_pool({.a = a, .z = a + cw, .row0 = l.lo, .n_rows = l.n_rows, .width = cw, .row_stride = w2,
                           .ratio = m, .overlap = overlap, .first_block = l.first_block, .n_blocks = l.n_blocks,
                           .out = ent + l.entry0 * dd},
                          c.stream);
    }
    norm(c, ent, DType::kF32, dd, C.norm.data(), ent, DType::kF32, dd, E, dd);
    rope(c, ent, DType::kF32, dd, E, 1, dd, K.entry_pos, inv_freq);
    if (io.index)
      fp4_index(c, ent, DType::kF32, E, dd);
    else
      fp8_kv(c, ent, DType::kF32, E, dd);
    gather_rows({.src_a = ent, .a_stride = dd, .src_dtype = DType::kF32, .dst = io.pool, .dst_stride = dd,
                 .dst_dtype = c.act, .dst_index = K.entry_dst, .rows = E, .width = dd},
                c.stream);
  }
  gather_rows({.src_a = az, .a_stride = w2, .src_dtype = DType::kF32, .src_index = K.state_src, .dst = io.state,
               .dst_stride = w2, .dst_dtype = DType::kF32, .dst_index = K.state_dst,
               .rows = int64_t(H.state_src.size()), .width = w2},
              c.stream);
}

// h [T, D] act (arena L.h) -> y [T, D] f32 (arena L.y). "act" = c.act: bf16, f32 in exact mode.
void attention_block(const StepCtx& c, const GpuAttention& A, GpuLayerCache& cache) {
  const DeepseekV4Config& g = *c.cfg;
  const StepMeta& M = *c.meta;
  const DevMeta& dm = *c.dmeta;
  const int64_t T = M.T, D = g.hidden_size, H = g.num_heads, d = g.head_dim, r = g.q_lora_rank;
  const ArenaLayout& L = c.L;
  void* h = c.at<void>(L.h);

  linear(c, A.wq_a, h, D, T, c.at<float>(L.qa), DType::kF32, r);
  norm(c, c.at<float>(L.qa), DType::kF32, r, A.q_norm.data(), c.at<void>(L.qa_bf), c.act, r, T, r);
  linear(c, A.wq_b, c.at<void>(L.qa_bf), r, T, c.at<float>(L.qf), DType::kF32, H * d);
  norm(c, c.at<float>(L.qf), DType::kF32, d, nullptr, c.at<void>(L.q), c.act, d, T * H, d);  // per head
  rope(c, c.at<void>(L.q), c.act, H * d, T, H, d, dm.pos, A.inv_freq);
  linear(c, A.wkv, h, D, T, c.at<float>(L.kvf), DType::kF32, d);
  norm(c, c.at<float>(L.kvf), DType::kF32, d, A.kv_norm.data(), c.at<void>(L.kv), c.act, d, T, d);
  rope(c, c.at<void>(L.kv), c.act, d, T, 1, d, dm.pos, A.inv_freq);
  fp8_kv(c, c.at<void>(L.kv), c.act, T, d);

  oc::SparseAttnParams sp{.q = c.at<void>(L.q), .q_stride = H * d, .win_kv = c.at<void>(L.win), .kv_stride = d,
                          .dtype = c.act, .win_begin = dm.win_begin, .win_count = dm.win_count,
                          .sink = A.sink.data(), .scale = 1.0f / std::sqrt(float(d)), .out = c.at<void>(L.o),
                          .out_stride = H * d, .num_tokens = T, .num_heads = H, .head_dim = d};
  if (A.comp) {
    const bool csa = A.kind == AttnKind::kCSA;
    const DevKind& K = dm.kind(A.ratio, csa);
    run_compressor(c, *A.comp, csa, K,
                   {.az = L.az, .stage = L.stage, .ent = L.ent, .state = cache.comp_state.data(),
                    .pool = cache.comp.data(), .index = false},
                   A.inv_freq);
    if (csa) {
      DI_CHECK(A.icomp.has_value(), "CSA layer without indexer");
      run_compressor(c, *A.icomp, true, K,
                     {.az = L.iaz, .stage = L.istage, .ent = L.ient, .state = cache.index_state.data(),
                      .pool = cache.index_keys.data(), .index = true},
                     A.inv_freq);
    }
    if (K.host->max_count > 0) {
      sp.cmp_kv = cache.comp.data();
      if (!csa) {
        sp.cmp_rows = K.cand_rows;
        sp.cmp_offset = K.cand_offset;
        sp.cmp_count = K.cand_count;
      } else {
        const int64_t Hi = g.index_n_heads, di = g.index_head_dim;
        void* qi = c.at<void>(L.qi);
        linear(c, A.index_wq_b, c.at<void>(L.qa_bf), r, T, qi, c.act, Hi * di);
        rope(c, qi, c.act, Hi * di, T, Hi, di, dm.pos, A.inv_freq);
        fp4_index(c, qi, c.act, T * Hi, di);
        linear(c, A.index_weights, h, D, T, c.at<float>(L.iw), DType::kF32, Hi);
        oc::indexer_topk({.q = qi, .w = c.at<float>(L.iw), .k_pool = cache.index_keys.data(),
                          .dtype = c.act, .cand_rows = K.cand_rows, .cand_offset = K.cand_offset,
                          .cand_count = K.cand_count, .num_tokens = T, .num_heads = Hi, .head_dim = di,
                          .qk_scale = 1.0f / std::sqrt(float(di)), .w_scale = 1.0f / std::sqrt(float(Hi)),
                          .topk = g.index_topk, .max_candidates = K.host->max_count,
                          .scores = c.at<float>(L.scores), .out_rows = c.at<int32_t>(L.sel_rows),
                          .out_count = c.at<int32_t>(L.sel_count)},
                         c.stream);
        sp.cmp_rows = c.at<int32_t>(L.sel_rows);
        sp.cmp_offset = dm.sel_offset;
        sp.cmp_count = c.at<int32_t>(L.sel_count);
      }
    }
  }
  // Window keys: ring rows of earlier positions + this step's kv, one contiguous run per token.
  gather_rows({.src_a = cache.window.data(), .a_stride = d, .src_b = c.at<void>(L.kv), .b_stride = d,
               .src_dtype = c.act, .src_index = dm.win_src, .dst = c.at<void>(L.win), .dst_stride = d,
               .dst_dtype = c.act, .dst_index = dm.win_dst, .rows = int64_t(M.win_src.size()), .width = d},
              c.stream);
  if (c.split.num_splits > 1) {
    sp.num_splits = c.split.num_splits;
    sp.split_keys = c.split.split_keys;
    sp.workspace = c.at<float>(L.attn_ws);
  }
  oc::sparse_attention(sp, c.stream);
  gather_rows({.src_a = c.at<void>(L.kv), .a_stride = d, .src_dtype = c.act, .src_index = dm.win_store_src,
               .dst = cache.window.data(), .dst_stride = d, .dst_dtype = c.act, .dst_index = dm.win_store_dst,
               .rows = int64_t(M.win_store_src.size()), .width = d},
              c.stream);
  rope(c, c.at<void>(L.o), c.act, H * d, T, H, d, dm.pos, A.inv_freq, /*inverse=*/true);

  // Grouped output projection: group gi of every token through wo_a[gi] [R, gin] (strided batch).
  const int64_t G = g.o_groups, R = g.o_lora_rank, gin = H * d / G;
  if (A.wo_a.dtype == DType::kF8E4M3) {
    DI_CHECK(A.wo_a.out == G * R && A.wo_a.in == gin, "wo_a is [", A.wo_a.out, ", ", A.wo_a.in, "], expected [", G * R,
             ", ", gin, "]");
    linear_fp8(c, A.wo_a, c.at<void>(L.o), H * d, gin, T, c.at<void>(L.zo), c.act, G * R, R, R, gin, G);
  } else {
    c.blas->gemm({.x = c.at<void>(L.o), .ldx = H * d, .w = A.wo_a.data(), .ldw = gin, .y = c.at<void>(L.zo),
                  .ldy = G * R, .in_dtype = A.wo_a.dtype, .out_dtype = c.act, .M = T, .N = R, .K = gin,
                  .batch = G, .batch_stride_x = gin, .batch_stride_w = R * gin, .batch_stride_y = R},
                 c.stream);
  }
  linear(c, A.wo_b, c.at<void>(L.zo), G * R, T, c.at<float>(L.y), DType::kF32, D);
}
}  // namespace

namespace {
// Sorts the step's (token, k) assignments by expert (stable: tokens ascending within an
// expert), so each expert runs one GEMM over a contiguous run of rows.
void permute_by_expert(MoeHost& m, int64_t T, int64_t K, int64_t E) {
  m.offset.assign(size_t(E + 1), 0);
  for (int64_t i = 0; i < T * K; ++i) {
    const int32_t e = m.ids[size_t(i)];
    if (e < 0 || e >= E)
      DI_THROW(InvalidArgument, "moe: router gave expert id ", e, " for token ", i / K, " (experts: ", E,
               "); is a hash table entry out of range?");
    m.offset[size_t(e + 1)]++;
  }
  for (int64_t e = 0; e < E; ++e) m.offset[size_t(e + 1)] += m.offset[size_t(e)];
  std::vector<int64_t> next(m.offset.begin(), m.offset.end() - 1);
  m.perm_src.resize(size_t(T * K));
  m.perm_w.resize(size_t(T * K));
  m.comb.resize(size_t(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t a = next[size_t(m.ids[size_t(t * K + k)])]++;
      m.perm_src[size_t(a)] = t;
      m.perm_w[size_t(a)] = m.wts[size_t(t * K + k)];
      m.comb[size_t(t * K + k)] = a;
    }
}

// SwiGLU expert over `rows` rows of gu [rows, 2I] (gate | up) into act [rows, I], both c.act.
void swiglu_rows(const StepCtx& c, void* gu, void* act, const float* row_weight, int64_t rows) {
  if (rows == 0) return;
  const int64_t I = c.cfg->moe_intermediate_size;
  ops::cuda::swiglu({.gate = gu, .gate_stride = 2 * I, .up = static_cast<char*>(gu) + I * int64_t(c.act_bytes),
                     .up_stride = 2 * I, .in_dtype = c.act, .row_weight = row_weight, .out = act, .out_stride = I,
                     .out_dtype = c.act, .rows = rows, .inter = I, .limit = float(c.cfg->swiglu_limit)},
                    c.stream);
}

// Shared expert: h [T, D] act -> sh [T, D] f32 (gu/act reused: same stream, routed work queued before).
void shared_expert(const StepCtx& c, const GpuMoE& M) {
  const int64_t T = c.meta->T, D = c.cfg->hidden_size, I = c.cfg->moe_intermediate_size;
  linear(c, M.shared.w13, c.at<void>(c.L.h), D, T, c.at<void>(c.L.gu), c.act, 2 * I);
  swiglu_rows(c, c.at<void>(c.L.gu), c.at<void>(c.L.act), nullptr, T);
  linear(c, M.shared.w2, c.at<void>(c.L.act), I, T, c.at<float>(c.L.sh), DType::kF32, D);
}

// Fixed-shape decode: routed experts from device-side ids (moe_decode.h, no host sync), then
// the shared expert and the fixed-order combine. Router logits/ids/weights are already in the arena.
void moe_block_device(const StepCtx& c, const GpuMoE& M) {
  const DeepseekV4Config& g = *c.cfg;
  const ArenaLayout& L = c.L;
  const int64_t T = c.meta->T, D = g.hidden_size, K = g.num_experts_per_tok;
  moe_decode({.x = c.at<void>(L.h), .expert_ids = c.at<int32_t>(L.ids), .weights = c.at<float>(L.wts),
              .w13 = static_cast<const void* const*>(M.w13_ptrs.data()),
              .w2 = static_cast<const void* const*>(M.w2_ptrs.data()), .format = M.format,
              .w13_scale = static_cast<const uint8_t* const*>(M.w13_scale_ptrs.data()),
              .w2_scale = static_cast<const uint8_t* const*>(M.w2_scale_ptrs.data()), .act = c.at<void>(L.act),
              .ye = c.at<float>(L.ye), .tokens = T, .topk = K, .num_experts = g.n_routed_experts, .dim = D,
              .inter = g.moe_intermediate_size, .dtype = c.act, .limit = float(g.swiglu_limit)},
             c.stream);
  shared_expert(c, M);
  moe_combine({.ye = c.at<float>(L.ye), .rows = c.dmeta->comb_rows, .shared = c.at<float>(L.sh),
               .out = c.at<float>(L.y), .tokens = T, .topk = K, .dim = D},
              c.stream);
}

// Any T, bf16 activations: the permutation by expert on the device (moe_route) and grouped GEMMs
// over the expert segments reading the weights as stored (bf16, FP4 or FP8): no host sync. The
// up GEMM gathers h rows through perm_src; its output is rounded to bf16 as cuBLASLt's was.
void moe_block_grouped(const StepCtx& c, const GpuMoE& M) {
  namespace oc = ops::cuda;
  const DeepseekV4Config& g = *c.cfg;
  const ArenaLayout& L = c.L;
  const int64_t T = c.meta->T, D = g.hidden_size, E = g.n_routed_experts, K = g.num_experts_per_tok;
  const int64_t I = g.moe_intermediate_size, max_tiles = oc::moe_route_max_tiles(T * K, E, oc::kGroupedTileM);
  oc::moe_route({.ids = c.at<int32_t>(L.ids), .weights = c.at<float>(L.wts), .tokens = T, .topk = K, .experts = E,
                 .tile_m = oc::kGroupedTileM, .seg = c.at<int32_t>(L.moe_seg), .perm_src = c.at<int64_t>(L.perm_src),
                 .perm_w = c.at<float>(L.perm_w), .comb = c.at<int64_t>(L.comb_rows),
                 .tiles = c.at<int32_t>(L.moe_tiles), .num_tiles = c.at<int32_t>(L.moe_ntiles), .max_tiles = max_tiles},
                c.stream);
  oc::GroupedGemmParams gp{.x = c.at<void>(L.h), .ldx = D, .x_rows = c.at<int64_t>(L.perm_src),
                           .w = static_cast<const void* const*>(M.w13_ptrs.data()),
                           .scale = static_cast<const uint8_t* const*>(M.w13_scale_ptrs.data()), .format = M.format,
                           .seg = c.at<int32_t>(L.moe_seg), .tiles = c.at<int32_t>(L.moe_tiles),
                           .num_tiles = c.at<int32_t>(L.moe_ntiles), .max_tiles = max_tiles, .experts = E,
                           .N = 2 * I, .K = D, .y = c.at<void>(L.gu), .ldy = 2 * I, .y_dtype = c.act};
  oc::grouped_gemm(gp, c.stream);
  // Routed weight applied before W2, as the reference does. Rows of invalid ids (past seg[E])
  // hold stale values here; the combine skips them (comb = -1).
  swiglu_rows(c, c.at<void>(L.gu), c.at<void>(L.act), c.at<float>(L.perm_w), T * K);
  gp.x = c.at<void>(L.act);
  gp.ldx = I;
  gp.x_rows = nullptr;
  gp.w = static_cast<const void* const*>(M.w2_ptrs.data());
  gp.scale = static_cast<const uint8_t* const*>(M.w2_scale_ptrs.data());
  gp.N = D;
  gp.K = I;
  gp.y = c.at<float>(L.ye);
  gp.ldy = D;
  gp.y_dtype = DType::kF32;
  oc::grouped_gemm(gp, c.stream);
  shared_expert(c, M);
  moe_combine({.ye = c.at<float>(L.ye), .rows = c.at<int64_t>(L.comb_rows), .shared = c.at<float>(L.sh),
               .out = c.at<float>(L.y), .tokens = T, .topk = K, .dim = D},
              c.stream);
}

// h [T, D] act -> y [T, D] f32 = Σ_k w_k E_k(h) + shared(h).
void moe_block(const StepCtx& c, const GpuMoE& M) {
  const DeepseekV4Config& g = *c.cfg;
  const ArenaLayout& L = c.L;
  const int64_t T = c.meta->T, D = g.hidden_size, E = g.n_routed_experts, K = g.num_experts_per_tok;
  const int64_t I = g.moe_intermediate_size, ab = int64_t(c.act_bytes);
  void* h = c.at<void>(L.h);
  float* logits = c.at<float>(L.logits_r);
  linear(c, M.gate, h, D, T, logits, DType::kF32, E);  // router logits in fp32
  const bool hash = M.tid2eid.data() != nullptr;
  ops::cuda::router({.logits = logits, .logits_stride = E, .bias = hash ? nullptr : M.bias.data(),
                     .tid2eid = hash ? M.tid2eid.data() : nullptr, .tid2eid_dtype = DType::kI32,
                     .token_ids = c.dmeta->token_ids, .vocab = hash ? M.tid2eid_rows : 0,
                     .expert_ids = c.at<int32_t>(L.ids), .weights = c.at<float>(L.wts), .tokens = T,
                     .num_experts = int(E), .topk = int(K), .route_scale = float(g.routed_scaling_factor)},
                    c.stream);
  if (c.meta->fixed) {
    moe_block_device(c, M);
    return;
  }
  if (c.act == DType::kBF16 && !M.host_routed && I % 32 == 0 && D % 32 == 0) {
    moe_block_grouped(c, M);
    return;
  }
  // Exact numerics (f32, the parity path): per-expert cuBLASLt fp32 GEMMs, whose shapes come from
  // the per-expert row counts: read the routing back (one sync per layer).
  MoeHost& mh = *c.moe;
  mh.ids.resize(size_t(T * K));
  mh.wts.resize(size_t(T * K));
  cuda::copy_d2h(mh.ids.data(), c.at<int32_t>(L.ids), size_t(T * K) * 4, c.stream, false);
  cuda::copy_d2h(mh.wts.data(), c.at<float>(L.wts), size_t(T * K) * 4, c.stream, true);
  permute_by_expert(mh, T, K, E);
  cuda::copy_h2d(c.at<int64_t>(L.perm_src), mh.perm_src.data(), size_t(T * K) * 8, c.stream, false);
  cuda::copy_h2d(c.at<float>(L.perm_w), mh.perm_w.data(), size_t(T * K) * 4, c.stream, false);
  cuda::copy_h2d(c.at<int64_t>(L.comb_rows), mh.comb.data(), size_t(T * K) * 8, c.stream, false);

  char* xe = c.at<char>(L.xe);
  char* gu = c.at<char>(L.gu);
  char* act = c.at<char>(L.act);
  float* ye = c.at<float>(L.ye);
  gather_rows({.src_a = h, .a_stride = D, .src_dtype = c.act, .src_index = c.at<int64_t>(L.perm_src),
               .dst = xe, .dst_stride = D, .dst_dtype = c.act, .rows = T * K, .width = D},
              c.stream);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a0 = mh.offset[size_t(e)], n = mh.offset[size_t(e + 1)] - a0;
    if (n > 0) linear(c, M.experts[size_t(e)].w13, xe + a0 * D * ab, D, n, gu + a0 * 2 * I * ab, c.act, 2 * I);
  }
  // Routed weight applied before W2, as the reference does.
  swiglu_rows(c, gu, act, c.at<float>(L.perm_w), T * K);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a0 = mh.offset[size_t(e)], n = mh.offset[size_t(e + 1)] - a0;
    if (n > 0) linear(c, M.experts[size_t(e)].w2, act + a0 * I * ab, I, n, ye + a0 * D, DType::kF32, D);
  }
  shared_expert(c, M);
  moe_combine({.ye = ye, .rows = c.at<int64_t>(L.comb_rows), .shared = c.at<float>(L.sh), .out = c.at<float>(L.y),
               .tokens = T, .topk = K, .dim = D},
              c.stream);
}

void hc_site(const StepCtx& c, const GpuHc& hc, const float* X, const float* norm_w) {
  const DeepseekV4Config& g = *c.cfg;
  const int64_t T = c.meta->T, D = g.hidden_size, n = g.hc_mult;
  ops::cuda::hc_pre({.x = X, .dtype = DType::kF32, .x_stride = n * D, .fn = hc.fn.data(), .base = hc.base.data(),
                     .scale = hc.scale.data(), .u = c.at<float>(c.L.u), .u_stride = D, .mix = c.at<float>(c.L.mix),
                     .workspace = c.at<float>(c.L.hc_ws), .tokens = T, .n = int(n), .dim = D,
                     .mode = ops::cuda::HcMode::kLayer, .sinkhorn_iters = int(g.hc_sinkhorn_iters),
                     .norm_eps = float(g.rms_norm_eps), .hc_eps = float(g.hc_eps)},
                    c.stream);
  norm(c, c.at<float>(c.L.u), DType::kF32, D, norm_w, c.at<void>(c.L.h), c.act, D, T, D);
}

void hc_merge(const StepCtx& c, const float* X, float* out) {
  const DeepseekV4Config& g = *c.cfg;
  const int64_t T = c.meta->T, D = g.hidden_size, n = g.hc_mult;
  ops::cuda::hc_post({.x = X, .x_stride = n * D, .y = c.at<float>(c.L.y), .y_stride = D, .mix = c.at<float>(c.L.mix),
                      .out = out, .out_stride = n * D, .dtype = DType::kF32, .tokens = T, .n = int(n), .dim = D},
                     c.stream);
}
}  // namespace

void decoder_layer(const StepCtx& c, const GpuLayer& L, GpuLayerCache& cache) {
  float* X = c.at<float>(c.L.X);
  float* X2 = c.at<float>(c.L.X2);
  hc_site(c, L.hc_attn, X, L.attn_norm.data());
  attention_block(c, L.attn, cache);
  hc_merge(c, X, X2);
  hc_site(c, L.hc_ffn, X2, L.ffn_norm.data());
  moe_block(c, L.ffn);
  hc_merge(c, X2, X);
}

}  // namespace deepinfer::model::v4::gpu
