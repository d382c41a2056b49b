// Prefix caching (issue #16) on the toy model, whose logits hash the whole history through its
// slot state and its paged blocks, so a wrong block, a stale slot or a checkpoint of other
// tokens changes the output: every test compares outputs (tokens, logprobs) with the cache on
// against the cache off or a request run alone, and checks that hits really happened.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>

#include "engine/engine.h"
#include "engine/prefix_cache.h"
#include "engine/toy_drafter.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
constexpr int64_t kBT = 16;  // ToyModelConfig::block_tokens
constexpr int32_t kL = 3;    // drafts with speculative decoding on

struct PrefixSetup {
  bool prefix = true;
  int64_t interval = 1;        // checkpoint_interval_blocks
  int64_t max_batched = 256;
  int64_t max_seqs = 16;
  int64_t num_blocks = 0;      // 0 = auto budget
  int32_t drafts = 0;
  bool grammar = false;
  int64_t host_blocks = 0;     // host tier
  std::optional<bool> async;   // DEEPINFER_ASYNC_SCHEDULING (unset: the default, on)
  bool async_copies = false;   // EngineConfig::async_checkpoint_copies
};

struct PrefixRun {
  std::map<std::string, RequestOutput> out;
  PrefixCacheStats prefix;
  int64_t restores = 0, evictions = 0, forward_tokens = 0;
  int64_t to_host = 0, from_host = 0;  // host-tier block copies
  bool async = false;                  // the engine ran asynchronously
};

// Runs the requests; `waves` splits them: each wave is added when the previous one finished
// (later waves can hit what earlier ones cached), the requests of a wave run concurrently.
PrefixRun run_waves(const PrefixSetup& s, const std::vector<std::vector<int32_t>>& prompts, const std::vector<SamplingParams>& params,
              const std::vector<size_t>& waves) {
  ToyModelConfig tc;
  tc.max_rollback = kL + 1;
  auto model = std::make_unique<ToyModel>(tc);
  ToyModel* toy = model.get();
  if (s.drafts > 0) model->set_drafter(std::make_unique<ToyDrafter>(tc, kL, [](int64_t p) { return int32_t(p % 4); }));
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = s.max_batched;
  ec.scheduler.max_num_seqs = s.max_seqs;
  ec.scheduler.prefix_cache.enabled = s.prefix;
  ec.scheduler.prefix_cache.checkpoint_interval_blocks = s.interval;
  ec.kv_cache_memory_bytes = s.num_blocks ? size_t(s.max_seqs) * 24 + size_t(s.num_blocks) * kBT * 4 : 0;
  ec.num_speculative_tokens = s.drafts;
  ec.prefix_host_bytes = size_t(s.host_blocks) * kBT * 4;
  ec.env.async_scheduling = s.async;
  ec.async_checkpoint_copies = s.async_copies;
  auto codec = make_toy_codec(tc.vocab_size);
  auto grammar = s.grammar ? make_grammar_compiler(codec.get(), tc.vocab_size, 1) : nullptr;
  Engine eng(ec, std::move(model), std::move(codec), std::move(grammar));
  PrefixRun r;
  r.async = eng.async_scheduling();
  size_t next = 0;
  for (size_t w = 0; w <= waves.size(); ++w) {
    const size_t end = w < waves.size() ? waves[w] : prompts.size();
    for (; next < end; ++next)
      eng.add_request(std::to_string(next), PromptInput::from_token_ids(prompts[next]), params[next % params.size()], 0);
    while (eng.has_unfinished()) {
      for (RequestOutput& o : eng.step())
        if (o.finished) r.out[o.request_id] = std::move(o);
      eng.cache().check_invariants();
      r.forward_tokens += eng.runner().last_batch().num_tokens();
    }
  }
  EXPECT_EQ(eng.cache().num_free_blocks(), eng.cache().geometry().num_blocks);
  r.prefix = eng.scheduler().prefix_cache().stats();
  r.restores = toy->num_restores();
  r.evictions = eng.cache().num_evictions();
  r.to_host = eng.runner().stats().blocks_to_host;
  r.from_host = eng.runner().stats().blocks_from_host;
  return r;
}

void expect_same(const PrefixRun& a, const PrefixRun& b, const std::string& what) {
  ASSERT_EQ(a.out.size(), b.out.size()) << what;
  for (const auto& [id, x] : a.out) {
    const RequestOutput& y = b.out.at(id);
    ASSERT_TRUE(x.error.empty() && y.error.empty()) << what << ": " << x.error << y.error;
    ASSERT_EQ(x.outputs.size(), y.outputs.size()) << what;
    for (size_t k = 0; k < x.outputs.size(); ++k) {
      EXPECT_EQ(x.outputs[k].token_ids, y.outputs[k].token_ids) << what << ", request " << id;
      EXPECT_EQ(x.outputs[k].finish_reason, y.outputs[k].finish_reason) << what << ", request " << id;
      ASSERT_EQ(x.outputs[k].logprobs.has_value(), y.outputs[k].logprobs.has_value());
      if (x.outputs[k].logprobs) {
        for (size_t j = 0; j < x.outputs[k].logprobs->size(); ++j)
          EXPECT_EQ((*x.outputs[k].logprobs)[j][0].second.logprob, (*y.outputs[k].logprobs)[j][0].second.logprob)
              << what << ", request " << id << " token " << j;
      }
    }
    ASSERT_EQ(x.prompt_logprobs.has_value(), y.prompt_logprobs.has_value()) << what;
    if (x.prompt_logprobs) {
      for (size_t j = 1; j < x.prompt_logprobs->size(); ++j)
        EXPECT_EQ((*x.prompt_logprobs)[j]->at(0).second.logprob, (*y.prompt_logprobs)[j]->at(0).second.logprob)
            << what << ", request " << id << " prompt position " << j;
    }
  }
}

std::vector<int32_t> tokens(uint32_t seed, size_t len) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(len);
  for (auto& x : t) x = int32_t(2 + g() % 300);
  return t;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

SamplingParams sampled(int n, uint64_t seed, bool logprobs = true) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 50;
  p.max_tokens = n;
  p.ignore_eos = true;
  p.seed = seed;
  if (logprobs) p.logprobs = 2;
  return p;
}
}  // namespace

TEST(PrefixCacheUnit, ChunksEndAtCheckpointBoundaries) {
  PrefixCache every({.enabled = true, .checkpoint_interval_blocks = 1}, 16);
  EXPECT_EQ(every.cut_chunk(0, 100, 100), 16);   // the first boundary
  EXPECT_EQ(every.cut_chunk(16, 84, 100), 16);
  EXPECT_EQ(every.cut_chunk(5, 8, 100), 8);      // crosses none
  EXPECT_EQ(every.cut_chunk(99, 1, 100), 1);     // decode is never cut
  EXPECT_EQ(every.cut_chunk(80, 20, 100), 16);   // 96: the last boundary before token 99
  EXPECT_EQ(every.cut_chunk(96, 4, 100), 4);
  PrefixCache last({.enabled = true, .checkpoint_interval_blocks = 0}, 16);
  EXPECT_EQ(last.cut_chunk(0, 100, 100), 96);    // only the prompt's last boundary
  EXPECT_EQ(last.cut_chunk(0, 96, 96), 80);      // 96 leaves no token: its last hit point is 80
  PrefixCache four({.enabled = true, .checkpoint_interval_blocks = 4}, 16);
  EXPECT_EQ(four.cut_chunk(10, 200, 300), 54);   // to 64
  PrefixCache off({.enabled = false}, 16);
  EXPECT_EQ(off.cut_chunk(0, 100, 100), 100);
  // A branch point (the end of blocks an earlier sequence cached) is one more boundary.
  EXPECT_EQ(last.cut_chunk(0, 100, 100, 32), 32);
  EXPECT_EQ(last.cut_chunk(32, 68, 100, 32), 64);  // passed: only the last boundary is left
  EXPECT_EQ(four.cut_chunk(10, 200, 300, 128), 54);  // the interval's boundary comes first
  EXPECT_EQ(four.cut_chunk(64, 200, 300, 80), 16);
  EXPECT_EQ(off.cut_chunk(0, 100, 100, 32), 100);  // nothing is cut with the cache off
}

// PrefixMatch::cached_tokens: the run of cached blocks, checkpointed or not.
TEST(PrefixCacheUnit, MatchReportsTheCachedRunPastItsHit) {
  kv::CacheGeometry g{.block_tokens = 4, .num_blocks = 8, .num_slots = 2};
  KVCacheManager kv(g, block_hash_seed("t"));
  const std::vector<int32_t> p = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  ASSERT_TRUE(kv.allocate(0, 13));
  kv.hash_full_blocks(0, p, {}, 13);
  PrefixCache pc({.enabled = true, .checkpoint_interval_blocks = 0}, 4);
  std::vector<int32_t> q = {5, 6, 7, 8, 9, 10, 11, 12, 40, 41, 42, 43, 44, 45};  // shares 2 blocks
  PrefixMatch m = pc.match(kv, q, {});
  EXPECT_EQ(m.num_tokens, 0);  // no checkpoint anywhere
  EXPECT_EQ(m.cached_tokens, 8);
  pc.put({block_hash(kv.hash_seed(), std::span(p).first(4)), std::make_shared<const model::SlotSnapshot>(
                                                                 model::SlotSnapshot{4, std::vector<uint8_t>(8)})});
  m = pc.match(kv, q, {});
  EXPECT_EQ(m.num_tokens, 4);
  EXPECT_EQ(m.cached_tokens, 8);
  m = pc.match(kv, std::span(p).first(9), {});  // 8 would leave no token: 2 blocks at most
  EXPECT_EQ(m.cached_tokens, 8);
  m = pc.match(kv, std::span(p).first(8), {});
  EXPECT_EQ(m.cached_tokens, 4);
  kv.free(0, 0);
  kv.complete_step(0);
}

// checkpoint_interval_blocks = -1 (the default): every block unless the model says prefill chunks
// shorter than its weight pass are weight-bound; then every ceil(tokens / block)-th block.
TEST(PrefixCacheUnit, AutomaticIntervalKeepsChunksAboveTheWeightPass) {
  for (const auto& [pass, want] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {10, 1}, {16, 1}, {17, 2}, {40, 3}, {1330, 84}}) {
    ToyModel m(ToyModelConfig{.prefill_weight_pass_tokens = pass});
    EXPECT_EQ(auto_checkpoint_interval(m, 16), want) << "weight pass " << pass << " tokens";
  }
  ToyModel flash(ToyModelConfig{.prefill_weight_pass_tokens = 1330});  // a V4-Flash-shaped stack on the H200
  EXPECT_EQ(auto_checkpoint_interval(flash, 256), 6);
  // Through the engine: a 100-token prompt on a model whose weight pass is 40 tokens is cut at 48
  // and 96 (its last boundary), so a prompt sharing its first 40 tokens finds no checkpoint inside
  // them; with checkpoints at every block it hits at 32.
  auto hit_after_shared_40 = [](std::optional<int64_t> interval) {
    EngineConfig ec;
    ec.scheduler.max_num_seqs = 4;
    ec.scheduler.max_num_batched_tokens = 256;
    if (interval) ec.scheduler.prefix_cache.checkpoint_interval_blocks = *interval;
    Engine eng(ec, std::make_unique<ToyModel>(ToyModelConfig{.prefill_weight_pass_tokens = 40}), nullptr);
    std::vector<int32_t> a(100), b(70);
    for (int i = 0; i < 100; ++i) a[size_t(i)] = 2 + (i * 7) % 300;
    for (int i = 0; i < 70; ++i) b[size_t(i)] = i < 40 ? a[size_t(i)] : 5;
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 1;
    int64_t cached = -1, k = 0;
    for (const auto* p : {&a, &b, &a}) {
      eng.add_request("r" + std::to_string(k++), PromptInput::from_token_ids(*p), sp, 0);
      while (eng.has_unfinished())
        for (const RequestOutput& o : eng.step())
          if (o.finished) cached = o.num_cached_tokens;
      if (p == &b) { EXPECT_EQ(cached, interval ? 32 : 0) << "prompt sharing 40 tokens"; }
    }
    return cached;  // a again: its last boundary
  };
  EXPECT_EQ(hit_after_shared_40(std::nullopt), 96);
  EXPECT_EQ(hit_after_shared_40(1), 96);
}

// Long intervals keep shared prefixes reusable: the second prompt sharing a prefix ends a chunk
// where the cached blocks it shares end (a branch point) and saves the state there, so from the
// third on every prompt with that prefix hits at the last whole block inside it. Outputs are those
// of the cache off, at every interval, asynchronous or not.
TEST(PrefixCache, BranchPointsMakeSharedPrefixesHitUnderLongIntervals) {
  const std::vector<int32_t> sys = tokens(71, 75);  // 4 whole blocks + 11 tokens
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t u = 0; u < 5; ++u) prompts.push_back(cat(sys, tokens(100 + u, 9 + 13 * u)));
  const std::vector<SamplingParams> params = {sampled(6, 5)};
  const std::vector<size_t> waves = {1, 2, 3, 4};  // one prompt at a time
  const PrefixRun off = run_waves({.prefix = false}, prompts, params, waves);
  for (int64_t interval : {0, 3, 8}) {
    for (bool async : {false, true}) {
      const std::string what = "interval " + std::to_string(interval) + (async ? ", async" : ", sync");
      const PrefixRun on = run_waves({.interval = interval, .async = async}, prompts, params, waves);
      expect_same(off, on, what);
      EXPECT_EQ(on.out.at("0").num_cached_tokens, 0) << what;
      // The second prompt's hit: interval 3 put a checkpoint at 48 inside the prefix; 0 and 8 none.
      EXPECT_EQ(on.out.at("1").num_cached_tokens, interval == 3 ? 48 : 0) << what;
      for (const char* id : {"2", "3", "4"}) EXPECT_EQ(on.out.at(id).num_cached_tokens, 64) << what << ", request " << id;
    }
  }
}

TEST(PrefixCacheUnit, CheckpointBudgetEvictsLeastRecentlyUsed) {
  PrefixCache pc({.enabled = true, .checkpoint_interval_blocks = 1, .checkpoint_budget_bytes = 100}, 16);
  auto snap = [](size_t n) { return std::make_shared<const model::SlotSnapshot>(model::SlotSnapshot{16, std::vector<uint8_t>(n)}); };
  pc.put({1, snap(40)});
  pc.put({2, snap(40)});
  pc.put({3, snap(40)});  // evicts 1
  EXPECT_FALSE(pc.has(1));
  EXPECT_TRUE(pc.has(2) && pc.has(3));
  pc.put({4, snap(200)});  // larger than the budget: not kept
  EXPECT_FALSE(pc.has(4));
  pc.drop(2);
  EXPECT_EQ(pc.stats().num_checkpoints, 1);
  EXPECT_EQ(pc.stats().checkpoint_bytes, 40u);
  EXPECT_EQ(pc.stats().checkpoints_evicted, 3);
}

TEST(PrefixCacheUnit, SharedBlocksRefcountedAndVerified) {
  kv::CacheGeometry g{.block_tokens = 4, .num_blocks = 6, .num_slots = 3};
  KVCacheManager kv(g, block_hash_seed("t"));
  const std::vector<int32_t> p = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  ASSERT_TRUE(kv.allocate(0, 9));
  kv.hash_full_blocks(0, p, {}, 9);
  const SeqCache a = *kv.get(0);
  const uint64_t h0 = block_hash(kv.hash_seed(), std::span(p).first(4));
  EXPECT_EQ(kv.find_cached(h0, kv.hash_seed(), std::span(p).first(4)), a.block_ids[0]);
  const std::vector<int32_t> other = {5, 6, 7, 9};
  EXPECT_EQ(kv.find_cached(h0, kv.hash_seed(), other), -1) << "token ids are compared, not only the hash";
  EXPECT_EQ(kv.find_cached(h0, h0, std::span(p).first(4)), -1) << "the parent hash is compared";
  kv.free(0, 0);  // step 0 in flight: pending
  const std::vector<int32_t> prefix = {a.block_ids[0], a.block_ids[1]};
  ASSERT_TRUE(kv.allocate_with_prefix(1, prefix, 10));  // takes the pending blocks back
  kv.check_invariants();
  EXPECT_EQ(kv.ref_count(a.block_ids[0]), 1);
  kv.free(1, 1);
  kv.complete_step(1);  // both releases done
  kv.check_invariants();
  EXPECT_EQ(kv.num_free_blocks(), 6);
  const std::vector<int32_t> front = {a.block_ids[0]};
  ASSERT_TRUE(kv.allocate_with_prefix(2, front, 8));
  EXPECT_EQ(kv.num_free_blocks(), 4);
  EXPECT_FALSE(kv.allocate_with_prefix(3, front, 4 * 7)) << "7 blocks do not fit";
  kv.check_invariants();
  ASSERT_TRUE(kv.allocate(4, 16));  // takes the other 4 free blocks, evicting the second block's hash
  EXPECT_EQ(kv.take_evicted().size(), 1u);
  kv.check_invariants();
}

// Second requests share the first's prefix up to every block boundary and inside blocks.
TEST(PrefixCache, HitsAtEveryBoundaryAndInsideBlocksAreExact) {
  const std::vector<int32_t> base = tokens(1, 5 * kBT + 3);
  std::vector<std::vector<int32_t>> prompts = {base};
  for (int64_t shared : {int64_t(1), kBT - 1, kBT, kBT + 1, 2 * kBT, 3 * kBT + 7, 5 * kBT, 5 * kBT + 3})
    prompts.push_back(cat(std::vector<int32_t>(base.begin(), base.begin() + shared), tokens(uint32_t(shared), 20)));
  prompts.push_back(base);  // the whole prompt again: hits at its last boundary
  std::vector<size_t> waves;
  for (size_t i = 1; i < prompts.size(); ++i) waves.push_back(i);  // one at a time
  const std::vector<SamplingParams> params = {sampled(24, 7)};
  const PrefixRun off = run_waves({.prefix = false}, prompts, params, waves);
  const PrefixRun on = run_waves({}, prompts, params, waves);
  expect_same(off, on, "cache on vs off");
  const std::vector<int64_t> want = {0, 0, 0, kBT, kBT, 2 * kBT, 3 * kBT, 5 * kBT, 5 * kBT, 5 * kBT};
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(on.out.at(std::to_string(i)).num_cached_tokens, want[i]) << "request " << i;
  EXPECT_EQ(off.prefix.hit_tokens, 0);
  EXPECT_EQ(on.restores, 7);
  EXPECT_LT(on.forward_tokens, off.forward_tokens);
}

// A conversation: each turn's prompt is the previous prompt + its answer + a new message; the
// checkpoints saved while decoding make the next turn hit at the answer's last boundary.
TEST(PrefixCache, MultiTurnHitsInsideTheAnswer) {
  std::vector<std::vector<int32_t>> turns = {tokens(2, 40)};
  PrefixRun on;
  for (int t = 0; t < 4; ++t) {
    std::vector<size_t> waves;
    for (size_t i = 1; i < turns.size(); ++i) waves.push_back(i);
    on = run_waves({}, turns, {sampled(30, 11, false)}, waves);
    const RequestOutput& last = on.out.at(std::to_string(turns.size() - 1));
    turns.push_back(cat(cat(turns.back(), last.outputs[0].token_ids), tokens(uint32_t(10 + t), 9)));
  }
  std::vector<size_t> waves;
  for (size_t i = 1; i < turns.size(); ++i) waves.push_back(i);
  on = run_waves({}, turns, {sampled(30, 11, false)}, waves);
  const PrefixRun off = run_waves({.prefix = false}, turns, {sampled(30, 11, false)}, waves);
  expect_same(off, on, "multi-turn");
  for (size_t i = 1; i < turns.size(); ++i) {
    const int64_t prev_end = int64_t(turns[i - 1].size()) + 30 - 1;  // computed positions of turn i - 1
    EXPECT_EQ(on.out.at(std::to_string(i)).num_cached_tokens, (prev_end / kBT) * kBT) << "turn " << i;
  }
}

// Evictions: a cache of few blocks; hits where blocks survive, misses where they were reused,
// outputs identical either way.
TEST(PrefixCache, ExactAfterEvictionAndWithConcurrentSharing) {
  const std::vector<int32_t> sys = tokens(3, 3 * kBT + 5);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(cat(i % 3 ? sys : tokens(uint32_t(40 + i), 50), tokens(uint32_t(i), 9 + i)));
  const std::vector<SamplingParams> params = {sampled(20, 5)};
  const std::vector<size_t> waves = {3, 6, 9};
  const PrefixRun off = run_waves({.prefix = false, .max_seqs = 3, .num_blocks = 24}, prompts, params, waves);
  const PrefixRun on = run_waves({.max_seqs = 3, .num_blocks = 24}, prompts, params, waves);
  expect_same(off, on, "small cache");
  EXPECT_GT(on.evictions, 0);
  EXPECT_GT(on.prefix.num_hits, 0);
  EXPECT_GT(on.prefix.checkpoints_evicted, 0) << "checkpoints leave with their blocks";
}

// Prompt logprobs are recomputed (no match); grammars and speculative decoding hit as usual.
TEST(PrefixCache, PromptLogprobsGrammarsAndDrafts) {
  const std::vector<int32_t> sys = tokens(4, 2 * kBT + 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(cat(sys, tokens(uint32_t(60 + i), 5 + 3 * i)));
  SamplingParams plp = sampled(12, 9);
  plp.prompt_logprobs = 1;
  const std::vector<size_t> waves = {1, 2, 3, 4, 5};
  const PrefixRun off_lp = run_waves({.prefix = false}, prompts, {plp}, waves);
  const PrefixRun on_lp = run_waves({}, prompts, {plp}, waves);
  expect_same(off_lp, on_lp, "prompt logprobs");
  EXPECT_EQ(on_lp.prefix.hit_tokens, 0);

  SamplingParams g = sampled(20, 3, false);
  g.structured_outputs.emplace();
  g.structured_outputs->regex = "[a-z]{3,9}(-[a-z0-9]{2,5}){2,4}";
  const PrefixRun off_g = run_waves({.prefix = false, .grammar = true}, prompts, {g}, waves);
  if (off_g.out.at("0").error.find("grammar module") == std::string::npos) {
    const PrefixRun on_g = run_waves({.grammar = true}, prompts, {g}, waves);
    expect_same(off_g, on_g, "grammar");
    EXPECT_GT(on_g.prefix.num_hits, 0);
  }
  const PrefixRun off_d = run_waves({.prefix = false}, prompts, {sampled(30, 4)}, waves);
  const PrefixRun on_d = run_waves({.drafts = kL}, prompts, {sampled(30, 4)}, waves);
  expect_same(off_d, on_d, "speculative decoding");
  EXPECT_EQ(on_d.prefix.num_hits, 5);
}

// No crosstalk: random requests (shared and unshared prefixes of random lengths, n > 1,
// speculative decoding on half of the runs, a host tier on half, a small cache that evicts and
// preempts) give the outputs each gives alone with the cache off.
TEST(PrefixCache, RandomizedNoCrosstalk) {
  std::mt19937 g(2026);
  std::vector<std::vector<int32_t>> roots = {tokens(100, 90), tokens(101, 70), tokens(102, 33)};
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    for (int i = 0; i < 14; ++i) {
      const auto& root = roots[g() % roots.size()];
      const size_t shared = g() % 3 == 0 ? 0 : 1 + g() % root.size();
      prompts.push_back(cat(std::vector<int32_t>(root.begin(), root.begin() + shared), tokens(g(), 1 + g() % 30)));
      SamplingParams p = sampled(5 + int(g() % 25), g(), g() % 2);
      p.n = 1 + int(g() % 2);
      params.push_back(p);
    }
    const PrefixSetup s{.max_batched = int64_t(32 + g() % 96), .max_seqs = 4, .num_blocks = 28,
                        .drafts = trial % 2 ? kL : 0, .host_blocks = trial >= 2 ? 12 : 0};
    std::vector<size_t> waves = {4, 8, 11};
    const PrefixRun on = run_waves(s, prompts, params, waves);  // params.size() == prompts.size(): one each
    EXPECT_GT(on.prefix.num_hits, 0) << "trial " << trial;
    if (s.host_blocks) { EXPECT_GT(on.to_host, 0) << "trial " << trial; }
    for (size_t i = 0; i < prompts.size(); ++i) {
      const PrefixRun alone = run_waves({.prefix = false}, {prompts[i]}, {params[i]}, {});
      PrefixRun one;
      one.out["0"] = on.out.at(std::to_string(i));
      expect_same(alone, one, "trial " + std::to_string(trial) + " request " + std::to_string(i));
    }
  }
}

// The host tier: a prefix's blocks are evicted from a small device cache by unrelated requests,
// spill to host slots and come back on a hit; outputs equal the cache off.
TEST(PrefixCache, HostTierRoundTripIsExact) {
  const std::vector<int32_t> sys = tokens(5, 4 * kBT + 2);
  std::vector<std::vector<int32_t>> prompts = {cat(sys, tokens(70, 6))};
  for (int i = 0; i < 4; ++i) prompts.push_back(tokens(uint32_t(80 + i), 3 * kBT + 5));  // evict sys
  for (int i = 0; i < 3; ++i) prompts.push_back(cat(sys, tokens(uint32_t(90 + i), 4 + i)));
  const std::vector<size_t> waves = {1, 5, 6, 7};
  const std::vector<SamplingParams> params = {sampled(10, 13)};
  const PrefixSetup small{.max_seqs = 2, .num_blocks = 12};
  PrefixSetup off = small, device = small, host = small;
  off.prefix = false;
  host.host_blocks = 64;
  const PrefixRun a = run_waves(off, prompts, params, waves);
  const PrefixRun b = run_waves(device, prompts, params, waves);
  const PrefixRun c = run_waves(host, prompts, params, waves);
  expect_same(a, b, "device only");
  expect_same(a, c, "host tier");
  EXPECT_EQ(b.out.at("5").num_cached_tokens, 0) << "the device cache lost the prefix";
  EXPECT_EQ(c.out.at("5").num_cached_tokens, 4 * kBT) << "the host tier kept it";
  EXPECT_EQ(c.out.at("7").num_cached_tokens, 4 * kBT);
  EXPECT_GT(c.to_host, 0);
  EXPECT_GE(c.from_host, 4);
  EXPECT_EQ(b.to_host + b.from_host, 0);
  // A host tier too small for the prefix: some blocks are lost, outputs still exact.
  host.host_blocks = 2;
  expect_same(a, run_waves(host, prompts, params, waves), "tiny host tier");
}

// Asynchronous scheduling with the cache on: the runner saves a step's checkpoints before the next
// step writes its slots, and a decode boundary's key (its block ends in the token the step in
// flight samples) is computed when that step is applied. Outputs, hits and checkpoints are those
// of synchronous steps: every boundary, decode boundaries (multi-turn), a small cache that
// evicts and preempts, a host tier, chunked prefill cut at boundaries.
TEST(PrefixCache, AsyncOnAndOffIdenticalWithHits) {
  const std::vector<int32_t> base = tokens(6, 5 * kBT + 3);
  std::vector<std::vector<int32_t>> prompts = {base};
  for (int64_t shared : {int64_t(1), kBT - 1, kBT, kBT + 1, 3 * kBT + 7, 5 * kBT + 3})
    prompts.push_back(cat(std::vector<int32_t>(base.begin(), base.begin() + shared), tokens(uint32_t(shared), 20)));
  std::vector<size_t> waves;
  for (size_t i = 1; i < prompts.size(); ++i) waves.push_back(i);
  SamplingParams greedy = sampled(3 * kBT, 0);
  greedy.temperature = 0;
  for (const auto& [what, setup] : std::vector<std::pair<std::string, PrefixSetup>>{
           {"one at a time", {}},
           {"small chunks", {.max_batched = 11}},
           {"small cache + host tier", {.max_batched = 40, .max_seqs = 2, .num_blocks = 14, .host_blocks = 16}},
           {"checkpoints at the prompt's end only", {.interval = 0}}}) {
    for (const std::vector<SamplingParams>& params :
         std::vector<std::vector<SamplingParams>>{{sampled(2 * kBT + 3, 21)}, {greedy}}) {
      PrefixSetup sync = setup, async = setup;
      sync.async = false;
      async.async = true;
      const PrefixRun a = run_waves(sync, prompts, params, waves);
      const PrefixRun b = run_waves(async, prompts, params, waves);
      ASSERT_FALSE(a.async);
      ASSERT_TRUE(b.async) << "prefix caching keeps asynchronous scheduling on";
      expect_same(a, b, what);
      for (const auto& [id, o] : a.out)
        EXPECT_EQ(o.num_cached_tokens, b.out.at(id).num_cached_tokens) << what << ", request " << id;
      EXPECT_GT(b.prefix.num_hits, 0) << what;
      EXPECT_EQ(a.prefix.hit_tokens, b.prefix.hit_tokens) << what;
      EXPECT_EQ(a.prefix.checkpoints_saved, b.prefix.checkpoints_saved) << what;
      EXPECT_EQ(a.restores, b.restores) << what;
      EXPECT_EQ(a.to_host, b.to_host) << what;
      EXPECT_EQ(a.from_host, b.from_host) << what;
      // And both equal the cache off.
      PrefixSetup off = setup;
      off.prefix = false;
      expect_same(run_waves(off, prompts, params, waves), b, what + " vs cache off");
    }
  }
  // Decode boundaries (deferred keys): turn 2 = turn 1's prompt + its answer + a message hits at
  // the answer's last boundary, asynchronously as synchronously.
  constexpr int kAnswer = 2 * kBT + 3;
  const SamplingParams p = sampled(kAnswer, 21, false);
  const PrefixRun first = run_waves({.async = true}, {base}, {p}, {});
  const std::vector<int32_t> turn2 = cat(cat(base, first.out.at("0").outputs[0].token_ids), tokens(8, 7));
  const PrefixRun a = run_waves({.async = false}, {base, turn2}, {p}, {1});
  const PrefixRun b = run_waves({.async = true}, {base, turn2}, {p}, {1});
  expect_same(a, b, "multi-turn");
  const int64_t prev_end = int64_t(base.size()) + kAnswer - 1;  // positions turn 1 computed
  EXPECT_EQ(b.out.at("1").num_cached_tokens, (prev_end / kBT) * kBT);
  EXPECT_EQ(a.out.at("1").num_cached_tokens, b.out.at("1").num_cached_tokens);
}

// Checkpoints through CausalLM::queue_save_slots (EngineConfig::async_checkpoint_copies: queued at
// the next launch, taken when the step is collected): the same checkpoints, hits, restores and
// outputs as save_slot at once, with steps asynchronous and synchronous, drafting on and off.
TEST(PrefixCache, QueuedCheckpointCopiesIdentical) {
  const std::vector<int32_t> base = tokens(9, 4 * kBT + 5);
  std::vector<std::vector<int32_t>> prompts = {base};
  for (int64_t shared : {kBT - 1, kBT, 2 * kBT + 3, 4 * kBT + 5})
    prompts.push_back(cat(std::vector<int32_t>(base.begin(), base.begin() + shared), tokens(uint32_t(shared + 50), 11)));
  const std::vector<size_t> waves = {1, 3};
  const std::vector<SamplingParams> params = {sampled(2 * kBT + 1, 31)};
  for (const auto& [what, setup] : std::vector<std::pair<std::string, PrefixSetup>>{
           {"async", {.async = true}},
           {"sync", {.async = false}},
           {"async, chunks, small cache + host tier",
            {.max_batched = 13, .max_seqs = 2, .num_blocks = 14, .host_blocks = 16, .async = true}},
           {"drafting", {.drafts = kL}}}) {
    PrefixSetup queued = setup;
    queued.async_copies = true;
    const PrefixRun a = run_waves(setup, prompts, params, waves);
    const PrefixRun b = run_waves(queued, prompts, params, waves);
    expect_same(a, b, what);
    EXPECT_GT(b.prefix.num_hits, 0) << what;
    EXPECT_EQ(a.prefix.hit_tokens, b.prefix.hit_tokens) << what;
    EXPECT_EQ(a.prefix.checkpoints_saved, b.prefix.checkpoints_saved) << what;
    EXPECT_EQ(a.restores, b.restores) << what;
    for (const auto& [id, o] : a.out) EXPECT_EQ(o.num_cached_tokens, b.out.at(id).num_cached_tokens) << what << " " << id;
  }
}

TEST(PrefixCacheUnit, HostTierSlotsBusyWhileLoading) {
  HostBlockTier t(2);
  const std::vector<int32_t> x = {1, 2}, y = {3, 4};
  const int32_t a = t.store(10, 0, x), b = t.store(11, 10, y);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_EQ(t.find(10, 0, x), a);
  EXPECT_EQ(t.find(10, 0, y), -1) << "token ids are compared";
  EXPECT_EQ(t.find(11, 99, y), -1) << "the parent hash is compared";
  t.take(a);                          // being loaded this step
  const int32_t c = t.store(12, 0, x);  // may not reuse slot a: takes b (the least recently stored)
  EXPECT_EQ(c, b);
  EXPECT_EQ(t.take_evicted(), std::vector<uint64_t>{11});
  EXPECT_EQ(t.store(13, 0, x), b) << "slot a stays busy: b is reused again";
  t.end_step();
  EXPECT_EQ(t.store(14, 0, y), a) << "free again after the step";
  EXPECT_EQ(t.stats().num_loads, 1);
}
