#include "engine/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace deepinfer::engine {

KVCacheManager::KVCacheManager(const kv::CacheGeometry& g) : geometry_(g) {
  DI_CHECK(g.block_tokens > 0 && g.num_blocks >= 0 && g.num_slots > 0, "bad cache geometry: block_tokens=",
           g.block_tokens, " num_blocks=", g.num_blocks, " num_slots=", g.num_slots);
  for (int64_t b = 0; b < g.num_blocks; ++b) free_blocks_.push_back(int32_t(b));
  for (int64_t s = 0; s < g.num_slots; ++s) free_slots_.push_back(int32_t(s));
  block_owner_.assign(size_t(g.num_blocks), kFree);
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
    int32_t b = free_blocks_.front();
    free_blocks_.pop_front();
    DI_CHECK(block_owner_[size_t(b)] == kFree, "block ", b, " handed out while held by ", block_owner_[size_t(b)]);
    block_owner_[size_t(b)] = id;
    c.block_ids.push_back(b);
    if (new_blocks) new_blocks->push_back(b);
  }
  return true;
}

void KVCacheManager::return_to_free(const Pending& p) {
  for (int32_t b : p.blocks) {
    DI_CHECK(block_owner_[size_t(b)] == kPending, "block ", b, " released twice");
    block_owner_[size_t(b)] = kFree;
    free_blocks_.push_back(b);
  }
  if (p.slot >= 0) {
    DI_CHECK(slot_owner_[size_t(p.slot)] == kPending, "slot ", p.slot, " released twice");
    slot_owner_[size_t(p.slot)] = kFree;
    free_slots_.push_back(p.slot);
  }
}

void KVCacheManager::release(std::vector<int32_t> blocks, int32_t slot, int64_t after_step) {
  for (int32_t b : blocks) block_owner_[size_t(b)] = kPending;
  if (slot >= 0) slot_owner_[size_t(slot)] = kPending;
  Pending p{after_step, std::move(blocks), slot};
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
  for (int32_t b : it->second.block_ids)
    DI_CHECK(block_owner_[size_t(b)] == id, "block ", b, " freed by ", id, " but owned by ", block_owner_[size_t(b)]);
  DI_CHECK(slot_owner_[size_t(it->second.slot)] == id, "slot ", it->second.slot, " freed by ", id);
  release(std::move(it->second.block_ids), it->second.slot, last_step);
  seqs_.erase(it);
}

int32_t KVCacheManager::truncate(int64_t id, int64_t num_tokens, int64_t last_step) {
  auto it = seqs_.find(id);
  DI_CHECK(it != seqs_.end(), "truncate of seq ", id, " which holds no cache");
  std::vector<int32_t>& table = it->second.block_ids;
  const size_t keep = size_t(std::min<int64_t>(blocks_for(num_tokens), int64_t(table.size())));
  if (keep < table.size()) {
    std::vector<int32_t> cut(table.begin() + ptrdiff_t(keep), table.end());
    table.resize(keep);
    release(std::move(cut), -1, last_step);
  }
  return int32_t(table.size());
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

int64_t KVCacheManager::num_pending_blocks() const {
  int64_t n = 0;
  for (const Pending& p : pending_) n += int64_t(p.blocks.size());
  return n;
}

double KVCacheManager::usage() const {
  return geometry_.num_blocks ? 1.0 - double(num_free_blocks()) / double(geometry_.num_blocks) : 0.0;
}

void KVCacheManager::check_invariants() const {
  int64_t held = 0, pending_slots = 0;
  for (auto& [id, c] : seqs_) {
    DI_CHECK(slot_owner_[size_t(c.slot)] == id, "slot ", c.slot, " owner mismatch");
    for (int32_t b : c.block_ids) DI_CHECK(block_owner_[size_t(b)] == id, "block ", b, " owner mismatch");
    held += int64_t(c.block_ids.size());
  }
  for (const Pending& p : pending_) {
    DI_CHECK(p.after_step > completed_step_, "release after step ", p.after_step, " still pending at ", completed_step_);
    for (int32_t b : p.blocks) DI_CHECK(block_owner_[size_t(b)] == kPending, "pending block ", b, " is not pending");
    pending_slots += p.slot >= 0;
  }
  for (int32_t b : free_blocks_) DI_CHECK(block_owner_[size_t(b)] == kFree, "free block ", b, " is held");
  DI_CHECK(held + num_pending_blocks() + num_free_blocks() == geometry_.num_blocks, "blocks lost: held=", held,
           " pending=", num_pending_blocks(), " free=", num_free_blocks());
  DI_CHECK(int64_t(seqs_.size()) + pending_slots + num_free_slots() == geometry_.num_slots, "slots lost");
}

}  // namespace deepinfer::engine
