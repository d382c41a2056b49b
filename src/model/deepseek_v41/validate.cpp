// Ranges of every DeepseekV41Config field, then the CSA2 role layout (MODEL-DEEPSEEK-V41.md §2.1,
// V41-REFERENCE-NOTES.md §2-§3): what the reference silently relies on is refused here by name.
#include <algorithm>
#include <sstream>

#include "core/check.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/config_fields.h"
#include "model/deepseek_v41/engram.h"

namespace deepinfer::model::v41 {
namespace {
constexpr int64_t kMaxDim = int64_t(1) << 24;
constexpr int64_t kMaxNgram = 16;
constexpr int64_t kMaxTableRows = int64_t(1) << 40;

bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

void check_dims(const config_detail::Fields& t, const DeepseekV41Config& c) {
  for (auto [k, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                      {"num_attention_heads", c.num_heads}, {"head_dim", c.head_dim}, {"q_lora_rank", c.q_lora_rank},
                      {"o_groups", c.o_groups}, {"o_lora_rank", c.o_lora_rank}, {"sliding_window", c.sliding_window},
                      {"index_n_heads", c.index_n_heads}, {"index_head_dim", c.index_head_dim},
                      {"index_topk", c.index_topk}, {"n_routed_experts", c.n_routed_experts},
                      {"num_experts_per_tok", c.num_experts_per_tok}, {"moe_intermediate_size", c.moe_intermediate_size},
                      {"hc_mult", c.hc_mult}, {"hc_sinkhorn_iters", c.hc_sinkhorn_iters},
                      {"max_position_embeddings", c.max_position_embeddings}})
    if (v < 1 || v > kMaxDim) t.fail(k, detail::str_cat("must be in [1, ", kMaxDim, "], got ", v));
  if (c.hc_sinkhorn_iters > 10000) t.fail("hc_sinkhorn_iters", "must be <= 10000");
  if (c.num_heads % c.o_groups)
    t.fail("o_groups", detail::str_cat("num_attention_heads=", c.num_heads, " is not divisible by o_groups=", c.o_groups));
  if (c.rope_head_dim <= 0 || c.rope_head_dim % 2 || c.rope_head_dim > c.head_dim)
    t.fail("qk_rope_head_dim", detail::str_cat("must be even and in (0, head_dim=", c.head_dim, "], got ", c.rope_head_dim));
  if (c.rope_head_dim > c.index_head_dim)
    t.fail("index_head_dim", detail::str_cat(c.index_head_dim, " is smaller than qk_rope_head_dim ", c.rope_head_dim,
                                             " (the indexer rotates its last qk_rope_head_dim channels)"));
  if (c.num_experts_per_tok > c.n_routed_experts)
    t.fail("num_experts_per_tok", detail::str_cat(c.num_experts_per_tok, " > n_routed_experts ", c.n_routed_experts));
  for (auto [k, v] : {std::pair<const char*, double>{"rms_norm_eps", c.rms_norm_eps}, {"hc_eps", c.hc_eps},
                      {"rope_theta", c.rope.theta}, {"compress_rope_theta", c.compress_rope.theta},
                      {"routed_scaling_factor", c.routed_scaling_factor}, {"gate_temp", c.gate_temp}})
    if (!(v > 0)) t.fail(k, detail::str_cat("must be > 0, got ", v));
  if (c.swiglu_limit < 0) t.fail("swiglu_limit", detail::str_cat("must be >= 0 (0 = no clamp), got ", c.swiglu_limit));
  for (auto [k, v] : {std::pair<const char*, int64_t>{"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_id}})
    if (v < 0 || v >= c.vocab_size) t.fail(k, detail::str_cat(v, " is not a token id in [0, vocab_size=", c.vocab_size, ")"));
}

// Strictly ascending ids in [0, n); `need_ratio`: each layer must have a compressed branch.
void check_ids(const config_detail::Fields& t, const char* key, const std::vector<int64_t>& ids, const DeepseekV41Config& c,
               bool need_ratio) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string k = detail::str_cat(key, "[", i, "]");
    if (ids[i] < 0 || ids[i] >= c.num_layers)
      t.fail(k, detail::str_cat(ids[i], " is not a layer in [0, num_hidden_layers=", c.num_layers, ")"));
    if (i && ids[i] <= ids[i - 1]) t.fail(k, "layer ids must be strictly ascending");
    if (need_ratio && c.compress_ratios[size_t(ids[i])] == 0)
      t.fail(k, detail::str_cat("layer ", ids[i], " has compress ratio 0 (no compressed branch)"));
  }
}

void check_engram(const config_detail::Fields& t, const DeepseekV41Config& c) {
  const EngramConfig& e = c.engram;
  check_ids(t, "engram_layer_ids", e.layer_ids, c, false);
  if (e.num_embeddings.size() != e.layer_ids.size())
    t.fail("engram_num_embeddings", detail::str_cat("has ", e.num_embeddings.size(), " entries for ", e.layer_ids.size(),
                                                    " engram_layer_ids"));
  if (e.layer_ids.empty()) return;
  for (size_t i = 0; i < e.num_embeddings.size(); ++i)
    if (e.num_embeddings[i] < 1 || e.num_embeddings[i] > kMaxTableRows)
      t.fail(detail::str_cat("engram_num_embeddings[", i, "]"), detail::str_cat("must be in [1, 2^40], got ", e.num_embeddings[i]));
  if (e.max_ngram_size < 2 || e.max_ngram_size > kMaxNgram)
    t.fail("engram_max_ngram_size", detail::str_cat("must be in [2, ", kMaxNgram, "], got ", e.max_ngram_size));
  if (e.n_heads < 1 || e.n_heads > 1024) t.fail("engram_n_heads", detail::str_cat("must be in [1, 1024], got ", e.n_heads));
  if (e.head_dim < 32 || e.head_dim % 32 || e.head_dim > kMaxDim)
    t.fail("engram_head_dim", detail::str_cat("must be a positive multiple of 32 (one scale per 32), got ", e.head_dim));
  if (e.vocab_size < 1 || e.vocab_size > (int64_t(1) << 40))
    t.fail("engram_vocab_size", detail::str_cat("must be in [1, 2^40], got ", e.vocab_size));
  if (e.compressed_vocab_size < 1 || e.compressed_vocab_size > c.vocab_size)
    t.fail("engram_compressed_vocab_size", detail::str_cat("must be in [1, vocab_size=", c.vocab_size, "], got ",
                                                           e.compressed_vocab_size));
  if (e.pad_id < 0 || e.pad_id >= c.vocab_size)
    t.fail("engram_pad_token_id", detail::str_cat(e.pad_id, " is not a token id in [0, vocab_size=", c.vocab_size, ")"));
  // A table's rows are its buckets: the sum of the layer's primes (engram.h).
  const auto primes = engram_primes(e);
  for (size_t i = 0; i < primes.size(); ++i) {
    int64_t rows = 0;
    for (int64_t p : primes[i]) rows += p;
    if (rows != e.num_embeddings[i])
      t.fail(detail::str_cat("engram_num_embeddings[", i, "]"),
             detail::str_cat(e.num_embeddings[i], " != ", rows, ", the sum of layer ", e.layer_ids[i],
                             "'s bucket primes (engram_vocab_size ", e.vocab_size, ", ", e.max_ngram_size, "-grams x ",
                             e.n_heads, " heads)"));
  }
}

void check_dspark(const config_detail::Fields& t, const DeepseekV41Config& c) {
  const DSparkConfig& d = c.dspark;
  if (d.num_stages == 0) return;  // the dspark_* keys are read but describe nothing
  if (d.block_size < 1 || d.block_size > 64) t.fail("dspark_block_size", detail::str_cat("must be in [1, 64], got ", d.block_size));
  if (d.noise_token_id < 0 || d.noise_token_id >= c.vocab_size)
    t.fail("dspark_noise_token_id", detail::str_cat(d.noise_token_id, " is not a token id in [0, ", c.vocab_size, ")"));
  if (d.markov_rank < 1 || d.markov_rank > kMaxDim) t.fail("dspark_markov_rank", "must be >= 1");
  if (d.n_routed_experts < 1 || d.n_routed_experts > kMaxDim) t.fail("dspark_n_routed_experts", "must be >= 1");
  if (d.num_experts_per_tok < 1 || d.num_experts_per_tok > d.n_routed_experts)
    t.fail("dspark_num_experts_per_tok", detail::str_cat("must be in [1, dspark_n_routed_experts=", d.n_routed_experts, "]"));
  if (d.target_layer_ids.empty()) t.fail("dspark_target_layer_ids", "needs at least one target layer");
  check_ids(t, "dspark_target_layer_ids", d.target_layer_ids, c, false);
}

// Derives every layer's roles (what it owns and reads) and refuses layouts the math forbids.
void derive_roles(const config_detail::Fields& t, DeepseekV41Config& c) {
  const auto& kv = c.kv_source_layer_ids;
  const auto& idx = c.index_source_layer_ids;
  check_ids(t, "kv_source_layer_ids", kv, c, true);
  check_ids(t, "index_source_layer_ids", idx, c, true);
  for (size_t i = 0; i < kv.size(); ++i)
    if (!contains(idx, kv[i]))  // else the group's first layer would attend with another group's top-k
      t.fail(detail::str_cat("kv_source_layer_ids[", i, "]"),
             detail::str_cat("KV source ", kv[i], " must also be an index source (in index_source_layer_ids)"));
  const int64_t cand = c.candidate_source_layer_id;
  if (cand >= 0) {
    if (!contains(idx, cand))
      t.fail("candidate_source_layer_id", detail::str_cat(cand, " is not in index_source_layer_ids"));
    if (!kv.empty() && kv.back() > cand)  // the candidate mask is as wide as the candidate source's group
      t.fail("candidate_source_layer_id", detail::str_cat("KV source ", kv.back(), " comes after the candidate source ",
                                                          cand, "; no KV source may follow it"));
    if (c.candidate_topk_blocks < 1 || c.candidate_topk_blocks > kMaxDim)
      t.fail("candidate_topk_blocks", detail::str_cat("must be in [1, ", kMaxDim, "], got ", c.candidate_topk_blocks));
    if (c.candidate_block_size < 1 || c.candidate_block_size > kMaxDim)
      t.fail("candidate_block_size", detail::str_cat("must be in [1, ", kMaxDim, "], got ", c.candidate_block_size));
  }
  c.roles.assign(size_t(c.num_layers), LayerRoles{});
  int32_t last_kv = -1, last_idx = -1;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerRoles& r = c.roles[size_t(l)];
    r.ratio = c.compress_ratios[size_t(l)];
    if (contains(kv, l)) last_kv = int32_t(l);
    if (contains(idx, l)) last_idx = int32_t(l);
    r.engram = contains(c.engram.layer_ids, l);
    r.dspark_target = c.dspark.num_stages > 0 && contains(c.dspark.target_layer_ids, l);
    if (r.ratio == 0) continue;
    const std::string k = detail::str_cat("compress_ratios[", l, "]");
    if (last_kv < 0) t.fail(k, detail::str_cat("layer ", l, " has ratio ", r.ratio, " but no KV source at or below it"));
    if (c.compress_ratios[size_t(last_kv)] != r.ratio)  // the reference's visibility uses the consumer's ratio
      t.fail(k, detail::str_cat("layer ", l, " has ratio ", r.ratio, " but its KV source ", last_kv, " has ratio ",
                                c.compress_ratios[size_t(last_kv)]));
    r.kv_source = last_kv;
    r.topk_source = last_idx;  // >= last_kv: every KV source is an index source
    r.role = last_kv == l ? LayerRole::kFull : last_idx == l ? LayerRole::kReindex : LayerRole::kReuse;
    r.candidate_source = l == cand;
    r.uses_candidates = last_idx == l && cand >= 0 && cand < l;
  }
}
}  // namespace

namespace config_detail {
void validate(const Fields& t, DeepseekV41Config& c) {
  check_dims(t, c);
  check_engram(t, c);
  check_dspark(t, c);
  derive_roles(t, c);
}
}  // namespace config_detail

const char* layer_role_name(LayerRole r) {
  switch (r) {
    case LayerRole::kSliding: return "sliding";
    case LayerRole::kFull: return "full";
    case LayerRole::kReuse: return "reuse";
    case LayerRole::kReindex: return "reindex";
  }
  return "?";
}

std::string DeepseekV41Config::schedule_str() const {
  std::string s;
  for (size_t i = 0; i < roles.size(); ++i) {
    if (i) s += ' ';
    const LayerRoles& r = roles[i];
    s += "SFRX"[int(r.role)];
    if (r.candidate_source) s += '*';
    else if (r.uses_candidates) s += 'c';
  }
  return s;
}

std::string DeepseekV41Config::summary() const {
  std::ostringstream os;
  os << "architecture: DeepseekV41ForCausalLM (" << (layout == ConfigLayout::kRelease ? "release" : "transformers")
     << " config layout)\n"
     << "dims: vocab " << vocab_size << ", hidden " << hidden_size << ", layers " << num_layers << " (+"
     << dspark.num_stages << " DSpark), heads " << num_heads << " x " << head_dim << " (rope " << rope_head_dim
     << "), q_lora " << q_lora_rank << ", o_groups " << o_groups << " x " << o_lora_rank << "\n"
     << "roles: " << schedule_str() << " (window " << sliding_window << ")\n"
     << "indexer: " << index_n_heads << " heads x " << index_head_dim << " top-" << index_topk;
  if (candidates_enabled())
    os << ", candidates from layer " << candidate_source_layer_id << ": " << candidate_topk_blocks << " blocks of "
       << candidate_block_size;
  os << "\nmoe: " << n_routed_experts << " experts top-" << num_experts_per_tok << " + 1 shared, width "
     << moe_intermediate_size << ", gate_temp " << gate_temp << ", scale " << routed_scaling_factor << ", swiglu_limit "
     << swiglu_limit << "\nmhc: " << hc_mult << " streams, " << hc_sinkhorn_iters << " sinkhorn iters (single pass)\n"
     << "engram: " << engram.layer_ids.size() << " layers, " << engram.max_ngram_size << "-grams x " << engram.n_heads
     << " heads, rows of " << engram.head_dim << ", " << engram.compressed_vocab_size << " classes\n";
  return os.str();
}

}  // namespace deepinfer::model::v41
