// ToyModel: a small deterministic CausalLM for engine tests (and LLM(model="builtin:toy")).
// Its logits at position p are a hash of the whole history, kept the way V4 keeps state:
// a rolling hash per cache slot (like compressor partials) and the last 4 tokens read back
// from the paged blocks through the block table (like compressed entries). A stale slot,
// a wrong block table or a mis-packed batch therefore changes the tokens or trips a check,
// so batching, chunking and preemption bugs show. `reference_logits` recomputes the same
// logits from the token list alone (no cache), the oracle for tests.
//
// Rollback (speculative decoding): each slot keeps the hash after each of its last
// max_rollback + 1 positions (a ring, as a model's window holds W + R entries), so dropping the
// last n <= max_rollback positions restores the hash exactly; a batch that starts anywhere but
// at the slot's length trips a check, so a missing or wrong rollback shows.
// Hidden rows: the "final stream" of position p is its ToyState (hash and the tokens at
// p-2..p), enough for ToyDrafter to continue the model exactly, as an MTP block continues the
// target from its hidden state.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "model/causal_lm.h"
#include "model/drafter.h"

namespace deepinfer::engine {

struct ToyModelConfig {
  int64_t vocab_size = 320;
  int64_t max_model_len = 2048;
  int64_t block_tokens = 16;
  uint64_t weights_seed = 1;
  int64_t max_rollback = 0;  // positions a slot can roll back
  int64_t eos_token_id = 1;  // tests may pick a frequent token to end sequences inside a run
  int64_t prefill_weight_pass_tokens = 0;  // what CausalLM::prefill_weight_pass_tokens reports (tests)
};

// The toy's state after a position: what its hidden row carries.
struct ToyState {
  uint64_t hash = 0;
  std::array<int32_t, 3> window = {-1, -1, -1};  // tokens at p-2, p-1, p; -1 = before the sequence
};

class ToyModel final : public model::CausalLM {
 public:
  static constexpr int64_t kHiddenElems = 8;  // a hidden row: [1, 8] f32 (ToyState encoded exactly)

  explicit ToyModel(const ToyModelConfig& config = {}) : cfg_(config) {}
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_model_len() const override { return cfg_.max_model_len; }
  int64_t eos_token_id() const override { return cfg_.eos_token_id; }
  int64_t bos_token_id() const override { return 0; }
  std::string describe() const override;
  kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const override;
  void allocate_cache(const kv::CacheGeometry& geometry) override;
  void reset_slot(int32_t slot) override;
  model::ForwardOutput run(const model::ForwardBatch& batch, const model::ForwardOptions& options) override;
  int64_t max_rollback() const override { return cfg_.max_rollback; }
  int64_t prefill_weight_pass_tokens() const override { return cfg_.prefill_weight_pass_tokens; }
  void rollback(int32_t slot, int64_t num_tokens, int64_t keep) override;
  model::Drafter* drafter() override { return drafter_.get(); }
  // Snapshots: the slot's hash ring cut back to `num_tokens` (within max_rollback of its length).
  bool can_save_slot(int32_t slot, int64_t num_tokens) const override;
  model::SlotSnapshot save_slot(int32_t slot, int64_t num_tokens) override;
  void restore_slot(int32_t slot, const model::SlotSnapshot& snapshot) override;
  // A block's bytes are its token ids [block_tokens] int32.
  size_t paged_block_bytes() const override { return size_t(geometry_.block_tokens) * sizeof(int32_t); }
  void copy_blocks_to_host(std::span<const model::HostBlockCopy> copies) override;
  void copy_blocks_from_host(std::span<const model::HostBlockCopy> copies) override;
  int64_t num_restores() const { return num_restores_; }
  int64_t num_block_copies() const { return num_block_copies_; }
  void set_drafter(std::unique_ptr<model::Drafter> d) { drafter_ = std::move(d); }

  // [tokens.size(), vocab] logits of every position, computed without a cache.
  static std::vector<float> reference_logits(const ToyModelConfig& config, const std::vector<int32_t>& tokens);
  // The state before any position (an empty sequence).
  static ToyState initial_state(const ToyModelConfig& config);
  // Advances `state` by the token at the next position and fills that position's logits [vocab].
  static void step(const ToyModelConfig& config, ToyState& state, int32_t token, float* logits);
  static void encode_hidden(const ToyState& s, float* row);  // row: [kHiddenElems]
  static ToyState decode_hidden(const float* row);
  int64_t num_forward_calls() const { return num_forward_calls_; }
  int64_t num_rollbacks() const { return num_rollbacks_; }

 private:
  struct Slot {
    std::deque<uint64_t> hashes;  // hash after each of the last max_rollback + 1 positions
    int64_t len = 0;
    bool reset = false;
  };
  uint64_t slot_hash(const Slot& s) const;
  const Slot& slot_at(int32_t slot) const;
  // Logits and/or the hidden row of position p of a sequence whose slot hash is `hash`.
  void emit(const model::SeqInBatch& s, int64_t p, uint64_t hash, float* logits, float* hidden) const;

  ToyModelConfig cfg_;
  kv::CacheGeometry geometry_;
  std::vector<int32_t> blocks_;  // [num_blocks, block_tokens] token ids, -1 = unwritten
  std::vector<Slot> slots_;      // [num_slots]
  std::unique_ptr<model::Drafter> drafter_;
  int64_t num_forward_calls_ = 0, num_rollbacks_ = 0, num_restores_ = 0, num_block_copies_ = 0;
};

}  // namespace deepinfer::engine
