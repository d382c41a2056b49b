// Expert parallelism on CPU ranks (threads of this process, one gloo group, one model each): every
// rank runs its own sequence in its own chunks (attention data parallelism), with steps where a
// rank has no tokens at all, while the routed experts of the main layers are sharded across the
// ranks. Each rank's logits must equal its sequence run alone on one rank: to the CPU's GEMM
// tolerance (an expert now sees other ranks' rows too, so its GEMMs have another M) with the same
// greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "golden.h"
#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek/expert_parallel.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v41/model.h"
#include "model/sequence_runner.h"
#include "parallel/gloo_group.h"
#include "parallel/launcher.h"

namespace deepinfer::testing {
namespace {
using model::ds::ExpertParallel;

struct RankWork {
  std::vector<int32_t> ids;
  std::vector<int64_t> chunks;     // per lockstep step; 0 = this rank has no tokens that step
  std::vector<float> logits;       // [ids, V]
};

std::unique_ptr<model::v4::DeepseekV4Model> load(const std::string& dir,
                                                 std::optional<parallel::ExpertShard> shard = std::nullopt) {
  auto m = model::v4::DeepseekV4Model::load(dir, {.max_rollback = 5, .expert_shard = shard});
  m->allocate_cache_for(2, 512);
  return m;
}

// Runs every rank's chunks in lockstep: step s runs chunks[s] tokens of the rank's sequence (an
// empty batch when 0).
void run_rank(model::CausalLM& m, const kv::CacheGeometry& g, RankWork& w) {
  const int64_t V = m.vocab_size();
  m.reset_slot(0);
  model::SeqInBatch seq{.cache_slot = 0, .block_table = model::slot_block_table(g, 0)};
  w.logits.assign(w.ids.size() * size_t(V), 0.f);
  int64_t done = 0;
  for (int64_t c : w.chunks) {
    model::ForwardBatch b;
    if (c > 0) {
      b.token_ids.assign(w.ids.begin() + done, w.ids.begin() + done + c);
      seq.num_computed_tokens = done;
      seq.num_new_tokens = int32_t(c);
      b.seqs = {seq};
      for (int64_t i = 0; i < c; ++i) b.logits_indices.push_back(int32_t(i));
    }
    model::ForwardOutput o = m.run(b, {});
    if (c > 0) std::copy_n(o.logits.data<float>(), c * V, w.logits.data() + done * V);
    done += c;
  }
  ASSERT_EQ(done, int64_t(w.ids.size()));
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, int64_t V, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  float scale = 0.f, diff = 0.f;
  int64_t flips = 0;
  const int64_t rows = int64_t(a.size()) / V;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * V;
    const float* y = b.data() + r * V;
    for (int64_t v = 0; v < V; ++v) scale = std::max(scale, std::fabs(x[v])), diff = std::max(diff, std::fabs(x[v] - y[v]));
    flips += (std::max_element(x, x + V) - x) != (std::max_element(y, y + V) - y);
  }
  std::printf("[expert-parallel] %s: max|d| %.3g (rel %.3g), argmax flips %lld/%lld\n", what.c_str(), diff,
              diff / std::max(scale, 1e-30f), (long long)flips, (long long)rows);
  EXPECT_LE(diff, 1e-5f * std::max(scale, 1.f)) << what;
  EXPECT_EQ(flips, 0) << what;
}

// replicated: a balanced EPLB placement of a skewed load with one redundant slot per rank, so hot
// experts have replicas on several ranks. eplb: runtime rebalancing every 2 steps over a 3-step
// window (any gain taken), so the placement changes while sequences are mid-flight.
// sharded: each rank's model prepares only its contiguous share of the routed experts
// (ModelLoadOptions::expert_shard), as the data-parallel engine loads them without EPLB.
struct EpCase {
  int n;
  bool replicated, eplb, sharded = false;
};
class ExpertParallelCpu : public ::testing::TestWithParam<EpCase> {};

parallel::ExpertPlacement placement_for(int32_t experts, int n, bool replicated, int64_t layer) {
  const int32_t slots = (experts + n - 1) / n;
  if (!replicated) return parallel::contiguous_placement(experts, n, slots);
  std::vector<double> load(static_cast<size_t>(experts));
  for (int32_t e = 0; e < experts; ++e) load[size_t(e)] = double((e * 7 + layer * 3) % experts + 1) * (e % 3 == 0 ? 5 : 1);
  parallel::ExpertPlacement p = parallel::balanced_placement(load, n, slots + 1);
  p.validate();
  return p;
}

TEST_P(ExpertParallelCpu, RanksMatchSingleRank) {
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  const auto [n, replicated, eplb, sharded] = GetParam();
  const auto inputs = read_inputs(dir);
  const std::vector<int32_t> ids = inputs.count("long") ? inputs.at("long") : inputs.begin()->second;
  // Rank r: a different slice of the ids, different chunking; rank 1 idles for the first steps and
  // the last rank finishes early (zero-token steps at both ends).
  std::vector<RankWork> work(static_cast<size_t>(n));
  const int64_t steps = 9;
  for (int r = 0; r < n; ++r) {
    RankWork& w = work[size_t(r)];
    const int64_t len = std::min<int64_t>(int64_t(ids.size()) - 5 * r, 40 + 23 * r);
    w.ids.assign(ids.begin() + 5 * r, ids.begin() + 5 * r + len);
    std::vector<int64_t> cuts = random_chunks(len, uint32_t(17 + r));
    w.chunks.assign(size_t(steps), 0);
    // Squeeze the random cuts into `steps` lockstep steps: the first cuts as they are, the rest in the last used step.
    const int64_t first = r == 1 ? 3 : 0, last = r == n - 1 ? steps - 3 : steps;
    int64_t s = first;
    for (int64_t c : cuts) {
      w.chunks[size_t(s)] += c;
      if (s + 1 < last) ++s;
    }
  }
  // References: each rank's work alone on one rank, same cuts.
  std::vector<std::vector<float>> alone(static_cast<size_t>(n));
  {
    auto m = load(dir);
    for (int r = 0; r < n; ++r) {
      RankWork w = work[size_t(r)];
      run_rank(*m, m->cache_geometry(), w);
      alone[size_t(r)] = w.logits;
    }
  }
  parallel::RendezvousDir rdv;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  std::vector<std::vector<std::vector<int64_t>>> loads(static_cast<size_t>(n));
  std::vector<int64_t> received(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = parallel::make_gloo_group({.rendezvous_dir = rdv.path(), .name = "ep", .rank = r, .size = n,
                                             .timeout = std::chrono::milliseconds(60000)});
        auto m = sharded ? load(dir, parallel::ExpertShard{.rank = r, .size = n}) : load(dir);
        auto& be = static_cast<model::ds::CpuBackend&>(m->backend());
        const auto& g = m->arch().dims;
        if (sharded) {  // exactly this rank's experts are prepared, in every main layer
          const std::vector<bool> mine = parallel::ExpertShard{.rank = r, .size = n}.held(int32_t(g.experts));
          const int64_t slots = (g.experts + n - 1) / n;
          EXPECT_LE(std::count(mine.begin(), mine.end(), true), slots);
          for (const auto& L : m->backend().weights().layers)
            for (int64_t e = 0; e < g.experts; ++e) {
              const auto& ex = L.ffn.experts[size_t(e)];
              EXPECT_EQ(ex.w13.defined() && ex.w2.defined(), bool(mine[size_t(e)])) << "rank " << r << " expert " << e;
            }
        }
        std::vector<parallel::ExpertPlacement> layouts;
        for (int64_t l = 0; l < m->arch().plan.num_layers(); ++l)
          layouts.push_back(placement_for(int32_t(g.experts), n, replicated, l));
        auto ep = std::make_shared<ExpertParallel>(
            *pg, layouts, model::ds::EplbOptions{.enabled = eplb, .window_steps = 3, .step_interval = 2, .min_gain = 0.0});
        if (sharded && eplb) ep->set_weight_store(be.expert_weight_store());  // re-placements move weights
        be.set_expert_parallel(ep);
        EXPECT_TRUE(m->joins_collectives());
        run_rank(*m, m->cache_geometry(), work[size_t(r)]);
        loads[size_t(r)] = be.expert_parallel()->take_load();
        if (eplb) {
          EXPECT_GT(be.expert_parallel()->num_rebalances(), 0) << "rank " << r;
          EXPECT_GT(be.expert_parallel()->num_slots_moved(), 0) << "rank " << r;
        }
        if (sharded && eplb) {  // after the moves a rank holds exactly the experts of its slots, no more
          received[size_t(r)] = ep->num_experts_received();
          EXPECT_EQ(ep->num_experts_received(), ep->num_experts_released()) << "rank " << r;  // slots stay full
          for (int64_t l = 0; l < m->arch().plan.num_layers(); ++l) {
            const std::vector<int32_t> local = ep->layout(l).local_logical(r);
            for (int32_t e = 0; e < int32_t(g.experts); ++e)
              EXPECT_EQ(be.holds_expert(l, e), std::find(local.begin(), local.end(), e) != local.end())
                  << "rank " << r << " layer " << l << " expert " << e;
          }
        }
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  // Report every rank's error: the first one to fail is the cause, the others see its group close.
  bool failed = false;
  for (int r = 0; r < n; ++r) {
    if (!errors[size_t(r)]) continue;
    failed = true;
    try {
      std::rethrow_exception(errors[size_t(r)]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
  if (failed) return;
  if (sharded && eplb) {  // the placements changed, so some rank gained experts it did not load
    int64_t total = 0;
    for (int64_t c : received) total += c;
    std::printf("[expert-parallel] sharded EPLB: %lld experts moved between ranks\n", (long long)total);
    EXPECT_GT(total, 0);
  }
  const int64_t V = 0 + int64_t(work[0].logits.size() / work[0].ids.size());
  for (int r = 0; r < n; ++r) expect_close(alone[size_t(r)], work[size_t(r)].logits, V, "rank " + std::to_string(r));
  // Every assignment was counted once, on the rank that routed it: tokens x top-k per layer.
  for (int r = 0; r < n; ++r) {
    int64_t total = 0;
    for (int64_t c : loads[size_t(r)][0]) total += c;
    EXPECT_GT(total, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ExpertParallelCpu,
                         ::testing::Values(EpCase{2, false, false}, EpCase{3, false, false}, EpCase{3, true, false},
                                           EpCase{3, true, true}, EpCase{2, false, false, true},
                                           EpCase{3, false, false, true}, EpCase{2, false, true, true},
                                           EpCase{3, false, true, true}, EpCase{4, false, false, true},
                                           EpCase{4, false, true, true}));

// A sharded model refuses another rank's seat; on the CPU it takes EPLB (its weights can move).
// A store missing an expert of its slots is refused by the expert-parallel layer, naming it.
TEST(ExpertParallelCpu, ShardedModelRefusesAnotherRankAndMissingExperts) {
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  auto pg = parallel::make_single_rank_group();
  {
    auto half = load(dir, parallel::ExpertShard{.rank = 0, .size = 2});  // experts of rank 0 of 2 only
    auto& be = static_cast<model::ds::CpuBackend&>(half->backend());
    const int32_t E = int32_t(half->arch().dims.experts);
    ExpertParallel ep(*pg, {parallel::contiguous_placement(E, 1, E)});
    try {
      ep.set_weight_store(be.expert_weight_store());
      FAIL() << "a store missing experts was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("does not hold its weights"), std::string::npos) << e.what();
    }
    try {  // adopting a held expert, or bytes of the wrong size, is refused
      std::vector<std::byte> bytes(size_t(be.expert_bytes(0)));
      be.pack_expert(0, 0, bytes);
      be.adopt_expert(0, 0, bytes);
      FAIL() << "adopted an expert held already";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("held already"), std::string::npos) << e.what();
    }
    const int32_t last = E - 1;  // rank 1's: not held here
    ASSERT_FALSE(be.holds_expert(0, last));
    std::vector<std::byte> small(16);
    EXPECT_THROW(be.adopt_expert(0, last, small), InvalidArgument);
    // A round trip: pack expert 0, free it, adopt it back as expert `last`'s slot would.
    std::vector<std::byte> bytes(size_t(be.expert_bytes(0)));
    be.pack_expert(0, 0, bytes);
    be.release_expert(0, 0);
    EXPECT_FALSE(be.holds_expert(0, 0));
    be.adopt_expert(0, 0, bytes);
    std::vector<std::byte> again(bytes.size());
    be.pack_expert(0, 0, again);
    EXPECT_EQ(bytes, again);
  }
  auto m = load(dir, parallel::ExpertShard{.rank = 0, .size = 1});
  m->enable_expert_parallel(*pg, {.enable_eplb = true});
  EXPECT_TRUE(m->joins_collectives());
  auto other = load(dir, parallel::ExpertShard{.rank = 1, .size = 2});
  try {
    other->enable_expert_parallel(*pg, {});
    FAIL() << "a rank-1-of-2 shard joined a one-rank group";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2"), std::string::npos) << e.what();
  }
}

// DeepSeek-V4.1 (v41_a, v41_b: Engram, two-level top-k, QAT formats, the routed weight before w2)
// with each rank preparing only its shard of the routed experts: every rank's logits equal its
// sequence alone on one rank. Fixed-order products (DEEPINFER_BATCH_INVARIANT) make an expert's
// rows independent of which other rows share its GEMM, so the QAT roundings cannot flip and the
// logits must be bit-identical.
TEST(ExpertParallelCpu, V41ShardedRanksMatchSingleRankBitForBit) {
  for (const char* fixture : {"v41_a", "v41_b"}) {
    const std::string dir = golden_dir(fixture);
    if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
    auto load41 = [&](std::optional<parallel::ExpertShard> shard) {
      auto m = model::v41::DeepseekV41Model::load(dir, {.max_rollback = 4, .batch_invariant = true,
                                                        .expert_shard = shard});
      m->allocate_cache_for(1, 256);
      return m;
    };
    const std::vector<int32_t> ids = read_inputs(dir).at("t161");
    const int n = 2;
    std::vector<RankWork> work(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {  // rank 0: 3 steps, rank 1: idles the first step, then 2
      RankWork& w = work[size_t(r)];
      w.ids.assign(ids.begin() + 7 * r, ids.begin() + 7 * r + 90 + 31 * r);
      const int64_t len = int64_t(w.ids.size());
      w.chunks = r == 0 ? std::vector<int64_t>{37, 41, len - 78} : std::vector<int64_t>{0, 57, len - 57};
    }
    std::vector<std::vector<float>> alone(static_cast<size_t>(n));
    {
      auto m = load41(std::nullopt);
      for (int r = 0; r < n; ++r) {
        RankWork w = work[size_t(r)];
        w.chunks.erase(std::remove(w.chunks.begin(), w.chunks.end(), 0), w.chunks.end());
        run_rank(*m, m->cache_geometry(), w);
        alone[size_t(r)] = w.logits;
      }
    }
    parallel::RendezvousDir rdv;
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          auto pg = parallel::make_gloo_group({.rendezvous_dir = rdv.path(), .name = "ep41", .rank = r, .size = n,
                                               .timeout = std::chrono::milliseconds(60000)});
          const parallel::ExpertShard shard{.rank = r, .size = n};
          auto m = load41(shard);
          const std::vector<bool> mine = shard.held(int32_t(m->arch().dims.experts));
          for (const auto& L : m->backend().weights().layers)
            for (size_t e = 0; e < mine.size(); ++e)
              if (L.ffn.experts.at(e).w13.defined() != bool(mine[e])) errors[size_t(r)] += "expert held wrongly; ";
          m->enable_expert_parallel(*pg, {});
          run_rank(*m, m->cache_geometry(), work[size_t(r)]);
        } catch (const std::exception& e) {
          errors[size_t(r)] += e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) ASSERT_EQ(errors[size_t(r)], "") << fixture << " rank " << r;
    for (int r = 0; r < n; ++r) {
      const std::vector<float>& a = alone[size_t(r)];
      const std::vector<float>& b = work[size_t(r)].logits;
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << fixture << " rank " << r;
      expect_close(a, b, int64_t(a.size() / work[size_t(r)].ids.size()), std::string(fixture) + " rank " + std::to_string(r));
    }
  }
}

// A placement whose rank count is not the group's is refused, naming both.
TEST(ExpertParallelCpu, PlacementForAnotherGroupSizeRefused) {
  auto pg = parallel::make_single_rank_group();
  std::vector<parallel::ExpertPlacement> layouts{parallel::contiguous_placement(8, 2, 4)};
  try {
    ExpertParallel ep(*pg, layouts);
    FAIL() << "accepted a 2-rank placement in a 1-rank group";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("2 ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::testing
