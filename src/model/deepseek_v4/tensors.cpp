#include "model/deepseek_v4/tensors.h"

#include "core/check.h"

namespace deepinfer::model::v4 {

int64_t TensorEntry::rows() const {
  int64_t r = 0;
  for (const TensorPart& p : parts) r += p.shape.empty() ? 1 : p.shape[0];
  return r;
}

int64_t TensorEntry::cols() const {
  if (parts.empty()) return 0;
  const Shape& s = parts[0].shape;
  int64_t c = 1;
  for (size_t i = 1; i < s.size(); ++i) c *= s[i];
  return c;
}

namespace {
// Builds entries for one model; `canon`/`prep` may be null (then targets stay null).
class Builder {
 public:
  Builder(const DeepseekV4Config& c, DeepseekV4Weights* canon, ds::ModelRef* prep, TensorTable& t)
      : c_(c), canon_(canon), prep_(prep), t_(t) {}

  void global() {
    const int64_t V = c_.vocab_size, D = c_.hidden_size;
    linear(LinearRole::kEmbed, {part("embed.weight", "embed_tokens.weight", {V, D}, canon_ ? &canon_->embed : nullptr)},
           prep_ ? &prep_->embed : nullptr);
    linear(LinearRole::kHead, {part("head.weight", "lm_head.weight", {V, D}, canon_ ? &canon_->head : nullptr)},
           prep_ ? &prep_->head : nullptr);
    flt("norm.weight", "norm.weight", {D}, canon_ ? &canon_->norm : nullptr, prep_ ? &prep_->norm : nullptr);
    hc_head("", "", canon_ ? &canon_->hc_head : nullptr, prep_ ? &prep_->hc_head : nullptr);
  }

  void layer(const LayerPlan& p, LayerWeights* cw, ds::LayerRef* pw, const std::string& prefix) {
    layer_ = p.index;
    const int64_t D = c_.hidden_size;
    const std::string& o = prefix;
    flt(o + "attn_norm.weight", o + "input_layernorm.weight", {D}, cw ? &cw->attn_norm : nullptr,
        pw ? &pw->attn_norm : nullptr);
    flt(o + "ffn_norm.weight", o + "post_attention_layernorm.weight", {D}, cw ? &cw->ffn_norm : nullptr,
        pw ? &pw->ffn_norm : nullptr);
    hc_site(o, "attn", cw ? &cw->hc_attn : nullptr, pw ? &pw->hc_attn : nullptr);
    hc_site(o, "ffn", cw ? &cw->hc_ffn : nullptr, pw ? &pw->hc_ffn : nullptr);
    attention(p, o, cw ? &cw->attn : nullptr, pw ? &pw->attn : nullptr);
    moe(p, o, cw ? &cw->ffn : nullptr, pw ? &pw->ffn : nullptr);
    layer_ = -1;
  }

  void mtp(const LayerPlan& p, int64_t k, MtpWeights* cw, ds::MtpRef* pw) {
    const int64_t D = c_.hidden_size;
    const std::string o = "mtp." + std::to_string(k) + ".";  // transformers does not model MTP
    layer_ = p.index;
    linear(LinearRole::kDense, {part(o + "e_proj.weight", "", {D, D}, cw ? &cw->e_proj : nullptr)},
           pw ? &pw->e_proj : nullptr);
    linear(LinearRole::kDense, {part(o + "h_proj.weight", "", {D, D}, cw ? &cw->h_proj : nullptr)},
           pw ? &pw->h_proj : nullptr);
    flt(o + "enorm.weight", "", {D}, cw ? &cw->enorm : nullptr, pw ? &pw->enorm : nullptr);
    flt(o + "hnorm.weight", "", {D}, cw ? &cw->hnorm : nullptr, pw ? &pw->hnorm : nullptr);
    flt(o + "norm.weight", "", {D}, cw ? &cw->norm : nullptr, pw ? &pw->norm : nullptr);
    hc_head(o, o, cw ? &cw->hc_head : nullptr, pw ? &pw->hc_head : nullptr);
    layer(p, cw ? &cw->block : nullptr, pw ? &pw->block : nullptr, o);
  }

 private:
  TensorPart part(std::string name, std::string hf, Shape shape, Linear* lin, std::string alias = "") {
    return {std::move(name), std::move(hf), std::move(alias), std::move(shape), lin, nullptr};
  }
  TensorPart part(std::string name, std::string hf, Shape shape, Tensor* t, std::string alias = "") {
    return {std::move(name), std::move(hf), std::move(alias), std::move(shape), nullptr, t};
  }
  void linear(LinearRole role, std::vector<TensorPart> parts, ds::LinearRef* dst, int32_t expert = -1,
              bool w13 = false) {
    TensorEntry e;
    e.kind = EntryKind::kLinear;
    e.role = role;
    e.parts = std::move(parts);
    e.layer = layer_;
    e.expert = expert;
    e.expert_w13 = w13;
    e.lin = dst;
    t_.entries.push_back(std::move(e));
  }
  void flt(std::string name, std::string hf, Shape shape, Tensor* canon, ds::VecRef* dst, std::string alias = "") {
    TensorEntry e;
    e.kind = EntryKind::kFloat;
    e.parts = {part(std::move(name), std::move(hf), std::move(shape), canon, std::move(alias))};
    e.layer = layer_;
    e.vec = dst;
    t_.entries.push_back(std::move(e));
  }

  void hc_site(const std::string& o, const char* site, HcParams* cw, ds::HcRef* pw) {
    const std::string so = o + "hc_" + site + "_", sh = o + site + "_hc.";
    flt(so + "fn", sh + "fn", {c_.hc_mix_dim(), c_.hc_dim()}, cw ? &cw->fn : nullptr, pw ? &pw->fn : nullptr);
    flt(so + "base", sh + "base", {c_.hc_mix_dim()}, cw ? &cw->base : nullptr, pw ? &pw->base : nullptr);
    flt(so + "scale", sh + "scale", {3}, cw ? &cw->scale : nullptr, pw ? &pw->scale : nullptr);
  }
  void hc_head(const std::string& o, const std::string& h, HcHeadParams* cw, ds::HcRef* pw) {
    flt(o + "hc_head_fn", h + "hc_head.hc_fn", {c_.hc_mult, c_.hc_dim()}, cw ? &cw->fn : nullptr,
        pw ? &pw->fn : nullptr);
    flt(o + "hc_head_base", h + "hc_head.hc_base", {c_.hc_mult}, cw ? &cw->base : nullptr, pw ? &pw->base : nullptr);
    flt(o + "hc_head_scale", h + "hc_head.hc_scale", {1}, cw ? &cw->scale : nullptr, pw ? &pw->scale : nullptr);
  }

  // attn.compressor.* or attn.indexer.compressor.* (HF: self_attn.compressor[.indexer].*).
  void compressor(const std::string& o, const std::string& h, int64_t ratio, int64_t d, bool overlap,
                  CompressorWeights* cw, ds::CompressorRef* pw) {
    const int64_t width = overlap ? 2 * d : d, D = c_.hidden_size;  // CSA keeps two halves per token
    if (cw) cw->ratio = ratio;
    if (pw) {
      pw->ratio = ratio;
      pw->width = width;
    }
    linear(LinearRole::kPlain,
           {part(o + "wkv.weight", h + "kv_proj.weight", {width, D}, cw ? &cw->wkv : nullptr),
            part(o + "wgate.weight", h + "gate_proj.weight", {width, D}, cw ? &cw->wgate : nullptr)},
           pw ? &pw->wkv_gate : nullptr);
    flt(o + "ape", h + "position_bias", {ratio, width}, cw ? &cw->ape : nullptr, pw ? &pw->ape : nullptr);
    flt(o + "norm.weight", h + "kv_norm.weight", {d}, cw ? &cw->norm : nullptr, pw ? &pw->norm : nullptr);
  }

  void attention(const LayerPlan& p, const std::string& prefix, AttentionWeights* a, ds::AttentionRef* A) {
    const int64_t D = c_.hidden_size, H = c_.num_heads, d = c_.head_dim, r = c_.q_lora_rank;
    const int64_t G = c_.o_groups, R = c_.o_lora_rank;
    const std::string o = prefix + "attn.", f = prefix + "self_attn.";
    auto dense = [&](const std::string& n, const std::string& hn, Shape s, Linear* cl, ds::LinearRef* pl) {
      linear(LinearRole::kDense, {part(o + n, f + hn, std::move(s), cl)}, pl);
    };
    dense("wq_a.weight", "q_a_proj.weight", {r, D}, a ? &a->wq_a : nullptr, A ? &A->wq_a : nullptr);
    flt(o + "q_norm.weight", f + "q_a_norm.weight", {r}, a ? &a->q_norm : nullptr, A ? &A->q_norm : nullptr);
    dense("wq_b.weight", "q_b_proj.weight", {H * d, r}, a ? &a->wq_b : nullptr, A ? &A->wq_b : nullptr);
    dense("wkv.weight", "kv_proj.weight", {d, D}, a ? &a->wkv : nullptr, A ? &A->wkv : nullptr);
    flt(o + "kv_norm.weight", f + "kv_norm.weight", {d}, a ? &a->kv_norm : nullptr, A ? &A->kv_norm : nullptr,
        o + "norm.weight");
    dense("wo_a.weight", "o_a_proj.weight", {G * R, H * d / G}, a ? &a->wo_a : nullptr, A ? &A->wo_a : nullptr);
    t_.entries.back().groups = G;
    dense("wo_b.weight", "o_b_proj.weight", {D, G * R}, a ? &a->wo_b : nullptr, A ? &A->wo_b : nullptr);
    flt(o + "attn_sink", f + "sinks", {H}, a ? &a->sink : nullptr, A ? &A->sink : nullptr);
    if (p.owns_entries()) {
      DI_CHECK(p.compressor == CompressorKind::kOverlap || p.compressor == CompressorKind::kPool,
               "V4 layer ", p.index, " with compressor kind ", int(p.compressor));
      if (a && !a->compressor) a->compressor.emplace();
      if (A && !A->comp) A->comp.emplace();
      compressor(o + "compressor.", f + "compressor.", p.ratio, d, p.compressor == CompressorKind::kOverlap,
                 a ? &*a->compressor : nullptr, A ? &*A->comp : nullptr);
    }
    if (p.select == SelectKind::kScore) {
      DI_CHECK(p.index_keys == IndexKeyKind::kOwnCompressor, "V4 scoring layer ", p.index, " without key compressor");
      const std::string io = o + "indexer.", ih = f + "compressor.indexer.";
      IndexerWeights* ix = nullptr;
      if (a) ix = a->indexer ? &*a->indexer : &a->indexer.emplace();
      if (A && !A->icomp) A->icomp.emplace();
      const int64_t Hi = c_.index_n_heads, di = c_.index_head_dim;
      linear(LinearRole::kDense, {part(io + "wq_b.weight", ih + "q_b_proj.weight", {Hi * di, r}, ix ? &ix->wq_b : nullptr)},
             A ? &A->index_wq_b : nullptr);
      linear(LinearRole::kPlain,
             {part(io + "weights_proj.weight", ih + "scorer.weights_proj.weight", {Hi, D},
                   ix ? &ix->weights_proj : nullptr)},
             A ? &A->index_weights : nullptr);
      compressor(io + "compressor.", ih, p.ratio, di, true, ix ? &ix->compressor : nullptr, A ? &*A->icomp : nullptr);
    }
  }

  void moe(const LayerPlan& p, const std::string& prefix, MoEWeights* m, ds::MoeRef* M) {
    const int64_t D = c_.hidden_size, E = c_.n_routed_experts, I = c_.moe_intermediate_size;
    const std::string o = prefix + "ffn.", f = prefix + "mlp.";
    linear(LinearRole::kPlain, {part(o + "gate.weight", f + "gate.weight", {E, D}, m ? &m->gate : nullptr)},
           M ? &M->gate : nullptr);
    if (p.moe == MoeKind::kHash) {
      TensorEntry e;
      e.kind = EntryKind::kTable;
      e.parts = {part(o + "gate.tid2eid", f + "gate.tid2eid", {c_.vocab_size, c_.num_experts_per_tok},
                      m ? &m->tid2eid : nullptr)};
      e.layer = layer_;
      e.table = M ? &M->tid2eid : nullptr;
      e.table_rows = M ? &M->tid2eid_rows : nullptr;
      t_.entries.push_back(std::move(e));
    } else {
      flt(o + "gate.bias", f + "gate.e_score_correction_bias", {E}, m ? &m->bias : nullptr, M ? &M->bias : nullptr);
    }
    if (m) m->experts.resize(size_t(E));
    if (M) M->experts.resize(size_t(E));
    for (int64_t e = 0; e < E; ++e) {  // HF fuses these into gate_up_proj / down_proj (the loader slices)
      const std::string eo = o + "experts." + std::to_string(e) + ".";
      ExpertWeights* ce = m ? &m->experts[size_t(e)] : nullptr;
      ds::ExpertRef* pe = M ? &M->experts[size_t(e)] : nullptr;
      linear(LinearRole::kExpert,
             {part(eo + "w1.weight", "", {I, D}, ce ? &ce->w1 : nullptr),
              part(eo + "w3.weight", "", {I, D}, ce ? &ce->w3 : nullptr)},
             pe ? &pe->w13 : nullptr, int32_t(e), true);
      linear(LinearRole::kExpert, {part(eo + "w2.weight", "", {D, I}, ce ? &ce->w2 : nullptr)},
             pe ? &pe->w2 : nullptr, int32_t(e), false);
    }
    const std::string so = o + "shared_experts.", sf = f + "shared_experts.";
    linear(LinearRole::kDense,
           {part(so + "w1.weight", sf + "gate_proj.weight", {I, D}, m ? &m->shared.w1 : nullptr),
            part(so + "w3.weight", sf + "up_proj.weight", {I, D}, m ? &m->shared.w3 : nullptr)},
           M ? &M->shared.w13 : nullptr);
    linear(LinearRole::kDense, {part(so + "w2.weight", sf + "down_proj.weight", {D, I}, m ? &m->shared.w2 : nullptr)},
           M ? &M->shared.w2 : nullptr);
  }

  const DeepseekV4Config& c_;
  DeepseekV4Weights* canon_;
  ds::ModelRef* prep_;
  TensorTable& t_;
  int32_t layer_ = -1;
};
}  // namespace

TensorTable v4_tensor_table(const DeepseekV4Config& cfg, const ModelPlan& plan, DeepseekV4Weights* canon,
                            ds::ModelRef* prep) {
  TensorTable t;
  Builder b(cfg, canon, prep, t);
  const size_t L = plan.layers.size(), K = plan.drafter.size();
  // Sizing keeps what is there: the backends walk the table of weights the loader already filled.
  if (canon) {
    canon->layers.resize(L);
    canon->mtp.resize(K);
  }
  if (prep) {
    prep->layers.assign(L, ds::LayerRef{});
    prep->mtp.assign(K, ds::MtpRef{});
  }
  b.global();
  for (size_t l = 0; l < L; ++l)
    b.layer(plan.layers[l], canon ? &canon->layers[l] : nullptr, prep ? &prep->layers[l] : nullptr,
            "layers." + std::to_string(l) + ".");
  for (size_t k = 0; k < K; ++k)
    b.mtp(plan.drafter[k], int64_t(k), canon ? &canon->mtp[k] : nullptr, prep ? &prep->mtp[k] : nullptr);
  return t;
}

void keep_expert_shard(TensorTable& table, const parallel::ExpertShard& shard, int32_t experts, int64_t main_layers) {
  const std::vector<bool> held = shard.held(experts);
  std::erase_if(table.entries, [&](const TensorEntry& e) {
    return e.role == LinearRole::kExpert && e.layer >= 0 && e.layer < main_layers && !held.at(size_t(e.expert));
  });
}

}  // namespace deepinfer::model::v4
