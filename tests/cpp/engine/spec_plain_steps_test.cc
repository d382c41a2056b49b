// Adaptive drafting's plain steps (spec_adaptive.h, issue #11): while every scheduled request has
// stopped drafting, a step is a plain one (SchedulerOutput::feeds_drafter false): no hidden rows,
// no drafter round, and with asynchronous scheduling it overlaps the next step as plain decoding
// does. Checked on the toy model with a ToyDrafter whose drafts are never accepted (the gate's
// threshold forced, so the decisions do not depend on timings): greedy output identical to plain
// decoding with asynchronous scheduling on and off, batched, chunked, with staggered arrivals,
// stop ids, stop strings, max_tokens and n > 1; plain steps overlap; the drafter's feeds skip the
// plain steps' positions and resume warm_steps before each re-probe; a paying batch never stops.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>

#include "engine/engine.h"
#include "engine/toy_drafter.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
constexpr int32_t kL = 3;

struct Setup {
  bool async = true;
  int32_t drafts = kL;       // 0: plain decoding
  int32_t accepted = 0;      // ToyDrafter: drafts accepted per verify step
  int64_t budget = 2048;
  double threshold = 1.5;    // DraftGateConfig::forced_threshold
  bool plain_steps = true;   // DraftGateConfig::plain_steps
  bool default_schedule = false;  // the gate's own stop / warm-up lengths (else short ones)
};

struct RunResult {
  std::map<std::string, std::string> out;  // request id -> every completion's text and ids
  SchedulerStats stats;
  ModelRunner::Stats runner;
  DraftGate::Stats gate;
  int64_t skipped = 0, fed = 0;
};

std::vector<int32_t> prompt_ids(int i, int len) {
  std::vector<int32_t> p = {0};
  for (int j = 1; j < len; ++j) p.push_back(2 + 'a' + (i * 5 + j * 3) % 26);
  return p;
}

struct Req {
  PromptInput prompt;
  SamplingParams params;
  int arrival = 0;  // step() call before which it is added
};

std::vector<Req> workload(bool seeded) {
  std::vector<Req> w;
  for (int i = 0; i < 9; ++i) {
    SamplingParams p;
    p.temperature = seeded && i % 2 ? 0.9f : 0.f;
    if (p.temperature > 0) p.seed = 500 + uint64_t(i);
    p.max_tokens = 40 + 23 * (i % 4);
    p.ignore_eos = true;
    if (i == 2) p.stop_token_ids = {2 + 'q'};
    if (i == 3) p.n = 2;
    if (i == 5) p.stop = {"zz"};
    w.push_back({PromptInput::from_token_ids(prompt_ids(i, 3 + 9 * i % 31)), p, i < 5 ? 0 : 30 + 17 * i});
  }
  return w;
}

RunResult run(const Setup& s, const std::vector<Req>& w) {
  EngineConfig ec;
  ec.env.async_scheduling = s.async;
  ec.scheduler.max_num_batched_tokens = s.budget;
  ec.scheduler.prefix_cache.enabled = false;
  ec.num_speculative_tokens = s.drafts;
  ec.adaptive_drafts = true;
  DraftGateConfig& g = ec.scheduler.draft_gate;
  if (!s.default_schedule) {
    g.min_verifies = 2;
    g.off_steps = 12;
    g.max_off_steps = 24;
    g.warm_steps = 4;
  }
  g.forced_threshold = s.threshold;
  g.plain_steps = s.plain_steps;
  ToyModelConfig tc;
  tc.max_rollback = kL + 1;
  auto model = std::make_unique<ToyModel>(tc);
  ToyDrafter* d = nullptr;
  if (s.drafts > 0) {
    const int32_t a = s.accepted;
    auto drafter = std::make_unique<ToyDrafter>(tc, kL, [a](int64_t) { return a; });
    drafter->allow_gaps(true);
    d = drafter.get();
    model->set_drafter(std::move(drafter));
  }
  Engine eng(ec, std::move(model), make_toy_codec(tc.vocab_size));
  RunResult r;
  for (int call = 0; r.out.size() < w.size(); ++call) {
    EXPECT_LT(call, 20000);
    if (call >= 20000) break;
    for (size_t i = 0; i < w.size(); ++i)
      if (w[i].arrival == call) eng.add_request("r" + std::to_string(i), w[i].prompt, w[i].params, 0);
    if (!eng.has_unfinished()) continue;
    for (const RequestOutput& o : eng.step()) {
      if (!o.finished) continue;
      std::string s = o.error + "|";
      for (const CompletionOutput& c : o.outputs) {
        s += c.text + "|" + c.finish_reason + "|";
        for (int32_t t : c.token_ids) s += std::to_string(t) + " ";
      }
      r.out[o.request_id] = s;
    }
    eng.cache().check_invariants();
  }
  EXPECT_EQ(eng.cache().num_free_blocks(), eng.cache().geometry().num_blocks);
  r.stats = eng.scheduler().stats();
  r.runner = eng.runner().stats();
  r.gate = eng.scheduler().draft_gate().stats();
  if (d) r.skipped = d->num_skipped_positions(), r.fed = d->num_fed_positions();
  return r;
}
}  // namespace

TEST(AdaptivePlainSteps, AllStoppedStepsArePlainOverlappedAndIdentical) {
  const std::vector<Req> w = workload(false);
  for (int64_t budget : {2048, 7}) {  // batched; chunked prefill
    const RunResult plain = run({.drafts = 0, .budget = budget}, w);
    for (bool async : {true, false}) {
      const std::string what = std::string(async ? "async" : "sync") + ", budget " + std::to_string(budget);
      const RunResult r = run({.async = async, .budget = budget}, w);
      ASSERT_EQ(r.out.size(), w.size()) << what;
      for (const auto& [id, s] : plain.out) EXPECT_EQ(r.out.at(id), s) << what << ", " << id;
      EXPECT_GT(r.gate.stops, 0) << what;
      EXPECT_GT(r.gate.reprobes, 0) << what;
      EXPECT_EQ(r.gate.probes, 0) << what << ": a forced threshold needs no probe";
      // Hopeless drafts stop everyone (chunked prefill keeps more steps feeding the drafter).
      EXPECT_GT(r.stats.num_plain_steps, budget > 7 ? r.stats.num_drafter_steps : 0) << what;
      EXPECT_EQ(r.stats.num_accepted_drafts, 0) << what;
      // The drafter missed the plain steps' positions and was fed again before each re-probe.
      EXPECT_GT(r.skipped, 0) << what;
      EXPECT_GT(r.fed, 0) << what;
      EXPECT_LT(r.runner.draft_calls, r.stats.num_steps) << what << ": plain steps run no drafter";
      // Asynchronous scheduling overlaps the plain steps (drafting steps are only pipelined).
      if (async) EXPECT_GT(r.runner.overlapped_launches, r.stats.num_plain_steps / 2) << what;
      else EXPECT_EQ(r.runner.overlapped_launches, 0) << what;
    }
  }
}

// plain_steps off (the behaviour before, bench-async --plain-steps 0): stopped requests keep
// feeding the drafter, no step is plain, nothing overlaps; same output.
TEST(AdaptivePlainSteps, OffKeepsFeedingTheDrafter) {
  const std::vector<Req> w = workload(false);
  const RunResult plain = run({.drafts = 0}, w);
  const RunResult r = run({.plain_steps = false}, w);
  for (const auto& [id, s] : plain.out) EXPECT_EQ(r.out.at(id), s) << id;
  EXPECT_GT(r.gate.stops, 0);
  EXPECT_EQ(r.stats.num_plain_steps, 0);
  EXPECT_EQ(r.skipped, 0);
  EXPECT_EQ(r.runner.overlapped_launches, 0);
}

// The default re-probe schedule with hopeless drafts: over a 1,100-token run (4 requests) only a
// few % of the steps feed the drafter or verify (the prefill, the first verifies, two re-probes of
// warm_steps + min_verifies steps each), the rest are plain: what bounds the cost of re-probing.
TEST(AdaptivePlainSteps, DefaultScheduleKeepsReprobesRare) {
  std::vector<Req> w;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 1100;
    p.ignore_eos = true;
    w.push_back({PromptInput::from_token_ids(prompt_ids(i, 12)), p, 0});
  }
  const RunResult r = run({.default_schedule = true}, w);
  const DraftGateConfig g;
  ASSERT_EQ(r.out.size(), w.size());
  const int64_t all = r.stats.num_drafter_steps + r.stats.num_plain_steps;
  // Stops at ~5, re-probes at ~261 and ~778 (stops of 256 then 512): each warm_steps + min_verifies.
  const int64_t predicted = 1 + g.min_verifies + 2 * (g.warm_steps + 1 + g.min_verifies);
  std::printf("[adaptive] default schedule, hopeless drafts: %lld of %lld steps fed the drafter (predicted ~%lld), "
              "%lld stops, %lld re-probes\n",
              (long long)r.stats.num_drafter_steps, (long long)all, (long long)predicted, (long long)r.gate.stops,
              (long long)r.gate.reprobes);
  EXPECT_EQ(r.gate.reprobes, 2 * 4) << "two per request";
  EXPECT_LE(r.stats.num_drafter_steps, predicted + 4);
  EXPECT_LT(double(r.stats.num_drafter_steps), 0.05 * double(all));
}

TEST(AdaptivePlainSteps, PayingBatchNeverStops) {
  const std::vector<Req> w = workload(false);
  const RunResult plain = run({.drafts = 0}, w);
  const RunResult r = run({.accepted = kL}, w);
  for (const auto& [id, s] : plain.out) EXPECT_EQ(r.out.at(id), s) << id;
  EXPECT_EQ(r.gate.stops, 0);
  EXPECT_EQ(r.stats.num_plain_steps, 0);
  EXPECT_EQ(r.skipped, 0) << "every position fed";
  EXPECT_EQ(r.runner.overlapped_launches, 0) << "drafting steps are collected before the next launch";
  EXPECT_GT(r.stats.num_accepted_drafts, 0);
}

// Seeded sampling with plain steps: the same run twice gives the same tokens (the forced threshold
// makes the gate's decisions a function of the steps), and every request completes.
TEST(AdaptivePlainSteps, SeededRunsRepeat) {
  const std::vector<Req> w = workload(true);
  const RunResult a = run({}, w), b = run({}, w);
  ASSERT_EQ(a.out.size(), w.size());
  EXPECT_EQ(a.out, b.out);
  EXPECT_GT(a.stats.num_plain_steps, 0);
}
