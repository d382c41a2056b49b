// HostBlockTier: the host-memory tier of prefix caching (issue #16), bookkeeping only.
// A device block whose content hash leaves the device cache (its block was reused) is spilled to
// a host slot: the scheduler asks the runner to copy it there (SchedulerOutput::block_spills)
// before the step overwrites the block. A later prefix hit on that hash gets a fresh device
// block and the runner copies the slot back (block_loads) before the forward. Slots are bounded
// by the budget (capacity), reused least recently stored first. The runner owns the memory
// (capacity x CausalLM::paged_block_bytes(), pinned on a device); this class only hands out
// slot ids. A slot being loaded this step is busy until end_step(), so a spill of the same step
// (the runner copies spills first, then loads) never overwrites it.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace deepinfer::engine {

struct HostTierStats {
  int64_t num_spills = 0, num_loads = 0, num_evictions = 0;  // blocks
  int64_t num_held = 0;
};

class HostBlockTier {
 public:
  explicit HostBlockTier(int64_t capacity_blocks);
  int64_t capacity() const { return int64_t(slots_.size()); }

  // The slot holding the block with this hash, parent hash and token ids, or -1.
  int32_t find(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) const;
  bool has(uint64_t hash) const { return index_.count(hash) > 0; }
  // A slot for a spilled block (a free one, else the least recently stored, whose hash is then
  // reported by take_evicted), or -1 when every slot is busy (or there are none).
  int32_t store(uint64_t hash, uint64_t parent, std::vector<int32_t> tokens);
  // The entry leaves the tier (a load copies it back to the device); its slot is busy until end_step().
  void take(int32_t slot);
  void end_step();
  std::vector<uint64_t> take_evicted();  // hashes dropped for room since the last call
  const HostTierStats& stats() const { return stats_; }

 private:
  struct Slot {
    bool held = false, busy = false;
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru;
  };
  Slot& at(int32_t slot);
  std::vector<Slot> slots_;
  std::list<int32_t> lru_;   // held slots, least recently stored first
  std::vector<int32_t> free_, busy_;
  std::unordered_map<uint64_t, int32_t> index_;  // hash -> slot
  std::vector<uint64_t> evicted_;
  HostTierStats stats_;
};

}  // namespace deepinfer::engine
