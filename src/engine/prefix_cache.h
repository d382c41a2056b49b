// PrefixCache: exact prefix reuse for V4's hybrid cache (issue #16).
//
// A sequence's cache state at a block boundary N is (a) the paged blocks covering [0, N) —
// content-addressed and shared through KVCacheManager — and (b) the slot's fixed state (every
// layer's window ring, compressor and indexer partials, drafter rings), which is not in blocks.
// (b) is kept as checkpoints: CausalLM::save_slot at N, stored here under the chain hash of the
// block that ends at N (the same hash KVCacheManager gives the block). A hit at admission is the
// longest run of cached blocks [0, N) whose end has a checkpoint: the sequence starts on those
// blocks (references taken), the runner restores the checkpoint into its slot, and only
// [N, end) is computed. Any boundary can hit (there is no minimum of block x ratio); at least
// the last token is always computed (its logits are needed).
//
// Where checkpoints come from: a slot can only be saved at N when its rings were written no
// further than N + max_rollback (CausalLM::can_save_slot). So with prefix caching on, a prefill
// chunk that would cross a checkpoint boundary ends there (cut_chunk): every
// checkpoint_interval_blocks-th block boundary and the last boundary before the prompt's last
// token. Decode crosses boundaries one position at a time, so each one it crosses is saved.
// The scheduler asks for checkpoints in SchedulerOutput::checkpoints (boundaries the step
// reaches, keyed by hash); the runner saves what the model can and returns them; update() stores
// them here. Checkpoints are host memory (SlotSnapshot bytes), bounded by a byte budget and
// evicted least recently used; one whose block left the cache is dropped (KVCacheManager
// reports evicted hashes).
//
// Exactness: a hit restores byte-for-byte the state the same tokens left, and blocks are matched
// on hash, parent hash and token ids. Requests asking for prompt logprobs skip matching (their
// logits over the whole prompt are recomputed).
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/host_tier.h"
#include "engine/kv_cache_manager.h"
#include "model/causal_lm.h"

namespace deepinfer::engine {

struct PrefixCacheConfig {
  bool enabled = true;
  // Prefill chunks end at every k-th block boundary (k = this) so the state there can be saved;
  // 0 = only at the prompt's last boundary (decode boundaries are always saved); -1 = automatic,
  // resolved by the Engine (auto_checkpoint_interval) before the cache is built.
  int64_t checkpoint_interval_blocks = -1;
  size_t checkpoint_budget_bytes = size_t(256) << 20;  // host memory for slot checkpoints
  int64_t host_blocks = 0;  // host-tier slots for evicted blocks (0 = no host tier)
};

struct PrefixCacheStats {
  int64_t num_lookups = 0, num_hits = 0;      // admissions looked up / that hit
  int64_t lookup_tokens = 0, hit_tokens = 0;  // their tokens / tokens served from the cache
  int64_t checkpoints_saved = 0;              // stored
  int64_t checkpoints_unsaveable = 0;         // asked for, the model could not save (rollback slack)
  int64_t checkpoints_evicted = 0;            // dropped for the budget or with their block
  int64_t num_checkpoints = 0;                // held now
  size_t checkpoint_bytes = 0;                // held now
  double hit_rate() const { return lookup_tokens ? double(hit_tokens) / double(lookup_tokens) : 0.0; }
};

struct PrefixMatch {
  std::vector<int32_t> blocks;                               // device blocks of the first blocks
  std::vector<int32_t> host_slots;                           // host-tier slots of the blocks after them
  std::shared_ptr<const model::SlotSnapshot> checkpoint;     // state at num_tokens; null = no hit
  int64_t num_tokens = 0;
  // End of the run of cached blocks the tokens start with, checkpointed or not (>= num_tokens):
  // blocks an earlier sequence computed, so where this one leaves them is a branch point of a
  // shared prefix (a system prompt, say). The scheduler ends a prefill chunk there once, so the
  // state is saved and the next sequence with that prefix hits there even when the checkpoint
  // interval is long (Request::branch_point).
  int64_t cached_tokens = 0;
};

// A checkpoint the scheduler asks for: the slot of `seq_id` at `num_tokens` positions (a block
// boundary the step reaches), stored under `key` (the hash of the block ending there).
// deferred: the block's last token is the one a step in flight samples (asynchronous scheduling:
// a decode step whose input is that token), so the key is unknown when the step is planned; the
// scheduler computes it from the sequence's tokens when it applies the step (key 0 until then).
struct CheckpointRequest {
  int64_t seq_id = 0;
  int64_t num_tokens = 0;
  uint64_t key = 0;
  bool deferred = false;
};

// A paged block copied between the device cache and a host-tier slot (HostBlockTier).
struct BlockCopy {
  int32_t block = -1;
  int32_t host_slot = -1;
};

struct SavedCheckpoint {
  uint64_t key = 0;
  std::shared_ptr<const model::SlotSnapshot> snapshot;
  // What CheckpointRequest asked (the scheduler keys a deferred one when it applies the step).
  int64_t seq_id = -1, num_tokens = 0;
  bool deferred = false;
};

class PrefixCache {
 public:
  PrefixCache(const PrefixCacheConfig& config, int64_t block_tokens);

  bool enabled() const { return config_.enabled; }
  // The longest cached prefix of tokens = prompt ++ output (it leaves at least one token to
  // compute). Counts a lookup in the stats when `count` (else count_lookup does, once the
  // sequence is admitted).
  // Blocks missing on the device may come from `host` (then every later one does too).
  // At most `max_tokens` tokens hit (bounded replay: the request's tail start).
  PrefixMatch match(const KVCacheManager& kv, std::span<const int32_t> prompt, std::span<const int32_t> output,
                    bool count = true, const HostBlockTier* host = nullptr, int64_t max_tokens = INT64_MAX);
  // How many of `n` tokens after `num_computed` a prefill chunk of a `num_tokens`-token
  // sequence schedules: cut at the first checkpoint boundary it would cross (every
  // checkpoint_interval_blocks-th, the prompt's last, and `branch_point` when > 0).
  int64_t cut_chunk(int64_t num_computed, int64_t n, int64_t num_tokens, int64_t branch_point = 0) const;
  // Checkpoint requests for the boundaries N in (after, first_position + tokens.size()] not
  // stored yet. `tokens` start at the block boundary first_position <= after (drafts included
  // at the end: the runner saves only what the step committed); `parent` is the hash of the
  // block before first_position (the chain's seed at 0).
  void plan_checkpoints(int64_t seq_id, int64_t first_position, int64_t after, uint64_t parent,
                        std::span<const int32_t> tokens, std::vector<CheckpointRequest>& out) const;

  void put(const SavedCheckpoint& c);
  bool has(uint64_t key) const { return index_.count(key) > 0; }
  void drop(uint64_t key);
  void count_lookup(int64_t num_tokens, int64_t hit_tokens);
  void note_unsaveable(int64_t n) { stats_.checkpoints_unsaveable += n; }
  const PrefixCacheStats& stats() const { return stats_; }
  const PrefixCacheConfig& config() const { return config_; }

 private:
  struct Entry {
    uint64_t key;
    std::shared_ptr<const model::SlotSnapshot> snapshot;
  };
  void erase(std::list<Entry>::iterator it);

  PrefixCacheConfig config_;
  int64_t block_tokens_;
  std::list<Entry> lru_;  // least recently used first
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
  PrefixCacheStats stats_;
};

}  // namespace deepinfer::engine
