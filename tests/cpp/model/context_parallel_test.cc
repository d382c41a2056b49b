// Context-parallel prefill on CPU ranks (threads of this process, one gloo group, one model each):
// every rank runs the same prompt's prefill chunks in lockstep; steps of at least min_tokens tokens
// split their attention core by the balanced plan (rank i: chunks i and 2cp-1-i) and all-gather the
// attention output rows. Afterwards every rank, the owner (rank 0, which holds the last chunk)
// included, must hold the complete KV state of one rank's prefill byte for byte (window rings,
// compressor partials, compressed entries, index keys) and the same last-position logits bit for
// bit; greedy decode then continues on the owner alone (decode steps are below the threshold, so
// they run no collective) and must give one rank's tokens and logits bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "cp_test_util.h"
#include "golden.h"
#include "model/deepseek/context_parallel.h"
#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek/expert_parallel.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v41/model.h"
#include "model/sequence_runner.h"
#include "parallel/cp_plan.h"
#include "parallel/gloo_group.h"
#include "parallel/launcher.h"

namespace deepinfer::testing {
namespace {
using model::ds::ContextParallel;
using model::ds::DeepseekModel;

using cp_util::load;
using cp_util::max_ratio;
using cp_util::Result;
using cp_util::run;

// Attention key reads of each rank's queries summed over the main layers (cp_work per layer
// kind): max / mean.
double layer_imbalance(const DeepseekModel& m, const parallel::CpPlan& plan) {
  std::vector<double> w(size_t(plan.cp), 0.0);
  const int64_t topk = m.arch().dims.index_topk;
  for (const auto& p : m.arch().plan.layers) {
    const bool scored = p.select == model::SelectKind::kScore || p.select == model::SelectKind::kReuse;
    const int64_t ratio = p.attends_compressed() ? p.ratio : 0;
    for (int32_t r = 0; r < plan.cp; ++r)
      for (const parallel::CpSpan& s : plan.spans[size_t(r)]) w[size_t(r)] += parallel::cp_work(s, p.window, ratio, scored ? topk : 0);
  }
  double mx = 0, sum = 0;
  for (double x : w) mx = std::max(mx, x), sum += x;
  return sum > 0 ? mx / (sum / double(plan.cp)) : 1.0;
}

struct CpCase {
  const char* fixture;
  bool v41;
  int cp;
  int64_t offset, len;
  std::vector<int64_t> chunks;  // prefill chunks (a first short one: a cached prefix)
  int64_t min_tokens = 16;
};
void PrintTo(const CpCase& c, std::ostream* os) { *os << c.fixture << " cp " << c.cp << " len " << c.len; }
class ContextParallelCpu : public ::testing::TestWithParam<CpCase> {};

TEST_P(ContextParallelCpu, PrefillMatchesOneRankThenOwnerDecodes) {
  const CpCase& c = GetParam();
  const std::string dir = golden_dir(c.fixture);
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  const auto inputs = read_inputs(dir);
  const std::vector<int32_t>& all = c.v41 ? inputs.at("t161") : inputs.at("long");
  ASSERT_LE(c.offset + c.len, int64_t(all.size()));
  const std::vector<int32_t> ids(all.begin() + c.offset, all.begin() + c.offset + c.len);
  const int64_t decode = 6;
  Result ref;
  {
    auto m = load(dir, c.v41);
    ref = run(*m, ids, c.chunks, decode);
  }
  const int n = c.cp;
  parallel::RendezvousDir rdv;
  std::vector<Result> got(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<int64_t> received(static_cast<size_t>(n), 0), splits(static_cast<size_t>(n), 0), gathers(static_cast<size_t>(n), 0);
  std::vector<parallel::CpPlan> plans(static_cast<size_t>(n));
  std::vector<double> imbalance(static_cast<size_t>(n), 0.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = parallel::make_gloo_group({.rendezvous_dir = rdv.path(), .name = "cp", .rank = r, .size = n,
                                             .timeout = std::chrono::milliseconds(60000)});
        auto m = load(dir, c.v41);
        auto cp = std::make_shared<ContextParallel>(
            *pg, model::ds::CpOptions{.min_tokens = c.min_tokens, .align = max_ratio(*m)});
        m->backend().set_context_parallel(cp);
        // The owner (rank 0 holds chunk 2cp-1, the last) decodes alone afterwards.
        got[size_t(r)] = run(*m, ids, c.chunks, r == 0 ? decode : 0);
        received[size_t(r)] = cp->bytes_received();
        splits[size_t(r)] = cp->split_steps();
        gathers[size_t(r)] = cp->gathers();
        plans[size_t(r)] = cp->last_plan();
        imbalance[size_t(r)] = layer_imbalance(*m, cp->last_plan());
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) ASSERT_TRUE(errors[size_t(r)].empty()) << "rank " << r << ": " << errors[size_t(r)];
  int64_t expect_splits = 0;
  for (int64_t ch : c.chunks) expect_splits += ch >= c.min_tokens;
  for (int r = 0; r < n; ++r) {
    const Result& g = got[size_t(r)];
    EXPECT_EQ(splits[size_t(r)], expect_splits) << "rank " << r;
    EXPECT_TRUE(g.last_logits == ref.last_logits) << "rank " << r << ": last-position logits differ";
    EXPECT_TRUE(g.slot_state == ref.slot_state) << "rank " << r << ": window rings / compressor partials differ";
    EXPECT_TRUE(g.blocks == ref.blocks) << "rank " << r << ": compressed entries / index keys differ";
  }
  EXPECT_EQ(got[0].decoded, ref.decoded);
  EXPECT_TRUE(got[0].decode_logits == ref.decode_logits) << "owner's decode logits differ";
  double contiguous = 0;  // the same last chunk cut into cp contiguous pieces
  {
    auto m = load(dir, c.v41);
    contiguous = layer_imbalance(*m, parallel::contiguous_cp_plan(c.len - c.chunks.back(), c.chunks.back(), n, max_ratio(*m)));
  }
  std::string spans;
  for (int32_t r = 0; r < plans[0].cp; ++r) {
    spans += " rank" + std::to_string(r) + ":";
    for (const auto& s : plans[0].spans[size_t(r)]) spans += "[" + std::to_string(s.begin) + "," + std::to_string(s.end) + ")";
  }
  std::printf("[context-parallel] %s cp %d len %lld chunks %zu: bit-identical; last split plan%s; attention "
              "work imbalance %.3f (contiguous would be %.3f); rank 0 received %lld bytes in %lld gathers "
              "(%lld per gather)\n",
              c.fixture, n, (long long)c.len, c.chunks.size(), spans.c_str(), imbalance[0],
              contiguous,
              (long long)received[0], (long long)gathers[0],
              (long long)(gathers[0] ? received[0] / gathers[0] : 0));
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, ContextParallelCpu,
    ::testing::Values(CpCase{"tiny", false, 2, 0, 157, {157}}, CpCase{"tiny", false, 3, 3, 211, {211}},
                      CpCase{"tiny", false, 2, 1, 201, {64, 137}},      // cached prefix, both chunks split
                      CpCase{"tiny", false, 3, 0, 233, {9, 224}},       // short first chunk runs whole
                      CpCase{"tiny", false, 3, 5, 19, {19}},            // some ranks get no rows
                      CpCase{"v41_a", true, 2, 0, 151, {151}}, CpCase{"v41_b", true, 3, 2, 143, {47, 96}}),
    [](const auto& info) {
      const CpCase& c = info.param;
      return std::string(c.v41 ? "V41" : "V4") + "_" + c.fixture + "_cp" + std::to_string(c.cp) + "_len" +
             std::to_string(c.len) + "_chunks" + std::to_string(c.chunks.size());
    });

// Bad options are refused. Context and expert parallelism run together only over the same ranks:
// on both ranks of a CP group of 2, an expert-parallel group of 1 is refused whichever is set
// first, naming both; expert parallelism over the CP group itself is accepted (cp_ep_test.cc).
TEST(ContextParallelCpu, RefusesBadOptionsAndAnotherExpertGroup) {
  auto one = parallel::make_single_rank_group();
  EXPECT_THROW(ContextParallel(*one, {.min_tokens = 1}), InvalidArgument);
  EXPECT_THROW(ContextParallel(*one, {.min_tokens = 8, .align = 0}), InvalidArgument);
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture " << dir << " absent";
  parallel::RendezvousDir rdv;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        auto pg = parallel::make_gloo_group({.rendezvous_dir = rdv.path(), .name = "cpref", .rank = r, .size = 2,
                                             .timeout = std::chrono::milliseconds(60000)});
        auto single = parallel::make_single_rank_group();
        auto m = load(dir, false);
        const int32_t E = int32_t(m->arch().dims.experts);
        const int64_t L = m->arch().plan.num_layers();
        auto ep_over = [&](parallel::ProcessGroup& g) {
          const int32_t n = g.size();
          return std::make_shared<model::ds::ExpertParallel>(
              g, std::vector<parallel::ExpertPlacement>(size_t(L), parallel::contiguous_placement(E, n, (E + n - 1) / n)));
        };
        auto cp = std::make_shared<ContextParallel>(*pg, model::ds::CpOptions{.min_tokens = 8});
        auto refused = [&](const std::function<void()>& f, const char* what) {
          try {
            f();
            errors[size_t(r)] += std::string(what) + " accepted; ";
          } catch (const InvalidArgument& e) {
            const std::string msg = e.what();
            if (msg.find("context parallelism over 2 ranks") == std::string::npos ||
                msg.find("expert parallelism over 1 ranks") == std::string::npos)
              errors[size_t(r)] += std::string(what) + ": " + msg + "; ";
          }
        };
        m->backend().set_context_parallel(cp);
        refused([&] { m->backend().set_expert_parallel(ep_over(*single)); }, "ep after cp");
        m->backend().set_context_parallel(nullptr);
        m->backend().set_expert_parallel(ep_over(*single));
        refused([&] { m->backend().set_context_parallel(cp); }, "cp after ep");
        m->backend().set_expert_parallel(ep_over(*pg));  // the CP group itself
        m->backend().set_context_parallel(cp);
      } catch (const std::exception& e) {
        errors[size_t(r)] += e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace deepinfer::testing
