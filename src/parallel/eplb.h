// Expert-parallel load balancing (EPLB): where each MoE layer's experts live across EP ranks.
//
// A layer has E logical experts (the checkpoint's) and R ranks x S slots of physical experts
// (R*S >= E). Every logical expert has at least one physical replica; the R*S - E redundant
// slots hold extra copies of hot experts so their tokens can be split. Physical index p lives on
// rank p / S, slot p % S. The dispatcher splits a logical expert's tokens evenly over its
// replicas, so the balancer models each replica as carrying load / replicas.
//
// Everything here is a pure function of its inputs (no randomness, ties broken by index), so
// every rank computing a placement from the same all-reduced load gets the same tables.
// Bad sizes or loads throw InvalidArgument naming the argument.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::parallel {

struct ExpertPlacement {  // one MoE layer
  int32_t num_logical = 0, num_ranks = 0, slots_per_rank = 0;
  std::vector<int32_t> physical_to_logical;               // [num_ranks * slots_per_rank]
  std::vector<std::vector<int32_t>> logical_to_physical;  // [num_logical] replicas, ascending physical index

  int32_t num_physical() const { return num_ranks * slots_per_rank; }
  int32_t rank_of(int32_t physical) const { return physical / slots_per_rank; }
  // Logical ids held in `rank`'s slots, in slot order. InvalidArgument for a bad rank.
  std::vector<int32_t> local_logical(int32_t rank) const;
  // Every logical has >= 1 replica, ids in range, the two tables describe the same mapping and
  // replica lists ascend. InvalidArgument naming the first bad entry.
  void validate() const;
  bool operator==(const ExpertPlacement&) const = default;
};

// The layout before any load is known: physical p holds logical p % E (experts 0..E-1 in order,
// then the redundant slots repeat experts 0, 1, ...).
ExpertPlacement contiguous_placement(int32_t num_logical, int32_t num_ranks, int32_t slots_per_rank);

// One rank's share of the placement expert parallelism starts from (contiguous ranges, the
// `num_redundant` spare slots repeating experts from the start): what a rank loads when expert
// weights never move (EPLB off). Every layer has the same placement before any load is known.
struct ExpertShard {
  int32_t rank = 0, size = 1, num_redundant = 0;
  int32_t slots_per_rank(int32_t experts) const { return (experts + num_redundant + size - 1) / size; }
  ExpertPlacement placement(int32_t experts) const {
    return contiguous_placement(experts, size, slots_per_rank(experts));
  }
  // [experts]: whether this rank holds each logical expert.
  std::vector<bool> held(int32_t experts) const;
};

// Balanced placement for `load` [E] (tokens per logical expert, >= 0, finite):
//  1. replication, several candidates: minimax (each redundant slot to the expert with the
//     highest load per replica; ties: fewer replicas, then lower index) and "target" ones (just
//     enough copies that each replica weighs <= t x the mean rank load, for a grid of t, spare
//     slots to the lightest experts); at most R copies of an expert while any has fewer;
//  2. packing: replicas (load / replicas each) sorted heaviest first go to the least loaded rank
//     with a free slot (greedy LPT with capacity S), preferring ranks that do not hold that
//     expert yet (a second copy on one rank only wastes memory);
//  3. local search on the best few packings: while a swap of two replicas between the heaviest
//     rank and another lowers the larger of the two loads, apply the best one (bounded; never
//     adds a duplicate). The lowest max rank load wins.
// Slots within a rank are ordered by logical id.
ExpertPlacement balanced_placement(std::span<const double> load, int32_t num_ranks, int32_t slots_per_rank);

// Loads per rank [R] under the even-split model.
std::vector<double> rank_loads(const ExpertPlacement& placement, std::span<const double> load);
// max rank load / mean rank load (1 = perfect; 1 when the load is all zero).
double balance_ratio(const ExpertPlacement& placement, std::span<const double> load);

// Per-layer, per-logical-expert token counts over the last `window_steps` steps (a ring: the
// oldest step drops out when a new one arrives). The sums are exact (int64).
class ExpertLoadWindow {
 public:
  ExpertLoadWindow(int32_t num_layers, int32_t num_logical, int32_t window_steps);
  // counts: [num_layers * num_logical], layer-major, each >= 0.
  void add_step(std::span<const int64_t> counts);
  std::vector<double> layer_load(int32_t layer) const;  // [num_logical] summed over the window
  int64_t steps() const { return filled_; }             // steps in the window now (<= window_steps)
  int32_t num_layers() const { return num_layers_; }
  int32_t num_logical() const { return num_logical_; }

 private:
  int32_t num_layers_, num_logical_, window_steps_;
  std::vector<int64_t> ring_;  // [window_steps, num_layers * num_logical]
  std::vector<int64_t> sum_;   // [num_layers * num_logical] sum over the ring
  int64_t next_ = 0, filled_ = 0;
};

// Whether to rearrange a layer: the placement balanced_placement gives for `load`, relabelled so
// it keeps as many experts as possible where `current` has them (ranks matched greedily by the
// number of experts they share, then slots kept in place), and whether it lowers the balance
// ratio by more than `min_gain` (absolute, e.g. 0.05: hysteresis so a noisy load does not make
// the layout thrash). `before`/`after`: the ratios of `current` and of the candidate (reported
// even when it is not taken). When not worth it, `placement` is `current`, `slots_changed` 0.
// Extension of the brief: `slots_changed` = physical slots whose expert changes (the weight copies
// a rearrangement costs).
struct Rebalance {
  bool worth_it = false;
  double before = 1, after = 1;
  ExpertPlacement placement;
  int32_t slots_changed = 0;
};
Rebalance plan_rebalance(const ExpertPlacement& current, std::span<const double> load, double min_gain);

}  // namespace deepinfer::parallel
