// Context parallelism together with expert parallelism on CPU ranks (threads of this process, one
// gloo group for both, one model each): every rank runs the same prompt's prefill chunks in
// lockstep; a split step splits its attention core (context_parallel_test.cc) and its MoE: each
// rank runs its own experts on all of the step's tokens and the outputs are all-gathered, combined
// in the single rank's order. Afterwards every rank must hold one rank's KV state byte for byte
// and the same last-position logits bit for bit; the owner (rank 0) then decodes with the
// ordinary expert-parallel dispatch while the other ranks run empty steps that join its MoE
// exchanges, and must give one rank's tokens and logits bit for bit. Placements: contiguous,
// EPLB-balanced with replicas of hot experts on several ranks, sharded models (each rank loads
// only its slots' experts), and sharded with runtime EPLB moving experts between the steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "cp_test_util.h"
#include "golden.h"
#include "model/deepseek/context_parallel.h"
#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek/expert_parallel.h"
#include "parallel/eplb.h"
#include "parallel/gloo_group.h"
#include "parallel/launcher.h"

namespace deepinfer::testing {
namespace {
using model::ds::ContextParallel;
using model::ds::ExpertParallel;
using cp_util::Result;

enum class Experts { kContiguous, kReplicated, kSharded, kShardedEplb };
const char* name_of(Experts e) {
  switch (e) {
    case Experts::kContiguous: return "contiguous";
    case Experts::kReplicated: return "replicated";
    case Experts::kSharded: return "sharded";
    case Experts::kShardedEplb: return "sharded_eplb";
  }
  return "?";
}

struct CpEpCase {
  const char* fixture;
  bool v41;
  int n;  // ranks: the CP group is the EP group
  int64_t offset, len;
  std::vector<int64_t> chunks;  // prefill chunks, each of at least min_tokens (every one split)
  Experts experts;
  int64_t min_tokens = 16;
};
void PrintTo(const CpEpCase& c, std::ostream* os) { *os << c.fixture << " cp=ep " << c.n << " " << name_of(c.experts); }
class CpEpCpu : public ::testing::TestWithParam<CpEpCase> {};

// A skewed load's balanced placement with one spare slot per rank: the hot experts get replicas
// on several ranks (a split step computes each of them whole on one of those).
parallel::ExpertPlacement replicated_placement(int32_t experts, int n, int64_t layer) {
  std::vector<double> load(static_cast<size_t>(experts));
  for (int32_t e = 0; e < experts; ++e) load[size_t(e)] = double((e * 5 + layer * 3) % experts + 1) * (e % 3 == 0 ? 6 : 1);
  parallel::ExpertPlacement p = parallel::balanced_placement(load, n, (experts + n - 1) / n + 1);
  p.validate();
  return p;
}

// What one rank reports besides its Result.
struct RankStats {
  int64_t split_steps = 0, moe_calls = 0, moe_pairs = 0, moe_bytes = 0, attn_bytes = 0, gathers = 0;
  int64_t rebalances = 0, experts_received = 0;
  bool replicas_across_ranks = false;  // some layer's expert has replicas on two ranks (at the start)
};

bool replicas_across_ranks(const ExpertParallel& ep, int64_t layers) {
  for (int64_t l = 0; l < layers; ++l) {
    const parallel::ExpertPlacement& L = ep.layout(l);
    for (const std::vector<int32_t>& reps : L.logical_to_physical)
      for (int32_t p : reps)
        if (p / L.slots_per_rank != reps[0] / L.slots_per_rank) return true;
  }
  return false;
}

// Rank r's model joined to `pg` for both kinds of parallelism, as the case asks.
std::unique_ptr<model::ds::DeepseekModel> join(const std::string& dir, const CpEpCase& c, parallel::ProcessGroup& pg,
                                               std::shared_ptr<ContextParallel>& cp, std::shared_ptr<ExpertParallel>& ep) {
  const int r = pg.rank(), n = pg.size();
  const bool sharded = c.experts == Experts::kSharded || c.experts == Experts::kShardedEplb;
  const bool eplb = c.experts == Experts::kShardedEplb;
  // EPLB: one spare slot per rank (contiguous ranges, the spares repeating experts from the start).
  const parallel::ExpertShard shard{.rank = r, .size = n, .num_redundant = eplb ? n : 0};
  auto m = cp_util::load(dir, c.v41, sharded ? std::optional(shard) : std::nullopt);
  auto& be = static_cast<model::ds::CpuBackend&>(m->backend());
  const int32_t E = int32_t(m->arch().dims.experts);
  const int64_t L = m->arch().plan.num_layers();
  std::vector<parallel::ExpertPlacement> layouts;
  for (int64_t l = 0; l < L; ++l)
    layouts.push_back(c.experts == Experts::kReplicated ? replicated_placement(E, n, l)
                      : sharded                         ? shard.placement(E)
                                                        : parallel::contiguous_placement(E, n, (E + n - 1) / n));
  // Runtime EPLB: re-placed every 2 forward steps over a 3-step window, any gain taken, so the
  // placement changes between the prefill chunks and during the decode.
  ep = std::make_shared<ExpertParallel>(
      pg, layouts, model::ds::EplbOptions{.enabled = eplb, .window_steps = 3, .step_interval = 2, .min_gain = 0.0});
  if (eplb) ep->set_weight_store(be.expert_weight_store());  // re-placements move weights
  be.set_expert_parallel(ep);
  cp = std::make_shared<ContextParallel>(pg, model::ds::CpOptions{.min_tokens = c.min_tokens, .align = cp_util::max_ratio(*m)});
  be.set_context_parallel(cp);
  return m;
}

TEST_P(CpEpCpu, PrefillMatchesOneRankThenOwnerDecodes) {
  const CpEpCase& c = GetParam();
  const std::string dir = golden_dir(c.fixture);
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  const auto inputs = read_inputs(dir);
  const std::vector<int32_t>& all = c.v41 ? inputs.at("t161") : inputs.at("long");
  ASSERT_LE(c.offset + c.len, int64_t(all.size()));
  const std::vector<int32_t> ids(all.begin() + c.offset, all.begin() + c.offset + c.len);
  for (int64_t ch : c.chunks) ASSERT_GE(ch, c.min_tokens) << "every chunk of a case is split";
  const int64_t decode = 6;
  Result ref;
  int64_t topk = 0, layers = 0;
  {
    auto m = cp_util::load(dir, c.v41);
    ref = cp_util::run(*m, ids, c.chunks, decode);
    topk = m->arch().dims.topk, layers = m->arch().plan.num_layers();
  }
  const int n = c.n;
  parallel::RendezvousDir rdv;
  std::vector<Result> got(static_cast<size_t>(n));
  std::vector<RankStats> stats(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = parallel::make_gloo_group({.rendezvous_dir = rdv.path(), .name = "cpep", .rank = r, .size = n,
                                             .timeout = std::chrono::milliseconds(60000)});
        std::shared_ptr<ContextParallel> cp;
        std::shared_ptr<ExpertParallel> ep;
        auto m = join(dir, c, *pg, cp, ep);
        EXPECT_TRUE(m->joins_collectives());
        stats[size_t(r)].replicas_across_ranks = replicas_across_ranks(*ep, layers);
        // The owner decodes; the others run as many empty steps (its MoE exchanges need them).
        got[size_t(r)] = cp_util::run(*m, ids, c.chunks, r == 0 ? decode : 0, r == 0 ? 0 : decode);
        RankStats& s = stats[size_t(r)];
        s.split_steps = cp->split_steps(), s.attn_bytes = cp->bytes_received(), s.gathers = cp->gathers();
        s.moe_calls = ep->replicated_calls(), s.moe_pairs = ep->replicated_pairs();
        s.moe_bytes = ep->replicated_bytes_received();
        s.rebalances = ep->num_rebalances(), s.experts_received = ep->num_experts_received();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) ASSERT_TRUE(errors[size_t(r)].empty()) << "rank " << r << ": " << errors[size_t(r)];
  int64_t tokens = 0;
  for (int64_t ch : c.chunks) tokens += ch;
  int64_t pairs = 0;
  std::string share;
  for (int r = 0; r < n; ++r) {
    const Result& g = got[size_t(r)];
    const RankStats& s = stats[size_t(r)];
    EXPECT_EQ(s.split_steps, int64_t(c.chunks.size())) << "rank " << r;
    EXPECT_EQ(s.moe_calls, int64_t(c.chunks.size()) * layers) << "rank " << r << ": every split step's MoE layers";
    EXPECT_TRUE(g.last_logits == ref.last_logits) << "rank " << r << ": last-position logits differ";
    EXPECT_TRUE(g.slot_state == ref.slot_state) << "rank " << r << ": window rings / compressor partials differ";
    EXPECT_TRUE(g.blocks == ref.blocks) << "rank " << r << ": compressed entries / index keys differ";
    pairs += s.moe_pairs;
    share += " " + std::to_string(s.moe_pairs);
  }
  // Each (token, k) pair of every split step's every layer computed exactly once in the group.
  EXPECT_EQ(pairs, tokens * topk * layers);
  EXPECT_EQ(got[0].decoded, ref.decoded);
  EXPECT_TRUE(got[0].decode_logits == ref.decode_logits) << "owner's decode logits differ";
  if (c.experts == Experts::kShardedEplb) {
    for (int r = 0; r < n; ++r) EXPECT_GT(stats[size_t(r)].rebalances, 0) << "rank " << r;
  }
  if (c.experts == Experts::kReplicated || c.experts == Experts::kShardedEplb) {
    EXPECT_TRUE(stats[0].replicas_across_ranks) << "the case means replicas on several ranks";
  }
  int64_t moved = 0;
  for (const RankStats& s : stats) moved += s.experts_received;
  const RankStats& s0 = stats[0];
  std::printf("[cp+ep] %s cp=ep %d %s len %lld chunks %zu: bit-identical; MoE pairs per rank%s (of %lld); rank 0 "
              "received %lld bytes of expert outputs per split layer, %lld of attention rows; %lld rebalances, "
              "%lld experts moved\n",
              c.fixture, n, name_of(c.experts), (long long)c.len, c.chunks.size(), share.c_str(),
              (long long)(tokens * topk * layers), (long long)(s0.moe_calls ? s0.moe_bytes / s0.moe_calls : 0),
              (long long)(s0.gathers ? s0.attn_bytes / s0.gathers : 0), (long long)s0.rebalances, (long long)moved);
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, CpEpCpu,
    ::testing::Values(CpEpCase{"tiny", false, 2, 0, 157, {157}, Experts::kContiguous},
                      CpEpCase{"tiny", false, 3, 3, 211, {211}, Experts::kSharded},
                      CpEpCase{"tiny", false, 3, 1, 201, {64, 137}, Experts::kReplicated},  // cached prefix, both split
                      CpEpCase{"tiny", false, 3, 5, 19, {19}, Experts::kSharded},        // rank 1: no attention rows
                      CpEpCase{"tiny", false, 2, 2, 233, {41, 96, 96}, Experts::kShardedEplb},
                      CpEpCase{"v41_a", true, 2, 0, 151, {151}, Experts::kSharded},
                      CpEpCase{"v41_b", true, 3, 2, 143, {47, 96}, Experts::kReplicated}),
    [](const auto& info) {
      const CpEpCase& c = info.param;
      return std::string(c.v41 ? "V41" : "V4") + "_" + c.fixture + "_cpep" + std::to_string(c.n) + "_" +
             name_of(c.experts) + "_len" + std::to_string(c.len);
    });

// ExpertParallel::dispatch_replicated alone (3 ranks, 5 experts in 3 slots each: experts 0..3 on
// two ranks, 4 on one; expert 0 hot): every rank passes the same random rows, ids and weights;
// each expert's pairs must all be computed by one rank holding it, every pair once, every rank
// must end with every pair's output, and an ordinary dispatch afterwards (each rank its own
// tokens) must still pair up. A bad expert id is an InternalError naming it.
TEST(CpEpCpu, ReplicatedDispatchComputesEachExpertWholeOnOneHolder) {
  const int n = 3;
  const int32_t E = 5, S = 3;
  const int64_t T = 37, D = 19, K = 2, P = T * K;
  const parallel::ExpertPlacement L = parallel::contiguous_placement(E, n, S);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> h(static_cast<size_t>(T * D)), w(static_cast<size_t>(P));
  for (float& x : h) x = u(rng);
  for (float& x : w) x = u(rng);
  std::vector<int32_t> ids(static_cast<size_t>(P));
  for (int64_t t = 0; t < T; ++t) {  // expert 0 in most tokens, the second pick distinct from the first
    ids[size_t(t * K)] = rng() % 4 ? 0 : int32_t(rng() % E);
    ids[size_t(t * K + 1)] = int32_t((ids[size_t(t * K)] + 1 + rng() % (E - 1)) % E);
  }
  // The expert function every holder computes alike: (e + 1) x + the pair's weight.
  auto compute = [&](const ExpertParallel& ep, int r, std::vector<int32_t>* experts) {
    const ExpertParallel::Received got = ep.received();
    std::vector<float> out(got.rows.size());
    for (size_t j = 0; j < got.slot.size(); ++j) {
      const int32_t e = L.physical_to_logical[size_t(r * S + got.slot[j])];
      if (experts) experts->push_back(e);
      for (int64_t d = 0; d < D; ++d) out[j * D + size_t(d)] = got.rows[j * D + size_t(d)] * float(e + 1) + got.weight[j];
    }
    return out;
  };
  auto expected = [&](const float* rows, const int32_t* pid, const float* pw, int64_t pairs) {
    std::vector<float> out(static_cast<size_t>(pairs * D));
    for (int64_t i = 0; i < pairs; ++i)
      for (int64_t d = 0; d < D; ++d) out[size_t(i * D + d)] = rows[(i / K) * D + d] * float(pid[i] + 1) + pw[i];
    return out;
  };
  parallel::RendezvousDir rdv;
  std::vector<std::vector<int32_t>> computed(static_cast<size_t>(n));
  std::vector<int64_t> bytes(static_cast<size_t>(n), 0);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = parallel::make_gloo_group({.rendezvous_dir = rdv.path(), .name = "repl", .rank = r, .size = n,
                                             .timeout = std::chrono::milliseconds(60000)});
        ExpertParallel ep(*pg, {L});
        ep.dispatch_replicated(0, h.data(), T, D, ids.data(), K, w.data());
        const std::vector<float> mine = compute(ep, r, &computed[size_t(r)]);
        std::vector<float> out(static_cast<size_t>(P * D));
        ep.give_back(mine.data(), out.data());
        if (out != expected(h.data(), ids.data(), w.data(), P)) errors[size_t(r)] += "replicated outputs differ; ";
        bytes[size_t(r)] = ep.replicated_bytes_received();
        if (ep.replicated_pairs() != int64_t(computed[size_t(r)].size())) errors[size_t(r)] += "pair count; ";
        // An ordinary step afterwards: rank r's own 5 + 4r tokens (the first rows of h, ids).
        const int64_t Tr = 5 + 4 * r;
        ep.dispatch(0, h.data(), Tr, D, ids.data(), K, w.data());
        const std::vector<float> theirs = compute(ep, r, nullptr);
        std::vector<float> back(static_cast<size_t>(Tr * K * D));
        ep.give_back(theirs.data(), back.data());
        if (back != expected(h.data(), ids.data(), w.data(), Tr * K)) errors[size_t(r)] += "dispatch outputs differ; ";
      } catch (const std::exception& e) {
        errors[size_t(r)] += e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
  std::vector<int64_t> count(static_cast<size_t>(E), 0), where(static_cast<size_t>(E), -1);
  for (int32_t e : ids) count[size_t(e)]++;
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    total += int64_t(computed[size_t(r)].size());
    EXPECT_EQ(bytes[size_t(r)], (P - int64_t(computed[size_t(r)].size())) * D * 4) << "rank " << r;
    const std::vector<int32_t> held = L.local_logical(r);
    for (int32_t e : computed[size_t(r)]) {
      EXPECT_NE(std::find(held.begin(), held.end(), e), held.end()) << "rank " << r << " computed expert " << e;
      EXPECT_TRUE(where[size_t(e)] < 0 || where[size_t(e)] == r) << "expert " << e << " split over ranks";
      where[size_t(e)] = r;
    }
  }
  EXPECT_EQ(total, P);
  for (int32_t e = 0; e < E; ++e)
    EXPECT_EQ(std::count(computed[size_t(where[size_t(e)])].begin(), computed[size_t(where[size_t(e)])].end(), e),
              count[size_t(e)]) << "expert " << e;
  auto one = parallel::make_single_rank_group();
  ExpertParallel ep(*one, {parallel::contiguous_placement(E, 1, E)});
  std::vector<int32_t> bad(ids.begin(), ids.begin() + 4);
  bad[3] = E + 2;
  try {
    ep.dispatch_replicated(0, h.data(), 2, D, bad.data(), K);
    FAIL() << "expert id " << E + 2 << " accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 7 at pair 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::testing
