// Multi-token (verify) steps on the toy model and ToyDrafter: for every forced acceptance
// length 0..L and a mixed pattern, output is token-identical (and logprob-identical) to plain
// decoding — alone, batched with mixed lengths, with chunked prefill, under preemption, with
// seeded sampling and penalties, grammars, max_tokens, stop ids and stop strings inside an
// accepted run. Every step keeps the budget, the cache invariants and releases nothing early.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "engine/spec_verify.h"
#include "engine/toy_drafter.h"
#include "engine/toy_model.h"

#include "spec_test_util.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
constexpr int32_t kL = 4;  // drafts per step

std::vector<int32_t> prompt_ids(int i, int len) {
  std::vector<int32_t> p = {0};
  for (int j = 1; j < len; ++j) p.push_back(2 + 'a' + (i * 7 + j * 3) % 26);
  return p;
}

using spec_test::greedy;

SamplingParams seeded(int n, uint64_t seed) {
  SamplingParams p = greedy(n);
  p.temperature = 0.8f;
  p.top_k = 40;
  p.seed = seed;
  return p;
}

struct SpecSetup {
  int64_t max_batched = 256;
  int64_t max_seqs = 16;
  size_t cache_bytes = 0;      // 0 = auto
  int32_t drafts = 0;          // 0 = plain decoding
  ToyAcceptPattern pattern = [](int64_t) { return kL; };
  int64_t eos_token_id = 1;
};

struct SpecRun {
  std::map<std::string, RequestOutput> out;
  SchedulerStats stats;
  ModelRunner::Stats runner;
  int64_t model_rollbacks = 0;
  int64_t drafter_fed = 0;
};

// Runs every (prompt, params) pair to completion, checking the step invariants as it goes.
SpecRun run_all(const SpecSetup& s, const std::vector<std::vector<int32_t>>& prompts, const std::vector<SamplingParams>& params,
        bool with_grammar = false) {
  ToyModelConfig tc;
  tc.max_rollback = kL + 1;
  tc.eos_token_id = s.eos_token_id;
  auto model = std::make_unique<ToyModel>(tc);
  ToyModel* toy = model.get();
  auto drafter = std::make_unique<ToyDrafter>(tc, kL, s.pattern);
  ToyDrafter* d = drafter.get();
  if (s.drafts > 0) model->set_drafter(std::move(drafter));
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = s.max_batched;
  ec.scheduler.max_num_seqs = s.max_seqs;
  ec.kv_cache_memory_bytes = s.cache_bytes;
  ec.num_speculative_tokens = s.drafts;
  auto codec = make_toy_codec(tc.vocab_size);
  auto grammar = with_grammar ? make_grammar_compiler(codec.get(), tc.vocab_size, 1) : nullptr;
  Engine eng(ec, std::move(model), std::move(codec), std::move(grammar));
  for (size_t i = 0; i < prompts.size(); ++i)
    eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompts[i]), params[i % params.size()], 0);
  SpecRun r;
  while (eng.has_unfinished()) {
    for (RequestOutput& o : eng.step())
      if (o.finished) r.out[o.request_id] = std::move(o);
    eng.cache().check_invariants();
    // Plain runs schedule asynchronously (the default): a step in flight may hold released blocks;
    // drafting steps are pipelined (applied before the next is planned): nothing waits.
    if (!eng.async_scheduling() || eng.pipelined_drafting()) {
      EXPECT_EQ(eng.cache().num_pending_blocks(), 0) << "synchronous steps release everything at update()";
    }
    const model::ForwardBatch b = eng.runner().last_batch();
    EXPECT_LE(b.num_tokens(), s.max_batched);
    EXPECT_LE(int64_t(b.seqs.size()), s.max_seqs);
  }
  EXPECT_EQ(eng.cache().num_free_blocks(), eng.cache().geometry().num_blocks);
  r.stats = eng.scheduler().stats();
  r.runner = eng.runner().stats();
  r.model_rollbacks = toy->num_rollbacks();
  r.drafter_fed = s.drafts > 0 ? d->num_fed_positions() : 0;
  return r;
}

void expect_same(const SpecRun& plain, const SpecRun& spec, const std::string& what) {
  ASSERT_EQ(plain.out.size(), spec.out.size()) << what;
  for (const auto& [id, a] : plain.out) {
    const RequestOutput& b = spec.out.at(id);
    ASSERT_TRUE(a.error.empty() && b.error.empty()) << what << ": " << a.error << b.error;
    ASSERT_EQ(a.outputs.size(), b.outputs.size());
    for (size_t k = 0; k < a.outputs.size(); ++k) {
      const CompletionOutput &x = a.outputs[k], &y = b.outputs[k];
      EXPECT_EQ(x.token_ids, y.token_ids) << what << ", request " << id;
      EXPECT_EQ(x.text, y.text) << what << ", request " << id;
      EXPECT_EQ(x.finish_reason, y.finish_reason) << what << ", request " << id;
      EXPECT_EQ(x.stop_token_id, y.stop_token_id) << what << ", request " << id;
      EXPECT_EQ(x.stop_string, y.stop_string) << what << ", request " << id;
      ASSERT_EQ(x.logprobs.has_value(), y.logprobs.has_value());
      if (x.logprobs) {
        ASSERT_EQ(x.logprobs->size(), y.logprobs->size());
        for (size_t j = 0; j < x.logprobs->size(); ++j)
          EXPECT_EQ((*x.logprobs)[j][0].second.logprob, (*y.logprobs)[j][0].second.logprob) << what << " token " << j;
      }
    }
  }
}

std::vector<std::vector<int32_t>> mixed_prompts(int n) {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < n; ++i) p.push_back(prompt_ids(i, 3 + 11 * i % 37));
  return p;
}
}  // namespace

TEST(SpecVerify, LongestMatchingPrefixThenTargetToken) {
  auto v = verify_drafts(std::vector<int32_t>{5, 6, 7}, std::vector<int32_t>{5, 6, 9, 4});
  EXPECT_EQ(v.num_accepted, 2);
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{5, 6, 9}));
  v = verify_drafts(std::vector<int32_t>{5, 6}, std::vector<int32_t>{5, 6, 8});
  EXPECT_EQ(v.num_accepted, 2);
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{5, 6, 8}));  // all accepted: plus the bonus
  v = verify_drafts(std::vector<int32_t>{3}, std::vector<int32_t>{2, 8});
  EXPECT_EQ(v.num_accepted, 0);
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{2}));
  v = verify_drafts({}, std::vector<int32_t>{7});
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{7}));
  EXPECT_THROW(verify_drafts(std::vector<int32_t>{1}, std::vector<int32_t>{1}), InternalError);
}

// Random chunks with random rollbacks after each: the logits equal a recompute of the kept
// tokens, and rolling back further than max_rollback is refused.
TEST(SpecToyModel, RollbackEqualsRecompute) {
  ToyModelConfig tc;
  tc.max_rollback = 5;
  ToyModel m(tc);
  kv::CacheGeometry g = m.plan_cache(size_t(1) << 20, 2);
  m.allocate_cache(g);
  m.reset_slot(1);
  std::mt19937 rng(7);
  std::vector<int32_t> kept;
  std::vector<int32_t> table;
  for (int32_t b = 0; b < g.num_blocks / 2; ++b) table.push_back(b);
  for (int it = 0; it < 40; ++it) {
    const int32_t n = 1 + int32_t(rng() % 7);
    model::ForwardBatch b;
    for (int32_t j = 0; j < n; ++j) b.token_ids.push_back(2 + int32_t(rng() % 300));
    b.seqs.push_back({1, table, int64_t(kept.size()), n});
    for (int32_t j = 0; j < n; ++j) b.logits_indices.push_back(j);
    Tensor logits = m.forward(b);
    std::vector<int32_t> all = kept;
    all.insert(all.end(), b.token_ids.begin(), b.token_ids.end());
    const auto ref = ToyModel::reference_logits(tc, all);
    for (int32_t j = 0; j < n; ++j)
      for (int64_t v = 0; v < tc.vocab_size; ++v)
        ASSERT_EQ(logits.data<float>()[j * tc.vocab_size + v], ref[(kept.size() + size_t(j)) * size_t(tc.vocab_size) + size_t(v)]);
    const int64_t drop = std::min<int64_t>(int64_t(rng() % 6), n);
    m.rollback(1, int64_t(all.size()), int64_t(all.size()) - drop);
    all.resize(all.size() - size_t(drop));
    kept = all;
  }
  EXPECT_THROW(m.rollback(1, int64_t(kept.size()), int64_t(kept.size()) - 6), InvalidArgument);
}

// The core identity: greedy speculative == plain, for every forced acceptance 0..L and a mixed
// pattern, in a batch of mixed lengths; the forced pattern is what the engine measures.
TEST(SpecDecode, GreedyIdenticalForEveryAcceptLength) {
  const auto prompts = mixed_prompts(6);
  const std::vector<SamplingParams> params = {greedy(40), greedy(17), greedy(33)};
  const SpecRun plain = run_all({}, prompts, params);
  EXPECT_EQ(plain.stats.num_draft_tokens, 0);
  for (int32_t a = 0; a <= kL; ++a) {
    SpecSetup s;
    s.drafts = kL;
    s.pattern = [a](int64_t) { return a; };
    const SpecRun spec = run_all(s, prompts, params);
    expect_same(plain, spec, "accept " + std::to_string(a));
    ASSERT_GT(spec.stats.num_draft_tokens, 0);
    // Greedy without sampling transforms: the target accepts exactly the correct drafts, min(a,
    // drafts scheduled) per step (fewer than L are scheduled near max_tokens).
    if (a == 0) { EXPECT_EQ(spec.stats.num_accepted_drafts, 0); }
    if (a == kL) { EXPECT_EQ(spec.stats.num_accepted_drafts, spec.stats.num_draft_tokens); }
    EXPECT_GE(spec.stats.num_accepted_drafts * kL, spec.stats.num_draft_tokens * a) << "accept " << a;
    EXPECT_LT(spec.stats.num_steps, plain.stats.num_steps + (a == 0 ? 1 : 0)) << "accept " << a;
    EXPECT_GT(spec.drafter_fed, 0);
    if (a < kL) { EXPECT_GT(spec.model_rollbacks, 0); }
  }
  SpecSetup mixed;
  mixed.drafts = kL;
  mixed.pattern = [](int64_t pos) { return int32_t((pos * 7 + pos / 3) % (kL + 1)); };
  expect_same(plain, run_all(mixed, prompts, params), "mixed pattern");
}

// Chunked prefill (a budget smaller than a prompt and than 1 + L for several sequences),
// preemption mid-verify (a cache that cannot hold everyone) and both together.
TEST(SpecDecode, IdenticalUnderChunkingAndPreemption) {
  const auto prompts = mixed_prompts(8);
  const std::vector<SamplingParams> params = {greedy(48), seeded(40, 11)};
  SpecSetup base;
  base.max_seqs = 8;
  const SpecRun plain = run_all(base, prompts, params);
  struct Case { const char* name; int64_t budget; size_t cache; bool preempts; };
  // Toy cache: 64 B per 16-token block, 24 B per slot; 8 slots + 16 blocks = 256 tokens for 8
  // sequences of up to ~90 tokens: sequences are preempted and recomputed.
  const std::vector<Case> cases = {{"chunked", 7, 0, false}, {"tight budget", 3, 0, false},
                                   {"preempted", 64, 8 * 24 + 16 * 64, true}, {"chunked+preempted", 9, 8 * 24 + 6 * 64, true}};
  for (const Case& c : cases)
    for (int32_t a : {0, 2, kL}) {
      SpecSetup s = base;
      s.max_batched = c.budget;
      s.cache_bytes = c.cache;
      s.drafts = kL;
      s.pattern = [a](int64_t pos) { return (pos % 3 == 0) ? kL : a; };
      const SpecRun spec = run_all(s, prompts, params);
      expect_same(plain, spec, std::string(c.name) + ", accept " + std::to_string(a));
      if (c.preempts) { EXPECT_GT(spec.stats.num_preemptions, 0) << c.name; }
      EXPECT_GT(spec.stats.num_draft_tokens, 0) << c.name;
    }
}

// Seeded sampling with penalties, min_tokens, logit bias and logprobs: each row is drawn as
// plain decoding would draw it (history with the earlier drafts, same Philox position).
TEST(SpecDecode, SeededSamplingAndPenaltiesIdentical) {
  const auto prompts = mixed_prompts(5);
  SamplingParams p = seeded(36, 5);
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.4f;
  p.presence_penalty = 0.2f;
  p.min_tokens = 9;
  p.ignore_eos = false;
  p.logit_bias = {{1, 2.5f}};  // EOS likely once min_tokens allows it
  p.logprobs = 2;
  SamplingParams g = greedy(30);
  g.repetition_penalty = 1.5f;
  g.logprobs = 0;
  const SpecRun plain = run_all({}, prompts, {p, g});
  for (int32_t a : {0, 1, kL}) {
    SpecSetup s;
    s.drafts = kL;
    s.pattern = [a](int64_t) { return a; };
    expect_same(plain, run_all(s, prompts, {p, g}), "accept " + std::to_string(a));
  }
}

// A stop token, EOS, max_tokens and a stop string falling inside an accepted run end it at the
// same token as plain decoding; nothing past it is emitted.
TEST(SpecDecode, StopsInsideAcceptedRun) {
  const auto prompts = mixed_prompts(4);
  const SpecRun base = run_all({}, prompts, {greedy(60)});
  const RequestOutput& r0 = base.out.at("0");
  const std::vector<int32_t>& toks = r0.outputs[0].token_ids;
  ASSERT_GE(toks.size(), 40u);
  SamplingParams stop_id = greedy(60);
  stop_id.stop_token_ids = {toks[13]};
  stop_id.ignore_eos = false;
  SamplingParams stop_str = greedy(60);
  stop_str.stop = {r0.outputs[0].text.substr(21, 3)};
  SamplingParams short_len = greedy(11);
  SamplingParams min_tok = stop_id;
  min_tok.min_tokens = 20;  // the stop id is masked until then
  SamplingParams eos = greedy(60);
  eos.ignore_eos = false;
  int k = 0;
  for (const SamplingParams& p : {stop_id, stop_str, short_len, min_tok, eos}) {
    SpecSetup plain_setup;
    if (k++ == 4) plain_setup.eos_token_id = toks[17];  // a token the greedy drafts propose
    const SpecRun plain = run_all(plain_setup, prompts, {p});
    for (int32_t a : {1, kL}) {
      SpecSetup s = plain_setup;
      s.drafts = kL;
      s.pattern = [a](int64_t) { return a; };
      const SpecRun spec = run_all(s, prompts, {p});
      expect_same(plain, spec, "case " + std::to_string(k - 1) + ", accept " + std::to_string(a));
      if (a == kL) { EXPECT_GT(spec.stats.num_accepted_drafts, 0); }
    }
    if (k == 5) { EXPECT_EQ(plain.out.at("0").outputs[0].stop_token_id, toks[17]) << "EOS ended request 0"; }
  }
  const SpecRun with_stop = run_all({}, prompts, {stop_str});
  EXPECT_EQ(with_stop.out.at("0").outputs[0].finish_reason, "stop");
  EXPECT_TRUE(with_stop.out.at("0").outputs[0].stop_string.has_value());
}

// Grammars: masks for every sampling row, drafts the grammar rejects are cut before
// verification, the matcher is rolled back; output identical to plain.
TEST(SpecDecode, GrammarIdenticalWithDrafts) {
  const auto prompts = mixed_prompts(4);
  SamplingParams p = greedy(40);
  p.structured_outputs.emplace();
  p.structured_outputs->regex = "[a-z]{3,9}(-[a-z0-9]{2,5}){2,4}";
  SamplingParams s2 = seeded(40, 3);
  s2.structured_outputs = p.structured_outputs;
  const SpecRun plain = run_all({}, prompts, {p, s2}, true);
  if (plain.out.at("0").error.find("grammar module") != std::string::npos) GTEST_SKIP() << "no grammar module";
  for (int32_t a : {0, 2, kL}) {
    SpecSetup s;
    s.drafts = kL;
    s.pattern = [a](int64_t) { return a; };
    const SpecRun spec = run_all(s, prompts, {p, s2}, true);
    expect_same(plain, spec, "grammar, accept " + std::to_string(a));
    if (a > 0) { EXPECT_GT(spec.stats.num_accepted_drafts, 0) << "drafts inside the grammar are verified"; }
  }
}

TEST(SpecDecode, DraftsNeedADrafter) {
  EngineConfig ec;
  ec.num_speculative_tokens = 3;
  EXPECT_THROW(Engine(ec, std::make_unique<ToyModel>(), nullptr), InvalidArgument);
  // A drafter but a model that cannot roll back: drafting is capped to what the model undoes.
  ToyModelConfig tc;
  tc.max_rollback = 2;
  auto m = std::make_unique<ToyModel>(tc);
  m->set_drafter(std::make_unique<ToyDrafter>(tc, 8, [](int64_t) { return 8; }));
  Engine eng(ec, std::move(m), nullptr);
  EXPECT_EQ(eng.scheduler().config().num_speculative_tokens, 2);
}

// A sequence aborted while its step is in flight keeps its blocks and slot until that step is
// reported complete (update()), so nothing the device may still write is handed out again.
TEST(SpecDecode, AbortedSequenceCacheWaitsForItsStep) {
  ToyModel model;
  kv::CacheGeometry g = model.plan_cache(size_t(1) << 16, 4);
  model.allocate_cache(g);
  KVCacheManager cache(g);
  Scheduler sched({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 512}, cache, model.vocab_size());
  ModelRunner runner(model);
  auto params = std::make_shared<const SamplingParams>(greedy(5));
  for (int64_t id = 0; id < 2; ++id) {
    auto r = std::make_unique<Request>();
    r->seq_id = id;
    r->arrival = id;
    r->params = params;
    r->prompt_ids = std::make_shared<const std::vector<int32_t>>(prompt_ids(int(id), 40));
    r->max_output_tokens = 5;
    r->eos_token_id = 1;
    sched.add(std::move(r));
  }
  SchedulerOutput step = sched.schedule();
  ASSERT_EQ(step.scheduled.size(), 2u);
  const int64_t free_before = cache.num_free_blocks(), slots_before = cache.num_free_slots();
  const int64_t held = int64_t(cache.get(0)->block_ids.size());  // prefix caching may cut the chunk
  sched.abort(0);  // while `step` runs
  EXPECT_EQ(cache.num_free_blocks(), free_before);
  EXPECT_EQ(cache.num_free_slots(), slots_before);
  EXPECT_EQ(cache.num_pending_blocks(), held);
  cache.check_invariants();
  ModelRunnerOutput result = runner.execute(step);
  std::vector<SeqUpdate> updates = sched.update(step, result);
  EXPECT_EQ(updates.size(), 1u);  // the aborted sequence produces nothing
  EXPECT_EQ(cache.num_pending_blocks(), 0);
  EXPECT_EQ(cache.num_free_blocks(), free_before + held);
  EXPECT_EQ(cache.num_free_slots(), slots_before + 1);
  cache.check_invariants();
}
