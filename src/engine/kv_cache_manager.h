// KVCacheManager: which paged blocks and which fixed-state slot each running sequence holds
// (MODEL-DEEPSEEK-V4.md §4; kv/kv_cache.h). Pure bookkeeping over ids: it never sees a tensor.
// One block covers `block_tokens` source tokens in every layer's compressed-entry and
// indexer-key pools (a per-sequence block table shared by all layers); one slot holds a
// sequence's window rings and compressor partials. Running out is an expected outcome
// (allocate returns false, the scheduler preempts), never an exception.
//
// Deferred release: blocks and slots a sequence gives up (finished, preempted, or blocks past
// the end after a rolled-back verify step) may still be read or written by a step in flight.
// free()/truncate() take the id of the last step that used them; they return to the free
// lists only once complete_step() has reported that step done (at once when it already is).
// Synchronous scheduling completes every step before the next is planned, so nothing waits
// then; asynchronous scheduling (plan N+1 while N runs) gets the right behaviour for free.
#pragma once
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache.h"

namespace deepinfer::engine {

struct SeqCache {
  int32_t slot = -1;
  std::vector<int32_t> block_ids;  // block table, in token order
};

class KVCacheManager {
 public:
  explicit KVCacheManager(const kv::CacheGeometry& geometry);

  int64_t blocks_for(int64_t num_tokens) const;
  // Side-effect free: could `seq_id` grow to hold `num_tokens` tokens (slot + blocks)?
  bool can_allocate(int64_t seq_id, int64_t num_tokens) const;
  // Grows seq_id's allocation (taking a slot first time) to cover `num_tokens`. Returns false
  // and changes nothing when blocks or slots run out. Appends new block ids to `new_blocks`.
  bool allocate(int64_t seq_id, int64_t num_tokens, std::vector<int32_t>* new_blocks = nullptr);
  // Gives up everything seq_id holds; it is reusable once step `last_step` completed.
  // No-op when it holds nothing.
  void free(int64_t seq_id, int64_t last_step);
  // Cuts seq_id's block table to the blocks covering `num_tokens`; the cut blocks are reusable
  // once `last_step` completed. Returns the table's new length.
  int32_t truncate(int64_t seq_id, int64_t num_tokens, int64_t last_step);
  // Every step up to `step` has completed: what waited for them is free again.
  void complete_step(int64_t step);
  const SeqCache* get(int64_t seq_id) const;

  int64_t num_free_blocks() const { return int64_t(free_blocks_.size()); }
  int64_t num_free_slots() const { return int64_t(free_slots_.size()); }
  int64_t num_pending_blocks() const;  // released, waiting for their step to complete
  int64_t last_completed_step() const { return completed_step_; }
  double usage() const;  // fraction of blocks not free (held or pending)
  const kv::CacheGeometry& geometry() const { return geometry_; }
  // Asserts that no block or slot is held twice or lost (tests call it every step).
  void check_invariants() const;

 private:
  static constexpr int64_t kFree = -1, kPending = -2;  // owner values besides a seq id
  struct Pending {
    int64_t after_step = 0;
    std::vector<int32_t> blocks;
    int32_t slot = -1;  // -1 = none
  };
  void release(std::vector<int32_t> blocks, int32_t slot, int64_t after_step);
  void return_to_free(const Pending& p);

  kv::CacheGeometry geometry_;
  std::deque<int32_t> free_blocks_;
  std::deque<int32_t> free_slots_;
  std::vector<int64_t> block_owner_;  // [num_blocks] seq id, kFree or kPending
  std::vector<int64_t> slot_owner_;   // [num_slots] seq id, kFree or kPending
  std::unordered_map<int64_t, SeqCache> seqs_;
  std::deque<Pending> pending_;       // in after_step order
  int64_t completed_step_ = -1;
};

}  // namespace deepinfer::engine
