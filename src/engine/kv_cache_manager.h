// KVCacheManager: which paged blocks and which fixed-state slot each running sequence holds
// (MODEL-DEEPSEEK-V4.md §4; kv/kv_cache.h). Pure bookkeeping over ids: it never sees a tensor.
// One block covers `block_tokens` source tokens in every layer's compressed-entry and
// indexer-key pools (a per-sequence block table shared by all layers); one slot holds a
// sequence's window rings and compressor partials. Running out is an expected outcome
// (allocate returns false, the scheduler preempts), never an exception.
//
// Blocks are reference-counted and content-addressed, ready for prefix reuse (issue #16):
//  * every block that is full of computed, committed tokens gets a content hash chained over its
//    token ids and its whole prefix, seeded with the model tag (model identity + numerics +
//    prefill mode, given at construction), so equal hashes mean equal cache contents;
//  * a block with refcount 0 sits in an LRU free list and keeps its hash (find_cached() still
//    finds it) until allocation takes it from the list's head, which evicts the hash; a
//    sequence's blocks are freed last-block-first, so the shared front of a prefix stays longest;
//  * allocation never hands out a block that any sequence references.
// Prefix reuse (engine/prefix_cache.h) matches a prompt's block hashes at admission
// (find_cached checks the block's parent hash and token ids too, so a 64-bit collision cannot
// give a false hit) and starts the sequence on those blocks (allocate_with_prefix: out of the
// free list, refcount + 1); the slot's fixed state comes from a checkpoint at that boundary.
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
#include <list>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache.h"

namespace deepinfer::engine {

// Seed of every block-hash chain: one value per (model identity, numerics, prefill mode).
uint64_t block_hash_seed(std::string_view model_identity);
// Content hash of a full block: its token ids [block_tokens] after the block whose hash is `parent`
// (the seed for the first block).
uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens);

struct SeqCache {
  int32_t slot = -1;
  std::vector<int32_t> block_ids;  // block table, in token order
  int32_t num_hashed = 0;          // leading blocks whose content hash is recorded
};

class KVCacheManager {
 public:
  explicit KVCacheManager(const kv::CacheGeometry& geometry, uint64_t hash_seed = block_hash_seed(""));

  int64_t blocks_for(int64_t num_tokens) const;
  // Side-effect free: could `seq_id` grow to hold `num_tokens` tokens (slot + blocks)?
  bool can_allocate(int64_t seq_id, int64_t num_tokens) const;
  // Grows seq_id's allocation (taking a slot first time) to cover `num_tokens`. Returns false
  // and changes nothing when blocks or slots run out. Appends new block ids to `new_blocks`.
  bool allocate(int64_t seq_id, int64_t num_tokens, std::vector<int32_t>* new_blocks = nullptr);
  // A new sequence (it holds nothing) starting on `prefix` (cached blocks, held or free, as
  // find_cached returned them: its first blocks, already hashed), grown to `num_tokens`.
  // Returns false and changes nothing when blocks or slots run out.
  bool allocate_with_prefix(int64_t seq_id, std::span<const int32_t> prefix, int64_t num_tokens);
  // Drops every reference seq_id holds; what no one references any more is reusable once step
  // `last_step` completed. No-op when it holds nothing.
  void free(int64_t seq_id, int64_t last_step);
  // Cuts seq_id's block table to the blocks covering `num_tokens`; the cut blocks are reusable
  // once `last_step` completed. Returns the table's new length. Hashed blocks are never cut.
  int32_t truncate(int64_t seq_id, int64_t num_tokens, int64_t last_step);
  // Records the content hash of each of seq_id's blocks that is now full of computed tokens:
  // the sequence's token ids are prompt then output (at least num_computed of them);
  // num_computed = how many have cache entries.
  void hash_full_blocks(int64_t seq_id, std::span<const int32_t> prompt, std::span<const int32_t> output,
                        int64_t num_computed);
  // Every step up to `step` has completed: what waited for them is free again.
  void complete_step(int64_t step);

  const SeqCache* get(int64_t seq_id) const;
  // The block whose recorded content hash is `hash` (held or free), or -1: what prefix reuse
  // looks up. A 64-bit hash; issue #16 decides whether a hit also compares the token ids.
  int32_t find_cached(uint64_t hash) const;
  // The block whose hash is `hash` and whose recorded parent hash and token ids are `parent` and
  // `tokens` (a hit is checked, not trusted to the hash), or -1.
  int32_t find_cached(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const;
  // Blocks whose hash left the cache (no other block holds it) since the last call, with what a
  // host-tier spill needs: the block id (its rows are intact until the next step runs), the
  // hash, the parent hash and the token ids.
  struct Evicted {
    int32_t block = -1;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;
  };
  std::vector<Evicted> take_evicted();
  int32_t ref_count(int32_t block) const { return blocks_[size_t(block)].ref; }
  std::optional<uint64_t> content_hash(int32_t block) const;
  uint64_t hash_seed() const { return hash_seed_; }

  int64_t num_free_blocks() const { return int64_t(free_lru_.size()); }
  int64_t num_free_slots() const { return int64_t(free_slots_.size()); }
  int64_t num_pending_blocks() const;  // released, waiting for their step to complete
  int64_t num_cached_blocks() const { return num_hashed_blocks_; }  // blocks carrying a content hash
  int64_t num_evictions() const { return num_evictions_; }  // hashed free blocks reused
  int64_t last_completed_step() const { return completed_step_; }
  double usage() const;  // fraction of blocks not free (held or pending)
  const kv::CacheGeometry& geometry() const { return geometry_; }
  // Asserts refcounts equal the references in block tables, no block or slot is lost or both
  // free and held, and every hash is findable (tests call it every step).
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref = 0;                 // sequences whose table holds it
    int32_t pending = 0;             // releases waiting for a step to complete (> 1 after a prefix
                                     // hit took and released it again meanwhile)
    bool free = false;               // in free_lru_
    std::optional<uint64_t> hash;    // content hash once full
    uint64_t parent = 0;             // with the hash: the previous block's hash (or the seed)
    std::vector<int32_t> tokens;     // with the hash: the block's token ids
    std::list<int32_t>::iterator lru;  // position in free_lru_ when free
  };
  struct Pending {
    int64_t after_step = 0;
    std::vector<int32_t> blocks;     // dropped to ref 0, in the order they go to the free list
    int32_t slot = -1;               // -1 = none
  };
  int32_t take_free_block();
  void unref(std::vector<int32_t> blocks, int32_t slot, int64_t after_step);
  void return_to_free(const Pending& p);

  kv::CacheGeometry geometry_;
  uint64_t hash_seed_;
  std::vector<Block> blocks_;                      // [num_blocks]
  std::list<int32_t> free_lru_;                    // ref-0 blocks, least recently freed first
  std::deque<int32_t> free_slots_;
  std::vector<int64_t> slot_owner_;                // [num_slots] seq id, kFree or kPending
  // content hash -> every block with that content (several when equal prefixes were computed
  // separately; prefix reuse will share one instead), oldest first
  std::unordered_map<uint64_t, std::vector<int32_t>> cached_;
  int64_t num_hashed_blocks_ = 0;
  std::unordered_map<int64_t, SeqCache> seqs_;
  std::deque<Pending> pending_;                    // in after_step order
  int64_t completed_step_ = -1;
  int64_t num_evictions_ = 0;
  std::vector<Evicted> evicted_;                   // hashes gone since take_evicted()
  static constexpr int64_t kFree = -1, kPending = -2;
};

}  // namespace deepinfer::engine
