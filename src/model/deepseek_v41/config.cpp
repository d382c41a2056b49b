// config.json -> DeepseekV41Config, release (composite) and transformers (flat) layouts.
#include "model/deepseek_v41/config.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/file.h"
#include "core/json.h"
#include "model/deepseek_v41/config_fields.h"

namespace deepinfer::model::v41 {
using json = nlohmann::json;
using config_detail::Fields;

namespace {
constexpr const char* kArchitecture = "DeepseekV41ForCausalLM";
// Bounds no real checkpoint comes near (V4.1-Flash: hidden 5,120, 40 layers, 384 experts); they
// keep products of two dims inside int64 and stop hostile values from spinning or allocating.
constexpr int64_t kMaxDim = int64_t(1) << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxStages = 64;
constexpr int64_t kMaxBlock = 4096;

// Keys transformers writes into every config (or that only training reads): accepted, unused.
#define DI_V41_HF_META "transformers_version", "_name_or_path", "dtype", "torch_dtype", "use_cache", \
    "initializer_range", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", \
    "attention_dropout", "output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward", \
    "id2label", "label2id", "problem_type", "tokenizer_class", "is_encoder_decoder", "auto_map"

void parse_yarn(const Fields& f, const json& r, const std::string& where, RopeParams& p) {
  Fields y(r, f.origin(), f.key(where) + ".");
  std::string type = y.get_string("rope_type", "");
  const std::string alt = y.get_string("type", "");
  if (type.empty()) type = alt.empty() ? "default" : alt;
  if (!alt.empty() && alt != type) y.fail("type", "'" + alt + "' disagrees with rope_type '" + type + "'");
  y.mark_read("rope_theta");
  y.mark_read("partial_rotary_factor");
  if (type == "default") {
    y.refuse_unread({});
    return;
  }
  if (type != "yarn") y.fail("rope_type", "unsupported '" + type + "' (supported: default, yarn)");
  p.yarn = true;
  p.factor = y.get_double("factor", 1.0);
  p.original_max_position = y.get_int("original_max_position_embeddings");
  p.beta_fast = y.get_double("beta_fast", 32.0);
  p.beta_slow = y.get_double("beta_slow", 1.0);
  // transformers forces attention_factor to 1.0 unless given (no YaRN mscale), which also makes
  // mscale / mscale_all_dim inert; the engine's rope implements exactly that and the floor/ceil
  // correction range (truncate = true).
  p.attention_factor = y.get_double("attention_factor", 1.0);
  if (p.attention_factor != 1.0)
    y.fail("attention_factor", detail::str_cat("must be 1 (YaRN attention scaling is not implemented), got ",
                                               p.attention_factor));
  if (!y.get_bool("truncate", true)) y.fail("truncate", "false is not implemented (the correction range is floored)");
  if (!(p.factor > 0) || p.original_max_position <= 0 || !(p.beta_fast > 0) || !(p.beta_slow > 0))
    y.fail("factor", "yarn needs factor, beta_fast, beta_slow and original_max_position_embeddings > 0");
  y.refuse_unread({"mscale", "mscale_all_dim"});
}

// rope_parameters {main, compress} as save_pretrained writes it; overrides the thetas and
// rope_scaling as transformers does. Its partial_rotary_factor must give qk_rope_head_dim.
void parse_rope_parameters(const Fields& f, DeepseekV41Config& c) {
  const json& rp = f.get_object("rope_parameters");
  for (const char* k : {"main", "compress"})
    if (!rp.contains(k) || !rp[k].is_object())
      f.fail("rope_parameters", std::string("expected objects 'main' and 'compress', '") + k + "' is missing");
  Fields r(rp, f.origin(), f.key("rope_parameters."));
  r.mark_read("main");
  r.mark_read("compress");
  r.refuse_unread({"rope_type"});  // a flat-shape leftover transformers may keep beside the two
  for (const char* k : {"main", "compress"}) {
    Fields s(rp[k], f.origin(), r.key(std::string(k) + "."));
    RopeParams& p = std::string(k) == "main" ? c.rope : c.compress_rope;
    p = RopeParams{};
    p.theta = s.get_double("rope_theta", p.theta);
    const double prf = s.get_double("partial_rotary_factor", double(c.rope_head_dim) / double(c.head_dim));
    if (int64_t(double(c.head_dim) * prf) != c.rope_head_dim)
      s.fail("partial_rotary_factor", detail::str_cat(prf, " * head_dim ", c.head_dim, " != qk_rope_head_dim ",
                                                      c.rope_head_dim));
    parse_yarn(r, rp[k], k, p);
  }
  if (c.rope.yarn) r.fail("main.rope_type", "YaRN on the sliding-window rope is not part of V4.1");
}

void parse_attention(const Fields& t, DeepseekV41Config& c) {
  c.vocab_size = t.get_int("vocab_size");
  c.hidden_size = t.get_int("hidden_size");
  c.num_layers = t.get_int("num_hidden_layers");
  c.num_heads = t.get_int("num_attention_heads");
  if (t.get_int("num_key_value_heads", 1) != 1)
    t.fail("num_key_value_heads", "must be 1 (one latent K=V head shared by all heads)");
  c.head_dim = t.get_int("head_dim");
  c.rope_head_dim = t.get_int("qk_rope_head_dim");
  c.q_lora_rank = t.get_int("q_lora_rank");
  c.o_groups = t.get_int("o_groups");
  c.o_lora_rank = t.get_int("o_lora_rank");
  c.sliding_window = t.get_int("sliding_window");
  if (t.get_bool("attention_bias", false)) t.fail("attention_bias", "true is not implemented (V4.1 has no biases)");
  c.rope.theta = t.get_double("rope_theta", 10000.0);
  c.compress_rope.theta = t.get_double("compress_rope_theta", 160000.0);
  if (t.has("rope_scaling")) parse_yarn(t, t.get_object("rope_scaling"), "rope_scaling", c.compress_rope);
  if (t.has("rope_parameters")) parse_rope_parameters(t, c);
  c.max_position_embeddings = t.get_int("max_position_embeddings", 1048576);
  c.index_n_heads = t.get_int("index_n_heads");
  c.index_head_dim = t.get_int("index_head_dim");
  c.index_topk = t.get_int("index_topk");
}

void parse_moe_hc(const Fields& t, DeepseekV41Config& c) {
  c.n_routed_experts = t.get_int("n_routed_experts");
  c.num_experts_per_tok = t.get_int("num_experts_per_tok");
  c.moe_intermediate_size = t.get_int("moe_intermediate_size");
  if (t.get_int("n_shared_experts", 1) != 1)
    t.fail("n_shared_experts", "must be 1 (the reference builds exactly one shared expert whatever this says)");
  c.scoring_func = t.get_string("scoring_func", "sqrtsoftplus");
  if (c.scoring_func != "sqrtsoftplus") t.fail("scoring_func", "'" + c.scoring_func + "' is not implemented (sqrtsoftplus)");
  const std::string topk_method = t.get_string("topk_method", "noaux_tc");
  if (topk_method != "noaux_tc") t.fail("topk_method", "'" + topk_method + "' is not implemented (noaux_tc)");
  const std::string act = t.get_string("hidden_act", "silu");
  if (act != "silu") t.fail("hidden_act", "'" + act + "' is not implemented (silu)");
  c.norm_topk_prob = t.get_bool("norm_topk_prob", true);
  c.routed_scaling_factor = t.get_double("routed_scaling_factor", 1.5);
  c.gate_temp = t.get_double("gate_temp", 1.0);
  c.swiglu_limit = t.get_double("swiglu_limit", 10.0);
  c.hc_mult = t.get_int("hc_mult", 4);
  c.hc_sinkhorn_iters = t.get_int("hc_sinkhorn_iters", 20);
  c.hc_eps = t.get_double("hc_eps", 1e-6);
  c.rms_norm_eps = t.get_double("rms_norm_eps", 1e-20);
  c.tie_word_embeddings = t.get_bool("tie_word_embeddings", c.tie_word_embeddings);
}

void parse_engram_dspark(const Fields& t, DeepseekV41Config& c) {
  EngramConfig& e = c.engram;
  e.layer_ids = t.has("engram_layer_ids") ? t.get_int_list("engram_layer_ids") : std::vector<int64_t>{};
  e.num_embeddings = t.has("engram_num_embeddings") ? t.get_int_list("engram_num_embeddings")
                                                    : std::vector<int64_t>(e.layer_ids.size(), 0);
  e.max_ngram_size = t.get_int("engram_max_ngram_size", 4);
  e.n_heads = t.get_int("engram_n_heads", 8);
  e.head_dim = t.get_int("engram_head_dim", 256);
  e.vocab_size = t.get_int("engram_vocab_size", 16000000);
  e.compressed_vocab_size = t.get_int("engram_compressed_vocab_size", 99092);
  // The release spells it engram_pad_token_id, transformers engram_pad_id: read either.
  const bool rel = t.has("engram_pad_token_id"), hf = t.has("engram_pad_id");
  e.pad_id = rel ? t.get_int("engram_pad_token_id") : t.get_int("engram_pad_id", 2);
  if (rel && hf && t.get_int("engram_pad_id") != e.pad_id)
    t.fail("engram_pad_id", detail::str_cat(t.get_int("engram_pad_id"), " disagrees with engram_pad_token_id ", e.pad_id));

  DSparkConfig& d = c.dspark;
  d.num_stages = t.get_int("num_nextn_predict_layers", 0);
  d.block_size = t.get_int("dspark_block_size", 5);
  d.noise_token_id = t.get_int("dspark_noise_token_id", 128799);
  d.markov_rank = t.get_int("dspark_markov_rank", 256);
  d.n_routed_experts = t.get_int("dspark_n_routed_experts", 128);
  d.num_experts_per_tok = t.get_int("dspark_num_experts_per_tok", 3);
  if (t.has("dspark_target_layer_ids")) d.target_layer_ids = t.get_int_list("dspark_target_layer_ids");
}

// compress_ratios and the source lists, with transformers' defaults where a list is absent
// (configuration_deepseek_v41.py __post_init__).
void parse_schedule(const Fields& t, DeepseekV41Config& c) {
  const std::vector<int64_t> ratios = t.get_int_list("compress_ratios");
  const int64_t n = c.num_layers, stages = c.dspark.num_stages;
  if (int64_t(ratios.size()) < n || int64_t(ratios.size()) > n + std::max<int64_t>(stages, 0))
    t.fail("compress_ratios", detail::str_cat("has ", ratios.size(), " entries; expected num_hidden_layers (", n,
                                               ") up to num_hidden_layers + num_nextn_predict_layers (", n + stages, ")"));
  for (size_t i = 0; i < ratios.size(); ++i) {
    const std::string k = detail::str_cat("compress_ratios[", i, "]");
    if (ratios[i] < 0 || ratios[i] > kMaxDim) t.fail(k, detail::str_cat("invalid ratio ", ratios[i]));
    if (int64_t(i) >= n && ratios[i] != 0)
      t.fail(k, detail::str_cat("the DSpark stages are sliding-window only (ratio 0), got ", ratios[i]));
  }
  c.compress_ratios.assign(ratios.begin(), ratios.begin() + n);
  const std::vector<int64_t> release_ratios = [] {
    std::vector<int64_t> r(40, 1);
    r[0] = r[1] = 0;
    for (int i = 2; i < 20; ++i) r[i] = 2;
    return r;
  }();
  const bool release_prefix = n <= 40 && std::equal(c.compress_ratios.begin(), c.compress_ratios.end(), release_ratios.begin());
  if (t.has("kv_source_layer_ids")) {
    c.kv_source_layer_ids = t.get_int_list("kv_source_layer_ids");
  } else if (release_prefix) {
    c.kv_source_layer_ids = {2, 8, 14, 20};
  } else {  // the first layer of each run of equal non-zero ratios
    for (int64_t i = 0; i < n; ++i)
      if (c.compress_ratios[i] > 0 && (i == 0 || c.compress_ratios[i - 1] != c.compress_ratios[i]))
        c.kv_source_layer_ids.push_back(i);
  }
  if (t.has("index_source_layer_ids")) c.index_source_layer_ids = t.get_int_list("index_source_layer_ids");
  else if (c.kv_source_layer_ids == std::vector<int64_t>{2, 8, 14, 20}) c.index_source_layer_ids = {2, 8, 14, 20, 24, 28, 32, 36};
  else c.index_source_layer_ids = c.kv_source_layer_ids;
  c.candidate_source_layer_id = t.has("candidate_source_layer_id") ? t.get_int("candidate_source_layer_id")
                              : c.kv_source_layer_ids.empty() ? -1 : c.kv_source_layer_ids.back();
  c.candidate_topk_blocks = t.get_int("candidate_topk_blocks", 2048);
  c.candidate_block_size = t.get_int("candidate_block_size", 8);
  if (c.dspark.target_layer_ids.empty() && !t.has("dspark_target_layer_ids")) {
    for (int64_t i = 0; i < n; ++i)
      if (std::find(c.kv_source_layer_ids.begin(), c.kv_source_layer_ids.end(), i) == c.kv_source_layer_ids.end())
        c.dspark.target_layer_ids.push_back(i);
    if (c.dspark.target_layer_ids.size() > 3)
      c.dspark.target_layer_ids.erase(c.dspark.target_layer_ids.begin(), c.dspark.target_layer_ids.end() - 3);
  }
}

// The flat config carries the derived `layer_types`; it must say what the source lists say.
void check_layer_types(const Fields& t, const DeepseekV41Config& c) {
  if (!t.has("layer_types")) return;
  const json& lt = t.raw("layer_types");
  if (!lt.is_array() || int64_t(lt.size()) != c.num_layers)
    t.fail("layer_types", detail::str_cat("expected a list of num_hidden_layers=", c.num_layers, " strings"));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool kv = std::find(c.kv_source_layer_ids.begin(), c.kv_source_layer_ids.end(), i) != c.kv_source_layer_ids.end();
    const std::string want = kv ? "shared_compressed_attention" : "sliding_attention";
    if (!lt[size_t(i)].is_string() || lt[size_t(i)].get<std::string>() != want)
      t.fail(detail::str_cat("layer_types[", i, "]"), "expected '" + want + "' (from kv_source_layer_ids), got " +
                                                          json_snippet(lt[size_t(i)]));
  }
}

void parse_text(const Fields& t, DeepseekV41Config& c) {
  parse_attention(t, c);
  parse_moe_hc(t, c);
  parse_engram_dspark(t, c);
  if (c.num_layers <= 0 || c.num_layers > kMaxLayers)
    t.fail("num_hidden_layers", detail::str_cat("must be in [1, ", kMaxLayers, "], got ", c.num_layers));
  if (c.dspark.num_stages < 0 || c.dspark.num_stages > kMaxStages)
    t.fail("num_nextn_predict_layers", detail::str_cat("must be in [0, ", kMaxStages, "], got ", c.dspark.num_stages));
  parse_schedule(t, c);
  check_layer_types(t, c);
  c.bos_token_id = t.get_int("bos_token_id", c.bos_token_id);
  if (t.has("eos_token_id") && t.raw("eos_token_id").is_array()) {
    const json& e = t.raw("eos_token_id");
    if (e.empty()) t.fail("eos_token_id", "empty list");
    c.eos_token_id = t.as_int(e[0], "eos_token_id[0]");
  } else {
    c.eos_token_id = t.get_int("eos_token_id", c.eos_token_id);
  }
  c.pad_token_id = t.get_int("pad_token_id", c.pad_token_id);
}

void parse_quantization(const Fields& f, const json& q, DeepseekV41Config& c) {
  Fields qf(q, f.origin(), f.key("quantization_config."));
  const std::string method = qf.get_string("quant_method", "");
  if (method != "fp8") qf.fail("quant_method", "unsupported '" + method + "' (supported: fp8)");
  if (qf.get_string("fmt", "e4m3") != "e4m3") qf.fail("fmt", "only e4m3 FP8 weights are implemented");
  if (qf.get_string("activation_scheme", "dynamic") != "dynamic") qf.fail("activation_scheme", "only dynamic is implemented");
  const std::string sf = qf.get_string("scale_fmt", "ue8m0");
  if (sf != "ue8m0") qf.fail("scale_fmt", "'" + sf + "' is not implemented (ue8m0)");
  if (qf.has("weight_block_size")) {
    const std::vector<int64_t> b = qf.get_int_list("weight_block_size");
    if (b.size() != 2 || b[0] != b[1] || b[0] < 1 || b[0] > kMaxBlock)
      qf.fail("weight_block_size", detail::str_cat("expected [b, b] with b in [1, ", kMaxBlock, "]"));
    c.fp8_block_out = b[0];
    c.fp8_block_in = b[1];
  }
  c.dense_format = WeightFormat::kFP8Block;
  const std::string ed = qf.get_string("expert_dtype", "fp4");
  if (ed == "fp4") c.expert_format = WeightFormat::kFP4;
  else if (ed == "fp8") c.expert_format = WeightFormat::kFP8Block;
  else if (ed == "bf16") c.expert_format = WeightFormat::kBF16;
  else qf.fail("expert_dtype", "unsupported '" + ed + "' (supported: fp4, fp8, bf16)");
  qf.refuse_unread({});
}

void parse_vision(const Fields& f, const json& v, DeepseekV41Config& c) {
  Fields vf(v, f.origin(), f.key("vision_config."));
  VisionConfig& o = c.vision;
  o.present = true;
  const std::string mt = vf.get_string("model_type", "deepseek_v41_vision");
  if (mt != "deepseek_v41_vision") vf.fail("model_type", "expected deepseek_v41_vision, got '" + mt + "'");
  o.hidden_size = vf.get_int("hidden_size", 1024);
  o.intermediate_size = vf.get_int("intermediate_size", 2816);
  o.num_layers = vf.get_int("num_hidden_layers", 32);
  o.num_heads = vf.get_int("num_attention_heads", 16);
  o.patch_size = vf.get_int("patch_size", 14);
  o.downsample_ratio = vf.get_int("downsample_ratio", 3);
  o.rope_theta = vf.get_double("rope_theta", 10000.0);
  o.max_image_tokens = vf.get_int("max_image_tokens", 1024);
  o.min_pixels = vf.get_int("min_pixels", 295936);
  if (vf.has("max_wh_ratio")) vf.get_int("max_wh_ratio");
  for (auto [k, x] : {std::pair<const char*, int64_t>{"hidden_size", o.hidden_size}, {"intermediate_size", o.intermediate_size},
                      {"num_hidden_layers", o.num_layers}, {"num_attention_heads", o.num_heads},
                      {"patch_size", o.patch_size}, {"downsample_ratio", o.downsample_ratio},
                      {"max_image_tokens", o.max_image_tokens}, {"min_pixels", o.min_pixels}})
    if (x <= 0 || x > kMaxDim) vf.fail(k, detail::str_cat("must be in [1, ", kMaxDim, "], got ", x));
  vf.refuse_unread({DI_V41_HF_META, "architectures"});
}

void check_architecture(const Fields& f) {
  if (!f.has("architectures")) return;
  const json& a = f.raw("architectures");
  if (!a.is_array()) f.fail("architectures", "expected a list of strings");
  for (const json& s : a)
    if (s.is_string() && s.get<std::string>() == kArchitecture) return;
  f.fail("architectures", "unknown architecture " + json_snippet(a) + "; supported: " + kArchitecture);
}
}  // namespace

namespace config_detail {
void validate(const Fields& t, DeepseekV41Config& c);  // validate.cpp: ranges, then the role layout
}

DeepseekV41Config DeepseekV41Config::from_json_string(const std::string& text, const std::string& origin) {
  const json j = parse_json_or_throw<ConfigError>(text, origin);
  if (!j.is_object()) DI_THROW(ConfigError, origin, ": top level is not a JSON object");
  Fields top(j, origin, "");
  DeepseekV41Config c;
  c.origin = origin;
  check_architecture(top);
  const std::string mt = top.get_string("model_type", "");
  if (top.has("text_config")) {  // release: composite
    if (mt != "deepseek_v41") top.fail("model_type", "a config with text_config must be deepseek_v41, got '" + mt + "'");
    c.layout = ConfigLayout::kRelease;
    c.bos_token_id = top.get_int("bos_token_id", 0);
    c.eos_token_id = top.get_int("eos_token_id", 1);
    c.pad_token_id = top.get_int("pad_token_id", 2);
    c.image_token_id = top.get_int("image_token_id", 129264);
    c.tie_word_embeddings = top.get_bool("tie_word_embeddings", false);  // text_config's value wins
    const json& tj = top.get_object("text_config");
    Fields t(tj, origin, "text_config.");
    const std::string tmt = t.get_string("model_type", "deepseek_v41_text");
    if (tmt != "deepseek_v41_text") t.fail("model_type", "expected deepseek_v41_text, got '" + tmt + "'");
    check_architecture(t);
    parse_text(t, c);
    for (const Fields* q : {&top, &t})
      if (q->has("quantization_config")) parse_quantization(*q, q->get_object("quantization_config"), c);
    if (top.has("vision_config")) parse_vision(top, top.get_object("vision_config"), c);
    config_detail::validate(t, c);
    t.refuse_unread({DI_V41_HF_META});
    top.refuse_unread({DI_V41_HF_META});
  } else {  // transformers' save_pretrained: flat
    if (mt != "deepseek_v41_text")
      top.fail("model_type", "expected deepseek_v41 (with text_config) or deepseek_v41_text, got '" + mt + "'");
    c.layout = ConfigLayout::kTransformers;
    c.eos_token_id = 1;  // transformers' text-config default; bos/pad have none
    parse_text(top, c);
    if (top.has("quantization_config")) parse_quantization(top, top.get_object("quantization_config"), c);
    config_detail::validate(top, c);
    top.refuse_unread({DI_V41_HF_META});
  }
  return c;
}

DeepseekV41Config DeepseekV41Config::from_file(const std::string& path) {
  std::string p = path;
  if (std::filesystem::is_directory(p)) p = (std::filesystem::path(p) / "config.json").string();
  return from_json_string(read_regular_file_or_throw<ConfigError>(p), p);
}

}  // namespace deepinfer::model::v41
