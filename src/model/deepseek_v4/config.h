// DeepSeek-V4 model configuration, normalised from either config.json layout:
//  - the official release layout (deepseek-ai/DeepSeek-V4-Flash: `compress_ratios`,
//    `num_hash_layers`, `qk_rope_head_dim`, `rope_scaling`, `quantization_config`, `expert_dtype`)
//  - the transformers layout (`layer_types`, `mlp_layer_types`, `compress_rates`,
//    `partial_rotary_factor`, `rope_parameters`).
// See shared docs MODEL-DEEPSEEK-V4.md §1. Every field is validated at parse time; a bad
// config.json throws ConfigError naming the file and field.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::model::v4 {

enum class AttnKind : uint8_t { kSliding, kCSA, kHCA };  // compress ratio 0 / 4 / 128 (configurable)
enum class MlpKind : uint8_t { kHashMoE, kMoE };
enum class CheckpointLayout : uint8_t { kOfficial, kTransformers };
enum class WeightFormat : uint8_t { kBF16, kF32, kFP8Block, kFP4 };  // how a linear's weight is stored

struct RopeParams {
  double theta = 10000.0;
  bool yarn = false;          // YaRN frequency interpolation (no attention mscale)
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double attention_factor = 1.0;  // YaRN mscale on cos/sin; V4 uses 1.0 (HF forces it)
};

struct DeepseekV4Config {
  std::string architecture;   // "DeepseekV4ForCausalLM"
  CheckpointLayout layout = CheckpointLayout::kTransformers;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;             // D
  int64_t num_layers = 0;              // main decoder layers (MTP excluded)
  int64_t num_heads = 0;               // query heads H
  int64_t num_kv_heads = 1;            // must be 1 (shared K=V head)
  int64_t head_dim = 0;                // 512 in V4
  int64_t rope_head_dim = 0;           // trailing dims of each head that are rotated (64)
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0, o_lora_rank = 0;
  int64_t sliding_window = 0;          // keys p-window+1..p

  int64_t n_routed_experts = 0, num_experts_per_tok = 0, n_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 0.0;           // 0 = no clamp
  std::string scoring_func = "sqrtsoftplus";
  bool norm_topk_prob = true;

  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;

  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;

  std::vector<AttnKind> layer_types;   // [num_layers]
  std::vector<int64_t> compress_ratio; // [num_layers] 0 for sliding layers, else m (4 or 128)
  std::vector<MlpKind> mlp_types;      // [num_layers]
  RopeParams rope;                     // sliding-only layers
  RopeParams compress_rope;            // CSA/HCA layers (theta = compress_rope_theta, YaRN)

  int64_t num_mtp_layers = 0;          // num_nextn_predict_layers (official layout only has weights)
  std::vector<int64_t> mtp_compress_ratio;  // [num_mtp_layers] trailing compress_ratios entries (0 if absent)
  int64_t bos_token_id = 0, eos_token_id = 1;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  // Quantisation of the stored weights (official layout); transformers layout is plain.
  WeightFormat dense_format = WeightFormat::kBF16;   // attention/shared-expert linears
  WeightFormat expert_format = WeightFormat::kBF16;  // routed experts ("fp4" -> kFP4, "fp8" -> kFP8Block)
  int64_t fp8_block = 128;                           // block edge of FP8 weight scales
  int64_t fp4_block = 32;                            // input elements per FP4 scale
  std::string scale_fmt;                             // quantization_config.scale_fmt ("ue8m0" or "")

  std::string origin;                                // file the config was read from (for messages)
  int64_t num_hash_layers() const;                   // count of kHashMoE layers

  // Parse `<dir>/config.json` (or a JSON string); throws ConfigError.
  static DeepseekV4Config from_file(const std::string& path);
  static DeepseekV4Config from_json_string(const std::string& json, const std::string& origin);
  // config.json text in `layout`'s field names (round-trips through from_json_string).
  std::string to_json_string() const;

  int64_t hc_dim() const { return hc_mult * hidden_size; }
  int64_t hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }
  int64_t heads_per_group() const { return num_heads / o_groups; }
  bool is_compressed(int64_t layer) const { return compress_ratio[layer] > 0; }
  std::string summary() const;  // one line per section, for `deepinfer info`
  // Compact attention schedule, one letter per layer, space-separated: S sliding, C CSA, H HCA.
  std::string schedule_str() const;
};

}  // namespace deepinfer::model::v4
