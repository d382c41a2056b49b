// ToyModel: a small deterministic CausalLM for engine tests (and LLM(model="builtin:toy")).
// Its logits at position p are a hash of the whole history, kept the way V4 keeps state:
// a rolling hash per cache slot (like compressor partials) and the last 4 tokens read back
// from the paged blocks through the block table (like compressed entries). A stale slot,
// a wrong block table or a mis-packed batch therefore changes the tokens or trips a check,
// so batching, chunking and preemption bugs show. `reference_logits` recomputes the same
// logits from the token list alone (no cache), the oracle for tests.
#pragma once
#include <cstdint>
#include <vector>

#include "model/causal_lm.h"

namespace deepinfer::engine {

struct ToyModelConfig {
  int64_t vocab_size = 320;
  int64_t max_model_len = 2048;
  int64_t block_tokens = 16;
  uint64_t weights_seed = 1;
};

class ToyModel final : public model::CausalLM {
 public:
  explicit ToyModel(const ToyModelConfig& config = {}) : cfg_(config) {}
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_model_len() const override { return cfg_.max_model_len; }
  int64_t eos_token_id() const override { return 1; }
  int64_t bos_token_id() const override { return 0; }
  std::string describe() const override;
  kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const override;
  void allocate_cache(const kv::CacheGeometry& geometry) override;
  void reset_slot(int32_t slot) override;
  model::ForwardOutput run(const model::ForwardBatch& batch, const model::ForwardOptions& options) override;

  // [tokens.size(), vocab] logits of every position, computed without a cache.
  static std::vector<float> reference_logits(const ToyModelConfig& config, const std::vector<int32_t>& tokens);
  int64_t num_forward_calls() const { return num_forward_calls_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    int64_t len = 0;
    bool reset = false;
  };
  ToyModelConfig cfg_;
  kv::CacheGeometry geometry_;
  std::vector<int32_t> blocks_;  // [num_blocks, block_tokens] token ids, -1 = unwritten
  std::vector<Slot> slots_;      // [num_slots]
  int64_t num_forward_calls_ = 0;
};

}  // namespace deepinfer::engine
