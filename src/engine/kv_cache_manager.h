// KVCacheManager: which paged blocks and which fixed-state slot each running sequence holds
// (MODEL-DEEPSEEK-V4.md §4; kv/kv_cache.h). Pure bookkeeping over ids: it never sees a tensor.
// One block covers `block_tokens` source tokens in every layer's compressed-entry and
// indexer-key pools (a per-sequence block table shared by all layers); one slot holds a
// sequence's window rings and compressor partials. Running out is an expected outcome
// (allocate returns false, the scheduler preempts), never an exception.
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
  void free(int64_t seq_id);  // no-op when it holds nothing
  const SeqCache* get(int64_t seq_id) const;

  int64_t num_free_blocks() const { return int64_t(free_blocks_.size()); }
  int64_t num_free_slots() const { return int64_t(free_slots_.size()); }
  double usage() const;  // fraction of blocks in use
  const kv::CacheGeometry& geometry() const { return geometry_; }
  // Asserts that no block or slot is held twice or lost (tests call it every step).
  void check_invariants() const;

 private:
  kv::CacheGeometry geometry_;
  std::deque<int32_t> free_blocks_;
  std::deque<int32_t> free_slots_;
  std::vector<int64_t> block_owner_;  // [num_blocks] seq id or -1
  std::vector<int64_t> slot_owner_;   // [num_slots] seq id or -1
  std::unordered_map<int64_t, SeqCache> seqs_;
};

}  // namespace deepinfer::engine
