#include "model/deepseek_v41/tensors.h"

#include "core/check.h"

namespace deepinfer::model::v41 {

const char* v41_store_name(V41Store s) {
  switch (s) {
    case V41Store::kFloat: return "float";
    case V41Store::kPlain: return "plain";
    case V41Store::kDense: return "dense";
    case V41Store::kExpert: return "expert";
    case V41Store::kEmbed: return "embed";
    case V41Store::kHead: return "head";
    case V41Store::kEngramTable: return "engram-table";
  }
  return "?";
}

bool v41_skipped_tensor(const std::string& name) {
  std::string n = name;
  if (n.rfind("model.", 0) == 0) n = n.substr(6);
  for (const char* p : {"mtp.", "vision.", "aligner.", "image_"})
    if (n.rfind(p, 0) == 0) return true;
  return false;
}

namespace {
class Builder {
 public:
  Builder(const DeepseekV41Config& c, V41TensorTable& t) : c_(c), t_(t) {}

  void global() {
    const int64_t V = c_.vocab_size, D = c_.hidden_size;
    add(V41Store::kEmbed, {{"embed.weight", "", {V, D}}});
    add(V41Store::kHead, {{"head.weight", "lm_head.weight", {V, D}}});
    add(V41Store::kFloat, {{"norm.weight", "", {D}}});
  }

  void layer(const LayerPlan& p) {
    layer_ = p.index;
    const int64_t D = c_.hidden_size;
    const std::string o = "layers." + std::to_string(p.index) + ".";
    add(V41Store::kFloat, {{o + "attn_norm.weight", "", {D}}});
    add(V41Store::kFloat, {{o + "ffn_norm.weight", "", {D}}});
    for (const char* site : {"attn", "ffn"}) {
      const std::string s = o + "hc_" + site + "_";
      add(V41Store::kFloat, {{s + "fn", "", {c_.hc_mix_dim(), c_.hc_dim()}}});
      add(V41Store::kFloat, {{s + "base", "", {c_.hc_mix_dim()}}});
      add(V41Store::kFloat, {{s + "scale", "", {3}}});
    }
    if (p.engram) engram(o);
    attention(p, o + "attn.");
    moe(o + "ffn.", c_.n_routed_experts, true);
    layer_ = -1;
  }

  // DSpark stage k (`mtp.k.*`, release layout only; MODEL-DEEPSEEK-V41.md §7): a sliding-window
  // block with its own expert count (no image routing bias), the first stage's main_proj over the
  // concatenated taps and main_norm, the last stage's norm, Markov head and confidence head.
  void dspark(int64_t k) {
    const DSparkConfig& ds = c_.dspark;
    const int64_t D = c_.hidden_size, V = c_.vocab_size, R = ds.markov_rank;
    const std::string o = "mtp." + std::to_string(k) + ".";
    layer_ = int32_t(c_.num_layers + k);
    LayerPlan p;
    p.index = layer_;
    add(V41Store::kFloat, {{o + "attn_norm.weight", "", {D}}});
    add(V41Store::kFloat, {{o + "ffn_norm.weight", "", {D}}});
    for (const char* site : {"attn", "ffn"}) {
      const std::string s = o + "hc_" + site + "_";
      add(V41Store::kFloat, {{s + "fn", "", {c_.hc_mix_dim(), c_.hc_dim()}}});
      add(V41Store::kFloat, {{s + "base", "", {c_.hc_mix_dim()}}});
      add(V41Store::kFloat, {{s + "scale", "", {3}}});
    }
    attention(p, o + "attn.");
    moe(o + "ffn.", ds.n_routed_experts, false);
    if (k == 0) {
      add(V41Store::kDense, {{o + "main_proj.weight", "", {D, D * int64_t(ds.target_layer_ids.size())}}});
      add(V41Store::kFloat, {{o + "main_norm.weight", "", {D}}});
    }
    if (k == ds.num_stages - 1) {
      add(V41Store::kFloat, {{o + "norm.weight", "", {D}}});
      add(V41Store::kPlain, {{o + "markov_head.embed.weight", "", {V, R}}});
      add(V41Store::kPlain, {{o + "markov_head.head.weight", "", {V, R}}});
      add(V41Store::kPlain, {{o + "confidence_head.proj.weight", "", {1, D + R}}});
    }
    layer_ = -1;
  }

 private:
  V41Entry& add(V41Store store, std::vector<V41Part> parts) {
    V41Entry e;
    e.store = store;
    e.parts = std::move(parts);
    e.layer = layer_;
    t_.entries.push_back(std::move(e));
    return t_.entries.back();
  }

  void engram(const std::string& o) {
    const EngramConfig& e = c_.engram;
    size_t k = 0;
    while (k < e.layer_ids.size() && e.layer_ids[k] != layer_) ++k;
    DI_CHECK(k < e.layer_ids.size(), "v41 tensor table: layer ", layer_, " has Engram but is not an Engram layer");
    const int64_t D = c_.hidden_size, n = c_.hc_mult, cols = e.num_columns() * e.head_dim;
    add(V41Store::kEngramTable, {{o + "engram.embed.weight", "", {e.num_embeddings[k], e.head_dim}}});
    add(V41Store::kDense, {{o + "engram.wkv.weight", "", {D * (n + 1), cols}}});  // [key (n*D) | value (D)]
    add(V41Store::kFloat, {{o + "engram.q_weight", "", {n, D}}});
    add(V41Store::kFloat, {{o + "engram.k_weight", "", {n, D}}});
  }

  void attention(const LayerPlan& p, const std::string& o) {
    const int64_t D = c_.hidden_size, H = c_.num_heads, d = c_.head_dim, r = c_.q_lora_rank;
    const int64_t G = c_.o_groups, R = c_.o_lora_rank;
    add(V41Store::kDense, {{o + "wq_a.weight", "", {r, D}}});
    add(V41Store::kFloat, {{o + "q_norm.weight", "", {r}}});
    add(V41Store::kDense, {{o + "wq_b.weight", "", {H * d, r}}});
    add(V41Store::kDense, {{o + "wkv.weight", "", {d, D}}});
    add(V41Store::kFloat, {{o + "kv_norm.weight", "", {d}}});
    add(V41Store::kDense, {{o + "wo_a.weight", "", {G * R, H * d / G}}}).groups = G;
    add(V41Store::kDense, {{o + "wo_b.weight", "", {D, G * R}}});
    add(V41Store::kFloat, {{o + "attn_sink", "", {H}}});
    if (p.owns_entries()) {  // the latent is d wide; ratio >= 2 pools with a gate
      std::vector<V41Part> kv = {{o + "compressor.wkv.weight", "", {d, D}}};
      if (p.compressor == CompressorKind::kPool) kv.push_back({o + "compressor.wgate.weight", "", {d, D}});
      add(V41Store::kPlain, std::move(kv));
      add(V41Store::kFloat, {{o + "compressor.norm.weight", "", {d}}});
    }
    const int64_t Hi = c_.index_n_heads, di = c_.index_head_dim;
    if (p.index_keys == IndexKeyKind::kFromLatent) {
      add(V41Store::kPlain, {{o + "indexer.wk.weight", "", {di, d}}});
      add(V41Store::kFloat, {{o + "indexer.k_norm.weight", "", {di}}});
    }
    if (p.select == SelectKind::kScore) {
      add(V41Store::kDense, {{o + "indexer.wq_b.weight", "", {Hi * di, r}}});
      add(V41Store::kPlain, {{o + "indexer.weights_proj.weight", "", {Hi, D}}});
    }
  }

  void moe(const std::string& o, int64_t E, bool image_bias) {
    const int64_t D = c_.hidden_size, I = c_.moe_intermediate_size;
    add(V41Store::kPlain, {{o + "gate.weight", "", {E, D}}});
    add(V41Store::kFloat, {{o + "gate.bias", "", {E}}});
    if (image_bias) add(V41Store::kFloat, {{o + "gate.bias_vl", "", {E}}}).used = false;
    for (int64_t e = 0; e < E; ++e) {
      const std::string eo = o + "experts." + std::to_string(e) + ".";
      V41Entry& w13 = add(V41Store::kExpert, {{eo + "w1.weight", "", {I, D}}, {eo + "w3.weight", "", {I, D}}});
      w13.expert = int32_t(e);
      w13.expert_w13 = true;
      add(V41Store::kExpert, {{eo + "w2.weight", "", {D, I}}}).expert = int32_t(e);
    }
    const std::string so = o + "shared_experts.";
    add(V41Store::kDense, {{so + "w1.weight", "", {I, D}}, {so + "w3.weight", "", {I, D}}});
    add(V41Store::kDense, {{so + "w2.weight", "", {D, I}}});
  }

  const DeepseekV41Config& c_;
  V41TensorTable& t_;
  int32_t layer_ = -1;
};
}  // namespace

V41TensorTable v41_tensor_table(const DeepseekV41Config& cfg, const ModelPlan& plan) {
  DI_CHECK(plan.num_layers() == cfg.num_layers, "v41 tensor table: ", plan.num_layers(), " plans for ", cfg.num_layers,
           " layers");
  V41TensorTable t;
  Builder b(cfg, t);
  b.global();
  for (const LayerPlan& p : plan.layers) b.layer(p);
  return t;
}

V41TensorTable v41_dspark_table(const DeepseekV41Config& cfg) {
  V41TensorTable t;
  Builder b(cfg, t);
  for (int64_t k = 0; k < cfg.dspark.num_stages; ++k) b.dspark(k);
  return t;
}

}  // namespace deepinfer::model::v41
