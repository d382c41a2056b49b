#include "model/deepseek_v4/model.h"
#include "model/sequence_runner.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <unordered_set>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/model_internal.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/hc.h"
#include "ops/cpu/rmsnorm.h"

namespace deepinfer::model::v4 {
using namespace ops::cpu;

DeepseekV4Model::~DeepseekV4Model() = default;

std::unique_ptr<DeepseekV4Model> DeepseekV4Model::load(const std::string& dir, const ModelOptions& options) {
  std::unique_ptr<DeepseekV4Model> m(new DeepseekV4Model());
  m->cfg_ = DeepseekV4Config::from_file(dir);
  if (m->cfg_.num_kv_heads != 1)
    DI_THROW(ConfigError, dir, "/config.json: num_key_value_heads must be 1, got ", m->cfg_.num_kv_heads);
  DeepseekV4Weights w = DeepseekV4Weights::load(dir, m->cfg_, LoadOptions{.progress = options.progress});
  if (!options.load_mtp) w.mtp.clear();
  m->prepare_weights(w);
  m->ws_ = std::make_unique<Workspace>();
  return m;
}

namespace {
std::vector<float> inv_freq_for(const RopeParams& p, int64_t rope_dim) {
  if (!p.yarn) return rope_inv_freq(p.theta, rope_dim, nullptr);
  YarnScaling y{p.factor, double(p.original_max_position), p.beta_fast, p.beta_slow};
  return rope_inv_freq(p.theta, rope_dim, &y);
}
}  // namespace

void DeepseekV4Model::prepare_weights(const DeepseekV4Weights& w) {
  const DeepseekV4Config& c = cfg_;
  if (c.rope.attention_factor != 1.0 || c.compress_rope.attention_factor != 1.0)
    DI_THROW(ConfigError, c.origin, ": rope attention_factor != 1 is not supported by DeepSeek-V4");
  w_.inv_freq_main = inv_freq_for(c.rope, c.rope_head_dim);
  w_.inv_freq_compress = inv_freq_for(c.compress_rope, c.rope_head_dim);
  w_.embed = to_f32_contig(w.embed);
  {
    const Tensor head = to_f32_contig(w.head);  // [V, D]
    w_.head = pack_weight(head.data<float>(), head.size(0), head.size(1), head.size(1));
  }
  w_.norm = to_f32_contig(w.norm);
  w_.hc_head = {to_f32_contig(w.hc_head.fn), to_f32_contig(w.hc_head.base), to_f32_contig(w.hc_head.scale)};
  for (int64_t l = 0; l < c.num_layers; ++l)
    w_.layers.push_back(to_cpu_layer(w.layers[l], c.layer_types[l], c.compress_ratio[l], c, w_));
  for (size_t k = 0; k < w.mtp.size(); ++k) {
    const MtpWeights& mw = w.mtp[k];
    const int64_t ratio = k < c.mtp_compress_ratio.size() ? c.mtp_compress_ratio[k] : 0;
    if (ratio != 0) DI_THROW(ConfigError, c.origin, ": MTP block ", k, " with compress ratio ", ratio, " unsupported");
    CpuMtp m;
    m.e_proj = to_cpu_linear(mw.e_proj, c);
    m.h_proj = to_cpu_linear(mw.h_proj, c);
    m.enorm = to_f32_contig(mw.enorm);
    m.hnorm = to_f32_contig(mw.hnorm);
    m.norm = to_f32_contig(mw.norm);
    m.hc_head = {to_f32_contig(mw.hc_head.fn), to_f32_contig(mw.hc_head.base), to_f32_contig(mw.hc_head.scale)};
    m.block = to_cpu_layer(mw.block, AttnKind::kSliding, 0, c, w_);
    w_.mtp.push_back(std::move(m));
  }
}

std::string DeepseekV4Model::describe() const {
  std::ostringstream os;
  os << cfg_.architecture << ": " << cfg_.num_layers << " layers [" << cfg_.schedule_str() << "], D=" << cfg_.hidden_size
     << ", H=" << cfg_.num_heads << "x" << cfg_.head_dim << ", experts " << cfg_.n_routed_experts << " top-"
     << cfg_.num_experts_per_tok << ", mtp " << w_.mtp.size() << ", backend cpu fp32";
  return os.str();
}

std::vector<kv::LayerCacheSpec> DeepseekV4Model::cache_specs() const {
  std::vector<kv::LayerCacheSpec> specs;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    kv::LayerCacheSpec s{.window = cfg_.sliding_window, .head_dim = cfg_.head_dim, .ratio = cfg_.compress_ratio[l]};
    if (s.ratio > 0) {
      s.overlap = cfg_.layer_types[l] == AttnKind::kCSA;
      s.comp_width = s.overlap ? 2 * cfg_.head_dim : cfg_.head_dim;
      if (s.overlap) {
        s.index_dim = cfg_.index_head_dim;
        s.index_width = 2 * cfg_.index_head_dim;
      }
    }
    specs.push_back(s);
  }
  for (size_t k = 0; k < w_.mtp.size(); ++k)  // MTP blocks: sliding only, after the main layers
    specs.push_back({.window = cfg_.sliding_window, .head_dim = cfg_.head_dim});
  return specs;
}

kv::CacheGeometry DeepseekV4Model::plan_cache(size_t budget_bytes, int64_t max_slots) const {
  return kv::KvCache::plan(cache_specs(), budget_bytes, max_slots);
}

void DeepseekV4Model::allocate_cache(const kv::CacheGeometry& geometry) { cache_ = kv::KvCache(cache_specs(), geometry); }

void DeepseekV4Model::allocate_cache_for(int64_t slots, int64_t max_tokens_per_slot) {
  auto specs = cache_specs();
  kv::CacheGeometry g;
  g.block_tokens = kv::KvCache::default_block_tokens(specs);
  g.num_slots = slots;
  g.num_blocks = slots * std::max<int64_t>(1, (max_tokens_per_slot + g.block_tokens - 1) / g.block_tokens);
  allocate_cache(g);
}

void DeepseekV4Model::reset_slot(int32_t slot) { cache_.reset_slot(slot); }

void DeepseekV4Model::validate(const ForwardBatch& b) const {
  validate_forward_batch(b, cache_.geometry(), cache_.allocated(), cfg_.vocab_size);
}

namespace {
BatchPlan make_plan(const ForwardBatch& b) {
  BatchPlan p;
  p.T = b.num_tokens();
  p.token_ids = b.token_ids.data();
  p.pos.resize(size_t(p.T));
  int64_t t = 0;
  for (const SeqInBatch& s : b.seqs) {
    p.seqs.push_back({.tok0 = t, .n = s.num_new_tokens, .pos0 = s.num_computed_tokens, .slot = s.cache_slot,
                      .block_table = &s.block_table});
    for (int64_t j = 0; j < s.num_new_tokens; ++j) p.pos[t + j] = s.num_computed_tokens + j;
    t += s.num_new_tokens;
  }
  return p;
}
}  // namespace

// logits [rows, V] of the final-normed hidden h [rows, D].
Tensor DeepseekV4Model::logits_for(const float* h, const std::vector<int32_t>& rows) {
  const int64_t R = int64_t(rows.size()), V = cfg_.vocab_size, D = cfg_.hidden_size;
  Tensor out = Tensor::empty({R, V}, DType::kF32);
  linear_packed(h, R, D, w_.head, out.data<float>(), V);
  return out;
}

ForwardOutput DeepseekV4Model::run(const ForwardBatch& batch, const ForwardOptions& /*options*/) {
  validate(batch);
  const BatchPlan plan = make_plan(batch);
  const int64_t T = plan.T, D = cfg_.hidden_size, n = cfg_.hc_mult, V = cfg_.vocab_size;
  Workspace& ws = *ws_;
  float* X = grow(ws.X, size_t(T * n * D));
  const float* emb = w_.embed.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < n; ++k) std::memcpy(X + (t * n + k) * D, emb + int64_t(plan.token_ids[t]) * D, D * 4);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) decoder_layer(w_.layers[l], cfg_, cache_.layer(l), plan, X, ws);

  ForwardOutput out;
  if (!batch.hidden_indices.empty()) {
    const int64_t Rh = int64_t(batch.hidden_indices.size());
    out.hidden.host = Tensor::empty({Rh, n, D}, DType::kF32);
    out.hidden.rows = Rh;
    out.hidden.row_elems = n * D;
    for (int64_t i = 0; i < Rh; ++i)
      std::memcpy(out.hidden.host.data<float>() + i * n * D, X + int64_t(batch.hidden_indices[i]) * n * D, n * D * 4);
  }
  // Head only for the requested rows.
  const int64_t R = int64_t(batch.logits_indices.size());
  Tensor sel = Tensor::empty({R, n, D}, DType::kF32);
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(sel.data<float>() + i * n * D, X + int64_t(batch.logits_indices[i]) * n * D, n * D * 4);
  if (R == 0) {
    out.logits = Tensor::empty({0, V}, DType::kF32);
    return out;
  }
  std::vector<float> h(size_t(R * D));
  hc_head(sel.data<float>(), R, hc_spec(cfg_), w_.hc_head.fn.data<float>(), w_.hc_head.base.data<float>(),
          w_.hc_head.scale.data<float>(), h.data());
  rmsnorm(h.data(), D, w_.norm.data<float>(), h.data(), D, R, D, float(cfg_.rms_norm_eps));
  out.logits = logits_for(h.data(), batch.logits_indices);
  return out;
}

Tensor DeepseekV4Model::forward_mtp(const ForwardBatch& batch, const Tensor& main_hidden, int64_t k) {
  if (k < 0 || k >= int64_t(w_.mtp.size()))
    DI_THROW(InvalidArgument, "forward_mtp: block ", k, " but the model has ", w_.mtp.size(), " MTP blocks");
  validate(batch);
  const BatchPlan plan = make_plan(batch);
  const int64_t T = plan.T, D = cfg_.hidden_size, n = cfg_.hc_mult, V = cfg_.vocab_size;
  if (main_hidden.dtype() != DType::kF32 || main_hidden.numel() != T * n * D)
    DI_THROW(InvalidArgument, "forward_mtp: main_hidden ", main_hidden.str(), " must be f32 [", T, ",", n, ",", D, "]");
  const CpuMtp& M = w_.mtp[k];
  const float eps = float(cfg_.rms_norm_eps);
  Workspace& ws = *ws_;
  // e = e_proj(enorm(embed[tok])), hs = h_proj(hnorm(stream)) per stream; X0_k = e + hs_k.
  std::vector<float> e(size_t(T * D)), ep(size_t(T * D)), hs(size_t(T * n * D));
  const float* emb = w_.embed.data<float>();
  for (int64_t t = 0; t < T; ++t) std::memcpy(e.data() + t * D, emb + int64_t(plan.token_ids[t]) * D, D * 4);
  rmsnorm(e.data(), D, M.enorm.data<float>(), e.data(), D, T, D, eps);
  linear(e.data(), T, D, M.e_proj.data(), D, ep.data());
  const Tensor mh = main_hidden.contiguous();
  rmsnorm(mh.data<float>(), D, M.hnorm.data<float>(), hs.data(), D, T * n, D, eps);
  float* X = grow(ws.X, size_t(T * n * D));
  linear(hs.data(), T * n, D, M.h_proj.data(), D, X);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < D; ++i) X[(t * n + j) * D + i] += ep[t * D + i];
  decoder_layer(M.block, cfg_, cache_.layer(cfg_.num_layers + k), plan, X, ws);

  const int64_t R = int64_t(batch.logits_indices.size());
  if (R == 0) return Tensor::empty({0, V}, DType::kF32);
  std::vector<float> sel(size_t(R * n * D)), h(size_t(R * D));
  for (int64_t i = 0; i < R; ++i)
    std::memcpy(sel.data() + i * n * D, X + int64_t(batch.logits_indices[i]) * n * D, n * D * 4);
  hc_head(sel.data(), R, hc_spec(cfg_), M.hc_head.fn.data<float>(), M.hc_head.base.data<float>(),
          M.hc_head.scale.data<float>(), h.data());
  rmsnorm(h.data(), D, M.norm.data<float>(), h.data(), D, R, D, eps);
  return logits_for(h.data(), batch.logits_indices);
}

}  // namespace deepinfer::model::v4

namespace deepinfer::model::v4 {

Tensor run_sequence(DeepseekV4Model& model, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks,
                    int32_t slot, bool need_hidden, Tensor* hidden) {
  const int64_t n = model.config().hc_mult, D = model.config().hidden_size;
  Tensor hid;
  Tensor out = deepinfer::model::run_sequence(model, model.cache().geometry(), ids, chunks, slot,
                                              need_hidden ? &hid : nullptr);
  if (hidden && need_hidden) *hidden = hid.view({int64_t(ids.size()), n, D});
  return out;
}

}  // namespace deepinfer::model::v4
