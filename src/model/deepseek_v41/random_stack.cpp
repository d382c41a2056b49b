#include "model/deepseek_v41/random_stack.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "deepinfer/error.h"
#include "model/deepseek_v4/fast_fill.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/engram.h"
#include "model/deepseek_v41/plan.h"
#include "model/deepseek_v41/tensors.h"

namespace deepinfer::model::v41 {
namespace fs = std::filesystem;
using nlohmann::json;
namespace fast = v4::fast;

namespace {
// The release's roles (MODEL-DEEPSEEK-V41.md §1, §2.1).
constexpr int64_t kReleaseLayers = 40;
int64_t release_ratio(int64_t l) { return l < 2 ? 0 : l < 20 ? 2 : 1; }
const std::vector<int64_t> kKvSources = {2, 8, 14, 20};
const std::vector<int64_t> kIndexSources = {2, 8, 14, 20, 24, 28, 32, 36};
constexpr int64_t kCandidateSource = 20;
const std::vector<int64_t> kEngramLayers = {1, 14};
constexpr int64_t kEngramVocab = 16000000, kEngramNgram = 4;

bool has(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

void check_layers(const std::vector<int64_t>& L) {
  if (L.empty()) DI_THROW(InvalidArgument, "v41 stack: no layers chosen");
  for (size_t i = 0; i < L.size(); ++i) {
    if (L[i] < 0 || L[i] >= kReleaseLayers)
      DI_THROW(InvalidArgument, "v41 stack: release layer ", L[i], " outside [0, ", kReleaseLayers, ")");
    if (i && L[i] <= L[i - 1]) DI_THROW(InvalidArgument, "v41 stack: release layers must be strictly ascending");
  }
  for (int64_t l : L) {
    if (release_ratio(l) == 0 || has(kKvSources, l)) continue;
    int64_t src = -1;  // the closest KV source at or below
    for (int64_t s : kKvSources)
      if (s <= l) src = s;
    if (!has(L, src))
      DI_THROW(InvalidArgument, "v41 stack: release layer ", l, " reads the compressed KV of layer ", src,
               ", which is not in the stack; add it");
  }
}

struct Moments {
  float mean, sd;
};

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// mHC, sinks and router biases: f32 in the release; the other float parameters (norms, Engram
// q/k weights) bf16.
bool release_f32(const std::string& n) {
  for (const char* suf : {"_fn", "_base", "_scale", "attn_sink", "bias", "bias_vl"})
    if (ends_with(n, suf)) return true;
  return false;
}

// V4's scales (random_checkpoint.h) by the tensor's role.
Moments moments(const V41Entry& e, const V41Part& p) {
  const std::string& n = p.name;
  const double fan_in = p.shape.size() == 2 ? double(p.shape[1]) : 1.0;
  switch (e.store) {
    case V41Store::kExpert: return {0, 0.06f};
    case V41Store::kEmbed: return {0, 1};
    case V41Store::kEngramTable: return {0, 0.5f};
    case V41Store::kHead: case V41Store::kDense: case V41Store::kPlain: return {0, float(1 / std::sqrt(fan_in))};
    case V41Store::kFloat: break;
  }
  if (ends_with(n, "_fn")) return {0, 0.05f};
  if (ends_with(n, "_base")) return {0, 0.5f};
  if (ends_with(n, "_scale")) return {1, 0.3f};
  if (ends_with(n, "attn_sink")) return {0, 1};
  if (ends_with(n, "bias") || ends_with(n, "bias_vl")) return {0, 0.05f};  // router biases
  return {1, 0.1f};  // norms, Engram q/k weights
}

std::string scale_name(const std::string& w) {
  return (ends_with(w, ".weight") ? w.substr(0, w.size() - 7) : w) + ".scale";
}

std::vector<fast::Item> plan_items(const DeepseekV41Config& c, const V41TensorTable& t, uint64_t seed) {
  std::vector<fast::Item> items;
  for (const V41Entry& e : t.entries)
    for (const V41Part& p : e.parts) {
      fast::Item it;
      const int64_t R = p.shape[0], C = p.shape.size() > 1 ? p.shape[1] : 1;
      const uint64_t n = uint64_t(R) * uint64_t(C);
      const Moments m = moments(e, p);
      const uint64_t key = fast::name_key(seed, p.name);
      const std::string nm = p.name;
      switch (e.store) {
        case V41Store::kDense: {
          const int64_t b = c.fp8_block_out, sr = (R + b - 1) / b, sc = (C + b - 1) / b;
          it.add(nm, "F8_E4M3", p.shape, n);
          it.add(scale_name(nm), "F8_E8M0", {sr, sc}, uint64_t(sr * sc));
          it.fill = [=](uint8_t* d) { fast::fill_fp8(d, d + n, R, C, b, b, key, m.mean, m.sd); };
          break;
        }
        case V41Store::kEngramTable: {
          it.add(nm, "F8_E4M3", p.shape, n);
          it.add(scale_name(nm), "F8_E8M0", {R, C / 32}, uint64_t(R * (C / 32)));
          it.fill = [=](uint8_t* d) { fast::fill_fp8(d, d + n, R, C, 1, 32, key, m.mean, m.sd); };
          break;
        }
        case V41Store::kExpert: {
          const int64_t b = c.fp4_block;
          if (C % b != 0) DI_THROW(InvalidArgument, nm, ": fp4 needs in-width % ", b, " == 0, got ", C);
          it.add(nm, "I8", {R, C / 2}, n / 2);
          it.add(scale_name(nm), "F8_E8M0", {R, C / b}, n / uint64_t(b));
          it.fill = [=](uint8_t* d) { fast::fill_fp4(d, d + n / 2, R, C, b, key, m.mean, m.sd); };
          break;
        }
        default: {
          const bool f32 = e.store == V41Store::kFloat && release_f32(nm);
          it.add(nm, f32 ? "F32" : "BF16", p.shape, n * (f32 ? 4 : 2));
          it.fill = [=](uint8_t* d) { fast::fill_float(d, int64_t(n), f32, key, m.mean, m.sd); };
        }
      }
      items.push_back(std::move(it));
    }
  return items;
}
}  // namespace

std::vector<int64_t> v41_default_stack_layers(int64_t n) {
  if (n < 1 || n > kReleaseLayers)
    DI_THROW(InvalidArgument, "v41 stack: layers must be in [1, ", kReleaseLayers, "], got ", n);
  const std::vector<int64_t> roles = {0, 1, 2, 3, 20, 24, 21};
  std::set<int64_t> pick;
  for (int64_t l : roles)
    if (int64_t(pick.size()) < n) pick.insert(l);
  for (int64_t l = 0; int64_t(pick.size()) < n; ++l) pick.insert(l);
  std::vector<int64_t> out(pick.begin(), pick.end());
  // Small n may have picked a reuse or reindex layer without its source: drop to a valid prefix.
  if (n < 5) {
    out.clear();
    for (int64_t l = 0; l < n; ++l) out.push_back(l);
  }
  return out;
}

std::string v41_stack_config_json(const V41StackOptions& o) {
  const std::vector<int64_t>& L = o.release_layers;
  check_layers(L);
  if (o.engram_rows < 1) DI_THROW(InvalidArgument, "v41 stack: engram_rows must be >= 1, got ", o.engram_rows);
  auto renumber = [&](const std::vector<int64_t>& ids) {
    std::vector<int64_t> out;
    for (size_t i = 0; i < L.size(); ++i)
      if (has(ids, L[i])) out.push_back(int64_t(i));
    return out;
  };
  std::vector<int64_t> ratios;
  for (int64_t l : L) ratios.push_back(release_ratio(l));
  const bool s = o.small;
  // A table's rows are the sum of its layer's bucket primes, the first primes above
  // engram_vocab_size (engram_primes): shrinking that bound shrinks the table.
  EngramConfig e;
  e.layer_ids = renumber(kEngramLayers);
  e.max_ngram_size = kEngramNgram;
  e.n_heads = s ? 4 : 8;
  const int64_t buckets = (kEngramNgram - 1) * e.n_heads;
  e.vocab_size = std::clamp<int64_t>(o.engram_rows / buckets, 1, kEngramVocab);
  std::vector<int64_t> engram_rows;
  for (const auto& primes : engram_primes(e)) {
    int64_t rows = 0;
    for (int64_t p : primes) rows += p;
    engram_rows.push_back(rows);
  }
  int64_t cand = -1;
  for (size_t i = 0; i < L.size(); ++i)
    if (L[i] == kCandidateSource) cand = int64_t(i);

  json t = {
      {"model_type", "deepseek_v41_text"},
      {"architectures", {"DeepseekV41ForCausalLM"}},
      {"vocab_size", 129280},
      {"hidden_size", s ? 256 : 5120},
      {"num_hidden_layers", int64_t(L.size())},
      {"num_attention_heads", s ? 8 : 64},
      {"num_key_value_heads", 1},
      {"head_dim", s ? 128 : 512},
      {"qk_rope_head_dim", 64},
      {"q_lora_rank", s ? 128 : 1280},
      {"o_groups", s ? 2 : 8},
      {"o_lora_rank", s ? 128 : 1024},
      {"sliding_window", 128},
      {"kv_source_layer_ids", renumber(kKvSources)},
      {"index_source_layer_ids", renumber(kIndexSources)},
      {"candidate_source_layer_id", cand},
      {"candidate_topk_blocks", 2048},
      {"candidate_block_size", 8},
      {"index_n_heads", s ? 8 : 32},
      {"index_head_dim", s ? 64 : 128},
      {"index_topk", 512},
      {"rope_theta", 10000.0},
      {"compress_rope_theta", 160000.0},
      {"rope_scaling",
       {{"rope_type", "yarn"}, {"factor", 16.0}, {"original_max_position_embeddings", 65536}, {"beta_fast", 32.0},
        {"beta_slow", 1.0}}},
      {"max_position_embeddings", 1048576},
      {"n_routed_experts", s ? 16 : 384},
      {"num_experts_per_tok", 6},
      {"n_shared_experts", 1},
      {"moe_intermediate_size", s ? 128 : 2304},
      {"scoring_func", "sqrtsoftplus"},
      {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", 1.5},
      {"gate_temp", 1.0},
      {"swiglu_limit", 10.0},
      {"hc_mult", 4},
      {"hc_sinkhorn_iters", 20},
      {"hc_eps", 1e-6},
      {"rms_norm_eps", 1e-20},
      {"engram_layer_ids", e.layer_ids},
      {"engram_num_embeddings", engram_rows},
      {"engram_max_ngram_size", e.max_ngram_size},
      {"engram_n_heads", e.n_heads},
      {"engram_head_dim", s ? 64 : 256},
      {"engram_vocab_size", e.vocab_size},
      {"engram_pad_token_id", 2},
      {"engram_compressed_vocab_size", 99092},
      {"num_nextn_predict_layers", 0},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"compress_ratios", ratios},
  };
  json top = {
      {"architectures", {"DeepseekV41ForCausalLM"}},
      {"model_type", "deepseek_v41"},
      {"text_config", t},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"pad_token_id", 2},
      {"image_token_id", 129264},
      {"dtype", "bfloat16"},
      {"tie_word_embeddings", false},
      {"quantization_config",
       {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"weight_block_size", {32, 32}},
        {"scale_fmt", "ue8m0"}, {"expert_dtype", "fp4"}}},
  };
  return top.dump(2) + "\n";
}

uint64_t write_v41_stack(const std::string& dir, const V41StackOptions& o) {
  const std::string text = v41_stack_config_json(o);
  const DeepseekV41Config c = DeepseekV41Config::from_json_string(text, dir + "/config.json");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) DI_THROW(CheckpointError, dir, ": cannot create folder: ", ec.message());
  {
    std::ofstream cf(fs::path(dir) / "config.json");
    cf << text;
    if (!cf) DI_THROW(CheckpointError, dir, "/config.json: write failed");
  }
  // The Engram sidecar (engram.h): the class map t mod C (numbered by first appearance, as the
  // format requires) and one odd multiplier per n-gram order below the int64 bound of engram.cpp.
  {
    const EngramConfig& e = c.engram;
    const int64_t C = e.compressed_vocab_size, V = c.vocab_size;
    json classes = json::array();
    for (int64_t i = 0; i < V; ++i) classes.push_back(i % C);
    const uint64_t bound = std::max<uint64_t>(1, (uint64_t(INT64_MAX) / uint64_t(C)) / 2);
    json mult = json::array();
    for (int64_t l : e.layer_ids) {
      json v = json::array();
      for (int64_t k = 0; k < e.max_ngram_size; ++k)
        v.push_back(int64_t(fast::mix64(o.seed ^ uint64_t(10007 * l + k)) % bound) * 2 + 1);
      mult.push_back({{"layer", l}, {"values", v}});
    }
    const json side = {{"format", "deepinfer.engram_sidecar"}, {"version", 1},
                       {"source", "synthetic: class(t) = t mod " + std::to_string(C) + " (random V4.1 stack)"},
                       {"tokenizer_sha256", nullptr}, {"num_ids", V}, {"num_classes", std::min(C, V)},
                       {"classes", classes}, {"max_ngram_size", e.max_ngram_size}, {"multipliers", mult}};
    std::ofstream sf(fs::path(dir) / "engram_sidecar.json");
    sf << side.dump() << "\n";
    if (!sf) DI_THROW(CheckpointError, dir, "/engram_sidecar.json: write failed");
  }
  const V41TensorTable table = v41_tensor_table(c, v41_plan(c, {}));
  std::vector<fast::Item> items = plan_items(c, table, o.seed);
  uint64_t bytes = 0;
  for (const auto& it : items) bytes += it.nbytes;
  const int shards = o.num_shards > 0 ? o.num_shards : int(c.num_layers) + 1;
  fast::write_streamed(dir, items, shards, o.progress);
  return bytes;
}

}  // namespace deepinfer::model::v41
