// Engine invariants on the toy model: greedy = argmax chain of the reference logits; a
// request's tokens do not depend on batch neighbours, chunking or preemption; budgets hold;
// stop strings, n > 1, logprobs and prompt logprobs match direct computations; bad requests
// fail alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
LLMConfig toy(int64_t max_batched = 2048, size_t cache_bytes = 0, int64_t max_seqs = 64) {
  LLMConfig c;
  c.model = "builtin:toy";
  c.max_num_batched_tokens = max_batched;
  c.kv_cache_memory_bytes = cache_bytes;
  c.max_num_seqs = max_seqs;
  return c;
}

std::vector<int32_t> prompt_ids(int i, int len) {
  std::vector<int32_t> p = {0};
  for (int j = 1; j < len; ++j) p.push_back(2 + 'a' + (i * 7 + j * 3) % 26);
  return p;
}

SamplingParams greedy(int n_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n_tokens;
  p.ignore_eos = true;
  return p;
}

SamplingParams seeded(int n_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.max_tokens = n_tokens;
  p.ignore_eos = true;
  p.seed = seed;
  return p;
}

std::vector<int32_t> argmax_chain(std::vector<int32_t> toks, int n) {
  ToyModelConfig c;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto l = ToyModel::reference_logits(c, toks);
    const float* last = l.data() + (toks.size() - 1) * size_t(c.vocab_size);
    int32_t t = int32_t(std::max_element(last, last + c.vocab_size) - last);
    out.push_back(t);
    toks.push_back(t);
  }
  return out;
}
}  // namespace

TEST(Engine, GreedyEqualsReferenceArgmaxChain) {
  LLM llm(toy());
  auto p = prompt_ids(3, 11);
  auto out = llm.generate({PromptInput::from_token_ids(p)}, {greedy(80)});
  ASSERT_TRUE(out[0].error.empty()) << out[0].error;
  EXPECT_EQ(out[0].outputs[0].token_ids, argmax_chain(p, 80));
  EXPECT_EQ(out[0].outputs[0].finish_reason, "length");
}

// The same 8 requests alone, batched, chunked (budget 7 tokens) and under cache pressure
// (forced preemption) give identical tokens, greedy and seeded.
TEST(Engine, TokensIndependentOfBatchChunkingAndPreemption) {
  std::vector<PromptInput> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(PromptInput::from_token_ids(prompt_ids(i, 5 + 6 * i)));
    params.push_back(i % 2 ? greedy(64) : seeded(64, 100 + i));
  }
  std::vector<std::vector<int32_t>> alone;
  {
    LLM llm(toy());
    for (int i = 0; i < 8; ++i) alone.push_back(llm.generate({prompts[size_t(i)]}, {params[size_t(i)]})[0].outputs[0].token_ids);
  }
  struct Case { const char* name; LLMConfig cfg; bool expect_preempt; };
  // Toy cache: 64 B per 16-token block, 24 B per slot; 8 slots + 24 blocks = 384 tokens for
  // 8 sequences of up to ~110 tokens each, so sequences must be preempted and recomputed.
  std::vector<Case> cases = {{"batched", toy(), false},
                             {"chunked", toy(7), false},
                             {"preempted", toy(64, 8 * 24 + 24 * 64, 8), true},
                             {"chunked+preempted", toy(13, 8 * 24 + 24 * 64, 8), true}};
  for (auto& c : cases) {
    LLM llm(c.cfg);
    auto out = llm.generate(prompts, params);
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(out[size_t(i)].error.empty()) << c.name << ": " << out[size_t(i)].error;
      EXPECT_EQ(out[size_t(i)].outputs[0].token_ids, alone[size_t(i)]) << c.name << " request " << i;
    }
    if (c.expect_preempt) {
      EXPECT_GT(llm.last_summary().num_preemptions, 0) << c.name;
    }
  }
}

TEST(Engine, BudgetsAndCacheInvariantsHoldEveryStep) {
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = 19;
  ec.scheduler.max_num_seqs = 5;
  ec.kv_cache_memory_bytes = 5 * 24 + 20 * 64;
  Engine eng(ec, std::make_unique<ToyModel>(), make_toy_codec(320));
  for (int i = 0; i < 12; ++i) eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompt_ids(i, 3 + 5 * i)), greedy(40), 0);
  int finished = 0;
  while (eng.has_unfinished()) {
    for (auto& o : eng.step()) finished += o.finished;
    eng.cache().check_invariants();
    auto b = eng.runner().last_batch();
    EXPECT_LE(b.num_tokens(), 19);
    EXPECT_LE(int64_t(b.seqs.size()), 5);
  }
  EXPECT_EQ(finished, 12);
  EXPECT_EQ(eng.cache().num_free_blocks(), eng.cache().geometry().num_blocks);
  EXPECT_GT(eng.scheduler().stats().num_preemptions, 0);
}

TEST(Engine, NSamplesIndependentOfN) {
  LLM llm(toy());
  auto p = PromptInput::from_token_ids(prompt_ids(1, 9));
  SamplingParams one = seeded(30, 77);
  SamplingParams four = one;
  four.n = 4;
  auto a = llm.generate({p}, {one})[0];
  auto b = llm.generate({p}, {four})[0];
  ASSERT_EQ(b.outputs.size(), 4u);
  EXPECT_EQ(a.outputs[0].token_ids, b.outputs[0].token_ids);
  EXPECT_NE(b.outputs[1].token_ids, b.outputs[0].token_ids);
  auto c = llm.generate({p}, {four})[0];
  for (int i = 0; i < 4; ++i) EXPECT_EQ(b.outputs[size_t(i)].token_ids, c.outputs[size_t(i)].token_ids);
}

TEST(Engine, LogprobsAndPromptLogprobsMatchReference) {
  LLM llm(toy(5));  // chunked prompt: prompt logprobs come from several steps
  auto p = prompt_ids(2, 13);
  SamplingParams sp = seeded(10, 5);
  sp.logprobs = 3;
  sp.prompt_logprobs = 2;
  auto out = llm.generate({PromptInput::from_token_ids(p)}, {sp})[0];
  const auto& o = out.outputs[0];
  std::vector<int32_t> all = p;
  all.insert(all.end(), o.token_ids.begin(), o.token_ids.end());
  ToyModelConfig c;
  auto ref = ToyModel::reference_logits(c, all);
  ASSERT_TRUE(out.prompt_logprobs.has_value());
  ASSERT_EQ(out.prompt_logprobs->size(), p.size());
  EXPECT_FALSE((*out.prompt_logprobs)[0].has_value());
  for (size_t i = 1; i < p.size(); ++i) {
    auto want = compute_logprobs(ref.data() + (i - 1) * 320, 320, p[i], 2);
    const auto& got = *(*out.prompt_logprobs)[i];
    EXPECT_EQ(got[0].first, p[i]);
    EXPECT_NEAR(got[0].second.logprob, want.logprob, 1e-5);
    EXPECT_EQ(got[0].second.rank, want.rank);
  }
  ASSERT_TRUE(o.logprobs.has_value());
  double cum = 0;
  for (size_t j = 0; j < o.token_ids.size(); ++j) {
    size_t pos = p.size() - 1 + j;
    auto want = compute_logprobs(ref.data() + pos * 320, 320, o.token_ids[j], 3);
    const auto& got = (*o.logprobs)[j];
    EXPECT_EQ(got[0].first, o.token_ids[j]);
    EXPECT_NEAR(got[0].second.logprob, want.logprob, 1e-5);
    size_t k = 1;
    for (auto& [t, lp] : want.top) {
      if (t == o.token_ids[j]) continue;
      ASSERT_LT(k, got.size());
      EXPECT_EQ(got[k].first, t);
      EXPECT_NEAR(got[k].second.logprob, lp, 1e-5);
      ++k;
    }
    cum += want.logprob;
  }
  EXPECT_NEAR(*o.cumulative_logprob, cum, 1e-4);
}

TEST(Engine, StopStringsTruncateAndStreamHoldsBack) {
  LLM llm(toy());
  auto p = PromptInput::from_text("Hello");
  auto base = llm.generate({p}, {greedy(60)})[0].outputs[0];
  std::string text = base.text;
  ASSERT_GE(text.size(), 20u) << text;
  std::string stop = text.substr(10, 3);
  size_t first = text.find(stop);
  SamplingParams sp = greedy(60);
  sp.stop = {stop};
  sp.output_kind = OutputKind::kDelta;
  std::string streamed;
  GenerateOptions opts;
  opts.on_output = [&](const RequestOutput& r) {
    streamed += r.outputs[0].text;
    // Never stream bytes that may belong to the stop string.
    EXPECT_EQ(streamed.find(stop), std::string::npos);
    EXPECT_LE(streamed.size(), first);
  };
  auto out = llm.generate({p}, {sp}, opts)[0].outputs[0];
  EXPECT_EQ(streamed, text.substr(0, first));
  EXPECT_EQ(out.finish_reason, "stop");
  EXPECT_EQ(out.stop_string, stop);
  sp.output_kind = OutputKind::kCumulative;
  sp.include_stop_str_in_output = true;
  EXPECT_EQ(llm.generate({p}, {sp})[0].outputs[0].text, text.substr(0, first + stop.size()));
}

TEST(Engine, BadRequestsFailAloneOthersComplete) {
  LLMConfig cfg = toy();
  cfg.max_model_len = 64;
  LLM llm(cfg);
  SamplingParams ok = greedy(8), bad_temp = greedy(8), so = greedy(8);
  bad_temp.temperature = -0.5f;
  so.structured_outputs = StructuredOutputsParams{};
  so.structured_outputs->regex = "[a-z";  // does not compile (or no grammar module in this build)
  std::vector<PromptInput> prompts = {PromptInput::from_token_ids(prompt_ids(0, 5)), PromptInput::from_token_ids({}),
                                      PromptInput::from_token_ids(std::vector<int32_t>(100, 5)),
                                      PromptInput::from_token_ids(prompt_ids(1, 5)), PromptInput::from_token_ids({3, 999}),
                                      PromptInput::from_token_ids(prompt_ids(2, 5)), PromptInput::from_text("")};
  std::vector<SamplingParams> params = {ok, ok, ok, bad_temp, ok, so, ok};
  auto out = llm.generate(prompts, params);
  EXPECT_TRUE(out[0].error.empty());
  EXPECT_EQ(out[0].outputs[0].token_ids.size(), 8u);
  EXPECT_NE(out[1].error.find("empty"), std::string::npos) << out[1].error;
  EXPECT_NE(out[2].error.find("max_model_len"), std::string::npos) << out[2].error;
  EXPECT_NE(out[3].error.find("temperature"), std::string::npos) << out[3].error;
  EXPECT_NE(out[4].error.find("outside"), std::string::npos) << out[4].error;
  EXPECT_TRUE(out[5].error.find("regex") != std::string::npos || out[5].error.find("structured") != std::string::npos)
      << out[5].error;
  EXPECT_NE(out[6].error.find("empty"), std::string::npos) << out[6].error;
  EXPECT_EQ(llm.last_summary().num_failed, 6);
}

TEST(Engine, MaxTokensMinTokensAndEos) {
  LLM llm(toy());
  SamplingParams sp;
  sp.temperature = 1.5f;
  sp.seed = 3;
  sp.max_tokens = 200;
  sp.logit_bias = {{1, 4.0f}};  // EOS likely
  sp.min_tokens = 5;
  auto o = llm.generate({PromptInput::from_token_ids(prompt_ids(4, 6))}, {sp})[0].outputs[0];
  EXPECT_EQ(o.finish_reason, "stop");
  EXPECT_EQ(o.stop_token_id, 1);
  EXPECT_GE(o.token_ids.size(), 6u);
  EXPECT_EQ(o.token_ids.back(), 1);
  for (size_t i = 0; i + 1 < o.token_ids.size(); ++i) EXPECT_NE(o.token_ids[i], 1);
}

// kv_cache_memory_bytes = 0: the budget holds every sequence at max_model_len (no more), and a
// host model never gets more than kHostCacheCap.
TEST(Engine, AutoCacheBudgetHoldsEverySequenceAtMaxLen) {
  ToyModelConfig tc;
  tc.max_model_len = 1000;
  ToyModel m(tc);
  const size_t budget = auto_cache_budget(m, 8, 1000);
  const kv::CacheGeometry g = m.plan_cache(budget, 8);
  EXPECT_EQ(g.num_blocks, 8 * ((1000 + tc.block_tokens - 1) / tc.block_tokens));
  EXPECT_LT(m.plan_cache(budget - 1, 8).num_blocks, g.num_blocks);  // not more than needed
  EXPECT_EQ(auto_cache_budget(m, 64, int64_t(1) << 40), kHostCacheCap);

  EngineConfig ec;  // kv_cache_memory_bytes 0 = auto
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_model_len = 1000;
  Engine engine(ec, std::make_unique<ToyModel>(tc), nullptr);
  EXPECT_EQ(engine.cache().geometry().num_blocks, g.num_blocks);
}
