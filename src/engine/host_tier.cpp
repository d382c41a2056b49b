#include "engine/host_tier.h"

#include <algorithm>

#include "core/check.h"

namespace deepinfer::engine {

HostBlockTier::HostBlockTier(int64_t capacity_blocks) {
  DI_CHECK(capacity_blocks >= 0, "HostBlockTier: capacity ", capacity_blocks);
  slots_.resize(size_t(capacity_blocks));
  for (int64_t s = capacity_blocks - 1; s >= 0; --s) free_.push_back(int32_t(s));
}

HostBlockTier::Slot& HostBlockTier::at(int32_t slot) {
  DI_CHECK(slot >= 0 && slot < int32_t(slots_.size()), "host slot ", slot, " of ", slots_.size());
  return slots_[size_t(slot)];
}

int32_t HostBlockTier::find(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return -1;
  const Slot& s = slots_[size_t(it->second)];
  return s.parent == parent && std::equal(s.tokens.begin(), s.tokens.end(), tokens.begin(), tokens.end()) ? it->second
                                                                                                         : -1;
}

int32_t HostBlockTier::store(uint64_t hash, uint64_t parent, std::vector<int32_t> tokens) {
  if (index_.count(hash)) return -1;  // already there (an equal block spilled before)
  int32_t slot = -1;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    slot = lru_.front();
    Slot& old = at(slot);
    lru_.pop_front();
    index_.erase(old.hash);
    evicted_.push_back(old.hash);
    stats_.num_evictions++;
    stats_.num_held--;
  } else {
    return -1;  // every slot is being loaded this step
  }
  Slot& s = at(slot);
  s = Slot{true, false, hash, parent, std::move(tokens), lru_.insert(lru_.end(), slot)};
  index_[hash] = slot;
  stats_.num_spills++;
  stats_.num_held++;
  return slot;
}

void HostBlockTier::take(int32_t slot) {
  Slot& s = at(slot);
  DI_CHECK(s.held && !s.busy, "host slot ", slot, " taken but it holds nothing");
  lru_.erase(s.lru);
  index_.erase(s.hash);
  s.held = false;
  s.busy = true;
  s.tokens.clear();
  busy_.push_back(slot);
  stats_.num_loads++;
  stats_.num_held--;
}

void HostBlockTier::end_step() {
  for (int32_t slot : busy_) {
    at(slot).busy = false;
    free_.push_back(slot);
  }
  busy_.clear();
}

std::vector<uint64_t> HostBlockTier::take_evicted() {
  std::vector<uint64_t> out;
  out.swap(evicted_);
  return out;
}

}  // namespace deepinfer::engine
