// Asynchronous scheduling on the toy model (its logits do not depend on the batch): step N+1 is
// launched before step N is applied; outputs (ids, text, finish reasons, stop strings, logprobs,
// prompt logprobs) are identical with it on and off under batching, chunking, preemption, stop
// strings found a step late, EOS / stop ids, max_tokens, grammars, n > 1 and aborts; caches come
// back only after the last step that used them and the books balance every step. Drafting steps
// (ToyDrafter) are pipelined: the same outputs, drafts and acceptance with it on and off.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "engine/engine.h"
#include "engine/toy_drafter.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
struct Cfg {
  int64_t budget = 2048;
  size_t cache_bytes = 0;
  int64_t max_seqs = 64;
  bool prefix = false;  // prefix caching (the engine's default is on)
  int32_t drafts = 0;   // speculative tokens (ToyDrafter, acceptance 0..3 by position)
};

std::unique_ptr<Engine> toy_engine(bool async, const Cfg& c = {}) {
  EngineConfig ec;
  ec.env.async_scheduling = async;
  ec.scheduler.max_num_batched_tokens = c.budget;
  ec.scheduler.prefix_cache.enabled = c.prefix;
  ec.scheduler.max_num_seqs = c.max_seqs;
  ec.kv_cache_memory_bytes = c.cache_bytes;
  ec.num_speculative_tokens = c.drafts;
  ToyModelConfig tc;
  if (c.drafts > 0) tc.max_rollback = 4;
  auto model = std::make_unique<ToyModel>(tc);
  if (c.drafts > 0) model->set_drafter(std::make_unique<ToyDrafter>(tc, 3, [](int64_t p) { return int32_t(p % 4); }));
  auto codec = make_toy_codec(320);
  auto grammar = make_grammar_compiler(codec.get(), 320, 1);
  return std::make_unique<Engine>(ec, std::move(model), std::move(codec), std::move(grammar));
}

std::vector<int32_t> prompt_ids(int i, int len) {
  std::vector<int32_t> p = {0};
  for (int j = 1; j < len; ++j) p.push_back(2 + 'a' + (i * 7 + j * 3) % 26);
  return p;
}

// Everything a request returned, flattened for comparison.
std::string summary(const RequestOutput& o) {
  std::string s = o.request_id + "|" + o.error + "|";
  if (o.prompt_logprobs)
    for (const auto& pos : *o.prompt_logprobs)
      if (pos)
        for (const auto& [id, lp] : *pos) s += std::to_string(id) + ":" + std::to_string(lp.logprob) + ",";
  for (const CompletionOutput& c : o.outputs) {
    s += "#" + c.text + "|" + c.finish_reason + "|" + c.stop_string.value_or("") + "|";
    for (int32_t t : c.token_ids) s += std::to_string(t) + " ";
    if (c.logprobs)
      for (const auto& pos : *c.logprobs)
        for (const auto& [id, lp] : pos) {
          uint32_t b;
          std::memcpy(&b, &lp.logprob, 4);
          s += std::to_string(id) + "/" + std::to_string(b) + "/" + std::to_string(lp.rank) + ";";
        }
  }
  return s;
}

// Runs the requests to the end (request i arrives before step arrival[i]); final outputs by id.
std::map<std::string, std::string> run_all(Engine& eng, const std::vector<PromptInput>& prompts,
                                           const std::vector<SamplingParams>& params, const std::vector<int>& arrival) {
  std::map<std::string, std::string> done;
  for (int step = 0; done.size() < prompts.size(); ++step) {
    EXPECT_LT(step, 10000);
    if (step >= 10000) break;
    for (size_t i = 0; i < prompts.size(); ++i)
      if (arrival[i] == step) eng.add_request("r" + std::to_string(i), prompts[i], params[i], 0);
    if (!eng.has_unfinished()) continue;
    for (const RequestOutput& o : eng.step())
      if (o.finished) done[o.request_id] = summary(o);
    eng.cache().check_invariants();
  }
  EXPECT_FALSE(eng.has_unfinished());
  EXPECT_EQ(eng.cache().num_free_blocks(), eng.cache().geometry().num_blocks);
  EXPECT_EQ(eng.cache().num_free_slots(), eng.cache().geometry().num_slots);
  return done;
}

struct Workload {
  std::vector<PromptInput> prompts;
  std::vector<SamplingParams> params;
  std::vector<int> arrival;
};

// 14 requests: greedy and seeded, EOS-prone (min_tokens), stop ids, stop strings, max_tokens 1,
// logprobs, prompt logprobs, n = 3, a grammar, and staggered arrivals.
Workload mixed_workload() {
  Workload w;
  for (int i = 0; i < 14; ++i) {
    SamplingParams p;
    p.max_tokens = 6 + 5 * (i % 7);
    if (i % 2) {
      p.temperature = 0.9f;
      p.top_p = 0.95f;
      p.seed = 1000 + uint64_t(i);
    } else {
      p.temperature = 0;
    }
    switch (i) {
      case 1: p.logit_bias = {{1, 8.0f}}, p.min_tokens = 3; break;  // EOS right after min_tokens
      case 2: p.stop_token_ids = {2 + 'e', 2 + 'o'}; break;
      case 3: p.stop = {"e", "ab"}; break;
      case 4: p.max_tokens = 1; break;
      case 5: p.logprobs = 3, p.prompt_logprobs = 2; break;
      case 6: p.n = 3; break;
      case 7:
        p.structured_outputs.emplace();
        p.structured_outputs->regex = "[0-9]{2}-[a-z]{3}";
        break;
      case 8: p.stop = {"c"}, p.include_stop_str_in_output = true; break;
      default: p.ignore_eos = true; break;
    }
    w.prompts.push_back(i == 3 || i == 8 ? PromptInput::from_text("hello there") : PromptInput::from_token_ids(prompt_ids(i, 4 + 5 * i)));
    w.params.push_back(p);
    w.arrival.push_back((i * 5) % 9);
  }
  // Stop strings that do occur: two characters from the middle of each one's own output.
  for (int i : {3, 8}) {
    SamplingParams free = w.params[size_t(i)];
    free.stop.clear();
    free.ignore_eos = true;
    auto eng = toy_engine(false);
    eng->add_request("x", w.prompts[size_t(i)], free, 0);
    const std::string base = [&] {
      std::string t;
      while (eng->has_unfinished())
        for (const RequestOutput& o : eng->step()) t = o.outputs[0].text;
      return t;
    }();
    EXPECT_GE(base.size(), 6u) << base;
    w.params[size_t(i)].stop = {base.substr(base.size() / 2, 2)};
  }
  return w;
}
}  // namespace

TEST(AsyncScheduling, OnByDefaultAndOffOnRequest) {
  EngineConfig ec;
  ec.scheduler.prefix_cache.enabled = false;
  Engine on(ec, std::make_unique<ToyModel>(), nullptr);
  EXPECT_TRUE(on.async_scheduling());
  ec.env.async_scheduling = false;
  Engine off(ec, std::make_unique<ToyModel>(), nullptr);
  EXPECT_FALSE(off.async_scheduling());
  // Prefix caching (on by default) keeps it on; drafting runs its steps synchronously.
  ec.scheduler.prefix_cache.enabled = true;
  ec.env.async_scheduling.reset();
  Engine prefix(ec, std::make_unique<ToyModel>(), nullptr);
  EXPECT_TRUE(prefix.async_scheduling());
  ToyModelConfig tc;
  tc.max_rollback = 4;
  auto drafting = std::make_unique<ToyModel>(tc);
  drafting->set_drafter(std::make_unique<ToyDrafter>(tc, 3, [](int64_t) { return 1; }));
  ec.num_speculative_tokens = 3;
  Engine spec(ec, std::move(drafting), nullptr);
  EXPECT_TRUE(spec.async_scheduling());
  EXPECT_TRUE(spec.pipelined_drafting()) << "drafting steps are pipelined, not fully overlapped";
  EXPECT_FALSE(on.pipelined_drafting());
  ec.env.async_scheduling = false;
  auto drafting_off = std::make_unique<ToyModel>(tc);
  drafting_off->set_drafter(std::make_unique<ToyDrafter>(tc, 3, [](int64_t) { return 1; }));
  Engine spec_off(ec, std::move(drafting_off), nullptr);
  EXPECT_FALSE(spec_off.async_scheduling());
  EXPECT_FALSE(spec_off.pipelined_drafting());
}

// Drafting steps are pipelined: a step() applies the step in flight, launches the next (its
// drafts from the applied one) and returns the applied step's outputs, so the last forward is
// always in flight when step() returns and the outputs come one call later.
TEST(AsyncScheduling, DraftingStepsReturnThePreviousStepAfterLaunchingTheNext) {
  for (bool async : {false, true}) {
    EngineConfig ec;
    ec.scheduler.prefix_cache.enabled = false;
    ec.env.async_scheduling = async;
    ec.num_speculative_tokens = 3;
    ToyModelConfig tc;
    tc.max_rollback = 4;
    auto m = std::make_unique<ToyModel>(tc);
    ToyModel* toy = m.get();
    m->set_drafter(std::make_unique<ToyDrafter>(tc, 3, [](int64_t p) { return int32_t(p % 3); }));
    Engine eng(ec, std::move(m), nullptr);
    ASSERT_EQ(eng.pipelined_drafting(), async);
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 20;
    p.ignore_eos = true;
    eng.add_request("a", PromptInput::from_token_ids(prompt_ids(1, 7)), p, 0);
    int calls = 0, reported = 0;
    size_t tokens = 0;
    bool finished = false;
    while (eng.has_unfinished()) {
      const std::vector<RequestOutput> outs = eng.step();
      ++calls;
      for (const RequestOutput& o : outs) {
        tokens = o.outputs[0].token_ids.size();
        finished = o.finished;
      }
      reported += outs.empty() ? 0 : 1;
      // Every step of this lone request samples: sync reports each call's own step, pipelined the
      // previous call's (its own forward still in flight).
      if (!finished) { EXPECT_EQ(reported + (async ? 1 : 0), toy->num_forward_calls()) << "call " << calls; }
    }
    EXPECT_EQ(tokens, 20u);
    EXPECT_TRUE(finished);
    EXPECT_EQ(calls, toy->num_forward_calls() + (async ? 1 : 0)) << "pipelined: one last call applies the last step";
    EXPECT_GT(eng.scheduler().stats().num_accepted_drafts, 0);
  }
}

// The pipeline is real: a step() returns the previous step's tokens, after launching the next.
TEST(AsyncScheduling, StepReturnsThePreviousStepAfterLaunchingTheNext) {
  for (bool async : {false, true}) {
    EngineConfig ec;
    ec.scheduler.prefix_cache.enabled = false;
    ec.env.async_scheduling = async;
    auto m = std::make_unique<ToyModel>();
    ToyModel* toy = m.get();
    Engine eng(ec, std::move(m), nullptr);
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 4;
    p.ignore_eos = true;
    eng.add_request("a", PromptInput::from_token_ids(prompt_ids(1, 7)), p, 0);
    size_t tokens = 0;
    int calls = 0;
    bool finished = false;
    while (eng.has_unfinished()) {
      for (const RequestOutput& o : eng.step()) {
        tokens = o.outputs[0].token_ids.size();
        finished = o.finished;
      }
      ++calls;
      // Sync: every call's forward is applied; async: the last forward is still in flight.
      if (!finished) { EXPECT_EQ(int64_t(tokens) + (async ? 1 : 0), toy->num_forward_calls()) << "call " << calls; }
    }
    EXPECT_EQ(tokens, 4u);
    EXPECT_TRUE(finished);
    // max_tokens is known ahead: no forward beyond the 4 that sample (async adds one empty call).
    EXPECT_EQ(toy->num_forward_calls(), 4);
    EXPECT_EQ(calls, async ? 5 : 4);
  }
}

TEST(AsyncScheduling, OutputsIdenticalOnAndOff) {
  const Workload w = mixed_workload();
  // Toy cache: 64 B per 16-token block, 24 B per slot.
  const std::vector<std::pair<const char*, Cfg>> cfgs = {{"batched", {}},
                                                         {"chunked", {.budget = 7}},
                                                         {"preempted", {.budget = 64, .cache_bytes = 6 * 24 + 14 * 64, .max_seqs = 6}},
                                                         {"chunked+preempted", {.budget = 13, .cache_bytes = 6 * 24 + 14 * 64, .max_seqs = 6}},
                                                         // Prefix caching: checkpoints at every boundary decode crosses
                                                         // (keyed when the step is applied), chunks cut at boundaries.
                                                         {"batched+prefix", {.prefix = true}},
                                                         {"chunked+preempted+prefix",
                                                          {.budget = 13, .cache_bytes = 6 * 24 + 14 * 64, .max_seqs = 6, .prefix = true}}};
  for (const auto& [name, cfg] : cfgs) {
    auto sync = toy_engine(false, cfg);
    auto async = toy_engine(true, cfg);
    const auto a = run_all(*sync, w.prompts, w.params, w.arrival);
    const auto b = run_all(*async, w.prompts, w.params, w.arrival);
    ASSERT_EQ(a.size(), w.prompts.size()) << name;
    for (const auto& [id, s] : a) EXPECT_EQ(b.at(id), s) << name << " " << id;
    if (std::string(name).find("preempted") != std::string::npos) {
      EXPECT_GT(async->scheduler().stats().num_preemptions, 0) << name;
    }
    if (cfg.prefix) {
      EXPECT_TRUE(async->async_scheduling()) << name;
      EXPECT_GT(async->scheduler().prefix_cache().stats().checkpoints_saved, 0) << name;
      // Same boundaries saved; with preemption the two engines preempt at different steps (an
      // async one waits for blocks a step in flight holds), so recomputed prefixes differ.
      if (std::string(name).find("preempted") == std::string::npos) {
        EXPECT_EQ(async->scheduler().prefix_cache().stats().checkpoints_saved,
                  sync->scheduler().prefix_cache().stats().checkpoints_saved)
            << name;
      }
    }
    // The stop-string, EOS and grammar requests did stop early: their late rows were dropped.
    EXPECT_NE(a.at("r1").find("|stop|"), std::string::npos) << a.at("r1");
    EXPECT_NE(a.at("r3").find("|stop|"), std::string::npos) << a.at("r3");
  }
}

// Speculative decoding with the pipeline on vs off: identical outputs (greedy and seeded drafts,
// rejection sampling, grammars, stop strings inside an accepted run, EOS / stop ids, max_tokens,
// n > 1, prompt logprobs) under batching, chunking, preemption and prefix caching.
TEST(AsyncScheduling, DraftingOutputsIdenticalOnAndOff) {
  const Workload w = mixed_workload();
  const size_t small = 6 * 24 + 14 * 64;
  const std::vector<std::pair<const char*, Cfg>> cfgs = {
      {"batched", {.drafts = 3}},
      {"chunked", {.budget = 7, .drafts = 3}},
      {"chunked+preempted", {.budget = 13, .cache_bytes = small, .max_seqs = 6, .drafts = 3}},
      {"batched+prefix", {.prefix = true, .drafts = 3}},
      {"preempted+prefix", {.budget = 64, .cache_bytes = small, .max_seqs = 6, .prefix = true, .drafts = 3}}};
  for (const auto& [name, cfg] : cfgs) {
    auto sync = toy_engine(false, cfg);
    auto pipelined = toy_engine(true, cfg);
    ASSERT_TRUE(pipelined->pipelined_drafting()) << name;
    const auto a = run_all(*sync, w.prompts, w.params, w.arrival);
    const auto b = run_all(*pipelined, w.prompts, w.params, w.arrival);
    ASSERT_EQ(a.size(), w.prompts.size()) << name;
    for (const auto& [id, s] : a) EXPECT_EQ(b.at(id), s) << name << " " << id;
    const SchedulerStats &x = sync->scheduler().stats(), &y = pipelined->scheduler().stats();
    EXPECT_GT(y.num_accepted_drafts, 0) << name;
    EXPECT_EQ(x.num_draft_tokens, y.num_draft_tokens) << name << ": the same drafts were verified";
    EXPECT_EQ(x.num_accepted_drafts, y.num_accepted_drafts) << name;
    EXPECT_EQ(x.num_preemptions, y.num_preemptions) << name << ": the plans are the synchronous ones";
    if (std::string(name).find("preempted") != std::string::npos) { EXPECT_GT(y.num_preemptions, 0) << name; }
    if (cfg.prefix) {
      EXPECT_EQ(sync->scheduler().prefix_cache().stats().checkpoints_saved,
                pipelined->scheduler().prefix_cache().stats().checkpoints_saved)
          << name;
    }
    EXPECT_NE(a.at("r3").find("|stop|"), std::string::npos) << a.at("r3");
  }
}

// A sequence that ends at step N was already scheduled into N+1: its blocks and slot wait for
// N+1 to complete, then return.
TEST(AsyncScheduling, FinishedSequenceReleasesAfterItsLastStep) {
  auto eng = toy_engine(true);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 50;
  p.stop_token_ids = {};
  p.logit_bias = {{1, 30.0f}};  // EOS first
  p.ignore_eos = false;
  eng->add_request("a", PromptInput::from_token_ids(prompt_ids(2, 20)), p, 0);
  std::vector<RequestOutput> outs;
  while (outs.empty()) outs = eng->step();
  ASSERT_TRUE(outs[0].finished);
  EXPECT_EQ(outs[0].outputs[0].token_ids, std::vector<int32_t>{1});
  // Its second row is in flight, holding its blocks.
  EXPECT_TRUE(eng->has_unfinished());
  EXPECT_GT(eng->cache().num_pending_blocks(), 0);
  EXPECT_TRUE(eng->step().empty());
  EXPECT_FALSE(eng->has_unfinished());
  EXPECT_EQ(eng->cache().num_pending_blocks(), 0);
  EXPECT_EQ(eng->cache().num_free_blocks(), eng->cache().geometry().num_blocks);
}

TEST(AsyncScheduling, AbortWhileInFlight) {
  auto eng = toy_engine(true);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 30;
  p.ignore_eos = true;
  eng->add_request("a", PromptInput::from_token_ids(prompt_ids(3, 9)), p, 0);
  eng->add_request("b", PromptInput::from_token_ids(prompt_ids(4, 5)), p, 0);
  for (int i = 0; i < 4; ++i) eng->step();
  std::vector<RequestOutput> ab = eng->abort("a");
  ASSERT_EQ(ab.size(), 1u);
  EXPECT_EQ(ab[0].outputs[0].finish_reason, "abort");
  const size_t at_abort = ab[0].outputs[0].token_ids.size();
  size_t b_tokens = 0;
  while (eng->has_unfinished())
    for (const RequestOutput& o : eng->step()) {
      EXPECT_NE(o.request_id, "a") << "output after abort";
      if (o.request_id == "b" && o.finished) b_tokens = o.outputs[0].token_ids.size();
    }
  EXPECT_EQ(b_tokens, 30u);
  EXPECT_LT(at_abort, 30u);
  EXPECT_EQ(eng->cache().num_free_blocks(), eng->cache().geometry().num_blocks);
}
