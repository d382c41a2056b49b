// DeepSeek-V4.1 model configuration (MODEL-DEEPSEEK-V41.md §1, V41-REFERENCE-NOTES.md §2), from
// either config.json the model ships with:
//  - the release layout: composite `model_type: deepseek_v41` with `text_config`,
//    `vision_config`, top-level `quantization_config` (FP8 32x32 ue8m0, `expert_dtype: fp4`) and
//    the release key `engram_pad_token_id`;
//  - the flat `model_type: deepseek_v41_text` that transformers' save_pretrained writes (derived
//    `layer_types`, nested `rope_parameters {main, compress}`, `engram_pad_id`).
// Every field is type- and range-checked; a bad file throws ConfigError naming the file and the key
// (`text_config.kv_source_layer_ids[2]`). Refused on purpose, also naming the key:
//  - unknown keys (a later revision that adds a field must be looked at, not silently run);
//  - values that change the math in ways the engine does not implement (more than one KV head, a
//    scoring function other than sqrtsoftplus, YaRN attention_factor != 1 or truncate = false,
//    n_shared_experts != 1 — transformers builds exactly one —, an activation other than silu,
//    attention bias);
//  - role layouts the math forbids (validate.cpp): a compressed layer without a KV source at or below
//    it, a consumer whose ratio differs from its source's, a KV source that is not an index
//    source, an index source that is not one, a candidate source that is not an index source,
//    a KV source after the candidate source.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/deepseek_v4/config.h"  // RopeParams

namespace deepinfer::model::v41 {

using v4::RopeParams;

enum class ConfigLayout : uint8_t { kRelease, kTransformers };  // composite / flat deepseek_v41_text
enum class WeightFormat : uint8_t { kBF16, kFP8Block, kFP4 };

// What a layer computes and reads (MODEL-DEEPSEEK-V41.md §2.1; V41-REFERENCE-NOTES.md §3).
enum class LayerRole : uint8_t {
  kSliding,  // ratio 0: its own window only
  kFull,     // KV source: compressor + compressed entries + index keys, and scores them
  kReuse,    // reads its KV source's entries and the closest index source's top-k
  kReindex,  // own index query + weights over its KV source's keys (candidate-masked if after it)
};
const char* layer_role_name(LayerRole r);

struct LayerRoles {
  LayerRole role = LayerRole::kSliding;
  int64_t ratio = 0;              // source tokens per compressed entry; 0 = sliding only
  int32_t kv_source = -1;         // closest KV source at or below (owns the entries and index keys)
  int32_t topk_source = -1;       // closest index source at or below (whose top-k this layer uses)
  bool candidate_source = false;  // publishes the candidate-block mask (two-level top-k)
  bool uses_candidates = false;   // an index source after the candidate source: scores inside the mask
  bool engram = false;            // Engram injection before this layer's block
  bool dspark_target = false;     // its attention input feeds the DSpark drafter (tap)
};

struct EngramConfig {
  std::vector<int64_t> layer_ids;       // ascending
  std::vector<int64_t> num_embeddings;  // table rows per Engram layer (= sum of its primes)
  int64_t max_ngram_size = 0;           // N: n-grams 2..N are hashed
  int64_t n_heads = 0, head_dim = 0;
  int64_t vocab_size = 0;               // prime search starts above vocab_size - 1
  int64_t pad_id = 2;                   // engram_pad_token_id (release) / engram_pad_id (HF)
  int64_t compressed_vocab_size = 0;    // classes of the tokenizer class map
  int64_t num_columns() const { return (max_ngram_size - 1) * n_heads; }  // rows per position per layer
};

struct DSparkConfig {
  int64_t num_stages = 0;               // num_nextn_predict_layers
  int64_t block_size = 0, noise_token_id = 0, markov_rank = 0;
  std::vector<int64_t> target_layer_ids;
  int64_t n_routed_experts = 0, num_experts_per_tok = 0;
};

struct VisionConfig {                   // parsed and checked; the tower itself is not run
  bool present = false;
  int64_t hidden_size = 0, intermediate_size = 0, num_layers = 0, num_heads = 0;
  int64_t patch_size = 0, downsample_ratio = 0, max_image_tokens = 0, min_pixels = 0;
  double rope_theta = 10000.0;
};

struct DeepseekV41Config {
  ConfigLayout layout = ConfigLayout::kRelease;
  std::string origin;                   // file the config was read from (for messages)

  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0;
  int64_t num_heads = 0, head_dim = 0, rope_head_dim = 0;
  int64_t q_lora_rank = 0, o_groups = 0, o_lora_rank = 0;
  int64_t sliding_window = 0;           // W: keys p-W+1..p
  std::vector<int64_t> compress_ratios; // [num_layers]
  std::vector<int64_t> kv_source_layer_ids, index_source_layer_ids;
  int64_t candidate_source_layer_id = -1;  // < 0: no two-level top-k
  int64_t candidate_topk_blocks = 0, candidate_block_size = 0;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;

  RopeParams rope;                      // ratio-0 layers and DSpark stages (theta, no YaRN)
  RopeParams compress_rope;             // every rotation of a ratio > 0 layer
  int64_t max_position_embeddings = 0;

  int64_t n_routed_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  std::string scoring_func = "sqrtsoftplus";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0, gate_temp = 1.0, swiglu_limit = 0.0;

  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6, rms_norm_eps = 1e-20;

  EngramConfig engram;
  DSparkConfig dspark;
  VisionConfig vision;

  int64_t bos_token_id = 0, eos_token_id = 1, pad_token_id = -1, image_token_id = -1;
  bool tie_word_embeddings = false;
  WeightFormat dense_format = WeightFormat::kBF16, expert_format = WeightFormat::kBF16;
  int64_t fp8_block_out = 32, fp8_block_in = 32;  // quantization_config.weight_block_size
  int64_t fp4_block = 32;                         // K elements per FP4 expert scale

  std::vector<LayerRoles> roles;        // [num_layers], derived and validated (validate.cpp)

  // Parse `<dir>/config.json`, a config.json path, or a JSON string; throws ConfigError.
  static DeepseekV41Config from_file(const std::string& path);
  static DeepseekV41Config from_json_string(const std::string& json, const std::string& origin);

  // Routing weights are normalised only with more than one expert per token (the reference's
  // `norm_topk_prob and top_k > 1`).
  bool routing_normalized() const { return norm_topk_prob && num_experts_per_tok > 1; }
  bool candidates_enabled() const { return candidate_source_layer_id >= 0; }
  int64_t hc_dim() const { return hc_mult * hidden_size; }
  int64_t hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }
  // One letter per layer: S sliding, F full, R reuse, X reindex; '*' candidate source, 'c' masked.
  std::string schedule_str() const;
  std::string summary() const;
};

}  // namespace deepinfer::model::v41
