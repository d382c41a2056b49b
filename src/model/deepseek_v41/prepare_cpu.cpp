#include <cstring>
#include <string>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek_v41/prepare.h"
#include "model/deepseek_v41/targets.h"
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
    const V41Target t = v41_target(c_, plan_, e, s_.refs);
    switch (t.kind) {
      case V41Target::kNone: return;
      case V41Target::kVec: return vec(i, *t.vec);
      case V41Target::kEngramTable: return v41_engram_table_ref(w_.parts[i][0], *t.engram);
      case V41Target::kEngramQ: return void(q_weight_ = w_.entry_f32(i, c_));
      case V41Target::kEngramK: return engram_w(i, *t.engram);
      case V41Target::kExpert:
        if (!held_.empty() && !held_.at(size_t(e.expert))) return;  // another rank's expert
        return lin(i, *t.lin);
      case V41Target::kLinear:
        if (t.lin == &s_.refs.head && pack_head_) return packed_head(i);
        return lin(i, *t.lin);
    }
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
  void packed_head(size_t i) {
    ds::ModelRef& m = s_.refs;
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
