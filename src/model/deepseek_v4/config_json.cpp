// DeepseekV4Config -> config.json in either layout (used by make-default-model and tests).
#include <nlohmann/json.hpp>

#include "model/deepseek_v4/config.h"

namespace deepinfer::model::v4 {
using json = nlohmann::json;

namespace {
json yarn_json(const RopeParams& r, bool hf) {
  json j = {{hf ? "rope_type" : "type", r.yarn ? "yarn" : "default"}};
  if (r.yarn) {
    j["factor"] = r.factor;
    j["original_max_position_embeddings"] = r.original_max_position;
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    if (hf) j["attention_factor"] = r.attention_factor;
  }
  return j;
}
}  // namespace

std::string DeepseekV4Config::to_json_string() const {
  const bool hf = layout == CheckpointLayout::kTransformers;
  json j = {
      {"architectures", {architecture.empty() ? "DeepseekV4ForCausalLM" : architecture}},
      {"model_type", "deepseek_v4"},
      {"vocab_size", vocab_size}, {"hidden_size", hidden_size}, {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads}, {"num_key_value_heads", num_kv_heads}, {"head_dim", head_dim},
      {"q_lora_rank", q_lora_rank}, {"o_groups", o_groups}, {"o_lora_rank", o_lora_rank},
      {"sliding_window", sliding_window}, {"n_routed_experts", n_routed_experts},
      {"num_experts_per_tok", num_experts_per_tok}, {"n_shared_experts", n_shared_experts},
      {"moe_intermediate_size", moe_intermediate_size}, {"routed_scaling_factor", routed_scaling_factor},
      {"swiglu_limit", swiglu_limit}, {"scoring_func", scoring_func}, {"norm_topk_prob", norm_topk_prob},
      {"hc_mult", hc_mult}, {"hc_sinkhorn_iters", hc_sinkhorn_iters}, {"hc_eps", hc_eps},
      {"rms_norm_eps", rms_norm_eps}, {"index_n_heads", index_n_heads}, {"index_head_dim", index_head_dim},
      {"index_topk", index_topk}, {"num_nextn_predict_layers", num_mtp_layers}, {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_id}, {"max_position_embeddings", max_position_embeddings},
      {"tie_word_embeddings", tie_word_embeddings}, {"rope_theta", rope.theta},
      {"compress_rope_theta", compress_rope.theta}, {"qk_rope_head_dim", rope_head_dim},
  };
  if (hf) {
    json lt = json::array(), mt = json::array();
    int64_t csa = 4, hca = 128;
    for (int64_t l = 0; l < num_layers; ++l) {
      lt.push_back(layer_types[l] == AttnKind::kSliding ? "sliding_attention"
                   : layer_types[l] == AttnKind::kCSA   ? "compressed_sparse_attention"
                                                        : "heavily_compressed_attention");
      if (layer_types[l] == AttnKind::kCSA) csa = compress_ratio[l];
      if (layer_types[l] == AttnKind::kHCA) hca = compress_ratio[l];
      mt.push_back(mlp_types[l] == MlpKind::kHashMoE ? "hash_moe" : "moe");
    }
    j["layer_types"] = lt;
    j["mlp_layer_types"] = mt;
    j["compress_rates"] = {{"compressed_sparse_attention", csa}, {"heavily_compressed_attention", hca}};
    j["partial_rotary_factor"] = double(rope_head_dim) / double(head_dim);
    json main = yarn_json(rope, true), comp = yarn_json(compress_rope, true);
    main["rope_theta"] = rope.theta;
    comp["rope_theta"] = compress_rope.theta;
    main["partial_rotary_factor"] = comp["partial_rotary_factor"] = j["partial_rotary_factor"];
    j["rope_parameters"] = {{"main", main}, {"compress", comp}};
  } else {
    json ratios = compress_ratio;
    for (int64_t r : mtp_compress_ratio) ratios.push_back(r);
    j["compress_ratios"] = ratios;
    j["num_hash_layers"] = num_hash_layers();
    if (compress_rope.yarn) j["rope_scaling"] = yarn_json(compress_rope, false);
    if (dense_format == WeightFormat::kFP8Block)
      j["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                  {"scale_fmt", scale_fmt.empty() ? "ue8m0" : scale_fmt},
                                  {"weight_block_size", {fp8_block, fp8_block}}};
    j["expert_dtype"] = expert_format == WeightFormat::kFP4 ? "fp4" : expert_format == WeightFormat::kFP8Block ? "fp8" : "bf16";
    j["topk_method"] = "noaux_tc";
    j["torch_dtype"] = "bfloat16";
  }
  return j.dump(2) + "\n";
}

}  // namespace deepinfer::model::v4
