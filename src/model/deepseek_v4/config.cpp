// config.json -> DeepseekV4Config for both layouts (MODEL-DEEPSEEK-V4.md §1).
// Official release: compress_ratios / num_hash_layers / qk_rope_head_dim / rope_scaling /
// quantization_config / expert_dtype. transformers 5.17: layer_types / mlp_layer_types /
// compress_rates / partial_rotary_factor / rope_parameters {main, compress}.
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "core/file.h"
#include "core/json.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer::model::v4 {
using json = nlohmann::json;

namespace {
constexpr const char* kArchitecture = "DeepseekV4ForCausalLM";
// Upper bounds that no real checkpoint comes near (V4-Pro: vocab 129,280, hidden 7,168, 61
// layers, 20 Sinkhorn iterations); they keep products of two dims inside int64 and stop a
// hostile config from spinning (hc_sinkhorn_iters: 1e12) or allocating without end.
constexpr int64_t kMaxDim = int64_t(1) << 24;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxMtpLayers = 64;
constexpr int64_t kMaxSinkhornIters = 10000;
constexpr int64_t kMaxFp8Block = 4096;

// Typed field access that names the file and field in every error.
class Fields {
 public:
  Fields(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}
  const std::string& origin() const { return origin_; }
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const json& at(const char* k) const {
    if (!j_.contains(k)) DI_THROW(ConfigError, origin_, ": missing required field '", k, "'");
    return j_[k];
  }

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    DI_THROW(ConfigError, origin_, ": field '", field, "': ", why);
  }
  int64_t get_int(const char* k) const {
    if (!has(k)) DI_THROW(ConfigError, origin_, ": missing required field '", k, "'");
    return as_int(j_[k], k);
  }
  int64_t get_int(const char* k, int64_t dflt) const { return has(k) ? as_int(j_[k], k) : dflt; }
  double get_double(const char* k, double dflt) const { return has(k) ? as_double(j_[k], k) : dflt; }
  bool get_bool(const char* k, bool dflt) const {
    if (!has(k)) return dflt;
    if (!j_[k].is_boolean()) fail(k, "expected a boolean, got " + json_snippet(j_[k]));
    return j_[k].get<bool>();
  }
  std::string get_string(const char* k, const std::string& dflt) const {
    if (!has(k)) return dflt;
    if (!j_[k].is_string()) fail(k, "expected a string, got " + json_snippet(j_[k]));
    return j_[k].get<std::string>();
  }
  // Integers in int64 range only: an unsigned past 2^63 would wrap, and a float past 2^63
  // cannot be converted at all.
  int64_t as_int(const json& v, const std::string& name) const {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      fail(name, "integer " + json_snippet(v) + " is out of range");
    if (v.is_number_integer()) return v.get<int64_t>();
    // JSON writers sometimes emit 4.0 for integers; accept exact integral floats only.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.2e18) return int64_t(d);
    }
    fail(name, "expected an integer, got " + json_snippet(v));
  }
  double as_double(const json& v, const std::string& name) const {
    if (!v.is_number()) fail(name, "expected a number, got " + json_snippet(v));
    const double d = v.get<double>();
    if (!std::isfinite(d)) fail(name, "expected a finite number, got " + json_snippet(v));
    return d;
  }
  const json& get_object(const char* k) const {
    if (!at(k).is_object()) fail(k, "expected an object, got " + json_snippet(j_[k]));
    return j_[k];
  }
  const json& get_array(const char* k) const {
    if (!at(k).is_array()) fail(k, "expected an array, got " + json_snippet(j_[k]));
    return j_[k];
  }

 private:
  const json& j_;
  std::string origin_;
};

void check_architecture(const Fields& f, DeepseekV4Config& c) {
  if (f.has("architectures")) {
    const json& a = f.get_array("architectures");
    if (a.empty() || !a[0].is_string()) f.fail("architectures", "expected a non-empty list of strings");
    for (const json& s : a)
      if (s.is_string() && s.get<std::string>() == kArchitecture) c.architecture = kArchitecture;
    if (c.architecture.empty())
      DI_THROW(ConfigError, f.origin(), ": unknown architecture ", a[0].get<std::string>(), "; supported: ",
               kArchitecture);
  } else if (f.get_string("model_type", "") == "deepseek_v4") {
    c.architecture = kArchitecture;  // some exports omit `architectures`
  } else {
    DI_THROW(ConfigError, f.origin(), ": missing field 'architectures' (and model_type is not deepseek_v4); supported: ",
             kArchitecture);
  }
}

void parse_common(const Fields& f, DeepseekV4Config& c) {
  c.vocab_size = f.get_int("vocab_size");
  c.hidden_size = f.get_int("hidden_size");
  c.num_layers = f.get_int("num_hidden_layers");
  c.num_heads = f.get_int("num_attention_heads");
  c.num_kv_heads = f.get_int("num_key_value_heads", 1);
  c.head_dim = f.get_int("head_dim");
  c.q_lora_rank = f.get_int("q_lora_rank");
  c.o_groups = f.get_int("o_groups");
  c.o_lora_rank = f.get_int("o_lora_rank");
  // The reference's inference/config.json says window_size; HF and the release say sliding_window.
  c.sliding_window = f.has("sliding_window") ? f.get_int("sliding_window") : f.get_int("window_size");
  c.n_routed_experts = f.get_int("n_routed_experts");
  c.num_experts_per_tok = f.get_int("num_experts_per_tok");
  c.n_shared_experts = f.get_int("n_shared_experts", 1);
  c.moe_intermediate_size = f.get_int("moe_intermediate_size");
  c.routed_scaling_factor = f.get_double("routed_scaling_factor", 1.0);
  c.swiglu_limit = f.get_double("swiglu_limit", 0.0);
  c.scoring_func = f.get_string("scoring_func", "sqrtsoftplus");
  c.norm_topk_prob = f.get_bool("norm_topk_prob", true);
  c.hc_mult = f.get_int("hc_mult", 4);
  c.hc_sinkhorn_iters = f.get_int("hc_sinkhorn_iters", 20);
  c.hc_eps = f.get_double("hc_eps", 1e-6);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-6);
  c.index_n_heads = f.get_int("index_n_heads", 0);
  c.index_head_dim = f.get_int("index_head_dim", 0);
  c.index_topk = f.get_int("index_topk", 0);
  c.num_mtp_layers = f.get_int("num_nextn_predict_layers", 0);
  c.bos_token_id = f.get_int("bos_token_id", 0);
  if (f.has("eos_token_id") && f.at("eos_token_id").is_array()) {
    const json& e = f.at("eos_token_id");
    if (e.empty()) f.fail("eos_token_id", "empty list");
    c.eos_token_id = f.as_int(e[0], "eos_token_id[0]");
  } else {
    c.eos_token_id = f.get_int("eos_token_id", 1);
  }
  c.max_position_embeddings = f.get_int("max_position_embeddings", 0);
  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", false);
}

void parse_yarn(const Fields& f, const json& r, const std::string& where, RopeParams& p) {
  auto num = [&](const char* k, double dflt) {
    if (!r.contains(k) || r[k].is_null()) return dflt;
    return f.as_double(r[k], where + "." + k);
  };
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (r.contains(k) && r[k].is_string()) type = r[k].get<std::string>();
  if (type == "default") return;
  if (type != "yarn") f.fail(where, "unsupported rope type '" + type + "' (supported: default, yarn)");
  p.yarn = true;
  p.factor = num("factor", 1.0);
  if (!r.contains("original_max_position_embeddings"))
    f.fail(where, "yarn needs 'original_max_position_embeddings'");
  p.original_max_position = f.as_int(r["original_max_position_embeddings"], where + ".original_max_position_embeddings");
  p.beta_fast = num("beta_fast", 32.0);
  p.beta_slow = num("beta_slow", 1.0);
  p.attention_factor = num("attention_factor", 1.0);
}

AttnKind kind_for_ratio(int64_t r) {
  // The reference builds the overlapping compressor + indexer exactly when ratio == 4.
  return r == 0 ? AttnKind::kSliding : (r == 4 ? AttnKind::kCSA : AttnKind::kHCA);
}

void parse_official(const Fields& f, DeepseekV4Config& c) {
  c.layout = CheckpointLayout::kOfficial;
  const json& ratios = f.get_array("compress_ratios");
  if (int64_t(ratios.size()) < c.num_layers)
    f.fail("compress_ratios", detail::str_cat("has ", ratios.size(), " entries, fewer than num_hidden_layers=",
                                               c.num_layers));
  std::vector<int64_t> values;
  for (size_t i = 0; i < ratios.size(); ++i) {
    int64_t r = f.as_int(ratios[i], detail::str_cat("compress_ratios[", i, "]"));
    if (r < 0 || r == 1 || r > kMaxDim)
      f.fail(detail::str_cat("compress_ratios[", i, "]"), detail::str_cat("invalid ratio ", r));
    values.push_back(r);
    if (int64_t(i) < c.num_layers) {
      c.compress_ratio.push_back(r);
      c.layer_types.push_back(kind_for_ratio(r));
    }
  }
  // Entries past num_layers belong to the MTP blocks (V4-Flash-0731 even has padding zeros).
  for (int64_t k = 0; k < c.num_mtp_layers; ++k) {
    size_t i = size_t(c.num_layers + k);
    c.mtp_compress_ratio.push_back(i < values.size() ? values[i] : 0);
  }
  const int64_t n_hash = f.get_int("num_hash_layers", 0);
  if (n_hash < 0 || n_hash > c.num_layers)
    f.fail("num_hash_layers", detail::str_cat(n_hash, " is outside [0, num_hidden_layers=", c.num_layers, "]"));
  for (int64_t l = 0; l < c.num_layers; ++l) c.mlp_types.push_back(l < n_hash ? MlpKind::kHashMoE : MlpKind::kMoE);
  c.rope_head_dim = f.get_int("qk_rope_head_dim");
  c.rope.theta = f.get_double("rope_theta", 10000.0);
  c.compress_rope.theta = f.get_double("compress_rope_theta", 160000.0);
  if (f.has("rope_scaling")) parse_yarn(f, f.get_object("rope_scaling"), "rope_scaling", c.compress_rope);

  if (f.has("quantization_config")) {
    const json& q = f.get_object("quantization_config");
    std::string method = q.contains("quant_method") && q["quant_method"].is_string()
                             ? q["quant_method"].get<std::string>() : json_snippet(q.value("quant_method", json()));
    if (method != "fp8") f.fail("quantization_config.quant_method", "unsupported '" + method + "' (supported: fp8)");
    if (q.contains("weight_block_size")) {
      const json& b = q["weight_block_size"];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || b[0] != b[1])
        f.fail("quantization_config.weight_block_size", "expected [b, b], got " + json_snippet(b));
      c.fp8_block = f.as_int(b[0], "quantization_config.weight_block_size[0]");
      // The loader divides by the block edge (scale shapes are ceil(dim / b)).
      if (c.fp8_block <= 0 || c.fp8_block > kMaxFp8Block)
        f.fail("quantization_config.weight_block_size",
               detail::str_cat("block edge must be in [1, ", kMaxFp8Block, "], got ", json_snippet(b)));
    }
    if (q.contains("scale_fmt") && q["scale_fmt"].is_string()) c.scale_fmt = q["scale_fmt"].get<std::string>();
    c.dense_format = WeightFormat::kFP8Block;
  }
  std::string ed = f.get_string("expert_dtype", "");
  if (ed.empty()) c.expert_format = c.dense_format;
  else if (ed == "fp4") c.expert_format = WeightFormat::kFP4;
  else if (ed == "fp8") c.expert_format = WeightFormat::kFP8Block;
  else if (ed == "bf16") c.expert_format = WeightFormat::kBF16;
  else f.fail("expert_dtype", "unsupported '" + ed + "' (supported: fp4, fp8, bf16)");
}

void parse_transformers(const Fields& f, DeepseekV4Config& c) {
  c.layout = CheckpointLayout::kTransformers;
  int64_t rate_csa = 4, rate_hca = 128;
  if (f.has("compress_rates")) {
    const json& r = f.get_object("compress_rates");
    if (r.contains("compressed_sparse_attention"))
      rate_csa = f.as_int(r["compressed_sparse_attention"], "compress_rates.compressed_sparse_attention");
    if (r.contains("heavily_compressed_attention"))
      rate_hca = f.as_int(r["heavily_compressed_attention"], "compress_rates.heavily_compressed_attention");
  }
  rate_csa = f.get_int("compress_rate_csa", rate_csa);  // legacy top-level overrides
  rate_hca = f.get_int("compress_rate_hca", rate_hca);
  if (rate_csa < 2) f.fail("compress_rates.compressed_sparse_attention", detail::str_cat("must be >= 2, got ", rate_csa));
  if (rate_hca < 2) f.fail("compress_rates.heavily_compressed_attention", detail::str_cat("must be >= 2, got ", rate_hca));

  const json& lt = f.get_array("layer_types");
  if (int64_t(lt.size()) != c.num_layers)
    f.fail("layer_types", detail::str_cat("has ", lt.size(), " entries but num_hidden_layers is ", c.num_layers));
  for (size_t i = 0; i < lt.size(); ++i) {
    std::string s = lt[i].is_string() ? lt[i].get<std::string>() : json_snippet(lt[i]);
    if (s == "sliding_attention") c.layer_types.push_back(AttnKind::kSliding), c.compress_ratio.push_back(0);
    else if (s == "compressed_sparse_attention") c.layer_types.push_back(AttnKind::kCSA), c.compress_ratio.push_back(rate_csa);
    else if (s == "heavily_compressed_attention") c.layer_types.push_back(AttnKind::kHCA), c.compress_ratio.push_back(rate_hca);
    else f.fail(detail::str_cat("layer_types[", i, "]"), "unknown layer type " + s +
                "; expected sliding_attention, compressed_sparse_attention or heavily_compressed_attention");
  }
  if (f.has("mlp_layer_types")) {
    const json& mt = f.get_array("mlp_layer_types");
    if (int64_t(mt.size()) != c.num_layers)
      f.fail("mlp_layer_types", detail::str_cat("has ", mt.size(), " entries but num_hidden_layers is ", c.num_layers));
    for (size_t i = 0; i < mt.size(); ++i) {
      std::string s = mt[i].is_string() ? mt[i].get<std::string>() : json_snippet(mt[i]);
      if (s == "hash_moe") c.mlp_types.push_back(MlpKind::kHashMoE);
      else if (s == "moe") c.mlp_types.push_back(MlpKind::kMoE);
      else f.fail(detail::str_cat("mlp_layer_types[", i, "]"), "unknown MLP type " + s + "; expected hash_moe or moe");
    }
  } else {
    const int64_t n_hash = f.get_int("num_hash_layers", 3);  // HF default
    for (int64_t l = 0; l < c.num_layers; ++l) c.mlp_types.push_back(l < n_hash ? MlpKind::kHashMoE : MlpKind::kMoE);
  }
  // HF saves both partial_rotary_factor and the derived qk_rope_head_dim; they must agree.
  if (f.has("partial_rotary_factor")) {
    double prf = f.get_double("partial_rotary_factor", 0.125);
    if (!(prf > 0 && prf <= 1)) f.fail("partial_rotary_factor", detail::str_cat("must be in (0, 1], got ", prf));
    c.rope_head_dim = int64_t(double(c.head_dim) * prf);
    if (f.has("qk_rope_head_dim") && f.get_int("qk_rope_head_dim") != c.rope_head_dim)
      f.fail("qk_rope_head_dim", detail::str_cat(f.get_int("qk_rope_head_dim"), " disagrees with head_dim*partial_rotary_factor = ",
                                                  c.rope_head_dim));
  } else {
    c.rope_head_dim = f.has("qk_rope_head_dim") ? f.get_int("qk_rope_head_dim") : c.head_dim / 8;
  }
  c.rope.theta = f.get_double("rope_theta", 10000.0);
  c.compress_rope.theta = f.get_double("compress_rope_theta", 160000.0);
  if (f.has("rope_parameters")) {
    const json& rp = f.get_object("rope_parameters");
    if (rp.contains("main") && rp.contains("compress")) {  // what HF writes after __post_init__
      for (const char* k : {"main", "compress"})
        if (!rp[k].is_object()) f.fail(std::string("rope_parameters.") + k, "expected an object");
      if (rp["main"].contains("rope_theta")) c.rope.theta = f.as_double(rp["main"]["rope_theta"], "rope_parameters.main.rope_theta");
      parse_yarn(f, rp["main"], "rope_parameters.main", c.rope);
      if (rp["compress"].contains("rope_theta"))
        c.compress_rope.theta = f.as_double(rp["compress"]["rope_theta"], "rope_parameters.compress.rope_theta");
      parse_yarn(f, rp["compress"], "rope_parameters.compress", c.compress_rope);
    } else {  // flat: the YaRN block applies to the compressed layers only
      parse_yarn(f, rp, "rope_parameters", c.compress_rope);
    }
  }
  c.mtp_compress_ratio.assign(size_t(std::max<int64_t>(c.num_mtp_layers, 0)), 0);
}

void validate(const Fields& f, const DeepseekV4Config& c) {
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) f.fail(name, detail::str_cat("must be > 0, got ", v));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_layers);
  positive("num_attention_heads", c.num_heads);
  positive("head_dim", c.head_dim);
  positive("q_lora_rank", c.q_lora_rank);
  positive("o_groups", c.o_groups);
  positive("o_lora_rank", c.o_lora_rank);
  positive("sliding_window", c.sliding_window);
  positive("n_routed_experts", c.n_routed_experts);
  positive("num_experts_per_tok", c.num_experts_per_tok);
  positive("moe_intermediate_size", c.moe_intermediate_size);
  positive("hc_mult", c.hc_mult);
  positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  auto at_most = [&](const char* name, int64_t v, int64_t hi) {
    if (v > hi) f.fail(name, detail::str_cat("must be <= ", hi, ", got ", v));
  };
  for (auto [name, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"num_attention_heads", c.num_heads}, {"head_dim", c.head_dim}, {"q_lora_rank", c.q_lora_rank},
                         {"o_groups", c.o_groups}, {"o_lora_rank", c.o_lora_rank}, {"sliding_window", c.sliding_window},
                         {"n_routed_experts", c.n_routed_experts}, {"moe_intermediate_size", c.moe_intermediate_size},
                         {"hc_mult", c.hc_mult}, {"index_n_heads", c.index_n_heads},
                         {"index_head_dim", c.index_head_dim}, {"index_topk", c.index_topk}})
    at_most(name, v, kMaxDim);
  at_most("num_hidden_layers", c.num_layers, kMaxLayers);
  at_most("num_nextn_predict_layers", c.num_mtp_layers, kMaxMtpLayers);
  at_most("hc_sinkhorn_iters", c.hc_sinkhorn_iters, kMaxSinkhornIters);
  if (c.max_position_embeddings < 0) f.fail("max_position_embeddings", "must be >= 0");
  // Epsilons and rope bases enter divisions, logs and powers: <= 0 made every logit NaN.
  auto positive_real = [&](const char* name, double v) {
    if (!(v > 0)) f.fail(name, detail::str_cat("must be > 0, got ", v));
  };
  positive_real("rms_norm_eps", c.rms_norm_eps);
  positive_real("hc_eps", c.hc_eps);
  positive_real("rope_theta", c.rope.theta);
  positive_real("compress_rope_theta", c.compress_rope.theta);
  positive_real("routed_scaling_factor", c.routed_scaling_factor);
  if (c.swiglu_limit < 0) f.fail("swiglu_limit", detail::str_cat("must be >= 0 (0 = no clamp), got ", c.swiglu_limit));
  for (auto [name, id] : {std::pair<const char*, int64_t>{"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_id}})
    if (id < 0 || id >= c.vocab_size)
      f.fail(name, detail::str_cat(id, " is not a token id in [0, vocab_size=", c.vocab_size, ")"));
  if (c.num_kv_heads != 1)
    f.fail("num_key_value_heads", detail::str_cat("must be 1 (one shared K=V head), got ", c.num_kv_heads));
  if (c.num_heads % c.o_groups != 0)
    f.fail("o_groups", detail::str_cat("num_attention_heads=", c.num_heads, " is not divisible by o_groups=", c.o_groups));
  if (c.rope_head_dim <= 0 || c.rope_head_dim % 2 != 0 || c.rope_head_dim > c.head_dim)
    f.fail("qk_rope_head_dim", detail::str_cat("rope dims must be even and in (0, head_dim=", c.head_dim, "], got ",
                                               c.rope_head_dim));
  if (c.num_experts_per_tok > c.n_routed_experts)
    f.fail("num_experts_per_tok", detail::str_cat(c.num_experts_per_tok, " > n_routed_experts=", c.n_routed_experts));
  if (c.n_shared_experts < 0 || c.n_shared_experts > 1)
    f.fail("n_shared_experts", detail::str_cat("only 0 or 1 supported, got ", c.n_shared_experts));
  if (c.scoring_func != "sqrtsoftplus" && c.scoring_func != "softmax" && c.scoring_func != "sigmoid")
    f.fail("scoring_func", "unsupported '" + c.scoring_func + "' (supported: sqrtsoftplus, softmax, sigmoid)");
  if (c.num_mtp_layers < 0) f.fail("num_nextn_predict_layers", "must be >= 0");
  bool any_csa = false;
  for (auto k : c.layer_types) any_csa |= k == AttnKind::kCSA;
  if (any_csa) {
    positive("index_n_heads", c.index_n_heads);
    positive("index_head_dim", c.index_head_dim);
    positive("index_topk", c.index_topk);
    if (c.rope_head_dim > c.index_head_dim)
      f.fail("index_head_dim", detail::str_cat(c.index_head_dim, " is smaller than the rope dims ", c.rope_head_dim));
  }
  for (const RopeParams* r : {&c.rope, &c.compress_rope})
    if (r->yarn && (!(r->factor > 0) || r->original_max_position <= 0 || !(r->beta_fast > 0) || !(r->beta_slow > 0)))
      f.fail(r == &c.rope ? "rope_parameters.main" : "rope_scaling",
             "yarn needs factor > 0, beta_fast > 0, beta_slow > 0 and original_max_position_embeddings > 0");
}
}  // namespace

DeepseekV4Config DeepseekV4Config::from_json_string(const std::string& text, const std::string& origin) {
  const json j = parse_json_or_throw<ConfigError>(text, origin);
  if (!j.is_object()) DI_THROW(ConfigError, origin, ": top level is not a JSON object");
  Fields f(j, origin);
  DeepseekV4Config c;
  c.origin = origin;
  check_architecture(f, c);
  parse_common(f, c);
  if (c.num_layers <= 0) f.fail("num_hidden_layers", detail::str_cat("must be > 0, got ", c.num_layers));
  if (f.has("layer_types")) parse_transformers(f, c);
  else if (f.has("compress_ratios")) parse_official(f, c);
  else
    DI_THROW(ConfigError, origin, ": needs 'layer_types' (transformers layout) or 'compress_ratios' (official layout) "
                                  "to know the attention schedule");
  validate(f, c);
  return c;
}

DeepseekV4Config DeepseekV4Config::from_file(const std::string& path) {
  std::string p = path;
  if (std::filesystem::is_directory(p)) p = (std::filesystem::path(p) / "config.json").string();
  return from_json_string(read_regular_file_or_throw<ConfigError>(p), p);
}

int64_t DeepseekV4Config::num_hash_layers() const {
  int64_t n = 0;
  for (auto m : mlp_types) n += m == MlpKind::kHashMoE;
  return n;
}

std::string DeepseekV4Config::schedule_str() const {
  std::string s;
  for (size_t i = 0; i < layer_types.size(); ++i) {
    if (i) s += ' ';
    s += layer_types[i] == AttnKind::kSliding ? 'S' : layer_types[i] == AttnKind::kCSA ? 'C' : 'H';
  }
  return s;
}

std::string DeepseekV4Config::summary() const {
  auto fmt_name = [](WeightFormat w) {
    switch (w) {
      case WeightFormat::kBF16: return "bf16";
      case WeightFormat::kF32: return "f32";
      case WeightFormat::kFP8Block: return "fp8 (block scales)";
      case WeightFormat::kFP4: return "fp4 e2m1 (e8m0 scales)";
    }
    return "?";
  };
  int64_t csa_rate = 0, hca_rate = 0;
  for (size_t i = 0; i < layer_types.size(); ++i) {
    if (layer_types[i] == AttnKind::kCSA) csa_rate = compress_ratio[i];
    if (layer_types[i] == AttnKind::kHCA) hca_rate = compress_ratio[i];
  }
  std::ostringstream os;
  os << "architecture: " << architecture << " (" << (layout == CheckpointLayout::kOfficial ? "official" : "transformers")
     << " config layout)\n";
  os << "dims: vocab " << vocab_size << ", hidden " << hidden_size << ", layers " << num_layers << " (+" << num_mtp_layers
     << " MTP), heads " << num_heads << " x " << head_dim << " (rope " << rope_head_dim << "), q_lora " << q_lora_rank
     << ", o_groups " << o_groups << " x " << o_lora_rank << "\n";
  os << "attention: window " << sliding_window << ", CSA ratio " << csa_rate << ", HCA ratio " << hca_rate
     << ", indexer " << index_n_heads << " heads x " << index_head_dim << " top-" << index_topk << "\n";
  os << "rope: theta " << rope.theta << " (sliding); theta " << compress_rope.theta << " (compressed)"
     << (compress_rope.yarn ? detail::str_cat(", yarn factor ", compress_rope.factor, " orig ",
                                              compress_rope.original_max_position)
                            : std::string())
     << "\n";
  os << "moe: " << n_routed_experts << " experts top-" << num_experts_per_tok << " + " << n_shared_experts
     << " shared, width " << moe_intermediate_size << ", " << num_hash_layers() << " hash layers, scoring "
     << scoring_func << ", scale " << routed_scaling_factor << ", swiglu_limit " << swiglu_limit << "\n";
  os << "mhc: " << hc_mult << " streams, " << hc_sinkhorn_iters << " sinkhorn iters\n";
  os << "weights: dense " << fmt_name(dense_format) << ", experts " << fmt_name(expert_format) << "\n";
  return os.str();
}

}  // namespace deepinfer::model::v4
