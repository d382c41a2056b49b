#include "engine/kv_cache_manager.h"

#include "core/check.h"

namespace deepinfer::engine {

KVCacheManager::KVCacheManager(const kv::CacheGeometry& g) : geometry_(g) {
  DI_CHECK(g.block_tokens > 0 && g.num_blocks >= 0 && g.num_slots > 0, "bad cache geometry: block_tokens=",
           g.block_tokens, " num_blocks=", g.num_blocks, " num_slots=", g.num_slots);
  for (int64_t b = 0; b < g.num_blocks; ++b) free_blocks_.push_back(int32_t(b));
  for (int64_t s = 0; s < g.num_slots; ++s) free_slots_.push_back(int32_t(s));
  block_owner_.assign(size_t(g.num_blocks), -1);
  slot_owner_.assign(size_t(g.num_slots), -1);
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
    DI_CHECK(slot_owner_[size_t(c.slot)] == -1, "slot ", c.slot, " handed out twice");
    slot_owner_[size_t(c.slot)] = id;
  }
  for (int64_t need = blocks_for(num_tokens); int64_t(c.block_ids.size()) < need;) {
    int32_t b = free_blocks_.front();
    free_blocks_.pop_front();
    DI_CHECK(block_owner_[size_t(b)] == -1, "block ", b, " handed out twice");
    block_owner_[size_t(b)] = id;
    c.block_ids.push_back(b);
    if (new_blocks) new_blocks->push_back(b);
  }
  return true;
}

void KVCacheManager::free(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  for (int32_t b : it->second.block_ids) {
    DI_CHECK(block_owner_[size_t(b)] == id, "block ", b, " freed by ", id, " but owned by ", block_owner_[size_t(b)]);
    block_owner_[size_t(b)] = -1;
    free_blocks_.push_back(b);
  }
  slot_owner_[size_t(it->second.slot)] = -1;
  free_slots_.push_back(it->second.slot);
  seqs_.erase(it);
}

const SeqCache* KVCacheManager::get(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

double KVCacheManager::usage() const {
  return geometry_.num_blocks ? 1.0 - double(num_free_blocks()) / double(geometry_.num_blocks) : 0.0;
}

void KVCacheManager::check_invariants() const {
  int64_t held = 0;
  for (auto& [id, c] : seqs_) {
    DI_CHECK(slot_owner_[size_t(c.slot)] == id, "slot ", c.slot, " owner mismatch");
    for (int32_t b : c.block_ids) DI_CHECK(block_owner_[size_t(b)] == id, "block ", b, " owner mismatch");
    held += int64_t(c.block_ids.size());
  }
  DI_CHECK(held + num_free_blocks() == geometry_.num_blocks, "blocks lost: held=", held, " free=", num_free_blocks());
  DI_CHECK(int64_t(seqs_.size()) + num_free_slots() == geometry_.num_slots, "slots lost");
}

}  // namespace deepinfer::engine
