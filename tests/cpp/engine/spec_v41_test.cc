// Speculative decoding of DeepSeek-V4.1 with its DSpark drafter (tests/data/golden/v41_a_release:
// the tiny release-layout fixture whose checkpoint holds the three DSpark stages), end to end
// through the engine on the CPU: greedy output is token-identical to plain decoding for requests
// alone, batched with mixed lengths, with chunked prefill, under forced preemption, with shared
// prefixes (slot checkpoints carry the DSpark rings) and with varlen verification (lengths from
// the confidence head); for every forced acceptance length 0..4 (an oracle drafter in place of
// DSpark); seeded sampling with drafts repeats. The fixture's weights are random, so DSpark's own
// drafts are almost never accepted: its runs check the rollback path of every step, the oracle's
// the accepting ones. Grammars are not run here (the fixture has no tokenizer); spec_model_test
// covers them on the V4 default model through the same engine path.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "../model/golden.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "model/drafter.h"
#include "spec_test_util.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
constexpr int32_t kL = 4;  // the fixture's dspark_block_size

std::string fixture() {
  const char* d = std::getenv("DEEPINFER_SOURCE_DIR");
  const std::filesystem::path src = d && *d ? std::filesystem::path(d)
                                            : std::filesystem::path(__FILE__).parent_path().parent_path().parent_path()
                                                  .parent_path();
  return (src / "tests" / "data" / "golden" / "v41_a_release").string();
}

// Run outside ctest (e.g. a packed binary on the GPU machine), __FILE__ may be relative to a build
// folder that is not the working directory: skip, naming the variable that points at the fixture.
class SpecV41 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::filesystem::path(fixture()) / "config.json"))
      GTEST_SKIP() << fixture() << "/config.json not found: set DEEPINFER_SOURCE_DIR to the source tree";
  }
};

struct Setup {
  int32_t drafts = kL;  // 0: plain decoding
  int64_t max_batched = 2048, max_seqs = 8;
  int64_t cache_blocks = 0;  // > 0: this many paged blocks (forces preemption)
  bool varlen = false;
  bool measured_cost = false;  // varlen with the curve the engine measures at start-up (DSpark rounds too)
  const std::vector<std::vector<int32_t>>* oracle = nullptr;
  std::function<int32_t(int64_t)> pattern;
};

struct V41Run {
  std::vector<std::vector<int32_t>> tokens;
  SchedulerStats stats;
  ModelRunner::Stats runner;
  double seconds = 0;  // the generation loop (not the load)
};

V41Run run(const Setup& s, const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params) {
  model::ModelLoadOptions lo;
  lo.env.accelerator = Accelerator::kCPU;
  lo.limits.max_rollback = kL + 1;
  lo.progress = false;
  // Fixed-order products: V4.1's QAT roundings turn the last-bit differences between chunkings and
  // batch shapes into whole FP8/FP4 steps now and then (docs/MODEL-V41.md), which would change
  // greedy tokens of plain decoding itself between a chunked and a whole prefill; with them every
  // path is bit-identical, so the comparisons below are about speculation alone.
  lo.env.batch_invariant = true;
  std::unique_ptr<model::CausalLM> m = load_model(fixture(), lo);
  EXPECT_NE(m->drafter(), nullptr);
  if (s.oracle) {
    auto oracle = std::make_unique<spec_test::OracleDrafter>(*s.oracle, m->vocab_size(), s.pattern, kL);
    m = std::make_unique<spec_test::DrafterSwap>(std::move(m), std::move(oracle));
  }
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = s.max_batched;
  ec.scheduler.max_num_seqs = s.max_seqs;
  if (s.cache_blocks > 0) ec.kv_cache_memory_bytes = spec_test::cache_bytes(*m, s.max_seqs, s.cache_blocks);
  ec.num_speculative_tokens = s.drafts;
  ec.varlen_drafts = s.varlen;
  if (s.varlen && !s.measured_cost) ec.step_cost = StepCostModel({{1, 1.0}, {8, 1.1}, {32, 1.6}, {128, 4.0}});
  Engine eng(ec, std::move(m), nullptr, nullptr);
  for (size_t i = 0; i < prompts.size(); ++i)
    eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompts[i]), params, 0);
  V41Run r;
  r.tokens.resize(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  while (eng.has_unfinished())
    for (RequestOutput& o : eng.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.finished && !o.outputs.empty()) r.tokens[size_t(std::stoi(o.request_id))] = o.outputs[0].token_ids;
    }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stats = eng.scheduler().stats();
  r.runner = eng.runner().stats();
  return r;
}

// Prompts of mixed lengths cut from the fixture's 161-token sequence (request i starts at 7i mod 100).
std::vector<std::vector<int32_t>> prompts(int n) {
  const std::vector<int32_t> t = deepinfer::testing::read_inputs(fixture()).at("t161");
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    const size_t from = size_t(7 * i) % 100, len = 5 + size_t(i * 29) % 50;
    out.emplace_back(t.begin() + long(from), t.begin() + long(from + len));
  }
  return out;
}

// `n` prompts of `len` tokens from the fixture's sequences laid end to end (request i from 3i).
std::vector<std::vector<int32_t>> long_prompts(int n, size_t len) {
  const auto in = deepinfer::testing::read_inputs(fixture());
  std::vector<int32_t> text;
  while (text.size() < len + size_t(3 * n))
    for (const char* k : {"t161", "t37", "t9"}) text.insert(text.end(), in.at(k).begin(), in.at(k).end());
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(text.begin() + 3 * i, text.begin() + 3 * i + long(len));
  return out;
}

using spec_test::greedy;
}  // namespace

TEST_F(SpecV41, GreedyDSparkIdenticalAloneBatchedChunkedPreemptedVarlen) {
  const auto ps = prompts(6);
  const SamplingParams p = greedy(24);
  const V41Run plain = run({.drafts = 0}, ps, p);
  for (size_t i = 0; i < 2; ++i) {
    const V41Run alone = run({}, {ps[i]}, p);
    EXPECT_EQ(alone.tokens[0], plain.tokens[i]) << "alone " << i;
    EXPECT_GT(alone.stats.num_draft_tokens, 0);
    EXPECT_GT(alone.runner.rollbacks, 0);
  }
  EXPECT_EQ(run({}, ps, p).tokens, plain.tokens) << "batched";
  EXPECT_EQ(run({.max_batched = 7}, ps, p).tokens, plain.tokens) << "chunked prefill";
  const V41Run var = run({.varlen = true}, ps, p);
  EXPECT_EQ(var.tokens, plain.tokens) << "varlen (confidence head)";
  EXPECT_GT(var.stats.num_draft_tokens, 0);
  EXPECT_EQ(run({.varlen = true, .measured_cost = true}, ps, p).tokens, plain.tokens) << "varlen, measured cost";
  // Forced preemption: three prompts just under a 256-token block and three blocks, so the
  // sequences crossing into a second block preempt one another.
  const auto lp = long_prompts(3, 245);
  const V41Run plain_long = run({.drafts = 0}, lp, p);
  const V41Run pre = run({.max_seqs = 3, .cache_blocks = 3}, lp, p);
  EXPECT_EQ(pre.tokens, plain_long.tokens) << "preempted";
  EXPECT_GT(pre.stats.num_preemptions, 0);
  std::printf("spec_v41: preemptions %lld; varlen verified %lld drafts in %lld verify steps\n",
              (long long)pre.stats.num_preemptions, (long long)var.stats.num_draft_tokens,
              (long long)var.stats.num_verify_steps);
}

TEST_F(SpecV41, SharedPrefixesRestoreTheDSparkRings) {
  // Requests sharing a long prefix run one after another: later ones start from the prefix
  // cache's slot checkpoints, which carry the DSpark rings.
  std::vector<std::vector<int32_t>> ps;
  for (int i = 0; i < 4; ++i) {
    ps.push_back(long_prompts(1, 300)[0]);  // a whole 256-token block: a checkpoint there
    ps.back().push_back(int32_t(10 + i));
  }
  const SamplingParams p = greedy(20);
  const V41Run plain = run({.drafts = 0, .max_seqs = 1}, ps, p);
  const V41Run spec = run({.max_seqs = 1}, ps, p);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.runner.restores, 0);
  std::printf("spec_v41: %lld restores, %lld checkpoints saved\n", (long long)spec.runner.restores,
              (long long)spec.runner.checkpoints_saved);
}

TEST_F(SpecV41, EveryForcedAcceptLengthIdentical) {
  const auto ps = prompts(4);
  const SamplingParams p = greedy(30);
  const V41Run plain = run({.drafts = 0}, ps, p);
  std::vector<std::vector<int32_t>> full;
  for (size_t i = 0; i < ps.size(); ++i) {
    full.push_back(ps[i]);
    full.back().insert(full.back().end(), plain.tokens[i].begin(), plain.tokens[i].end());
  }
  const V41Run o = run({.oracle = &full, .pattern = [](int64_t pos) { return int32_t(pos % (kL + 1)); }}, ps, p);
  EXPECT_EQ(o.tokens, plain.tokens);
  ASSERT_EQ(o.stats.draft_verified_at.size(), size_t(kL));
  EXPECT_GT(o.stats.num_accepted_drafts, 0);
  // Some step accepted every draft, and some rejected the first.
  EXPECT_GT(o.stats.draft_accepted_at[kL - 1], 0);
  EXPECT_GT(o.stats.draft_verified_at[0], o.stats.draft_accepted_at[0]);
}

TEST_F(SpecV41, SeededSamplingWithDraftsRepeats) {
  const auto ps = prompts(3);
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 11;
  p.max_tokens = 20;
  p.ignore_eos = true;
  const V41Run a = run({}, ps, p), b = run({}, ps, p);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_GT(a.stats.num_draft_tokens, 0);
  for (const auto& t : a.tokens) EXPECT_EQ(t.size(), 20u);
}

// Opt-in measurement (DEEPINFER_SPEC_V41_BENCH=1; docs/PERFORMANCE.md): decode throughput with
// DSpark drafting (block 4) against plain decoding at batch 1 / 8 / 32, greedy, 48 new tokens,
// and the acceptance length (tokens committed per verify step) and per-position acceptance; and the
// same verify path with an oracle drafter whose 4 drafts are always right (what a drafter that is
// never wrong would give on this CPU: the engine's ceiling, not DSpark's).
TEST_F(SpecV41, BenchDSparkAgainstPlain) {
  if (!std::getenv("DEEPINFER_SPEC_V41_BENCH")) GTEST_SKIP() << "set DEEPINFER_SPEC_V41_BENCH=1";
  const SamplingParams p = greedy(48);
  std::printf("| batch | plain tok/s | DSpark L=4 tok/s | speedup | varlen tok/s | accept len | per-position acceptance "
              "| oracle L=4 tok/s | oracle speedup | DSpark draft s / verify s |\n");
  for (int b : {1, 8, 32}) {
    const auto ps = prompts(b);
    const V41Run plain = run({.drafts = 0, .max_seqs = 32}, ps, p);
    const V41Run spec = run({.max_seqs = 32}, ps, p);
    const V41Run var = run({.max_seqs = 32, .varlen = true}, ps, p);
    EXPECT_EQ(spec.tokens, plain.tokens);
    std::vector<std::vector<int32_t>> full;
    for (size_t i = 0; i < ps.size(); ++i) {
      full.push_back(ps[i]);
      full.back().insert(full.back().end(), plain.tokens[i].begin(), plain.tokens[i].end());
    }
    const V41Run oracle = run({.max_seqs = 32, .oracle = &full, .pattern = [](int64_t) { return kL; }}, ps, p);
    EXPECT_EQ(oracle.tokens, plain.tokens);
    const double n = double(b) * 48, vs = double(std::max<int64_t>(spec.stats.num_verify_steps, 1));
    std::string per;
    for (size_t i = 0; i < spec.stats.draft_verified_at.size(); ++i)
      per += std::to_string(double(spec.stats.draft_accepted_at[i]) /
                            double(std::max<int64_t>(spec.stats.draft_verified_at[i], 1))).substr(0, 5) + " ";
    std::printf("| %d | %.1f | %.1f | %.2fx | %.1f | %.2f | %s| %.1f | %.2fx | %.2f / %.2f |\n", b,
                n / plain.seconds, n / spec.seconds, plain.seconds / spec.seconds, n / var.seconds,
                1.0 + double(spec.stats.num_accepted_drafts) / vs, per.c_str(), n / oracle.seconds,
                plain.seconds / oracle.seconds, spec.runner.draft_time_s, spec.runner.verify_time_s);
  }
}
