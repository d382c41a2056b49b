// Expert parallelism for the shared forward's MoE seam (backend.h: route -> dispatch -> experts ->
// combine): each main MoE layer's experts are placed in `slots_per_rank` slots on each rank of an
// expert-parallel group (physical expert p = rank * slots_per_rank + slot; a logical expert may have
// several replicas, EPLB's redundant copies). A step's (token, k) assignments travel to a rank
// holding their expert (an all-to-all of the rows), the local experts run, the outputs travel back
// (the reverse all-to-all) and every token is combined on its own rank in ascending expert order,
// the single-rank backend's order, so the result does not depend on the rank count.
//
// Lockstep: every rank of the group calls dispatch/return for every main MoE layer of every step,
// also with zero tokens (the model runs the forward with an empty batch then: CausalLM::
// joins_collectives). The drafter's MTP blocks are not expert-parallel: every rank holds their
// experts, so drafting needs no collectives.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "parallel/process_group.h"

namespace deepinfer::model::ds {

// One MoE layer's placement (the same tables as parallel::ExpertPlacement).
struct EpLayerLayout {
  int32_t num_logical = 0, num_ranks = 1, slots_per_rank = 0;
  std::vector<int32_t> physical_to_logical;  // [num_ranks * slots_per_rank]
  // Derived: replicas per logical expert (ascending physical index).
  std::vector<std::vector<int32_t>> replicas;
  void finish();  // fills `replicas`, checks every logical expert has one (InvalidArgument)
  std::vector<int32_t> local_logical(int32_t rank) const;  // logical ids of that rank's slots
};
// Logical experts dealt out in contiguous ranges (E/ranks per rank, the first E % ranks one more),
// `redundant` extra slots per rank repeating experts round-robin.
EpLayerLayout contiguous_layout(int32_t num_logical, int32_t num_ranks);

class ExpertParallel {
 public:
  // `layers[l]` for main layer l; layers without MoE... every V4 layer has one.
  ExpertParallel(parallel::ProcessGroup& group, std::vector<EpLayerLayout> layers);
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  const EpLayerLayout& layout(int64_t layer) const { return layers_.at(size_t(layer)); }
  bool holds(int64_t layer, int32_t logical) const;  // this rank has a replica
  // Replaces a layer's placement (EPLB rearrangement; every rank, the same step, between steps).
  void set_layout(int64_t layer, EpLayerLayout layout);

  // Sends each assignment's row (h[pair / K], D floats) to a rank holding expert ids[pair]; after
  // it, received() lists what this rank must compute. Counts this rank's routed tokens per expert.
  void dispatch(int64_t layer, const float* h, int64_t T, int64_t D, const int32_t* ids, int64_t K);
  struct Received {
    std::span<const float> rows;       // [m, D] in arrival order
    std::span<const int32_t> slot;     // [m] local slot of each row
  };
  Received received() const;
  // outputs [m, D] of the received rows (arrival order) back to their ranks: out[pair] rows [T*K, D].
  void give_back(const float* outputs, float* out);

  // Tokens this rank routed to each logical expert since the last take_load() ([layers][E]).
  std::vector<std::vector<int64_t>> take_load();

 private:
  parallel::ProcessGroup& group_;
  std::vector<EpLayerLayout> layers_;
  std::vector<std::vector<int64_t>> load_;
  // The step in flight.
  int64_t D_ = 0, pairs_ = 0;
  std::vector<int64_t> send_order_;   // [pairs] pair index of each sent row, in send order
  std::vector<int64_t> send_bytes_, recv_bytes_;
  std::vector<float> recv_rows_;
  std::vector<int32_t> recv_slot_;
};

}  // namespace deepinfer::model::ds
