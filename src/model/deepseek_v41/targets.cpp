#include "model/deepseek_v41/targets.h"

#include <string>

#include "core/check.h"
#include "deepinfer/error.h"

namespace deepinfer::model::v41 {

namespace {
ds::VecRef* layer_vec(const std::string& sfx, ds::LayerRef& L) {
  if (sfx == "attn_norm.weight") return &L.attn_norm;
  if (sfx == "ffn_norm.weight") return &L.ffn_norm;
  if (sfx == "hc_attn_fn") return &L.hc_attn.fn;
  if (sfx == "hc_attn_base") return &L.hc_attn.base;
  if (sfx == "hc_attn_scale") return &L.hc_attn.scale;
  if (sfx == "hc_ffn_fn") return &L.hc_ffn.fn;
  if (sfx == "hc_ffn_base") return &L.hc_ffn.base;
  if (sfx == "hc_ffn_scale") return &L.hc_ffn.scale;
  if (sfx == "attn.q_norm.weight") return &L.attn.q_norm;
  if (sfx == "attn.kv_norm.weight") return &L.attn.kv_norm;
  if (sfx == "attn.attn_sink") return &L.attn.sink;
  if (sfx == "attn.indexer.k_norm.weight") return &L.attn.index_k_norm;
  if (sfx == "ffn.gate.bias") return &L.ffn.bias;
  if (sfx == "attn.compressor.norm.weight") {
    if (!L.attn.comp) L.attn.comp.emplace();
    return &L.attn.comp->norm;
  }
  return nullptr;
}

ds::LinearRef* layer_linear(const std::string& sfx, ds::LayerRef& L) {
  ds::AttentionRef& A = L.attn;
  ds::MoeRef& M = L.ffn;
  if (sfx == "attn.wq_a.weight") return &A.wq_a;
  if (sfx == "attn.wq_b.weight") return &A.wq_b;
  if (sfx == "attn.wkv.weight") return &A.wkv;
  if (sfx == "attn.wo_a.weight") return &A.wo_a;
  if (sfx == "attn.wo_b.weight") return &A.wo_b;
  if (sfx == "attn.indexer.wk.weight") return &A.index_wk;
  if (sfx == "attn.indexer.wq_b.weight") return &A.index_wq_b;
  if (sfx == "attn.indexer.weights_proj.weight") return &A.index_weights;
  if (sfx == "ffn.gate.weight") return &M.gate;
  if (sfx == "ffn.shared_experts.w1.weight") return &M.shared.w13;
  if (sfx == "ffn.shared_experts.w2.weight") return &M.shared.w2;
  if (sfx == "engram.wkv.weight") return &L.engram.wkv;
  return nullptr;
}
}  // namespace

V41Target v41_target(const DeepseekV41Config& c, const ModelPlan& plan, const V41Entry& e, ds::ModelRef& m) {
  V41Target t;
  if (!e.used || e.layer >= c.num_layers) return t;  // DSpark stages: the drafter's own preparation
  const std::string n = e.name();
  if (e.layer < 0) {
    if (n == "norm.weight") return {.kind = V41Target::kVec, .vec = &m.norm};
    if (n == "embed.weight") return {.kind = V41Target::kLinear, .lin = &m.embed};
    if (n == "head.weight") return {.kind = V41Target::kLinear, .lin = &m.head};
    DI_THROW(InternalError, "v41: no prepared target for '", n, "'");
  }
  ds::LayerRef& L = m.layers.at(size_t(e.layer));
  const std::string sfx = n.substr(("layers." + std::to_string(e.layer) + ".").size());
  if (e.store == V41Store::kEngramTable) return {.kind = V41Target::kEngramTable, .engram = &L.engram};
  if (e.store == V41Store::kExpert) {
    L.ffn.experts.resize(size_t(c.n_routed_experts));
    ds::ExpertRef& x = L.ffn.experts.at(size_t(e.expert));
    return {.kind = V41Target::kExpert, .lin = e.expert_w13 ? &x.w13 : &x.w2};
  }
  if (ds::VecRef* v = layer_vec(sfx, L)) return {.kind = V41Target::kVec, .vec = v};
  if (ds::LinearRef* l = layer_linear(sfx, L)) return {.kind = V41Target::kLinear, .lin = l};
  if (sfx == "attn.compressor.wkv.weight") {
    ds::AttentionRef& A = L.attn;
    if (!A.comp) A.comp.emplace();
    A.comp->ratio = plan.layer(e.layer).ratio;
    A.comp->width = c.head_dim;
    return {.kind = V41Target::kLinear, .lin = &A.comp->wkv_gate};
  }
  if (sfx == "engram.q_weight") return {.kind = V41Target::kEngramQ, .engram = &L.engram};
  if (sfx == "engram.k_weight") return {.kind = V41Target::kEngramK, .engram = &L.engram};
  DI_THROW(InternalError, "v41: no prepared target for '", n, "'");
}

void v41_engram_table_ref(const v4::Linear& l, ds::EngramRef& g) {
  const bool fp8 = l.format == v4::WeightFormat::kFP8Block;
  DI_CHECK(!fp8 || l.scale.dtype() == DType::kE8M0, "Engram table scales must be E8M0");
  g.table = l.weight.raw_data();
  g.rows = l.weight.size(0);
  g.dim = l.weight.size(1);
  g.table_dtype = fp8 ? DType::kF8E4M3 : l.weight.dtype();
  g.table_scale = fp8 ? l.scale.raw_data() : nullptr;
}

v4::TensorTable v41_device_table(const DeepseekV41Config& c, const ModelPlan& plan, const V41Weights* w,
                                 ds::ModelRef* m) {
  V41TensorTable local;
  if (!w) local = v41_tensor_table(c, plan);
  const V41TensorTable& tab = w ? w->table : local;
  ds::ModelRef scratch;
  scratch.layers.assign(size_t(plan.num_layers()), ds::LayerRef{});
  ds::ModelRef& dst = m ? *m : scratch;
  v4::TensorTable out;
  for (size_t i = 0; i < tab.entries.size(); ++i) {
    const V41Entry& e = tab.entries[i];
    const V41Target t = v41_target(c, plan, e, dst);
    if (t.kind != V41Target::kLinear && t.kind != V41Target::kVec && t.kind != V41Target::kExpert) continue;
    v4::TensorEntry d;
    d.layer = e.layer;
    d.expert = e.expert;
    d.expert_w13 = e.expert_w13;
    d.groups = e.groups;
    if (t.kind == V41Target::kVec) {
      d.kind = v4::EntryKind::kFloat;
      d.vec = m ? t.vec : nullptr;
    } else {
      d.kind = v4::EntryKind::kLinear;
      d.lin = m ? t.lin : nullptr;
      switch (e.store) {
        case V41Store::kDense: d.role = v4::LinearRole::kDense; break;
        case V41Store::kExpert: d.role = v4::LinearRole::kExpert; break;
        case V41Store::kEmbed: d.role = v4::LinearRole::kEmbed; break;
        case V41Store::kHead: d.role = v4::LinearRole::kHead; break;
        default: d.role = v4::LinearRole::kPlain; break;
      }
    }
    for (size_t j = 0; j < e.parts.size(); ++j) {
      v4::TensorPart p{.name = e.parts[j].name, .hf = e.parts[j].hf, .shape = e.parts[j].shape};
      if (w) {
        v4::Linear& l = const_cast<v4::Linear&>(w->parts.at(i).at(j));
        if (d.kind == v4::EntryKind::kFloat)
          p.t = &l.weight;
        else
          p.lin = &l;
      }
      d.parts.push_back(std::move(p));
    }
    out.entries.push_back(std::move(d));
  }
  return out;
}

}  // namespace deepinfer::model::v41
