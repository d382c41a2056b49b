// DeepSeek-V4 forward pass on the CPU backend (fp32 reference mode), MODEL-DEEPSEEK-V4.md.
// One batched pass over every scheduled sequence's new tokens (varlen, packed back to back);
// each sequence's decode state lives in the KvCache (window ring + compressor partials in its
// slot, compressed entries / indexer keys in the paged blocks of its block table). A full
// forward, a chunked prefill with any chunk sizes and token-by-token decode give the same
// logits; a sequence's results do not depend on its batch neighbours.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "kv/kv_cache.h"
#include "model/causal_lm.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/cpu_weights.h"
#include "model/deepseek_v4/weights.h"

namespace deepinfer::model::v4 {

struct ModelOptions {
  bool load_mtp = true;      // prepare the MTP block(s) when the checkpoint has them
  bool progress = false;     // loader progress lines
};

// Per-forward scratch, reused across calls so steady-state decode does not allocate.
struct Workspace;

class DeepseekV4Model final : public CausalLM {
 public:
  // Parses <dir>/config.json, maps the weights and prepares f32 copies (dequantising FP8/FP4).
  // Throws ConfigError / CheckpointError naming the file and tensor.
  static std::unique_ptr<DeepseekV4Model> load(const std::string& dir, const ModelOptions& options = {});
  // Engine entry point: the environment knobs do not change the CPU reference forward.
  static std::unique_ptr<DeepseekV4Model> load(const std::string& dir, const EnvConfig& /*env*/) {
    return load(dir, ModelOptions{});
  }
  ~DeepseekV4Model() override;

  const DeepseekV4Config& config() const { return cfg_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_model_len() const override { return cfg_.max_position_embeddings; }
  int64_t eos_token_id() const override { return cfg_.eos_token_id; }
  int64_t bos_token_id() const override { return cfg_.bos_token_id; }
  std::string describe() const override;
  bool has_mtp() const { return !w_.mtp.empty(); }

  kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const override;
  void allocate_cache(const kv::CacheGeometry& geometry) override;
  // Convenience for tools/tests: `slots` slots and room for `max_tokens` tokens per slot.
  void allocate_cache_for(int64_t slots, int64_t max_tokens_per_slot);
  void reset_slot(int32_t slot) override;
  kv::KvCache& cache() { return cache_; }

  // f32 logits [batch.logits_indices.size(), vocab]; hidden rows [rows, hc_mult, D] (host) of
  // batch.hidden_indices.
  ForwardOutput run(const ForwardBatch& batch, const ForwardOptions& options) override;

  // MTP draft (§7) with block k. batch.token_ids[i] is the token that FOLLOWS main position i
  // (positions come from the batch's seqs as in forward()); main_hidden [T, hc_mult, D] are the
  // main model's final streams at those positions. Uses its own window ring in the same slots.
  // Returns logits [batch.logits_indices.size(), vocab] predicting the token after that one.
  Tensor forward_mtp(const ForwardBatch& batch, const Tensor& main_hidden, int64_t k = 0);

 private:
  DeepseekV4Model() = default;
  void prepare_weights(const DeepseekV4Weights& w);
  std::vector<kv::LayerCacheSpec> cache_specs() const;
  void validate(const ForwardBatch& batch) const;
  Tensor logits_for(const float* h, const std::vector<int32_t>& rows);

  DeepseekV4Config cfg_;
  CpuModelWeights w_;
  kv::KvCache cache_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace deepinfer::model::v4

namespace deepinfer::model {
namespace deepseek_v4 = v4;  // the engine spells the namespace out
}

namespace deepinfer::model::v4 {

// Runs one sequence through `model` in chunks of the given sizes (they must sum to ids.size())
// in cache slot `slot` (reset first; blocks slot*per_slot.. of a cache from allocate_cache_for),
// returning logits for every position [T, vocab]. One chunk = full forward; all ones = decode.
Tensor run_sequence(DeepseekV4Model& model, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks,
                    int32_t slot = 0, bool need_hidden = false, Tensor* hidden = nullptr);

}  // namespace deepinfer::model::v4
