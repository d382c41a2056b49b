// EPLB placement: replication, capacity-constrained LPT packing, swap local search; the load
// window and the rebalance decision. See eplb.h for the contract, docs/PARALLEL-ALGORITHMS.md for
// measurements.
#include "parallel/eplb.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace deepinfer::parallel {
namespace {

constexpr int kTargetSteps = 49;  // replication targets 0.3, 0.325, ..., 1.5 x the mean rank load
constexpr size_t kPolished = 3;   // candidates that get the local search

void check_sizes(int64_t num_logical, int64_t num_ranks, int64_t slots_per_rank) {
  if (num_logical < 1) DI_THROW(InvalidArgument, "eplb: num_logical must be >= 1, got ", num_logical);
  if (num_ranks < 1) DI_THROW(InvalidArgument, "eplb: num_ranks must be >= 1, got ", num_ranks);
  if (slots_per_rank < 1) DI_THROW(InvalidArgument, "eplb: slots_per_rank must be >= 1, got ", slots_per_rank);
  const int64_t physical = num_ranks * slots_per_rank;
  if (physical > std::numeric_limits<int32_t>::max())
    DI_THROW(InvalidArgument, "eplb: num_ranks x slots_per_rank = ", physical, " physical experts is too many");
  if (physical < num_logical)
    DI_THROW(InvalidArgument, "eplb: ", num_ranks, " ranks x ", slots_per_rank, " slots = ", physical,
             " physical experts cannot hold ", num_logical, " logical experts");
}

void check_load(std::span<const double> load, int32_t num_logical) {
  if (int64_t(load.size()) != num_logical)
    DI_THROW(InvalidArgument, "eplb: load has ", load.size(), " entries, expected num_logical = ", num_logical);
  for (size_t e = 0; e < load.size(); ++e)
    if (!std::isfinite(load[e]) || load[e] < 0)
      DI_THROW(InvalidArgument, "eplb: load[", e, "] = ", load[e], " (must be finite and >= 0)");
}

// Fills logical_to_physical from physical_to_logical (ascending physical index by construction).
ExpertPlacement make_placement(int32_t num_logical, int32_t num_ranks, int32_t slots_per_rank,
                               std::vector<int32_t> physical_to_logical) {
  ExpertPlacement p;
  p.num_logical = num_logical;
  p.num_ranks = num_ranks;
  p.slots_per_rank = slots_per_rank;
  p.physical_to_logical = std::move(physical_to_logical);
  p.logical_to_physical.assign(size_t(num_logical), {});
  for (int32_t phys = 0; phys < p.num_physical(); ++phys)
    p.logical_to_physical[size_t(p.physical_to_logical[size_t(phys)])].push_back(phys);
  return p;
}

// Adds copies to `count` [E] until it sums to `num_physical`, one at a time to the expert that
// `before(e, b)` ranks first (ties to the lower index). Copies are capped at num_ranks while any
// expert is below that (then 2 x num_ranks, ...): a copy past R must share a rank with another
// copy of the same expert, which takes no load off that rank.
template <class Before>
void add_copies(std::vector<int32_t>& count, int32_t num_ranks, int64_t num_physical, Before before) {
  int64_t total = std::accumulate(count.begin(), count.end(), int64_t{0});
  int64_t cap = num_ranks;
  while (total < num_physical) {
    int64_t best = -1;
    for (size_t e = 0; e < count.size(); ++e)
      if (count[e] < cap && (best < 0 || before(e, size_t(best)))) best = int64_t(e);
    if (best < 0) {
      cap += num_ranks;
      continue;
    }
    ++count[size_t(best)];
    ++total;
  }
}

// Minimax replication: each extra slot to the highest load per replica (cross-multiplied, no
// division), ties to fewer replicas — an all-equal or all-zero load spreads its copies
// round-robin instead of piling them on expert 0. This minimises the largest replica.
std::vector<int32_t> replicate_minimax(std::span<const double> load, int32_t num_ranks, int64_t num_physical) {
  std::vector<int32_t> count(load.size(), 1);
  add_copies(count, num_ranks, num_physical, [&](size_t e, size_t b) {
    const double lhs = load[e] * count[b], rhs = load[b] * count[e];
    return lhs > rhs || (lhs == rhs && count[e] < count[b]);
  });
  return count;
}

// Target replication: just enough copies that every replica weighs <= `target` (at most R), the
// slots left over spread over the lightest experts as fillers. Minimax replication can leave more
// than R replicas heavier than half a rank's share, and two of them on one rank cost up to ~1.3x
// on skewed loads with few slots per rank; replicas sized to one rank's share pack far better.
// Empty when the target needs more slots than exist.
std::vector<int32_t> replicate_to_target(std::span<const double> load, int32_t num_ranks, int64_t num_physical,
                                         double target) {
  std::vector<int32_t> count(load.size());
  int64_t total = 0;
  for (size_t e = 0; e < load.size(); ++e) {
    count[e] = int32_t(std::clamp(std::ceil(load[e] / target), 1.0, double(num_ranks)));
    total += count[e];
  }
  if (total > num_physical) return {};
  add_copies(count, num_ranks, num_physical, [&](size_t e, size_t b) {
    return count[e] < count[b] || (count[e] == count[b] && load[e] < load[b]);
  });
  return count;
}

struct Replica {
  int32_t logical;
  double weight;  // load / replicas
};

// The state the packing and the local search share: each rank's replicas and their load sum.
struct Packing {
  int32_t num_logical;
  std::vector<std::vector<Replica>> items;  // [R][<= S]
  std::vector<double> load;                 // [R]
  std::vector<int32_t> holds;               // [R * E] copies of each logical on each rank

  int32_t& held(size_t rank, int32_t logical) { return holds[rank * size_t(num_logical) + size_t(logical)]; }
  void add(size_t rank, const Replica& r) {
    items[rank].push_back(r);
    load[rank] += r.weight;
    ++held(rank, r.logical);
  }
  void resum(size_t rank) {
    double s = 0;
    for (const Replica& r : items[rank]) s += r.weight;
    load[rank] = s;
  }
};

// The only ranks with a free slot already hold r's expert (late in the greedy pass, when few
// ranks have room): put r on a rank o that lacks it instead and move one of o's replicas, one
// that `free_rank` lacks, to `free_rank` — the one closest in weight to r, so loads barely change.
// False when no such exchange exists (then a duplicate is forced, e.g. more copies than ranks).
bool place_by_exchange(Packing& pk, const Replica& r, size_t free_rank) {
  int64_t best_o = -1;
  size_t best_y = 0;
  double best_diff = 0;
  for (size_t o = 0; o < pk.items.size(); ++o) {
    if (o == free_rank || pk.held(o, r.logical) > 0) continue;
    for (size_t y = 0; y < pk.items[o].size(); ++y) {
      const Replica& ry = pk.items[o][y];
      if (pk.held(free_rank, ry.logical) > 0) continue;
      const double diff = std::fabs(ry.weight - r.weight);
      if (best_o < 0 || diff < best_diff) best_o = int64_t(o), best_y = y, best_diff = diff;
    }
  }
  if (best_o < 0) return false;
  const size_t o = size_t(best_o);
  const Replica moved = pk.items[o][best_y];
  pk.items[o].erase(pk.items[o].begin() + int64_t(best_y));
  --pk.held(o, moved.logical);
  pk.resum(o);
  pk.add(free_rank, moved);
  pk.add(o, r);
  return true;
}

// Greedy LPT with capacity: heaviest replica first onto the least loaded rank that has a free
// slot, preferring ranks without that expert (a duplicate is only taken when forced).
Packing pack(std::span<const double> load, const std::vector<int32_t>& count, int32_t num_ranks,
             int32_t slots_per_rank) {
  const int32_t E = int32_t(load.size());
  std::vector<Replica> all;
  for (int32_t e = 0; e < E; ++e)
    for (int32_t c = 0; c < count[size_t(e)]; ++c) all.push_back({e, load[size_t(e)] / count[size_t(e)]});
  // Stable: equal weights keep (logical, replica) order, so ties go by index.
  std::stable_sort(all.begin(), all.end(), [](const Replica& a, const Replica& b) { return a.weight > b.weight; });

  Packing pk{E, std::vector<std::vector<Replica>>(size_t(num_ranks)), std::vector<double>(size_t(num_ranks), 0.0),
             std::vector<int32_t>(size_t(num_ranks) * size_t(E), 0)};
  for (const Replica& r : all) {
    int64_t best = -1;
    bool best_fresh = false;
    for (size_t k = 0; k < size_t(num_ranks); ++k) {
      if (int32_t(pk.items[k].size()) >= slots_per_rank) continue;
      const bool fresh = pk.held(k, r.logical) == 0;
      if (best < 0 || (fresh && !best_fresh) || (fresh == best_fresh && pk.load[k] < pk.load[size_t(best)])) {
        best = int64_t(k);
        best_fresh = fresh;
      }
    }
    DI_CHECK(best >= 0, "eplb: no free slot for logical ", r.logical);
    if (!best_fresh && place_by_exchange(pk, r, size_t(best))) continue;
    pk.add(size_t(best), r);
  }
  return pk;
}

// One improving swap between the heaviest rank and another, the one that lowers max(the two
// loads) the most; false when none lowers it (then no single swap can lower the maximum).
bool improve_once(Packing& pk) {
  const size_t R = pk.items.size();
  const size_t h = size_t(std::max_element(pk.load.begin(), pk.load.end()) - pk.load.begin());
  const double top = pk.load[h];
  // A relative margin keeps rounding noise from counting as an improvement (and from cycling).
  double best_max = top - 1e-12 * std::max(1.0, top);
  int64_t best_o = -1;
  size_t best_a = 0, best_b = 0;
  for (size_t o = 0; o < R; ++o) {
    if (o == h) continue;
    for (size_t a = 0; a < pk.items[h].size(); ++a) {
      const Replica& ra = pk.items[h][a];
      if (pk.held(o, ra.logical) > 0) continue;  // would put a second copy on o
      for (size_t b = 0; b < pk.items[o].size(); ++b) {
        const Replica& rb = pk.items[o][b];
        const double d = ra.weight - rb.weight;
        if (d <= 0 || pk.held(h, rb.logical) > 0) continue;
        const double m = std::max(top - d, pk.load[o] + d);
        if (m < best_max) {
          best_max = m;
          best_o = int64_t(o);
          best_a = a;
          best_b = b;
        }
      }
    }
  }
  if (best_o < 0) return false;
  const size_t o = size_t(best_o);
  Replica& ra = pk.items[h][best_a];
  Replica& rb = pk.items[o][best_b];
  --pk.held(h, ra.logical), ++pk.held(o, ra.logical);
  --pk.held(o, rb.logical), ++pk.held(h, rb.logical);
  std::swap(ra, rb);
  pk.resum(h);
  pk.resum(o);
  return true;
}

}  // namespace

std::vector<int32_t> ExpertPlacement::local_logical(int32_t rank) const {
  if (rank < 0 || rank >= num_ranks)
    DI_THROW(InvalidArgument, "eplb: rank ", rank, " out of range [0, ", num_ranks, ")");
  const auto first = physical_to_logical.begin() + int64_t(rank) * slots_per_rank;
  return std::vector<int32_t>(first, first + slots_per_rank);
}

void ExpertPlacement::validate() const {
  check_sizes(num_logical, num_ranks, slots_per_rank);
  if (int64_t(physical_to_logical.size()) != int64_t(num_ranks) * slots_per_rank)
    DI_THROW(InvalidArgument, "eplb: physical_to_logical has ", physical_to_logical.size(), " entries, expected ",
             int64_t(num_ranks) * slots_per_rank);
  if (int64_t(logical_to_physical.size()) != num_logical)
    DI_THROW(InvalidArgument, "eplb: logical_to_physical has ", logical_to_physical.size(), " entries, expected ",
             num_logical);
  for (size_t p = 0; p < physical_to_logical.size(); ++p)
    if (physical_to_logical[p] < 0 || physical_to_logical[p] >= num_logical)
      DI_THROW(InvalidArgument, "eplb: physical_to_logical[", p, "] = ", physical_to_logical[p], " out of range");
  size_t listed = 0;
  for (size_t e = 0; e < logical_to_physical.size(); ++e) {
    const auto& reps = logical_to_physical[e];
    if (reps.empty()) DI_THROW(InvalidArgument, "eplb: logical expert ", e, " has no physical replica");
    for (size_t i = 0; i < reps.size(); ++i) {
      const int32_t p = reps[i];
      if (p < 0 || p >= int32_t(physical_to_logical.size()) || physical_to_logical[size_t(p)] != int32_t(e))
        DI_THROW(InvalidArgument, "eplb: logical_to_physical[", e, "][", i, "] = ", p,
                 " does not map back to logical ", e);
      if (i > 0 && reps[i - 1] >= p)
        DI_THROW(InvalidArgument, "eplb: logical_to_physical[", e, "] is not strictly ascending at ", i);
    }
    listed += reps.size();
  }
  // Every list entry maps back and lists are strictly ascending, so equal totals mean a bijection.
  if (listed != physical_to_logical.size())
    DI_THROW(InvalidArgument, "eplb: logical_to_physical lists ", listed, " replicas for ",
             physical_to_logical.size(), " physical slots");
}

ExpertPlacement contiguous_placement(int32_t num_logical, int32_t num_ranks, int32_t slots_per_rank) {
  check_sizes(num_logical, num_ranks, slots_per_rank);
  std::vector<int32_t> p2l(size_t(num_ranks) * size_t(slots_per_rank));
  for (size_t p = 0; p < p2l.size(); ++p) p2l[p] = int32_t(p % size_t(num_logical));
  return make_placement(num_logical, num_ranks, slots_per_rank, std::move(p2l));
}

namespace {

// Replication candidates: minimax first, then replicas sized to a grid of fractions of a rank's
// mean load (a heuristic scan: which target packs best depends on the load's shape).
std::vector<std::vector<int32_t>> replication_candidates(std::span<const double> load, int32_t num_ranks,
                                                         int64_t num_physical) {
  std::vector<std::vector<int32_t>> out = {replicate_minimax(load, num_ranks, num_physical)};
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / num_ranks;
  if (!(mean > 0)) return out;
  for (int k = 0; k < kTargetSteps; ++k) {
    std::vector<int32_t> c = replicate_to_target(load, num_ranks, num_physical, mean * (0.3 + 0.025 * k));
    if (!c.empty() && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

ExpertPlacement balanced_placement(std::span<const double> load, int32_t num_ranks, int32_t slots_per_rank) {
  check_sizes(int64_t(load.size()), num_ranks, slots_per_rank);
  const int32_t E = int32_t(load.size());
  check_load(load, E);
  // Pack every candidate greedily (cheap), polish the best few with the local search (the
  // expensive part), keep the best; exact comparisons and first-wins ties keep it deterministic.
  std::vector<Packing> packed;
  for (const auto& count : replication_candidates(load, num_ranks, int64_t(num_ranks) * slots_per_rank))
    packed.push_back(pack(load, count, num_ranks, slots_per_rank));
  auto max_load = [](const Packing& pk) { return *std::max_element(pk.load.begin(), pk.load.end()); };
  std::vector<size_t> order(packed.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return max_load(packed[a]) < max_load(packed[b]); });
  const Packing* best = nullptr;
  for (size_t i = 0; i < std::min<size_t>(kPolished, order.size()); ++i) {
    Packing& pk = packed[order[i]];
    // Each swap lowers the sorted load vector lexicographically, so this ends; the bound is a guard.
    const int64_t max_swaps = 4 * int64_t(num_ranks) * slots_per_rank;
    for (int64_t n = 0; n < max_swaps && improve_once(pk); ++n) {
    }
    if (best == nullptr || max_load(pk) < max_load(*best)) best = &pk;
  }
  std::vector<int32_t> p2l;
  p2l.reserve(size_t(num_ranks) * size_t(slots_per_rank));
  for (const auto& items : best->items) {
    std::vector<int32_t> ids;
    for (const Replica& r : items) ids.push_back(r.logical);
    std::sort(ids.begin(), ids.end());
    p2l.insert(p2l.end(), ids.begin(), ids.end());
  }
  return make_placement(E, num_ranks, slots_per_rank, std::move(p2l));
}

std::vector<double> rank_loads(const ExpertPlacement& placement, std::span<const double> load) {
  placement.validate();
  check_load(load, placement.num_logical);
  std::vector<double> per_rank(size_t(placement.num_ranks), 0.0);
  for (int32_t p = 0; p < placement.num_physical(); ++p) {
    const size_t e = size_t(placement.physical_to_logical[size_t(p)]);
    per_rank[size_t(placement.rank_of(p))] += load[e] / double(placement.logical_to_physical[e].size());
  }
  return per_rank;
}

double balance_ratio(const ExpertPlacement& placement, std::span<const double> load) {
  const std::vector<double> per_rank = rank_loads(placement, load);
  const double total = std::accumulate(per_rank.begin(), per_rank.end(), 0.0);
  if (total <= 0) return 1.0;
  return *std::max_element(per_rank.begin(), per_rank.end()) / (total / double(per_rank.size()));
}

ExpertLoadWindow::ExpertLoadWindow(int32_t num_layers, int32_t num_logical, int32_t window_steps)
    : num_layers_(num_layers), num_logical_(num_logical), window_steps_(window_steps) {
  if (num_layers < 1) DI_THROW(InvalidArgument, "eplb: ExpertLoadWindow num_layers must be >= 1, got ", num_layers);
  if (num_logical < 1) DI_THROW(InvalidArgument, "eplb: ExpertLoadWindow num_logical must be >= 1, got ", num_logical);
  if (window_steps < 1)
    DI_THROW(InvalidArgument, "eplb: ExpertLoadWindow window_steps must be >= 1, got ", window_steps);
  const size_t per_step = size_t(num_layers) * size_t(num_logical);
  ring_.assign(per_step * size_t(window_steps), 0);
  sum_.assign(per_step, 0);
}

void ExpertLoadWindow::add_step(std::span<const int64_t> counts) {
  const size_t per_step = sum_.size();
  if (counts.size() != per_step)
    DI_THROW(InvalidArgument, "eplb: add_step got ", counts.size(), " counts, expected num_layers x num_logical = ",
             num_layers_, " x ", num_logical_, " = ", per_step);
  // Check everything before changing anything, so a bad step leaves the window as it was.
  int64_t* slot = ring_.data() + size_t(next_) * per_step;
  for (size_t i = 0; i < per_step; ++i) {
    if (counts[i] < 0)
      DI_THROW(InvalidArgument, "eplb: add_step count for layer ", i / size_t(num_logical_), " expert ",
               i % size_t(num_logical_), " is negative (", counts[i], ")");
    int64_t next_sum = 0;
    if (__builtin_add_overflow(sum_[i] - slot[i], counts[i], &next_sum))
      DI_THROW(InvalidArgument, "eplb: add_step count for layer ", i / size_t(num_logical_), " expert ",
               i % size_t(num_logical_), " overflows the window sum (", counts[i], ")");
  }
  for (size_t i = 0; i < per_step; ++i) {
    sum_[i] += counts[i] - slot[i];
    slot[i] = counts[i];
  }
  next_ = (next_ + 1) % window_steps_;
  filled_ = std::min<int64_t>(filled_ + 1, window_steps_);
}

std::vector<double> ExpertLoadWindow::layer_load(int32_t layer) const {
  if (layer < 0 || layer >= num_layers_)
    DI_THROW(InvalidArgument, "eplb: layer ", layer, " out of range [0, ", num_layers_, ")");
  const auto first = sum_.begin() + int64_t(layer) * num_logical_;
  return std::vector<double>(first, first + num_logical_);
}

namespace {

// Multiset intersection size of two ranks' logical ids; `scratch` [E] is all zero on entry and exit.
int32_t shared_experts(std::span<const int32_t> a, std::span<const int32_t> b, std::vector<int32_t>& scratch) {
  for (int32_t e : a) ++scratch[size_t(e)];
  int32_t n = 0;
  for (int32_t e : b)
    if (scratch[size_t(e)] > 0) --scratch[size_t(e)], ++n;
  for (int32_t e : a) scratch[size_t(e)] = 0;
  return n;
}

// `fresh` relabelled to move as few experts as possible relative to `current` (same shape): ranks
// are interchangeable for balance, so match them greedily by shared experts, then keep each shared
// expert in the slot it has now and fill the other slots in ascending logical order.
ExpertPlacement align_to(const ExpertPlacement& fresh, const ExpertPlacement& current) {
  const size_t R = size_t(fresh.num_ranks), S = size_t(fresh.slots_per_rank);
  std::span<const int32_t> f(fresh.physical_to_logical), c(current.physical_to_logical);
  std::vector<int32_t> scratch(size_t(fresh.num_logical), 0);
  struct Pair { int32_t shared; size_t fr, cr; };
  std::vector<Pair> pairs;
  pairs.reserve(R * R);
  for (size_t fr = 0; fr < R; ++fr)
    for (size_t cr = 0; cr < R; ++cr)
      pairs.push_back({shared_experts(f.subspan(fr * S, S), c.subspan(cr * S, S), scratch), fr, cr});
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) { return a.shared > b.shared; });
  std::vector<int64_t> target(R, -1);  // fresh rank -> current rank position
  std::vector<bool> taken(R, false);
  for (const Pair& pr : pairs)
    if (target[pr.fr] < 0 && !taken[pr.cr]) target[pr.fr] = int64_t(pr.cr), taken[pr.cr] = true;

  std::vector<int32_t> p2l(R * S, -1);
  for (size_t fr = 0; fr < R; ++fr) {
    const size_t cr = size_t(target[fr]);
    std::vector<int32_t> left(f.begin() + int64_t(fr * S), f.begin() + int64_t((fr + 1) * S));  // ascending
    for (size_t s = 0; s < S; ++s) {
      auto it = std::find(left.begin(), left.end(), c[cr * S + s]);
      if (it != left.end()) p2l[cr * S + s] = *it, left.erase(it);
    }
    size_t next = 0;
    for (size_t s = 0; s < S; ++s)
      if (p2l[cr * S + s] < 0) p2l[cr * S + s] = left[next++];
  }
  return make_placement(fresh.num_logical, fresh.num_ranks, fresh.slots_per_rank, std::move(p2l));
}

}  // namespace

Rebalance plan_rebalance(const ExpertPlacement& current, std::span<const double> load, double min_gain) {
  if (!std::isfinite(min_gain) || min_gain < 0)
    DI_THROW(InvalidArgument, "eplb: min_gain must be finite and >= 0, got ", min_gain);
  Rebalance out;
  out.before = balance_ratio(current, load);  // validates current and load
  ExpertPlacement fresh =
      align_to(balanced_placement(load, current.num_ranks, current.slots_per_rank), current);
  out.after = balance_ratio(fresh, load);
  out.worth_it = out.before - out.after > min_gain;
  if (!out.worth_it) {
    out.placement = current;
    return out;
  }
  for (size_t p = 0; p < fresh.physical_to_logical.size(); ++p)
    out.slots_changed += int32_t(fresh.physical_to_logical[p] != current.physical_to_logical[p]);
  out.placement = std::move(fresh);
  return out;
}

std::vector<bool> ExpertShard::held(int32_t experts) const {
  const ExpertPlacement p = placement(experts);
  const int32_t S = p.slots_per_rank;
  std::vector<bool> out(static_cast<size_t>(experts), false);
  for (int32_t s = 0; s < S; ++s) out[size_t(p.physical_to_logical[size_t(rank * S + s)])] = true;
  return out;
}

}  // namespace deepinfer::parallel
