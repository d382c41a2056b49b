// config.json parsing in both layouts, and one test per kind of bad config.
#include <nlohmann/json.hpp>

#include "model/deepseek_v4/config.h"
#include "test_util.h"

using namespace deepinfer;
using namespace deepinfer::model::v4;
using namespace di_test;
using json = nlohmann::json;

namespace {
// What transformers 5.17 writes for the §9 tiny config (save_pretrained, trimmed of unused keys).
json hf_tiny() {
  return json::parse(R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "bos_token_id": 0,
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
  "compress_rope_theta": 160000.0, "eos_token_id": 1, "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20,
  "head_dim": 64, "hidden_size": 256, "index_head_dim": 32, "index_n_heads": 16, "index_topk": 8,
  "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                  "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
  "max_position_embeddings": 1048576, "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
  "moe_intermediate_size": 128, "n_routed_experts": 8, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 8, "num_experts_per_tok": 2, "num_hidden_layers": 6, "num_key_value_heads": 1,
  "num_nextn_predict_layers": 1, "o_groups": 2, "o_lora_rank": 64, "partial_rotary_factor": 0.25,
  "q_lora_rank": 128, "qk_rope_head_dim": 16, "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "compress": {"attention_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0,
                 "original_max_position_embeddings": 65536, "partial_rotary_factor": 0.25,
                 "rope_theta": 160000.0, "rope_type": "yarn"},
    "main": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"}},
  "rope_theta": 10000.0, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 16,
  "swiglu_limit": 10.0, "tie_word_embeddings": false, "vocab_size": 512})");
}

// The release config.json of DeepSeek-V4-Flash (MODEL-DEEPSEEK-V4.md §1).
json official_flash() {
  json ratios = {0, 0};
  for (int i = 0; i < 20; ++i) ratios.push_back(4), ratios.push_back(128);
  ratios.push_back(4), ratios.push_back(0);
  json j = json::parse(R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "bos_token_id": 0, "eos_token_id": 1,
  "expert_dtype": "fp4", "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 512,
  "hidden_size": 4096, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512,
  "max_position_embeddings": 1048576, "moe_intermediate_size": 2048, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 64, "num_experts_per_tok": 6,
  "num_hidden_layers": 43, "num_hash_layers": 3, "num_key_value_heads": 1, "num_nextn_predict_layers": 1,
  "o_groups": 8, "o_lora_rank": 1024, "q_lora_rank": 1024, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "sliding_window": 128,
  "swiglu_limit": 10.0, "tie_word_embeddings": false, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
  "vocab_size": 129280, "compress_rope_theta": 160000})");
  j["compress_ratios"] = ratios;
  return j;
}

DeepseekV4Config parse(const json& j) { return DeepseekV4Config::from_json_string(j.dump(), "test/config.json"); }
std::string config_error(const json& j) {
  return error_of<ConfigError>([&] { parse(j); });
}
}  // namespace

TEST(Config, TransformersLayout) {
  DeepseekV4Config c = parse(hf_tiny());
  EXPECT_EQ(c.layout, CheckpointLayout::kTransformers);
  EXPECT_EQ(c.architecture, "DeepseekV4ForCausalLM");
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.rope_head_dim, 16);
  EXPECT_EQ(c.schedule_str(), "S C H C H S");
  EXPECT_EQ(c.compress_ratio, (std::vector<int64_t>{0, 4, 16, 4, 16, 0}));
  EXPECT_EQ(c.num_hash_layers(), 2);
  EXPECT_EQ(c.mlp_types[2], MlpKind::kMoE);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.theta, 160000.0);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.factor, 16.0);
  EXPECT_EQ(c.compress_rope.original_max_position, 65536);
  EXPECT_EQ(c.hc_mix_dim(), 24);
  EXPECT_EQ(c.heads_per_group(), 4);
  EXPECT_EQ(c.dense_format, WeightFormat::kBF16);
}

TEST(Config, TransformersFlatRopeParametersAndDefaults) {
  json j = hf_tiny();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 4096}};
  j.erase("mlp_layer_types");
  j.erase("qk_rope_head_dim");
  DeepseekV4Config c = parse(j);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.factor, 8.0);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_EQ(c.num_hash_layers(), 3);  // HF default when mlp_layer_types is absent
}

TEST(Config, OfficialFlash) {
  DeepseekV4Config c = parse(official_flash());
  EXPECT_EQ(c.layout, CheckpointLayout::kOfficial);
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.layer_types.size(), 43u);
  EXPECT_EQ(c.layer_types[0], AttnKind::kSliding);
  EXPECT_EQ(c.layer_types[2], AttnKind::kCSA);
  EXPECT_EQ(c.layer_types[3], AttnKind::kHCA);
  EXPECT_EQ(c.layer_types[42], AttnKind::kCSA);
  EXPECT_EQ(c.compress_ratio[41], 128);
  EXPECT_EQ(c.num_mtp_layers, 1);
  EXPECT_EQ(c.mtp_compress_ratio, (std::vector<int64_t>{0}));  // entry 43 of compress_ratios
  EXPECT_EQ(c.num_hash_layers(), 3);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_FALSE(c.rope.yarn);
  EXPECT_DOUBLE_EQ(c.compress_rope.beta_fast, 32.0);
  EXPECT_EQ(c.dense_format, WeightFormat::kFP8Block);
  EXPECT_EQ(c.expert_format, WeightFormat::kFP4);
  EXPECT_EQ(c.fp8_block, 128);
  EXPECT_EQ(c.scale_fmt, "ue8m0");
}

TEST(Config, OfficialWithPaddedRatiosAndWindowSize) {
  json j = official_flash();
  j["compress_ratios"].push_back(0);
  j["compress_ratios"].push_back(0);  // V4-Flash-0731 ships 46 entries
  j.erase("sliding_window");
  j["window_size"] = 128;             // the reference's inference/config.json spelling
  DeepseekV4Config c = parse(j);
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.sliding_window, 128);
}

TEST(Config, RoundTripsThroughToJson) {
  for (const json& j : {hf_tiny(), official_flash()}) {
    DeepseekV4Config a = parse(j);
    DeepseekV4Config b = DeepseekV4Config::from_json_string(a.to_json_string(), "roundtrip");
    EXPECT_EQ(a.layout, b.layout);
    EXPECT_EQ(a.schedule_str(), b.schedule_str());
    EXPECT_EQ(a.compress_ratio, b.compress_ratio);
    EXPECT_EQ(a.num_hash_layers(), b.num_hash_layers());
    EXPECT_EQ(a.rope_head_dim, b.rope_head_dim);
    EXPECT_EQ(a.compress_rope.yarn, b.compress_rope.yarn);
    EXPECT_EQ(a.dense_format, b.dense_format);
    EXPECT_EQ(a.expert_format, b.expert_format);
    EXPECT_EQ(a.mtp_compress_ratio, b.mtp_compress_ratio);
  }
}

TEST(ConfigErrors, MalformedJson) {
  std::string e = error_of<ConfigError>([] { DeepseekV4Config::from_json_string("{\"vocab_size\": 12,", "m/config.json"); });
  EXPECT_HAS(e, "m/config.json: not valid JSON");
  fs::path d = fresh_dir("cfg_missing");
  e = error_of<ConfigError>([&] { DeepseekV4Config::from_file(d.string()); });
  EXPECT_HAS(e, "config.json: cannot open");
}

TEST(ConfigErrors, UnknownArchitecture) {
  json j = hf_tiny();
  j["architectures"] = {"LlamaForCausalLM"};
  EXPECT_HAS(config_error(j), "test/config.json: unknown architecture LlamaForCausalLM; supported: DeepseekV4ForCausalLM");
}

TEST(ConfigErrors, LayerTypesLengthMismatch) {
  json j = hf_tiny();
  j["layer_types"].erase(j["layer_types"].size() - 1);
  EXPECT_HAS(config_error(j), "test/config.json: field 'layer_types': has 5 entries but num_hidden_layers is 6");
  j = hf_tiny();
  j["mlp_layer_types"].push_back("moe");
  EXPECT_HAS(config_error(j), "field 'mlp_layer_types': has 7 entries");
  j = official_flash();
  j["num_hidden_layers"] = 50;
  EXPECT_HAS(config_error(j), "field 'compress_ratios': has 44 entries, fewer than num_hidden_layers=50");
}

TEST(ConfigErrors, UnknownLayerType) {
  json j = hf_tiny();
  j["layer_types"][3] = "full_attention";
  EXPECT_HAS(config_error(j), "field 'layer_types[3]': unknown layer type full_attention");
}

TEST(ConfigErrors, MissingRequiredField) {
  json j = hf_tiny();
  j.erase("hidden_size");
  EXPECT_HAS(config_error(j), "test/config.json: missing required field 'hidden_size'");
  j = official_flash();
  j.erase("compress_ratios");
  EXPECT_HAS(config_error(j), "needs 'layer_types' (transformers layout) or 'compress_ratios'");
}

TEST(ConfigErrors, WrongType) {
  json j = hf_tiny();
  j["num_attention_heads"] = "eight";
  EXPECT_HAS(config_error(j), "field 'num_attention_heads': expected an integer, got \"eight\"");
  j = hf_tiny();
  j["norm_topk_prob"] = 1;
  EXPECT_HAS(config_error(j), "field 'norm_topk_prob': expected a boolean");
  j = official_flash();
  j["rope_scaling"] = "yarn";
  EXPECT_HAS(config_error(j), "field 'rope_scaling': expected an object");
}

TEST(ConfigErrors, Inconsistent) {
  json j = hf_tiny();
  j["o_groups"] = 3;
  EXPECT_HAS(config_error(j), "field 'o_groups': num_attention_heads=8 is not divisible by o_groups=3");
  j = hf_tiny();
  j["num_key_value_heads"] = 8;
  EXPECT_HAS(config_error(j), "field 'num_key_value_heads': must be 1");
  j = official_flash();
  j["qk_rope_head_dim"] = 63;
  EXPECT_HAS(config_error(j), "field 'qk_rope_head_dim': rope dims must be even");
  j = official_flash();
  j["qk_rope_head_dim"] = 1024;
  EXPECT_HAS(config_error(j), "field 'qk_rope_head_dim'");
  j = hf_tiny();
  j["qk_rope_head_dim"] = 32;  // disagrees with partial_rotary_factor 0.25 * 64
  EXPECT_HAS(config_error(j), "field 'qk_rope_head_dim': 32 disagrees");
  j = hf_tiny();
  j["num_experts_per_tok"] = 9;
  EXPECT_HAS(config_error(j), "field 'num_experts_per_tok': 9 > n_routed_experts=8");
  j = official_flash();
  j["expert_dtype"] = "int3";
  EXPECT_HAS(config_error(j), "field 'expert_dtype': unsupported 'int3'");
  j = official_flash();
  j["quantization_config"]["weight_block_size"] = {128, 64};
  EXPECT_HAS(config_error(j), "field 'quantization_config.weight_block_size'");
  j = official_flash();
  j["rope_scaling"]["type"] = "dynamic";
  EXPECT_HAS(config_error(j), "field 'rope_scaling': unsupported rope type 'dynamic'");
}
