#include "model/deepseek/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/activations.h"
#include "model/deepseek/context_parallel.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/compressor.h"
#include "ops/cpu/engram.h"
#include "ops/cpu/hc.h"
#include "ops/cpu/indexer.h"
#include "ops/cpu/moe.h"
#include "ops/cpu/qat.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/rope.h"
#include "ops/cpu/router.h"
#include "ops/cpu/rows.h"

namespace deepinfer::model::ds {
namespace oc = ops::cpu;

CpuBackend::CpuBackend(const Arch& arch, std::vector<kv::LayerCacheSpec> specs, std::unique_ptr<CpuWeightStore> w,
                       const CpuBackendOptions& options)
    : arch_(arch),
      gemm_(options.batch_invariant ? oc::GemmKind::kFixedOrder : oc::GemmKind::kFast),
      specs_(std::move(specs)),
      store_(std::move(w)) {
  DI_CHECK(store_ != nullptr, "CpuBackend without weights");
}

CpuBackend::~CpuBackend() = default;

kv::CacheGeometry CpuBackend::plan_cache(size_t budget_bytes, int64_t max_slots) const {
  return kv::KvCache::plan(specs_, budget_bytes, max_slots);
}

void CpuBackend::allocate_cache(const kv::CacheGeometry& g) { cache_ = kv::KvCache(specs_, g); }

SlotSnapshot CpuBackend::save_slot(int32_t slot, int64_t num_tokens) {
  return {.num_tokens = num_tokens, .bytes = cache_.save_slot(slot)};
}

void CpuBackend::restore_slot(int32_t slot, const SlotSnapshot& s) { cache_.restore_slot(slot, s.bytes); }

void CpuBackend::copy_blocks_to_host(std::span<const HostBlockCopy> copies) {
  for (const HostBlockCopy& c : copies) cache_.copy_block_out(c.block, c.host);
}

void CpuBackend::copy_blocks_from_host(std::span<const HostBlockCopy> copies) {
  for (const HostBlockCopy& c : copies) cache_.copy_block_in(c.block, c.host);
}

LayerCacheRef CpuBackend::cache(int64_t layer) {
  kv::LayerCache& c = cache_.layer(layer);
  auto ptr = [](Tensor& t) -> void* { return t.defined() ? t.raw_data() : nullptr; };
  return {.window = ptr(c.window), .entries = ptr(c.comp), .keys = ptr(c.index_keys),
          .state = static_cast<float*>(ptr(c.comp_state)), .index_state = static_cast<float*>(ptr(c.index_state))};
}

void CpuBackend::size_buffers() {
  const StepSizes s = step_sizes(plan_);
  size_t words = 0;
  for (size_t b = 0; b < size_t(Buf::kCount); ++b) {
    off_[b] = words;
    words += (std::max<size_t>(buffer_size(Buf(b), arch_.dims, s, 4).bytes(), 8) + 7) / 8;
  }
  if (arena_.size() < words) arena_.resize(words);  // grows only: steady-state steps do not allocate
}

void* CpuBackend::buf(Buf b) const {
  return const_cast<uint64_t*>(arena_.data() + off_[size_t(b)]);
}

void CpuBackend::use_fixed_shapes(int64_t max_context, const FixedLimits& limits) {
  fixed_ = true;
  fixed_limits_ = limits;
  fixed_caps_ = fixed_candidate_caps(specs_, max_context);
}

std::optional<ModelBackend::FixedShape> CpuBackend::fixed_shape(const ForwardBatch& b) const {
  if (!fixed_ || !fixed_eligible(specs_, b, fixed_caps_, fixed_limits_)) return std::nullopt;
  return FixedShape{.padded = fixed_token_bucket(b.num_tokens()), .caps = &fixed_caps_};
}

void CpuBackend::begin_step(StepPlan plan) {
  plan_ = std::move(plan);
  if (cp_) cp_->begin_step(plan_);
  fixed_steps_ += plan_.fixed ? 1 : 0;
  // A fixed-shape step runs its padded rows through Engram too: zero rows past the step's tokens.
  for (size_t l = 0; plan_.fixed && l < engram_rows_.size(); ++l) {
    const int64_t width = l < store_->refs.layers.size() ? store_->refs.layers[l].engram.wkv.in : 0;
    if (!engram_rows_[l].empty() && width > 0)
      engram_rows_[l].resize(std::max(engram_rows_[l].size(), size_t(plan_.T * width)), 0.f);
  }
  const StepPlan& p = plan_;
  StepIndex& ix = index_;
  ix = StepIndex{};
  ix.token_ids = p.token_ids.data();
  ix.pos = p.pos.data();
  ix.embed_src = p.embed_src.data();
  ix.win_src = p.win_src.data();
  ix.win_store_src = p.win_store_src.data();
  ix.win_store_dst = p.win_store_dst.data();
  ix.sel_offset = p.sel_offset.data();
  ix.logits_rows = p.logits_rows.data();
  ix.hidden_rows = p.hidden_rows.data();
  ix.win_begin = p.win_begin.data();
  ix.win_count = p.win_count.data();
  if (!p.tail_win_begin.empty()) {
    ix.tail_win_begin = p.tail_win_begin.data();
    ix.tail_win_count = p.tail_win_count.data();
  }
  if (p.fixed) {
    ix.win_dst = p.win_dst.data();
    ix.comb_rows = p.comb_rows.data();
  }
  for (const CompressPlan& k : p.kinds) {
    KindIndex d{.host = &k, .stage_src = k.stage_src.data(), .entry_pos = k.entry_pos.data(),
                .entry_dst = k.entry_dst.data(), .state_src = k.state_src.data(), .state_dst = k.state_dst.data(),
                .cand_offset = k.cand_offset.data(), .cand_rows = k.cand_rows.data(), .cand_count = k.cand_count.data()};
    if (p.fixed) {
      d.cand_rows = p.cand_pool.data();
      d.stage_dst = k.stage_dst.data();
      d.block = k.block.data();
    }
    ix.kinds.push_back(d);
  }
  size_buffers();
}

ForwardOutput CpuBackend::end_step(const ForwardOptions& options, int64_t rows, int64_t hidden_rows) {
  if (options.logits_on_device) DI_THROW(InternalError, "the CPU backend has no device logits");
  const Dims& g = arch_.dims;
  ForwardOutput out;
  out.logits = Tensor::empty({rows, g.vocab}, DType::kF32);
  if (rows > 0) std::memcpy(out.logits.raw_data(), buf(Buf::kLogits), size_t(rows * g.vocab) * sizeof(float));
  if (hidden_rows > 0) {
    const int64_t e = g.hidden_elems();
    out.hidden.host = g.taps > 0 ? Tensor::empty({hidden_rows, e}, DType::kF32)
                                 : Tensor::empty({hidden_rows, g.streams, g.hidden}, DType::kF32);
    std::memcpy(out.hidden.host.raw_data(), buf(Buf::kHidden), size_t(hidden_rows * e) * sizeof(float));
    out.hidden.rows = hidden_rows;
    out.hidden.row_elems = e;
  }
  return out;
}

void CpuBackend::greedy_rows(int64_t rows, int32_t* tokens, float* logprobs) {
  const int64_t V = arch_.dims.vocab;
  DI_CHECK(rows >= 0 && rows <= plan_.T, "greedy_rows: ", rows, " rows of a ", plan_.T, "-token step");
  const float* L = static_cast<const float*>(buf(Buf::kLogits));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = L + r * V;
    const int64_t tok = std::max_element(row, row + V) - row;  // first maximum: lowest id
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - double(row[tok]));
    tokens[r] = int32_t(tok);
    logprobs[r] = float(-std::log(sum));
  }
}

const float* CpuBackend::stage_hidden(const HiddenRows& rows, const RowRanges& ranges, int64_t padded_rows) {
  DI_CHECK(rows.host.defined() && rows.host.dtype() == DType::kF32, "stage_hidden: the CPU needs host hidden rows");
  const Tensor h = rows.host.contiguous();
  const int64_t e = rows.row_elems;
  staged_hidden_.clear();
  for (const auto& [first, count] : ranges) {
    DI_CHECK(first >= 0 && count >= 0 && first + count <= rows.rows, "stage_hidden: rows [", first, ", ", first + count,
             ") of ", rows.rows);
    staged_hidden_.insert(staged_hidden_.end(), h.data<float>() + first * e, h.data<float>() + (first + count) * e);
  }
  DI_CHECK(padded_rows == 0 || int64_t(staged_hidden_.size()) <= padded_rows * e, "stage_hidden: ",
           staged_hidden_.size() / size_t(e), " rows staged for a ", padded_rows, "-row step");
  if (padded_rows > 0) staged_hidden_.resize(size_t(padded_rows * e), 0.f);
  return staged_hidden_.data();
}

// ---- ops ----

void CpuBackend::gather(const GatherArgs& a) {
  oc::gather_rows({.src_a = a.src_a, .a_stride = a.a_stride, .src_b = a.src_b, .b_stride = a.b_stride,
                   .src_dtype = a.src_dtype, .src_index = a.src_index, .dst = a.dst, .dst_stride = a.dst_stride,
                   .dst_dtype = a.dst_dtype, .dst_index = a.dst_index, .rows = a.rows, .width = a.width});
}

void CpuBackend::linear(const LinearRef& W, const void* x, int64_t ldx, int64_t M, void* y, DType y_dtype,
                        int64_t ldy) {
  if (M == 0) return;
  DI_CHECK(y_dtype == DType::kF32, "cpu linear: f32 outputs only");
  if (W.panels && (gemm_ == oc::GemmKind::kFast || !W.w)) {  // batch-invariant mode: gemm_fixed where W.w exists
    oc::linear_packed(static_cast<const float*>(x), M, ldx, *static_cast<const oc::PackedWeight*>(W.packed),
                      static_cast<float*>(y), ldy);
    return;
  }
  DI_CHECK(W.dtype == DType::kF32 && W.w, "cpu linear: weight not prepared as f32");
  oc::gemm(gemm_, M, W.out, W.in, static_cast<const float*>(x), ldx, static_cast<const float*>(W.w), W.in,
           /*trans_b=*/true, static_cast<float*>(y), ldy);
}

void CpuBackend::linear_grouped(const LinearRef& W, int64_t groups, const void* x, int64_t ldx, int64_t M, void* y,
                                int64_t ldy) {
  const int64_t R = W.out / groups, gin = W.in;
  const float* xf = static_cast<const float*>(x);
  const float* wf = static_cast<const float*>(W.w);
  float* yf = static_cast<float*>(y);
  if (W.panels && gemm_ == oc::GemmKind::kFast && R % oc::kPanelCols == 0) {  // group g = panels of rows [gR, gR+R)
    const auto& P = *static_cast<const oc::PackedWeight*>(W.packed);
    for (int64_t g = 0; g < groups; ++g) oc::linear_packed_cols(xf + g * gin, M, ldx, P, g * R, R, yf + g * R, ldy);
    return;
  }
  for (int64_t g = 0; g < groups; ++g)
    oc::gemm(gemm_, M, R, gin, xf + g * gin, ldx, wf + g * R * gin, gin, true, yf + g * R, ldy);
}

void CpuBackend::rmsnorm(const NormArgs& a) {
  DI_CHECK(a.x_dtype == DType::kF32 && a.y_dtype == DType::kF32, "cpu rmsnorm: f32 only");
  oc::rmsnorm(static_cast<const float*>(a.x), a.x_stride, a.w, static_cast<float*>(a.y), a.y_stride, a.rows, a.dim,
              a.eps);
}

void CpuBackend::rope(const RopeArgs& a) {
  DI_CHECK(a.row_stride == a.heads * a.head_dim, "cpu rope: rows must be contiguous heads");
  oc::rope_apply(static_cast<float*>(a.x), a.rows, a.heads, a.head_dim, a.rope_dim, a.pos, a.inv_freq, a.inverse);
}

// V4.1's QAT formats apply in the fp32 reference too (notes §4); V4's production formats are GPU-only.
void CpuBackend::round_trip(void* x, DType dtype, int64_t row_stride, int64_t rows, int64_t dim, RowFormat f) {
  if (f == RowFormat::kPlain || rows == 0) return;
  oc::QatFormat q;
  switch (f) {
    case RowFormat::kFp8Block32: q = oc::QatFormat::kFp8Ue8m0Block32; break;
    case RowFormat::kFp4E4m3Block16: q = oc::QatFormat::kFp4E4m3Block16; break;
    case RowFormat::kFp4Ue8m0Block32: q = oc::QatFormat::kFp4Ue8m0Block32; break;
    default: DI_THROW(InternalError, "cpu backend: cache format ", row_format_name(f), " is not implemented");
  }
  DI_CHECK(dtype == DType::kF32, "cpu backend: round trip of ", dtype_name(dtype), " rows");
  oc::qat_round_trip(q, static_cast<float*>(x), rows, dim, row_stride);
}

void CpuBackend::add_position_bias(float* z, int64_t z_stride, const float* bias, const int64_t* pos, int64_t m,
                                   int64_t rows, int64_t width) {
  oc::add_position_bias({.z = z, .z_stride = z_stride, .bias = bias, .pos = pos, .m = m, .rows = rows, .width = width});
}

void CpuBackend::compressor_pool(const PoolArgs& a) {
  oc::compressor_pool({.a = a.a, .z = a.z, .row0 = a.row0, .n_rows = a.n_rows, .width = a.width,
                       .row_stride = a.row_stride, .ratio = a.ratio, .overlap = a.overlap,
                       .first_block = a.first_block, .n_blocks = a.n_blocks, .out = a.out});
}

void CpuBackend::decode_pool(const DecodePoolArgs& a) {
  oc::decode_pool({.stage = a.stage, .ld = a.ld, .block = a.block, .tokens = a.tokens,
                   .rows_per_token = a.rows_per_token, .width = a.width, .ratio = a.ratio, .overlap = a.overlap,
                   .out = a.out});
}

void CpuBackend::indexer_topk(const IndexerArgs& a) {
  oc::indexer_topk({.q = static_cast<const float*>(a.q), .w = a.w, .num_tokens = a.num_tokens,
                    .num_heads = a.num_heads, .head_dim = a.head_dim, .k_pool = static_cast<const float*>(a.k_pool),
                    .cand_rows = a.cand_rows, .cand_offset = a.cand_offset, .cand_count = a.cand_count,
                    .qk_scale = a.qk_scale, .w_scale = a.w_scale, .topk = a.topk, .out_rows = a.out_rows,
                    .out_count = a.out_count, .block_size = a.block_size, .topk_blocks = a.topk_blocks,
                    .out_blocks = a.out_blocks, .in_blocks = a.in_blocks});
}

void CpuBackend::sparse_attention(const AttentionArgs& a) {
  DI_CHECK(a.q_stride == a.num_heads * a.head_dim && a.out_stride == a.q_stride && a.kv_stride == a.head_dim,
           "cpu attention: contiguous rows only");
  oc::sparse_attention({.q = static_cast<const float*>(a.q), .num_tokens = a.num_tokens, .num_heads = a.num_heads,
                        .head_dim = a.head_dim, .win_kv = static_cast<const float*>(a.win_kv),
                        .win_begin = a.win_begin, .win_count = a.win_count,
                        .cmp_kv = static_cast<const float*>(a.cmp_kv), .cmp_rows = a.cmp_rows,
                        .cmp_offset = a.cmp_offset, .cmp_count = a.cmp_count, .sink = a.sink, .scale = a.scale,
                        .out = static_cast<float*>(a.out)});
}

oc::HcSpec CpuBackend::hc_spec() const {
  const Dims& g = arch_.dims;
  return {.n = g.streams, .dim = g.hidden, .sinkhorn_iters = g.sinkhorn_iters, .rms_eps = g.eps, .hc_eps = g.hc_eps,
          .gemm = gemm_};
}

// The site's fn [rows, n*D] in panels, packed at its first use (a few per layer, 74 KiB each for
// the default model); keyed by the weight's address, which does not change while the backend lives.
const oc::PackedWeight* CpuBackend::hc_fn_packed(const float* fn, int64_t rows) {
  if (gemm_ != oc::GemmKind::kFast) return nullptr;
  auto it = hc_packed_.find(fn);
  if (it == hc_packed_.end()) {
    const int64_t nd = arch_.dims.streams * arch_.dims.hidden;
    it = hc_packed_.emplace(fn, oc::pack_weight(fn, rows, nd, nd)).first;
  }
  return &it->second;
}

void CpuBackend::hc_site(const HcSiteArgs& a) {
  const Dims& g = arch_.dims;
  oc::HcSpec spec = hc_spec();
  const int64_t n = g.streams;
  const int64_t rows = a.head ? n : (2 + n) * n;
  DI_CHECK(a.w->fn.n == rows * n * g.hidden, "cpu hc: fn of ", a.w->fn.n, " values for [", rows, ", ", n * g.hidden, "]");
  spec.fn_packed = hc_fn_packed(a.w->fn.p, rows);
  if (a.head) {
    oc::hc_head(a.x, a.tokens, spec, a.w->fn.p, a.w->base.p, a.w->scale.p, a.u);
    return;
  }
  // mix [T, (2+n)n] holds post [T, n] then comb [T, n, n] (the CPU op's two outputs), and, for a
  // mixes-only site, its pre [T, n] after them.
  const int64_t T = a.tokens;
  if (!a.u) {
    oc::hc_mix(a.x, T, spec, a.w->fn.p, a.w->base.p, a.w->scale.p, a.mix + T * n * (n + 1), a.mix, a.mix + T * n);
    return;
  }
  oc::hc_pre(a.x, a.tokens, spec, a.w->fn.p, a.w->base.p, a.w->scale.p, a.u, a.mix, a.mix + a.tokens * g.streams);
}

void CpuBackend::hc_post(const HcPostArgs& a) {
  const Dims& g = arch_.dims;
  const oc::HcSpec spec = hc_spec();
  oc::hc_post(a.x, a.y, a.mix, a.mix + a.tokens * g.streams, a.tokens, spec, a.out);
}

void CpuBackend::hc_collapse(const float* x, const float* prev_mix, float* u, int64_t tokens) {
  const Dims& g = arch_.dims;
  const oc::HcSpec spec{.n = g.streams, .dim = g.hidden, .sinkhorn_iters = g.sinkhorn_iters, .rms_eps = g.eps,
                        .hc_eps = g.hc_eps};
  const int64_t n = g.streams;
  oc::hc_collapse(x, tokens, spec, prev_mix ? prev_mix + tokens * n * (n + 1) : nullptr, u);
}

void CpuBackend::stream_mean(const float* x, float* out, int64_t out_stride, int64_t tokens) {
  const int64_t n = arch_.dims.streams, D = arch_.dims.hidden;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < D; ++c) {
      float s = 0.f;  // in stream order, then one division (torch's mean over the stream axis)
      for (int64_t k = 0; k < n; ++k) s += x[(t * n + k) * D + c];
      out[t * out_stride + c] = s / float(n);
    }
}

void CpuBackend::add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim) {
  oc::add_streams(x, v, tokens, streams, dim);
}

const void* CpuBackend::engram_rows(int64_t layer) const {
  const std::vector<float>* r = size_t(layer) < engram_rows_.size() ? &engram_rows_[size_t(layer)] : nullptr;
  if (!r || r->empty() || int64_t(r->size()) % std::max<int64_t>(plan_.T, 1) != 0)
    DI_THROW(InternalError, "cpu backend: no Engram rows staged for layer ", layer, " in this ", plan_.T,
             "-token step");
  return r->data();
}

void CpuBackend::engram_inject(float* x, const float* kv, const float* w, int64_t tokens) {
  const Dims& g = arch_.dims;
  oc::engram_inject({.x = x, .kv = kv, .w = w, .dead = nullptr, .tokens = tokens, .n = g.streams, .dim = g.hidden,
                     .eps = g.eps});
}

// ---- MoE: the local implementation of the seam ----

void CpuBackend::moe_route(const MoeRef& M, const float* logits, int32_t* ids, float* wts) {
  const Dims& g = arch_.dims;
  const bool hash = M.tid2eid != nullptr;
  oc::route({.logits = logits, .num_tokens = plan_.T, .num_experts = g.experts, .topk = g.topk,
             .bias = M.bias.p, .tid2eid = M.tid2eid, .token_ids = plan_.token_ids.data(),
             .vocab_size = hash ? M.tid2eid_rows : 0, .normalize = g.norm_topk, .routed_scale = g.routed_scale,
             .gate_temp = g.gate_temp, .out_ids = ids, .out_weights = wts});
}

// Counting sort of the step's (token, k) pairs by expert (stable: tokens ascending within an
// expert), and the pairs' input rows gathered per expert.
void CpuBackend::moe_dispatch(const MoeRef& M) {
  const Dims& g = arch_.dims;
  const int64_t T = plan_.T, K = g.topk, E = g.experts, D = g.hidden;
  const int32_t* ids = at<int32_t>(Buf::kIds);
  ep_step_ = ep_ && M.ep_layer >= 0;
  if (ep_step_) {
    if (M.ep_layer == 0) ep_->begin_step();  // once per main forward, on every rank alike
    const float* pair_weights = g.route_before_w2 ? at<float>(Buf::kWts) : nullptr;
    // A context-parallel split step has every token on every rank (the same rows, ids and
    // weights): each rank runs its own experts on them, nothing is dispatched.
    if (cp_ && cp_->active()) ep_->dispatch_replicated(M.ep_layer, at<float>(Buf::kH), T, D, ids, K, pair_weights);
    else ep_->dispatch(M.ep_layer, at<float>(Buf::kH), T, D, ids, K, pair_weights);
    return;
  }
  moe_start_.assign(size_t(E + 1), 0);
  for (int64_t i = 0; i < T * K; ++i) {
    DI_CHECK(ids[i] >= 0 && ids[i] < E, "moe: expert id ", ids[i], " at ", i);
    moe_start_[size_t(ids[i] + 1)]++;
  }
  for (int64_t e = 0; e < E; ++e) moe_start_[size_t(e + 1)] += moe_start_[size_t(e)];
  moe_pairs_.resize(size_t(T * K));
  std::vector<int64_t> fill(moe_start_.begin(), moe_start_.end() - 1);
  for (int64_t i = 0; i < T * K; ++i) moe_pairs_[size_t(fill[size_t(ids[i])]++)] = i;
  moe_x_.resize(size_t(T * K * D));
  const float* h = at<float>(Buf::kH);
  for (int64_t a = 0; a < T * K; ++a) std::copy_n(h + (moe_pairs_[size_t(a)] / K) * D, D, moe_x_.data() + a * D);
}

void CpuBackend::moe_experts(const MoeRef& M) {
  if (ep_step_) return ep_experts(M);
  const Dims& g = arch_.dims;
  const int64_t E = g.experts, D = g.hidden, K = g.topk, T = plan_.T;
  moe_out_.resize(size_t(T * K * D));
  // Routed weight before w2 (route_before_w2): each pair's weight, in the expert's row order.
  const float* wts = at<float>(Buf::kWts);
  std::vector<float> scale;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a0 = moe_start_[size_t(e)], n = moe_start_[size_t(e + 1)] - a0;
    if (n == 0) continue;
    if (g.route_before_w2) {
      scale.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) scale[size_t(i)] = wts[moe_pairs_[size_t(a0 + i)]];
    }
    run_expert(M.experts[size_t(e)], moe_x_.data() + a0 * D, n, g.route_before_w2 ? scale.data() : nullptr,
               moe_out_.data() + a0 * D);
  }
}

void CpuBackend::moe_shared(const MoeRef& M) {
  run_expert(M.shared, at<float>(Buf::kH), plan_.T, nullptr, at<float>(Buf::kShared));
}

// out [n, D] = the expert over x [n, D]: packed weights in one w13 product (fast mode), else the
// f32 weights through gemm_ (batch-invariant mode: gemm_fixed; an expert without panels).
void CpuBackend::run_expert(const ExpertRef& ex, const float* x, int64_t n, const float* row_scale, float* out) {
  const Dims& g = arch_.dims;
  const int64_t D = g.hidden, I = g.moe_inter;
  if (ex.w13.panels && ex.w2.panels && gemm_ == oc::GemmKind::kFast) {
    moe_g_.resize(size_t(n * I));
    moe_u_.resize(size_t(n * 2 * I));
    oc::expert_forward_packed(x, n, D, I, *static_cast<const oc::PackedWeight*>(ex.w13.packed),
                              *static_cast<const oc::PackedWeight*>(ex.w2.packed), g.swiglu_limit, moe_u_.data(),
                              moe_g_.data(), out, row_scale);
    return;
  }
  DI_CHECK(ex.w13.w && ex.w2.w, "cpu expert: weights not prepared as f32");
  moe_g_.resize(size_t(n * I));
  moe_u_.resize(size_t(n * I));
  const float* w = static_cast<const float*>(ex.w13.w);
  oc::expert_forward(x, n, D, I, {w, w + I * D, static_cast<const float*>(ex.w2.w)}, g.swiglu_limit, moe_g_.data(),
                     moe_u_.data(), out, gemm_, row_scale);
}

// y = Σ routed in expert order (pairs of one expert in token order), weighted, then + shared.
void CpuBackend::moe_combine(const MoeRef& M) {
  if (ep_step_) return ep_combine();
  const Dims& g = arch_.dims;
  const int64_t T = plan_.T, D = g.hidden, K = g.topk, E = g.experts;
  float* y = at<float>(Buf::kY);
  const float* wts = at<float>(Buf::kWts);
  std::fill(y, y + T * D, 0.f);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t a = moe_start_[size_t(e)]; a < moe_start_[size_t(e + 1)]; ++a) {
      const int64_t pair = moe_pairs_[size_t(a)];
      float* yt = y + (pair / K) * D;
      const float* o = moe_out_.data() + a * D;
      if (g.route_before_w2) {  // weighted inside the expert
        for (int64_t d = 0; d < D; ++d) yt[d] += o[d];
        continue;
      }
      const float w = wts[pair];
      for (int64_t d = 0; d < D; ++d) yt[d] += w * o[d];
    }
  const float* sh = at<float>(Buf::kShared);
  for (int64_t i = 0; i < T * D; ++i) y[i] += sh[i];
}

// ---- MoE, expert-parallel (expert_parallel.h) ----

namespace {
// Context and expert parallelism together need one group of ranks for both (the same ranks in the
// same order): a split step's experts are computed where they are held, on the tokens every CP
// rank has (ExpertParallel::dispatch_replicated).
void check_same_group(const std::string& who, const ContextParallel& cp, const ExpertParallel& ep) {
  if (cp.size() != ep.size() || cp.rank() != ep.rank())
    DI_THROW(InvalidArgument, who, ": context parallelism over ", cp.size(), " ranks (here rank ", cp.rank(),
             ") with expert parallelism over ", ep.size(), " ranks (here rank ", ep.rank(),
             "): they run together only over the same group (context_parallel_size = expert_parallel_size)");
}
}  // namespace

void CpuBackend::set_context_parallel(std::shared_ptr<ContextParallel> cp) {
  if (cp && ep_) check_same_group(describe(), *cp, *ep_);
  cp_ = std::move(cp);
}

void CpuBackend::set_expert_parallel(std::shared_ptr<ExpertParallel> ep) {
  if (ep && cp_) check_same_group(describe(), *cp_, *ep);
  ep_ = std::move(ep);
  ModelRef& m = store_->refs;
  for (size_t l = 0; l < m.layers.size(); ++l) m.layers[l].ffn.ep_layer = ep_ ? int32_t(l) : -1;
}

// The received rows grouped by local slot (stable: arrival order within a slot), each slot's
// expert over its rows, the outputs back in arrival order, then back to their ranks.
void CpuBackend::ep_experts(const MoeRef& M) {
  const Dims& g = arch_.dims;
  const int64_t D = g.hidden, K = g.topk, T = plan_.T;
  const parallel::ExpertPlacement& L = ep_->layout(M.ep_layer);
  const ExpertParallel::Received got = ep_->received();
  const int64_t m = int64_t(got.slot.size()), S = L.slots_per_rank;
  std::vector<int64_t> start(static_cast<size_t>(S + 1), 0);
  for (int32_t s : got.slot) start[size_t(s + 1)]++;
  for (int64_t s = 0; s < S; ++s) start[size_t(s + 1)] += start[size_t(s)];
  std::vector<int64_t> order(static_cast<size_t>(m));
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t j = 0; j < m; ++j) order[size_t(fill[size_t(got.slot[size_t(j)])]++)] = j;
  int64_t max_n = 0;
  for (int64_t s = 0; s < S; ++s) max_n = std::max(max_n, start[size_t(s + 1)] - start[size_t(s)]);
  std::vector<float> x(static_cast<size_t>(max_n * D)), y(size_t(max_n * D)), scale(static_cast<size_t>(max_n));
  DI_CHECK(!g.route_before_w2 || got.weight.size() == size_t(m), "expert-parallel rank ", ep_->rank(), ": ",
           got.weight.size(), " routed weights for ", m, " received rows");
  ep_out_.resize(size_t(m * D));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t a0 = start[size_t(s)], n = start[size_t(s + 1)] - a0;
    if (n == 0) continue;
    const int32_t e = L.physical_to_logical[size_t(int64_t(ep_->rank()) * S + s)];
    const ExpertRef& ex = M.experts.at(size_t(e));
    if (!ex.w13.defined() || !ex.w2.defined())
      DI_THROW(InternalError, "expert-parallel rank ", ep_->rank(), ": layer ", M.ep_layer, " slot ", s, " names expert ",
               e, " whose weights this rank does not hold");
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(got.rows.data() + order[size_t(a0 + i)] * D, D, x.data() + i * D);
      if (g.route_before_w2) scale[size_t(i)] = got.weight[size_t(order[size_t(a0 + i)])];
    }
    // The same kernel as one rank (fixed order under batch invariance).
    run_expert(ex, x.data(), n, g.route_before_w2 ? scale.data() : nullptr, y.data());
    for (int64_t i = 0; i < n; ++i) std::copy_n(y.data() + i * D, D, ep_out_.data() + order[size_t(a0 + i)] * D);
  }
  moe_out_.resize(size_t(T * K * D));
  ep_->give_back(ep_out_.data(), moe_out_.data());
}

// y[t] = Σ over t's assignments in ascending expert order (ties: k order) of w * out, then + shared:
// the same additions, in the same order, as the single-rank combine.
void CpuBackend::ep_combine() {
  const Dims& g = arch_.dims;
  const int64_t T = plan_.T, D = g.hidden, K = g.topk;
  float* y = at<float>(Buf::kY);
  const float* wts = at<float>(Buf::kWts);
  const int32_t* ids = at<int32_t>(Buf::kIds);
  std::fill(y, y + T * D, 0.f);
  std::vector<int64_t> ks(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) ks[size_t(k)] = k;
    std::stable_sort(ks.begin(), ks.end(), [&](int64_t a, int64_t b) { return ids[t * K + a] < ids[t * K + b]; });
    float* yt = y + t * D;
    for (int64_t k : ks) {
      const float* o = moe_out_.data() + (t * K + k) * D;
      if (g.route_before_w2) {  // weighted on the expert's rank
        for (int64_t d = 0; d < D; ++d) yt[d] += o[d];
        continue;
      }
      const float w = wts[t * K + k];
      for (int64_t d = 0; d < D; ++d) yt[d] += w * o[d];
    }
  }
  const float* sh = at<float>(Buf::kShared);
  for (int64_t i = 0; i < T * D; ++i) y[i] += sh[i];
}

}  // namespace deepinfer::model::ds
