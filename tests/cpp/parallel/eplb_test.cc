// EPLB placement on skewed loads: validity, balance before (contiguous) / after (balanced),
// determinism, the rebalance hysteresis, the load window, and errors for bad sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "deepinfer/error.h"
#include "parallel/eplb.h"

using namespace deepinfer;
using namespace deepinfer::parallel;

namespace {

// Zipf(s) loads over E experts, shuffled with a fixed seed (hot experts land anywhere, as in a
// trained router), scaled to about 1e6 tokens.
std::vector<double> zipf(int32_t E, double s, uint64_t seed = 1) {
  std::vector<double> load(static_cast<size_t>(E));
  for (int32_t i = 0; i < E; ++i) load[size_t(i)] = std::round(1e6 / std::pow(double(i + 1), s));
  std::mt19937_64 rng(seed);
  for (size_t i = load.size(); i > 1; --i) std::swap(load[i - 1], load[size_t(rng() % i)]);  // Fisher-Yates
  return load;
}

// Token counts a top-k router with Zipf(s) expert popularity hands out in one window: `picks`
// draws (tokens x k), so the load is noisy rather than an exact power law.
std::vector<double> router_draws(int32_t E, double s, int64_t picks, uint64_t seed = 2) {
  std::vector<double> p = zipf(E, s, seed);
  std::mt19937_64 rng(seed);
  std::discrete_distribution<int32_t> pick(p.begin(), p.end());
  std::vector<double> load(p.size(), 0.0);
  for (int64_t i = 0; i < picks; ++i) load[size_t(pick(rng))] += 1;
  return load;
}

// Every rank holds each logical at most once unless the replica count forces more.
void expect_no_needless_duplicates(const ExpertPlacement& p) {
  for (int32_t r = 0; r < p.num_ranks; ++r) {
    std::vector<int32_t> ids = p.local_logical(r);
    std::sort(ids.begin(), ids.end());
    for (size_t i = 1; i < ids.size(); ++i)
      if (ids[i] == ids[i - 1]) {
        EXPECT_GT(int32_t(p.logical_to_physical[size_t(ids[i])].size()), p.num_ranks)
            << "rank " << r << " holds logical " << ids[i] << " twice";
      }
  }
}

struct Case {
  const char* name;
  std::vector<double> load;
  int32_t ranks, slots;
  double max_after;  // asserted bound on the balanced ratio
};

}  // namespace

TEST(Eplb, ContiguousPlacement) {
  ExpertPlacement p = contiguous_placement(10, 4, 3);  // 12 slots: 10 experts, then copies of 0 and 1
  p.validate();
  EXPECT_EQ(p.physical_to_logical, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1}));
  EXPECT_EQ(p.logical_to_physical[0], (std::vector<int32_t>{0, 10}));
  EXPECT_EQ(p.logical_to_physical[9], (std::vector<int32_t>{9}));
  EXPECT_EQ(p.local_logical(3), (std::vector<int32_t>{9, 0, 1}));
  EXPECT_EQ(p.rank_of(7), 2);
  std::vector<double> load(10, 1.0);
  // Ranks: {0,1,2} = .5+.5+1, {3,4,5} = 3, {6,7,8} = 3, {9,0,1} = 1+.5+.5.
  EXPECT_EQ(rank_loads(p, load), (std::vector<double>{2, 3, 3, 2}));
  EXPECT_DOUBLE_EQ(balance_ratio(p, load), 3.0 / 2.5);
}

TEST(Eplb, SkewedLoadsBalanceBeforeAfter) {
  std::vector<double> one_hot(64, 100.0);
  one_hot[17] = 100000.0;
  std::vector<Case> cases = {
      // The brief's reference case: we get 1.0000 (DeepSeek's EPLB global policy: 1.0002).
      {"zipf1.0 E256 R16 S18 (32 redundant)", zipf(256, 1.0), 16, 18, 1.001},
      {"zipf1.0 E256 R8 S36 (32 redundant)", zipf(256, 1.0), 8, 36, 1.001},
      {"zipf1.0 E256 R64 S5 (64 redundant)", zipf(256, 1.0), 64, 5, 1.002},
      {"zipf1.5 E256 R16 S18 (32 redundant)", zipf(256, 1.5), 16, 18, 1.001},
      // Minimax replication alone gives 1.2821 here (as DeepSeek's does); target replication 1.0002.
      {"zipf1.5 E256 R64 S5 (64 redundant)", zipf(256, 1.5), 64, 5, 1.005},
      {"router draws zipf1.2 R64 S5", router_draws(256, 1.2, 4096 * 8), 64, 5, 1.01},
      // The hottest expert alone is 2.61x a rank's share: 2.7699 is the floor, reached.
      {"zipf1.0 E256 R16 S16 (no redundancy)", zipf(256, 1.0), 16, 16, 2.78},
      {"zipf1.0 E250 R16 S16 (E % R != 0)", zipf(250, 1.0), 16, 16, 1.001},
      {"one hot E64 R8 S9 (8 redundant)", one_hot, 8, 9, 1.005},
      {"all equal E256 R16 S17", std::vector<double>(256, 7.0), 16, 17, 1.0 + 1e-12},
      {"all equal E256 R16 S16", std::vector<double>(256, 7.0), 16, 16, 1.0 + 1e-12},
  };
  for (const Case& c : cases) {
    const int32_t E = int32_t(c.load.size());
    const ExpertPlacement before = contiguous_placement(E, c.ranks, c.slots);
    const ExpertPlacement after = balanced_placement(c.load, c.ranks, c.slots);
    after.validate();
    expect_no_needless_duplicates(after);
    const double rb = balance_ratio(before, c.load), ra = balance_ratio(after, c.load);
    EXPECT_GE(ra, 1.0 - 1e-12) << c.name;
    EXPECT_LE(ra, c.max_after) << c.name;
    EXPECT_LE(ra, rb + 1e-12) << c.name;
    // Floor for this replication: the rank holding the heaviest replica also holds S-1 others,
    // at least the S-1 lightest. The packing must come close to it.
    std::vector<double> w;
    for (size_t e = 0; e < c.load.size(); ++e)
      for (size_t k = 0; k < after.logical_to_physical[e].size(); ++k)
        w.push_back(c.load[e] / double(after.logical_to_physical[e].size()));
    std::sort(w.begin(), w.end());
    const double total = std::accumulate(w.begin(), w.end(), 0.0), mean = total / c.ranks;
    const double floor = std::max(1.0, (w.back() + std::accumulate(w.begin(), w.begin() + (c.slots - 1), 0.0)) / mean);
    std::printf("  %-40s contiguous %.4f -> balanced %.4f (floor %.4f)\n", c.name, rb, ra, floor);
    EXPECT_GE(ra, floor * (1 - 1e-12)) << c.name;
    EXPECT_LE(ra, std::max(floor * 1.01, 1.002)) << c.name;
  }
}

TEST(Eplb, ReplicationFollowsLoadPerReplica) {
  // 4 experts, loads 8,4,2,1, 4 extra slots: copies go to 8 (->4 each), then 8 again or 4 ...
  // greedy max load-per-replica: 8/1 -> 8 gets 2; 4 vs 8/2=4 tie, fewer replicas wins -> 4 gets 2;
  // then 8/2=4 -> 3 copies; then 4/2 = 2, 8/3 = 2.67 -> 8 gets 4.
  std::vector<double> load = {8, 4, 2, 1};
  ExpertPlacement p = balanced_placement(load, 4, 2);
  EXPECT_EQ(p.logical_to_physical[0].size(), 4u);
  EXPECT_EQ(p.logical_to_physical[1].size(), 2u);
  EXPECT_EQ(p.logical_to_physical[2].size(), 1u);
  EXPECT_EQ(p.logical_to_physical[3].size(), 1u);
  // Replicas 2,2,2,2,2,2,2,1 over 4 ranks x 2: the optimum (4,4,4,3) is reached.
  EXPECT_DOUBLE_EQ(balance_ratio(p, load), 4.0 / 3.75);
  expect_no_needless_duplicates(p);
}

TEST(Eplb, ZerosAndTinyShapes) {
  // All-zero load: a valid placement, copies spread round-robin, ratio 1.
  ExpertPlacement z = balanced_placement(std::vector<double>(10, 0.0), 4, 4);
  z.validate();
  for (const auto& reps : z.logical_to_physical) EXPECT_LE(reps.size(), 2u);
  EXPECT_EQ(balance_ratio(z, std::vector<double>(10, 0.0)), 1.0);
  // One rank, one expert, many slots: duplicates are forced and allowed.
  ExpertPlacement one = balanced_placement(std::vector<double>{5.0}, 1, 3);
  one.validate();
  EXPECT_EQ(one.physical_to_logical, (std::vector<int32_t>{0, 0, 0}));
  // More replicas than ranks: forced duplicates, still valid and balanced.
  std::vector<double> hot = {1000, 1, 1, 1};
  ExpertPlacement forced = balanced_placement(hot, 2, 8);
  forced.validate();
  expect_no_needless_duplicates(forced);
  EXPECT_LE(balance_ratio(forced, hot), 1.01);
}

TEST(Eplb, Deterministic) {
  for (double s : {1.0, 1.5}) {
    const std::vector<double> load = zipf(256, s, 7);
    for (int32_t R : {8, 16, 64}) {
      const int32_t S = 256 / R + 2;
      EXPECT_EQ(balanced_placement(load, R, S), balanced_placement(load, R, S)) << s << " " << R;
    }
  }
  // Ties resolve by index: equal loads give the same placement as the contiguous one would, up to
  // the pack order; run twice and compare exactly.
  std::vector<double> flat(40, 3.0);
  EXPECT_EQ(balanced_placement(flat, 8, 6), balanced_placement(flat, 8, 6));
}

TEST(Eplb, RebalanceHysteresis) {
  const std::vector<double> load = zipf(256, 1.0, 3);
  const ExpertPlacement start = contiguous_placement(256, 16, 18);
  Rebalance first = plan_rebalance(start, load, 0.05);
  ASSERT_TRUE(first.worth_it);
  first.placement.validate();
  EXPECT_GT(first.before, first.after + 0.05);
  EXPECT_NEAR(first.after, balance_ratio(balanced_placement(load, 16, 18), load), 1e-9);  // relabelling is free
  EXPECT_GT(first.slots_changed, 0);
  EXPECT_LT(first.slots_changed, first.placement.num_physical());
  std::printf("  zipf1.0 E256 R16 S18 from contiguous: %.4f -> %.4f, %d of %d slots change\n", first.before,
              first.after, first.slots_changed, first.placement.num_physical());

  // The same load again, and a load with 1% noise: nothing worth moving.
  Rebalance again = plan_rebalance(first.placement, load, 0.05);
  EXPECT_FALSE(again.worth_it);
  EXPECT_EQ(again.placement, first.placement);
  EXPECT_EQ(again.slots_changed, 0);
  std::vector<double> noisy = load;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> jitter(0.99, 1.01);
  for (double& x : noisy) x = std::round(x * jitter(rng));
  Rebalance still = plan_rebalance(first.placement, noisy, 0.05);
  EXPECT_FALSE(still.worth_it) << still.before << " -> " << still.after;
  EXPECT_EQ(still.placement, first.placement);
  // min_gain 0 takes any strict improvement; a shifted hot set is worth it at 0.05 too.
  Rebalance shifted = plan_rebalance(first.placement, zipf(256, 1.0, 99), 0.05);
  EXPECT_TRUE(shifted.worth_it);
  shifted.placement.validate();
}

TEST(Eplb, RebalanceKeepsExpertsInPlace) {
  // A small hot-set change: the aligned placement moves far fewer slots than a fresh layout would.
  std::vector<double> load = zipf(64, 1.0, 5);
  ExpertPlacement cur = balanced_placement(load, 8, 9);
  std::vector<double> next = load;
  std::swap(next[0], next[63]);
  Rebalance r = plan_rebalance(cur, next, 0.0);
  ExpertPlacement fresh = balanced_placement(next, 8, 9);
  int32_t fresh_changed = 0;
  for (size_t p = 0; p < fresh.physical_to_logical.size(); ++p)
    fresh_changed += int32_t(fresh.physical_to_logical[p] != cur.physical_to_logical[p]);
  if (r.worth_it) {
    r.placement.validate();
    EXPECT_LE(r.slots_changed, fresh_changed);
    EXPECT_NEAR(r.after, balance_ratio(fresh, next), 1e-9);
  }
  std::printf("  swap of two experts' loads: worth_it %d, %.4f -> %.4f, %d slots change (unaligned %d)\n",
              int(r.worth_it), r.before, r.after, r.slots_changed, fresh_changed);
}

TEST(Eplb, LoadWindow) {
  ExpertLoadWindow w(2, 3, 2);  // 2 layers x 3 experts, last 2 steps
  EXPECT_EQ(w.steps(), 0);
  EXPECT_EQ(w.layer_load(1), (std::vector<double>{0, 0, 0}));
  w.add_step(std::vector<int64_t>{1, 2, 3, 10, 20, 30});
  w.add_step(std::vector<int64_t>{4, 5, 6, 40, 50, 60});
  EXPECT_EQ(w.steps(), 2);
  EXPECT_EQ(w.layer_load(0), (std::vector<double>{5, 7, 9}));
  w.add_step(std::vector<int64_t>{100, 0, 0, 0, 0, 1});  // the first step drops out
  EXPECT_EQ(w.steps(), 2);
  EXPECT_EQ(w.layer_load(0), (std::vector<double>{104, 5, 6}));
  EXPECT_EQ(w.layer_load(1), (std::vector<double>{40, 50, 61}));
  // A bad step is refused whole and changes nothing.
  EXPECT_THROW(w.add_step(std::vector<int64_t>{1, 1, 1, 1, 1, -1}), InvalidArgument);
  EXPECT_THROW(w.add_step(std::vector<int64_t>{1, 2, 3}), InvalidArgument);
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(w.add_step(std::vector<int64_t>{big, 0, 0, 0, 0, 0}), InvalidArgument);
  EXPECT_EQ(w.layer_load(0), (std::vector<double>{104, 5, 6}));
  EXPECT_EQ(w.steps(), 2);
  EXPECT_THROW(w.layer_load(2), InvalidArgument);
  EXPECT_THROW(w.layer_load(-1), InvalidArgument);
  EXPECT_THROW(ExpertLoadWindow(0, 3, 2), InvalidArgument);
  EXPECT_THROW(ExpertLoadWindow(2, 0, 2), InvalidArgument);
  EXPECT_THROW(ExpertLoadWindow(2, 3, 0), InvalidArgument);
}

TEST(Eplb, BadSizesAndLoads) {
  EXPECT_THROW(contiguous_placement(0, 4, 4), InvalidArgument);
  EXPECT_THROW(contiguous_placement(4, 0, 4), InvalidArgument);
  EXPECT_THROW(contiguous_placement(4, 4, 0), InvalidArgument);
  EXPECT_THROW(contiguous_placement(17, 4, 4), InvalidArgument);  // 16 slots < 17 experts
  EXPECT_THROW(contiguous_placement(4, 1 << 20, 1 << 12), InvalidArgument);  // int32 overflow
  EXPECT_THROW(balanced_placement(std::vector<double>{}, 4, 4), InvalidArgument);
  EXPECT_THROW(balanced_placement(std::vector<double>(17, 1.0), 4, 4), InvalidArgument);
  EXPECT_THROW(balanced_placement(std::vector<double>{1, -1}, 2, 1), InvalidArgument);
  EXPECT_THROW(balanced_placement(std::vector<double>{1, std::nan("")}, 2, 1), InvalidArgument);
  EXPECT_THROW(balanced_placement(std::vector<double>{1, INFINITY}, 2, 1), InvalidArgument);
  const ExpertPlacement p = contiguous_placement(6, 2, 4);
  EXPECT_THROW(balance_ratio(p, std::vector<double>(5, 1.0)), InvalidArgument);
  EXPECT_THROW(p.local_logical(2), InvalidArgument);
  EXPECT_THROW(plan_rebalance(p, std::vector<double>(6, 1.0), -0.1), InvalidArgument);
  EXPECT_THROW(plan_rebalance(p, std::vector<double>(6, 1.0), NAN), InvalidArgument);
  try {
    (void)contiguous_placement(17, 4, 4);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold 17 logical experts"), std::string::npos) << e.what();
  }
}

TEST(Eplb, ValidateCatchesInconsistentTables) {
  const ExpertPlacement good = contiguous_placement(6, 2, 4);
  good.validate();
  auto expect_bad = [](ExpertPlacement p, const char* what) {
    try {
      p.validate();
      ADD_FAILURE() << "validate accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("eplb:"), std::string::npos) << e.what();
    }
  };
  ExpertPlacement p = good;
  p.physical_to_logical[7] = 6;  // out of range
  expect_bad(p, "logical id out of range");
  p = good;
  p.physical_to_logical[6] = 2;  // table says 0, list says 0: now they disagree
  expect_bad(p, "tables disagree");
  p = good;
  p.logical_to_physical[5].clear();  // no replica
  expect_bad(p, "expert without replica");
  p = good;
  std::swap(p.logical_to_physical[0][0], p.logical_to_physical[0][1]);
  expect_bad(p, "descending replica list");
  p = good;
  p.physical_to_logical.pop_back();
  expect_bad(p, "short physical table");
  p = good;
  p.logical_to_physical[1].push_back(1);  // listed twice
  expect_bad(p, "duplicate replica");
}
