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
//
// Together with context parallelism over the same ranks (context_parallel.h): a split prefill
// step holds every token on every rank already, so dispatch_replicated moves no rows: each rank
// runs its own experts on the step's tokens and the outputs are all-gathered (the MoE work is
// split across the CP ranks too). Steps that are not split use dispatch.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/deepseek/expert_weights.h"
#include "parallel/device_all_to_all.h"
#include "parallel/eplb.h"
#include "parallel/process_group.h"

namespace deepinfer::model::ds {

// Runtime EPLB (vLLM's enable_eplb, eplb window_size and step_interval): each rank keeps its
// per-expert token counts of the last `window_steps` forward steps; every `step_interval` steps
// the ranks sum them (one all-reduce) and re-place each layer whose balance ratio improves by more
// than `min_gain` (parallel::plan_rebalance). Identical inputs give every rank the same placement.
// A rank holding every expert only re-routes at a re-placement; a rank holding only its slots'
// experts (a sharded model: set_weight_store) also receives the experts it gains from a rank that
// held them and frees the ones it no longer serves (expert_weights.h).
struct EplbOptions {
  bool enabled = false;
  int32_t window_steps = 1000;
  int32_t step_interval = 3000;
  double min_gain = 0.05;
};

class ExpertParallel {
 public:
  // `layers[l]`: main layer l's placement (parallel/eplb.h; contiguous_placement before any load
  // is known). Every layer's num_ranks must be the group's size.
  ExpertParallel(parallel::ProcessGroup& group, std::vector<parallel::ExpertPlacement> layers, EplbOptions eplb = {});
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  std::string describe_group() const { return group_.describe(); }

  // The device-side exchange (issue #14): an all-to-all of device buffers over the same ranks
  // in the same order (NCCL between GPUs: parallel::make_group_all_to_all over make_nccl_group;
  // a loopback in tests). A CUDA backend given one moves the MoE rows from device memory on its
  // step stream (cuda/device_expert_exchange.h) instead of staging them through the host group;
  // this object still steps (begin_step) and holds the placements. Not built with it: EPLB (its
  // load counts live on the device then, and weight moves are host-side), so InvalidArgument
  // when EPLB is on, or for a size/rank that differs from the group's. Every rank sets one or none.
  void set_device_exchange(std::shared_ptr<parallel::DeviceAllToAllV> a2a);
  parallel::DeviceAllToAllV* device_exchange() const { return device_a2a_.get(); }
  const parallel::ExpertPlacement& layout(int64_t layer) const { return layers_.at(size_t(layer)); }

  // Sends each assignment's row (h[pair / K], D floats) to a rank holding expert ids[pair]; after
  // it, received() lists what this rank must compute. Counts this rank's routed tokens per expert.
  // `pair_weights` [T*K] (optional) travel with their rows: a backend that applies the routed
  // weight inside the expert (the CUDA backend, before W2, as the reference) needs them there.
  void dispatch(int64_t layer, const float* h, int64_t T, int64_t D, const int32_t* ids, int64_t K,
                const float* pair_weights = nullptr);
  struct Received {
    std::span<const float> rows;       // [m, D] in arrival order
    std::span<const int32_t> slot;     // [m] local slot of each row
    std::span<const float> weight;     // [m] the rows' routed weights (empty unless dispatched with them)
  };
  Received received() const;
  // outputs [m, D] of the received rows (arrival order) back to their ranks: out[pair] rows [T*K, D].
  // After dispatch_replicated: every rank's outputs to every rank (one all-gather), so every rank
  // ends with all T*K rows of out.
  void give_back(const float* outputs, float* out);

  // A context-parallel split step (the CP group is this group, same ranks in the same order):
  // every rank passes the same h [T, D], ids [T*K] and pair_weights, and no row is sent. Each
  // logical expert with pairs is computed whole by one rank holding it: its only holder, or, for
  // an expert with replicas on several ranks, the least loaded of those (pairs assigned so far;
  // ties: the lower rank), such experts taken by descending pair count (ties: lower id); every
  // rank derives the same assignment from the same ids. received() then lists this rank's pairs
  // in ascending pair order, so an expert sees the single rank's rows in its order and count (its
  // GEMMs are the single rank's, bit for bit), and give_back all-gathers the outputs. Counts
  // only the pairs this rank computes (the group's sum counts each pair once, for EPLB).
  void dispatch_replicated(int64_t layer, const float* h, int64_t T, int64_t D, const int32_t* ids, int64_t K,
                           const float* pair_weights = nullptr);
  // Split steps' MoE (this rank, since construction): main-layer calls, (token, k) pairs computed
  // here, output bytes received from the other ranks.
  int64_t replicated_calls() const { return replicated_calls_; }
  int64_t replicated_pairs() const { return replicated_pairs_; }
  int64_t replicated_bytes_received() const { return replicated_bytes_; }

  // Tokens this rank routed to each logical expert since the last take_load() ([layers][E]).
  std::vector<std::vector<int64_t>> take_load();

  // Called by every rank once per forward step (also an empty one), before the step's first
  // dispatch: counts the step and, every step_interval steps, rebalances (a collective).
  void begin_step();
  int64_t num_rebalances() const { return rebalances_; }        // rounds that moved something
  int64_t num_slots_moved() const { return slots_moved_; }      // physical slots re-assigned, all layers

  // A sharded rank's weights (the backend's): from now on a re-placement moves expert weights
  // (rebalance). The store must hold every expert of this rank's slots in every layer now
  // (InvalidArgument naming the first missing one). Every rank of the group sets one or none.
  void set_weight_store(ExpertWeightStore* store);
  int64_t num_experts_received() const { return experts_received_; }  // this rank, all rounds
  int64_t num_experts_released() const { return experts_released_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  void rebalance();
  // Copies the experts each rank gains in `layer` from `before` to `after` (from the lowest rank
  // that held each), then frees what this rank no longer serves. A collective.
  void move_weights(int64_t layer, const parallel::ExpertPlacement& before, const parallel::ExpertPlacement& after);

  parallel::ProcessGroup& group_;
  std::vector<parallel::ExpertPlacement> layers_;
  std::vector<std::vector<int64_t>> load_;
  EplbOptions eplb_;
  std::unique_ptr<parallel::ExpertLoadWindow> window_;
  std::vector<std::vector<int64_t>> since_window_;  // this rank's counts since the last window step
  int64_t steps_ = 0, rebalances_ = 0, slots_moved_ = 0;
  std::shared_ptr<parallel::DeviceAllToAllV> device_a2a_;
  ExpertWeightStore* store_ = nullptr;  // the backend's (outlives this object's use of it)
  int64_t experts_received_ = 0, experts_released_ = 0, bytes_received_ = 0;
  // The step in flight.
  int64_t D_ = 0, pairs_ = 0, row_ = 0;  // row_: floats per sent row ([slot][weight?][D values])
  bool replicated_ = false;           // dispatched by dispatch_replicated
  std::vector<int64_t> gather_order_;  // replicated: [pairs] pair index of each row, grouped by computing rank
  std::vector<int64_t> gather_rows_;   // replicated: [size] rows each rank computes
  int64_t replicated_calls_ = 0, replicated_pairs_ = 0, replicated_bytes_ = 0;
  std::vector<int64_t> send_order_;   // [pairs] pair index of each sent row, in send order
  std::vector<int64_t> send_bytes_, recv_bytes_;
  std::vector<float> recv_rows_;
  std::vector<int32_t> recv_slot_;
  std::vector<float> recv_weight_;
};

}  // namespace deepinfer::model::ds
