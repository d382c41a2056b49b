#include "model/deepseek_v41/dspark_weights.h"

#include <string>

#include "deepinfer/error.h"
#include "model/deepseek_v41/prepare.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer::model::v41 {

DSparkWeights DSparkWeights::load(const DeepseekV41Config& cfg, const V41Weights& w) {
  if (cfg.dspark.num_stages <= 0 || w.num_dspark != cfg.dspark.num_stages)
    DI_THROW(CheckpointError, cfg.origin, ": the DSpark drafter needs its ", cfg.dspark.num_stages,
             " stages (mtp.*), the checkpoint has ", w.num_dspark);
  auto get = [&](const std::string& name) {
    const int64_t i = w.find(name);
    if (i < 0) DI_THROW(CheckpointError, cfg.origin, ": DSpark tensor '", name, "' is missing");
    return w.entry_f32(size_t(i), cfg).contiguous();
  };
  DSparkWeights d;
  for (int64_t k = 0; k < cfg.dspark.num_stages; ++k) {
    const std::string o = "mtp." + std::to_string(k) + ".";
    DSparkStageWeights s;
    s.attn_norm = get(o + "attn_norm.weight");
    s.ffn_norm = get(o + "ffn_norm.weight");
    s.hc_attn_fn = get(o + "hc_attn_fn");
    s.hc_attn_base = get(o + "hc_attn_base");
    s.hc_attn_scale = get(o + "hc_attn_scale");
    s.hc_ffn_fn = get(o + "hc_ffn_fn");
    s.hc_ffn_base = get(o + "hc_ffn_base");
    s.hc_ffn_scale = get(o + "hc_ffn_scale");
    const std::string a = o + "attn.";
    s.wq_a = get(a + "wq_a.weight");
    s.q_norm = get(a + "q_norm.weight");
    s.wq_b = get(a + "wq_b.weight");
    s.wkv = get(a + "wkv.weight");
    s.kv_norm = get(a + "kv_norm.weight");
    s.wo_a = get(a + "wo_a.weight");
    s.wo_b = get(a + "wo_b.weight");
    s.sink = get(a + "attn_sink");
    const std::string f = o + "ffn.";
    s.gate = get(f + "gate.weight");
    s.gate_bias = get(f + "gate.bias");
    for (int64_t e = 0; e < cfg.dspark.n_routed_experts; ++e) {
      const std::string eo = f + "experts." + std::to_string(e) + ".";
      s.w13.push_back(get(eo + "w1.weight"));  // the table stacks W1|W3 under W1's name
      s.w2.push_back(get(eo + "w2.weight"));
    }
    s.shared13 = get(f + "shared_experts.w1.weight");
    s.shared2 = get(f + "shared_experts.w2.weight");
    d.stages.push_back(std::move(s));
  }
  d.main_proj = get("mtp.0.main_proj.weight");
  d.main_norm = get("mtp.0.main_norm.weight");
  const std::string last = "mtp." + std::to_string(cfg.dspark.num_stages - 1) + ".";
  d.norm = get(last + "norm.weight");
  d.mk_embed = get(last + "markov_head.embed.weight");
  d.mk_head = get(last + "markov_head.head.weight");
  d.conf = get(last + "confidence_head.proj.weight");
  d.embed = get("embed.weight");
  d.head = get("head.weight");
  d.inv_freq = v41_inv_freq(cfg.rope, cfg.rope_head_dim);
  d.stored = &w;
  return d;
}

}  // namespace deepinfer::model::v41
