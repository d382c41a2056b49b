#include "engine/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace deepinfer::engine {
namespace {
uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t block_hash_seed(std::string_view identity) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then mixed
  for (unsigned char c : identity) h = (h ^ c) * 0x100000001b3ull;
  return mix(h ^ identity.size());
}

uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent ^ 0x6b43a9b5e3c1f7d1ull);
  for (int32_t t : tokens) h = mix(h ^ (uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ull));
  return mix(h ^ tokens.size());
}

KVCacheManager::KVCacheManager(const kv::CacheGeometry& g, uint64_t hash_seed) : geometry_(g), hash_seed_(hash_seed) {
  DI_CHECK(g.block_tokens > 0 && g.num_blocks >= 0 && g.num_slots > 0, "bad cache geometry: block_tokens=",
           g.block_tokens, " num_blocks=", g.num_blocks, " num_slots=", g.num_slots);
  blocks_.resize(size_t(g.num_blocks));
  for (int32_t b = 0; b < int32_t(g.num_blocks); ++b) {
    blocks_[size_t(b)].lru = free_lru_.insert(free_lru_.end(), b);
    blocks_[size_t(b)].free = true;
  }
  for (int64_t s = 0; s < g.num_slots; ++s) free_slots_.push_back(int32_t(s));
  slot_owner_.assign(size_t(g.num_slots), kFree);
}

int64_t KVCacheManager::blocks_for(int64_t n) const { return (n + geometry_.block_tokens - 1) / geometry_.block_tokens; }

bool KVCacheManager::can_allocate(int64_t id, int64_t num_tokens) const {
  auto it = seqs_.find(id);
  int64_t have = it == seqs_.end() ? 0 : int64_t(it->second.block_ids.size());
  bool need_slot = it == seqs_.end();
  if (need_slot && free_slots_.empty()) return false;
  return blocks_for(num_tokens) - have <= num_free_blocks();
}

// The least recently freed block; a hash it still carries is evicted.
int32_t KVCacheManager::take_free_block() {
  const int32_t b = free_lru_.front();
  free_lru_.pop_front();
  Block& blk = blocks_[size_t(b)];
  DI_CHECK(blk.free && blk.ref == 0 && !blk.pending, "block ", b, " handed out while referenced (ref ", blk.ref, ")");
  blk.free = false;
  if (blk.hash) {
    std::vector<int32_t>& same = cached_.at(*blk.hash);
    same.erase(std::find(same.begin(), same.end(), b));
    if (same.empty()) cached_.erase(*blk.hash);
    if (!cached_.count(*blk.hash)) evicted_.push_back({b, *blk.hash, blk.parent, std::move(blk.tokens)});
    blk.hash.reset();
    blk.tokens.clear();
    --num_hashed_blocks_;
    ++num_evictions_;
  }
  return b;
}

bool KVCacheManager::allocate(int64_t id, int64_t num_tokens, std::vector<int32_t>* new_blocks) {
  if (!can_allocate(id, num_tokens)) return false;
  auto [it, inserted] = seqs_.try_emplace(id);
  SeqCache& c = it->second;
  if (inserted) {
    c.slot = free_slots_.front();
    free_slots_.pop_front();
    DI_CHECK(slot_owner_[size_t(c.slot)] == kFree, "slot ", c.slot, " handed out while held by ", slot_owner_[size_t(c.slot)]);
    slot_owner_[size_t(c.slot)] = id;
  }
  for (int64_t need = blocks_for(num_tokens); int64_t(c.block_ids.size()) < need;) {
    const int32_t b = take_free_block();
    blocks_[size_t(b)].ref = 1;
    c.block_ids.push_back(b);
    if (new_blocks) new_blocks->push_back(b);
  }
  return true;
}

bool KVCacheManager::allocate_with_prefix(int64_t id, std::span<const int32_t> prefix, int64_t num_tokens) {
  DI_CHECK(!seqs_.count(id), "allocate_with_prefix: seq ", id, " already holds a cache");
  if (prefix.empty()) return allocate(id, num_tokens);
  DI_CHECK(int64_t(prefix.size()) * geometry_.block_tokens <= num_tokens, "seq ", id, ": prefix of ", prefix.size(),
           " blocks for ", num_tokens, " tokens");
  int64_t prefix_free = 0;  // prefix blocks now in the free list: taking them leaves fewer to allocate
  for (int32_t b : prefix) {
    DI_CHECK(b >= 0 && b < geometry_.num_blocks && blocks_[size_t(b)].hash, "prefix block ", b, " is not cached");
    prefix_free += blocks_[size_t(b)].free;
  }
  if (free_slots_.empty() || blocks_for(num_tokens) - int64_t(prefix.size()) > num_free_blocks() - prefix_free)
    return false;
  for (int32_t b : prefix) {
    Block& blk = blocks_[size_t(b)];
    if (blk.free) {
      free_lru_.erase(blk.lru);
      blk.free = false;
    }
    blk.ref++;  // a pending block (released, its step in flight) stays out of the free list now
  }
  SeqCache& c = seqs_[id];
  c.block_ids.assign(prefix.begin(), prefix.end());
  c.num_hashed = int32_t(prefix.size());
  c.slot = free_slots_.front();
  free_slots_.pop_front();
  DI_CHECK(slot_owner_[size_t(c.slot)] == kFree, "slot ", c.slot, " handed out while held by ", slot_owner_[size_t(c.slot)]);
  slot_owner_[size_t(c.slot)] = id;
  const bool ok = allocate(id, num_tokens);
  DI_CHECK(ok, "allocate_with_prefix: room was checked");
  return true;
}

void KVCacheManager::return_to_free(const Pending& p) {
  for (int32_t b : p.blocks) {
    Block& blk = blocks_[size_t(b)];
    DI_CHECK(blk.pending > 0 && !blk.free, "block ", b, " released twice");
    if (--blk.pending > 0 || blk.ref > 0) continue;  // referenced again meanwhile (a prefix hit): stays out of the free list
    blk.lru = free_lru_.insert(free_lru_.end(), b);
    blk.free = true;
  }
  if (p.slot >= 0) {
    DI_CHECK(slot_owner_[size_t(p.slot)] == kPending, "slot ", p.slot, " released twice");
    slot_owner_[size_t(p.slot)] = kFree;
    free_slots_.push_back(p.slot);
  }
}

// Drops one reference on each of `blocks` (and gives up `slot`); blocks reaching 0 go to the
// free list, in the given order, once `after_step` completed.
void KVCacheManager::unref(std::vector<int32_t> blocks, int32_t slot, int64_t after_step) {
  std::vector<int32_t> released;
  for (int32_t b : blocks) {
    Block& blk = blocks_[size_t(b)];
    DI_CHECK(blk.ref > 0, "block ", b, " released with refcount ", blk.ref);
    if (--blk.ref == 0) {
      blk.pending++;
      released.push_back(b);
    }
  }
  if (slot >= 0) slot_owner_[size_t(slot)] = kPending;
  Pending p{after_step, std::move(released), slot};
  if (after_step <= completed_step_) {
    return_to_free(p);
    return;
  }
  // Keep the queue sorted by step (releases normally arrive in order; a late abort may not).
  auto pos = std::upper_bound(pending_.begin(), pending_.end(), after_step,
                              [](int64_t s, const Pending& q) { return s < q.after_step; });
  pending_.insert(pos, std::move(p));
}

void KVCacheManager::free(int64_t id, int64_t last_step) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  DI_CHECK(slot_owner_[size_t(it->second.slot)] == id, "slot ", it->second.slot, " freed by ", id);
  // Last block first: the front of a prefix is the most shareable, so it is evicted last.
  std::vector<int32_t> blocks(it->second.block_ids.rbegin(), it->second.block_ids.rend());
  unref(std::move(blocks), it->second.slot, last_step);
  seqs_.erase(it);
}

int32_t KVCacheManager::truncate(int64_t id, int64_t num_tokens, int64_t last_step) {
  auto it = seqs_.find(id);
  DI_CHECK(it != seqs_.end(), "truncate of seq ", id, " which holds no cache");
  SeqCache& c = it->second;
  const size_t keep = size_t(std::min<int64_t>(blocks_for(num_tokens), int64_t(c.block_ids.size())));
  DI_CHECK(keep >= size_t(c.num_hashed), "seq ", id, ": truncating to ", keep, " blocks would cut hashed blocks (",
           c.num_hashed, ")");
  if (keep < c.block_ids.size()) {
    std::vector<int32_t> cut(c.block_ids.rbegin(), c.block_ids.rend() - ptrdiff_t(keep));
    c.block_ids.resize(keep);
    unref(std::move(cut), -1, last_step);
  }
  return int32_t(c.block_ids.size());
}

void KVCacheManager::hash_full_blocks(int64_t id, std::span<const int32_t> prompt, std::span<const int32_t> output,
                                      int64_t num_computed) {
  auto it = seqs_.find(id);
  DI_CHECK(it != seqs_.end(), "hash_full_blocks of seq ", id, " which holds no cache");
  const int64_t np = int64_t(prompt.size());
  DI_CHECK(num_computed >= 0 && num_computed <= np + int64_t(output.size()), "seq ", id, ": ", num_computed,
           " computed of ", np + int64_t(output.size()), " tokens");
  SeqCache& c = it->second;
  const int64_t bt = geometry_.block_tokens;
  const int64_t full = std::min<int64_t>(num_computed / bt, int64_t(c.block_ids.size()));
  if (full <= c.num_hashed) return;  // the common decode step: no block filled
  std::vector<int32_t> tokens(static_cast<size_t>(bt));  // one block's token ids
  for (int64_t i = c.num_hashed; i < full; ++i) {
    for (int64_t j = 0; j < bt; ++j) {
      const int64_t p = i * bt + j;
      tokens[size_t(j)] = p < np ? prompt[size_t(p)] : output[size_t(p - np)];
    }
    const uint64_t parent = i == 0 ? hash_seed_ : *blocks_[size_t(c.block_ids[size_t(i - 1)])].hash;
    const uint64_t h = block_hash(parent, tokens);
    Block& blk = blocks_[size_t(c.block_ids[size_t(i)])];
    DI_CHECK(!blk.hash, "block ", c.block_ids[size_t(i)], " hashed twice");
    blk.hash = h;
    blk.parent = parent;
    blk.tokens = tokens;
    cached_[h].push_back(c.block_ids[size_t(i)]);
    ++num_hashed_blocks_;
  }
  c.num_hashed = int32_t(full);
}

void KVCacheManager::complete_step(int64_t step) {
  DI_CHECK(step >= completed_step_, "step ", step, " completed after step ", completed_step_);
  completed_step_ = step;
  while (!pending_.empty() && pending_.front().after_step <= step) {
    return_to_free(pending_.front());
    pending_.pop_front();
  }
}

const SeqCache* KVCacheManager::get(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

int32_t KVCacheManager::find_cached(uint64_t hash) const {
  auto it = cached_.find(hash);
  return it == cached_.end() ? -1 : it->second.front();
}

int32_t KVCacheManager::find_cached(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return -1;
  for (int32_t b : it->second) {
    const Block& blk = blocks_[size_t(b)];
    if (blk.parent == parent && std::equal(blk.tokens.begin(), blk.tokens.end(), tokens.begin(), tokens.end())) return b;
  }
  return -1;
}

std::vector<KVCacheManager::Evicted> KVCacheManager::take_evicted() {
  std::vector<Evicted> out;
  out.swap(evicted_);
  return out;
}

std::optional<uint64_t> KVCacheManager::content_hash(int32_t block) const { return blocks_[size_t(block)].hash; }

int64_t KVCacheManager::num_pending_blocks() const {
  int64_t n = 0;
  for (const Pending& p : pending_) n += int64_t(p.blocks.size());
  return n;
}

double KVCacheManager::usage() const {
  return geometry_.num_blocks ? 1.0 - double(num_free_blocks()) / double(geometry_.num_blocks) : 0.0;
}

void KVCacheManager::check_invariants() const {
  std::vector<int32_t> refs(blocks_.size(), 0);
  int64_t pending_slots = 0;
  for (auto& [id, c] : seqs_) {
    DI_CHECK(slot_owner_[size_t(c.slot)] == id, "slot ", c.slot, " owner mismatch");
    DI_CHECK(c.num_hashed >= 0 && size_t(c.num_hashed) <= c.block_ids.size(), "seq ", id, " hashed count");
    for (size_t i = 0; i < c.block_ids.size(); ++i) {
      const int32_t b = c.block_ids[i];
      refs[size_t(b)]++;
      DI_CHECK(blocks_[size_t(b)].hash.has_value() == (int64_t(i) < c.num_hashed), "seq ", id, " block ", b,
               ": hash recorded ", blocks_[size_t(b)].hash.has_value(), " but position ", i, " of ", c.num_hashed,
               " hashed");
    }
  }
  int64_t n_free = 0, n_pending = 0;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& blk = blocks_[b];
    DI_CHECK(blk.ref == refs[b], "block ", b, " refcount ", blk.ref, " but ", refs[b], " tables hold it");
    // A pending block may be referenced again (a prefix hit) before its step completes.
    DI_CHECK(!(blk.free && blk.pending) && !(blk.free && blk.ref > 0) && (blk.ref > 0 || blk.free || blk.pending),
             "block ", b, " ref ", blk.ref, " free ", blk.free, " pending ", blk.pending);
    n_free += blk.free;
    n_pending += blk.pending;
    if (blk.hash) {
      auto c = cached_.find(*blk.hash);
      DI_CHECK(c != cached_.end() && std::count(c->second.begin(), c->second.end(), int32_t(b)) == 1, "block ", b,
               "'s hash is not findable");
    }
  }
  int64_t n_cached = 0;
  for (auto& [h, same] : cached_) {
    DI_CHECK(!same.empty(), "empty hash entry");
    for (int32_t b : same) DI_CHECK(blocks_[size_t(b)].hash == h, "hash table points at block ", b, " of other content");
    n_cached += int64_t(same.size());
  }
  DI_CHECK(n_cached == num_hashed_blocks_, n_cached, " blocks in the hash table, ", num_hashed_blocks_, " hashed");
  for (int32_t b : free_lru_) DI_CHECK(blocks_[size_t(b)].free, "free list holds block ", b, " which is not free");
  for (const Pending& p : pending_) {
    DI_CHECK(p.after_step > completed_step_, "release after step ", p.after_step, " still pending at ", completed_step_);
    pending_slots += p.slot >= 0;
  }
  DI_CHECK(n_free == num_free_blocks() && n_pending == num_pending_blocks(), "free list ", num_free_blocks(), " vs ",
           n_free, " free blocks; ", num_pending_blocks(), " queued vs ", n_pending, " pending");
  DI_CHECK(int64_t(seqs_.size()) + pending_slots + num_free_slots() == geometry_.num_slots, "slots lost");
}

}  // namespace deepinfer::engine
