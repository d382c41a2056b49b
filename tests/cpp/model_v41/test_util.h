// Helpers shared by the DeepSeek-V4.1 tests.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace v41_test {
namespace fs = std::filesystem;

inline fs::path source_dir() {
  const char* s = std::getenv("DEEPINFER_SOURCE_DIR");
  return s ? fs::path(s) : fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
}

inline fs::path golden(const std::string& name) { return source_dir() / "tests" / "data" / "golden" / name; }

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs f, expects exception type E, returns its message.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// The released composite config.json, from the values of MODEL-DEEPSEEK-V41.md §1.
inline nlohmann::json release_json() {
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 18; ++i) ratios.push_back(2);
  for (int i = 0; i < 20; ++i) ratios.push_back(1);
  for (int i = 0; i < 3; ++i) ratios.push_back(0);
  using json = nlohmann::json;
  json text = {
      {"model_type", "deepseek_v41_text"}, {"vocab_size", 129280}, {"hidden_size", 5120}, {"num_hidden_layers", 40},
      {"num_attention_heads", 64}, {"num_key_value_heads", 1}, {"head_dim", 512}, {"qk_rope_head_dim", 64},
      {"q_lora_rank", 1280}, {"o_groups", 8}, {"o_lora_rank", 1024}, {"sliding_window", 128},
      {"compress_ratios", ratios}, {"kv_source_layer_ids", {2, 8, 14, 20}},
      {"index_source_layer_ids", {2, 8, 14, 20, 24, 28, 32, 36}}, {"candidate_source_layer_id", 20},
      {"candidate_topk_blocks", 2048}, {"candidate_block_size", 8}, {"index_n_heads", 32}, {"index_head_dim", 128},
      {"index_topk", 512}, {"rope_theta", 10000.0}, {"compress_rope_theta", 160000.0},
      {"rope_scaling", {{"type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 65536},
                        {"beta_fast", 32}, {"beta_slow", 1}}},
      {"max_position_embeddings", 1048576}, {"n_routed_experts", 384}, {"num_experts_per_tok", 6},
      {"n_shared_experts", 1}, {"moe_intermediate_size", 2304}, {"scoring_func", "sqrtsoftplus"},
      {"topk_method", "noaux_tc"}, {"norm_topk_prob", true}, {"routed_scaling_factor", 1.5}, {"gate_temp", 1.0},
      {"swiglu_limit", 10.0}, {"hc_mult", 4}, {"hc_sinkhorn_iters", 20}, {"hc_eps", 1e-6}, {"rms_norm_eps", 1e-20},
      {"engram_layer_ids", {1, 14}}, {"engram_num_embeddings", {384006168, 384016682}},
      {"engram_max_ngram_size", 4}, {"engram_n_heads", 8}, {"engram_head_dim", 256}, {"engram_vocab_size", 16000000},
      {"engram_pad_token_id", 2}, {"engram_compressed_vocab_size", 99092}, {"num_nextn_predict_layers", 3},
      {"dspark_block_size", 5}, {"dspark_noise_token_id", 128799}, {"dspark_target_layer_ids", {37, 38, 39}},
      {"dspark_markov_rank", 256}, {"dspark_n_routed_experts", 128}, {"dspark_num_experts_per_tok", 3}};
  return {{"architectures", {"DeepseekV41ForCausalLM"}}, {"model_type", "deepseek_v41"}, {"text_config", text},
          {"vision_config", {{"model_type", "deepseek_v41_vision"}, {"hidden_size", 1024}, {"intermediate_size", 2816},
                             {"num_hidden_layers", 32}, {"num_attention_heads", 16}, {"patch_size", 14},
                             {"downsample_ratio", 3}, {"max_image_tokens", 1024}, {"min_pixels", 295936}}},
          {"bos_token_id", 0}, {"eos_token_id", 1}, {"pad_token_id", 2}, {"image_token_id", 129264},
          {"dtype", "bfloat16"},
          {"quantization_config", {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {32, 32}}, {"scale_fmt", "ue8m0"}, {"expert_dtype", "fp4"}}}};
}

#define V41_EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

}  // namespace v41_test
