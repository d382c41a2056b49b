// Per-slot Engram history of a V4.1 model (MODEL-DEEPSEEK-V41.md §5): the last tokens of each cache
// slot's sequence, enough to rebuild its EngramHistory at any position the rollback contract allows
// (causal_lm.h). Each step asks for the histories at the batch's first positions (a sequence that
// starts earlier than the tail's end was rolled back: the tail is cut there), hashes the new tokens
// and appends them. The tail travels in slot snapshots (prefix cache checkpoints) so a restored
// slot continues exactly. Tokens only: the class map and hashing are the EngramHasher's.
#pragma once
#include <cstdint>
#include <vector>

#include "model/deepseek_v41/engram_rows.h"
#include "model/forward_batch.h"

namespace deepinfer::model::v41 {

class EngramSlots {
 public:
  // Keeps the last (N-1) + max_rollback tokens of every slot.
  EngramSlots(const EngramHasher& hasher, int64_t max_rollback);

  void reset(int32_t slot);
  // Every Engram layer's table row ids of the batch's new tokens (engram_step_ids), histories from
  // the slots' tails; the tails then hold the new tokens. Throws InternalError naming the slot when
  // a sequence starts at a position whose history the tail no longer holds.
  std::vector<std::vector<int64_t>> step(const ForwardBatch& batch, const std::vector<const ds::EngramRef*>& tables);
  // The tail of `slot` up to position n, as bytes appended to a slot snapshot, and back.
  void append_snapshot(int32_t slot, int64_t n, std::vector<uint8_t>& bytes) const;
  // Strips what append_snapshot added from the end of `bytes` into `slot`.
  void take_snapshot(int32_t slot, std::vector<uint8_t>& bytes);

 private:
  struct Tail {
    std::vector<int32_t> tokens;  // positions [end - size, end)
    int64_t end = 0;
  };
  Tail& tail(int32_t slot);
  EngramHistory history_at(int32_t slot, int64_t pos);

  const EngramHasher& hasher_;
  int64_t keep_ = 0;
  std::vector<Tail> tails_;
};

}  // namespace deepinfer::model::v41
