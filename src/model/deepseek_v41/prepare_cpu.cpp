#include <cstring>
#include <string>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek_v41/prepare.h"
#include "ops/cpu/rope.h"

namespace deepinfer::model::v41 {

std::vector<float> v41_inv_freq(const RopeParams& p, int64_t rope_dim) {
  if (!p.yarn) return ops::cpu::rope_inv_freq(p.theta, rope_dim, nullptr);
  ops::cpu::YarnScaling y{p.factor, double(p.original_max_position), p.beta_fast, p.beta_slow};
  return ops::cpu::rope_inv_freq(p.theta, rope_dim, &y);
}

namespace {
class Preparer {
 public:
  Preparer(const DeepseekV41Config& c, const ModelPlan& plan, const V41Weights& w, ds::CpuWeightStore& s,
           std::vector<bool> held, bool pack_head)
      : c_(c), plan_(plan), w_(w), s_(s), held_(std::move(held)), pack_head_(pack_head) {}

  void entry(size_t i) {
    const V41Entry& e = w_.table.entries[i];
    if (!e.used || e.layer >= c_.num_layers) return;  // DSpark stages: the drafter's own preparation
    const std::string n = e.name();
    if (e.layer < 0) return global(i, n);
    ds::LayerRef& L = s_.refs.layers[size_t(e.layer)];
    const std::string sfx = n.substr(("layers." + std::to_string(e.layer) + ".").size());
    if (e.store == V41Store::kEngramTable) return engram_table(i, L.engram);
    if (e.store == V41Store::kExpert) {
      L.ffn.experts.resize(size_t(c_.n_routed_experts));
      if (!held_.empty() && !held_.at(size_t(e.expert))) return;  // another rank's expert
      ds::ExpertRef& x = L.ffn.experts[size_t(e.expert)];
      return lin(i, e.expert_w13 ? x.w13 : x.w2);
    }
    ds::AttentionRef& A = L.attn;
    ds::MoeRef& M = L.ffn;
    if (vec_target(sfx, L, i)) return;
    if (sfx == "attn.wq_a.weight") return lin(i, A.wq_a);
    if (sfx == "attn.wq_b.weight") return lin(i, A.wq_b);
    if (sfx == "attn.wkv.weight") return lin(i, A.wkv);
    if (sfx == "attn.wo_a.weight") return lin(i, A.wo_a);
    if (sfx == "attn.wo_b.weight") return lin(i, A.wo_b);
    if (sfx == "attn.compressor.wkv.weight") {
      const LayerPlan& p = plan_.layer(e.layer);
      if (!A.comp) A.comp.emplace();
      A.comp->ratio = p.ratio;
      A.comp->width = c_.head_dim;
      return lin(i, A.comp->wkv_gate);
    }
    if (sfx == "attn.indexer.wk.weight") return lin(i, A.index_wk);
    if (sfx == "attn.indexer.wq_b.weight") return lin(i, A.index_wq_b);
    if (sfx == "attn.indexer.weights_proj.weight") return lin(i, A.index_weights);
    if (sfx == "ffn.gate.weight") return lin(i, M.gate);
    if (sfx == "ffn.shared_experts.w1.weight") return lin(i, M.shared.w13);
    if (sfx == "ffn.shared_experts.w2.weight") return lin(i, M.shared.w2);
    if (sfx == "engram.wkv.weight") return lin(i, L.engram.wkv);
    if (sfx == "engram.q_weight") return void(q_weight_ = w_.entry_f32(i, c_));
    if (sfx == "engram.k_weight") return engram_w(i, L.engram);
    DI_THROW(InternalError, "v41_prepare_cpu: no prepared target for '", n, "'");
  }

  void rope() {
    s_.rope.push_back(std::make_unique<std::vector<float>>(v41_inv_freq(c_.rope, c_.rope_head_dim)));
    s_.rope.push_back(std::make_unique<std::vector<float>>(v41_inv_freq(c_.compress_rope, c_.rope_head_dim)));
    ds::ModelRef& m = s_.refs;
    m.inv_freq_main = {s_.rope[0]->data(), int64_t(s_.rope[0]->size())};
    m.inv_freq_compress = {s_.rope[1]->data(), int64_t(s_.rope[1]->size())};
    for (const LayerPlan& p : plan_.layers)
      m.layers[size_t(p.index)].attn.inv_freq = p.rope == RopeKind::kMain ? m.inv_freq_main.p : m.inv_freq_compress.p;
  }

 private:
  Tensor keep(Tensor t) {
    s_.tensors.push_back(t);
    return t;
  }
  void lin(size_t i, ds::LinearRef& r) {
    const Tensor t = keep(w_.entry_f32(i, c_));
    r = {};
    r.w = t.raw_data();
    r.dtype = DType::kF32;
    r.out = t.size(0);
    r.in = t.size(1);
  }
  void vec(size_t i, ds::VecRef& v) {
    const Tensor t = keep(w_.entry_f32(i, c_));
    v = {t.data<float>(), t.numel()};
  }
  bool vec_target(const std::string& sfx, ds::LayerRef& L, size_t i) {
    ds::VecRef* v = nullptr;
    if (sfx == "attn_norm.weight") v = &L.attn_norm;
    else if (sfx == "ffn_norm.weight") v = &L.ffn_norm;
    else if (sfx == "hc_attn_fn") v = &L.hc_attn.fn;
    else if (sfx == "hc_attn_base") v = &L.hc_attn.base;
    else if (sfx == "hc_attn_scale") v = &L.hc_attn.scale;
    else if (sfx == "hc_ffn_fn") v = &L.hc_ffn.fn;
    else if (sfx == "hc_ffn_base") v = &L.hc_ffn.base;
    else if (sfx == "hc_ffn_scale") v = &L.hc_ffn.scale;
    else if (sfx == "attn.q_norm.weight") v = &L.attn.q_norm;
    else if (sfx == "attn.kv_norm.weight") v = &L.attn.kv_norm;
    else if (sfx == "attn.attn_sink") v = &L.attn.sink;
    else if (sfx == "attn.indexer.k_norm.weight") v = &L.attn.index_k_norm;
    else if (sfx == "ffn.gate.bias") v = &L.ffn.bias;
    else if (sfx == "attn.compressor.norm.weight") {
      if (!L.attn.comp) L.attn.comp.emplace();
      v = &L.attn.comp->norm;
    }
    if (!v) return false;
    vec(i, *v);
    return true;
  }
  void global(size_t i, const std::string& n) {
    ds::ModelRef& m = s_.refs;
    if (n == "norm.weight") return vec(i, m.norm);
    if (n == "embed.weight") return lin(i, m.embed);
    DI_CHECK(n == "head.weight", "v41_prepare_cpu: no prepared target for '", n, "'");
    if (!pack_head_) return lin(i, m.head);
    const Tensor t = w_.entry_f32(i, c_);  // streamed once per step: 16-column panels
    s_.packed.push_back(std::make_unique<ops::cpu::PackedWeight>(
        ops::cpu::pack_weight(t.data<float>(), t.size(0), t.size(1), t.size(1))));
    m.head = {};
    m.head.dtype = DType::kF32;
    m.head.out = t.size(0);
    m.head.in = t.size(1);
    m.head.panels = true;
    m.head.packed = s_.packed.back().get();
  }
  void engram_table(size_t i, ds::EngramRef& g) {
    const v4::Linear& l = w_.parts[i][0];
    g.table = l.weight.raw_data();
    g.rows = l.weight.size(0);
    g.dim = l.weight.size(1);
    g.table_dtype = l.format == v4::WeightFormat::kFP8Block ? DType::kF8E4M3 : l.weight.dtype();
    g.table_scale = l.format == v4::WeightFormat::kFP8Block ? l.scale.raw_data() : nullptr;
    DI_CHECK(l.format != v4::WeightFormat::kFP8Block || l.scale.dtype() == DType::kE8M0,
             "Engram table scales must be E8M0");
  }
  void engram_w(size_t i, ds::EngramRef& g) {
    DI_CHECK(q_weight_.defined(), "engram.k_weight before engram.q_weight");
    const Tensor k = w_.entry_f32(i, c_);
    Tensor prod = Tensor::empty(k.shape(), DType::kF32);
    for (int64_t j = 0; j < k.numel(); ++j) prod.data<float>()[j] = q_weight_.data<float>()[j] * k.data<float>()[j];
    prod = keep(prod);
    g.w = {prod.data<float>(), prod.numel()};
    q_weight_ = Tensor();
  }

  const DeepseekV41Config& c_;
  const ModelPlan& plan_;
  const V41Weights& w_;
  ds::CpuWeightStore& s_;
  std::vector<bool> held_;  // routed experts this rank prepares (empty: all)
  bool pack_head_;
  Tensor q_weight_;
};
}  // namespace

std::unique_ptr<ds::CpuWeightStore> v41_prepare_cpu(const DeepseekV41Config& cfg, const ModelPlan& plan,
                                                    const V41Weights& weights,
                                                    const std::optional<parallel::ExpertShard>& shard,
                                                    bool pack_head) {
  auto store = std::make_unique<ds::CpuWeightStore>();
  store->keepalive = weights.keepalive;
  store->refs.layers.assign(size_t(plan.num_layers()), ds::LayerRef{});
  Preparer p(cfg, plan, weights, *store, shard ? shard->held(int32_t(cfg.n_routed_experts)) : std::vector<bool>{},
             pack_head);
  for (size_t i = 0; i < weights.table.entries.size(); ++i) p.entry(i);
  p.rope();
  return store;
}

}  // namespace deepinfer::model::v41
