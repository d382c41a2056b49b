// Moving routed-expert weights between expert-parallel ranks (EPLB on a sharded model).
//
// A rank that prepared only its shard of the routed experts holds exactly the experts of its slots.
// When EPLB re-places a layer, the experts a rank gains are copied from a rank that held them
// before (ExpertParallel::rebalance, one variable all-to-all per re-placed layer) and the ones it
// no longer serves are freed, so a rank's memory stays bounded by its slots. The bytes are the
// backend's stored form (opaque to the exchange): any two ranks of a group run the same backend
// with the same numerics, so what one packs the other can adopt.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace deepinfer::model::ds {

class ExpertWeightStore {
 public:
  virtual ~ExpertWeightStore() = default;
  // Whether main layer `layer`'s routed expert `expert` is prepared on this rank.
  virtual bool holds_expert(int64_t layer, int32_t expert) const = 0;
  // Size of one expert's packed form in `layer` (the same for every expert of a layer).
  virtual int64_t expert_bytes(int64_t layer) const = 0;
  // Writes the held expert's weights into dst (expert_bytes(layer) bytes).
  virtual void pack_expert(int64_t layer, int32_t expert, std::span<std::byte> dst) const = 0;
  // Takes an expert this rank did not hold from bytes another rank packed; InvalidArgument when the
  // size is wrong or the expert is already held.
  virtual void adopt_expert(int64_t layer, int32_t expert, std::span<const std::byte> src) = 0;
  // Frees a held expert's weights (it is not served here any more).
  virtual void release_expert(int64_t layer, int32_t expert) = 0;
};

}  // namespace deepinfer::model::ds
