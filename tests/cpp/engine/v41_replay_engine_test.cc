// Bounded replay through the engine (DeepSeek-V4.1 golden fixture v41_a, CPU, fixed-order
// products): DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact reaches the model, the runner marks each
// request's tail (decoder_from = prompt - keep) unless it asks for prompt logprobs, prefix hits end
// at or before the tail, and the cache identity names the mode (compact and full never share
// blocks). On this fixture the default keep (140) covers every decode row's cone (3 tail layers x
// window 8), so compact generations equal full prefill's; keep 14 (window + rollback) is allowed
// and approximates.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/env.h"
#include "engine/engine.h"
#include "engine/adapters.h"
#include "engine/model_loader.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
std::string fixture() {
  const char* s = std::getenv("DEEPINFER_SOURCE_DIR");
  return std::string(s ? s : DEEPINFER_TEST_SOURCE_DIR) + "/tests/data/golden/v41_a";
}

struct ReplayRun {
  std::vector<std::vector<int32_t>> tokens;
  int64_t hit_tokens = 0, forward_tokens = 0;
  uint64_t seed = 0;  // the cache's block-hash seed (from the cache identity)
};

// Two waves: every prompt, then every prompt again (the second wave may hit the first's cache).
ReplayRun run_engine(std::optional<std::string> mode, std::optional<int> keep, const std::vector<std::vector<int32_t>>& prompts,
        bool prompt_logprobs = false) {
  EnvConfig env;
  env.accelerator = Accelerator::kCPU;
  env.batch_invariant = true;
  env.async_scheduling = false;
  env.use_nextn_decode = 0;
  env.yoco_truncation_mode = mode;
  env.yoco_keep_tokens = keep;
  EngineConfig ec;
  ec.env = env;
  ec.scheduler.max_num_seqs = 4;
  ec.scheduler.max_num_batched_tokens = 96;  // chunks the prompts: tails straddle chunks
  ec.scheduler.max_model_len = 1024;
  ec.scheduler.prefix_cache.enabled = true;
  auto model = load_model(fixture(), {.env = env,
                                      .limits = {.max_num_seqs = 4, .max_num_batched_tokens = 96,
                                                 .max_model_len = 1024, .max_rollback = 6},
                                      .progress = false});
  Engine eng(ec, std::move(model), nullptr);
  ReplayRun r;
  r.seed = eng.cache().hash_seed();
  SamplingParams p;
  p.temperature = 0.f;
  p.max_tokens = 12;
  p.ignore_eos = true;
  if (prompt_logprobs) p.prompt_logprobs = 1;
  r.tokens.resize(prompts.size() * 2);
  for (int wave = 0; wave < 2; ++wave) {
    for (size_t i = 0; i < prompts.size(); ++i)
      eng.add_request(std::to_string(wave * 100 + int(i)), PromptInput::from_token_ids(prompts[i]), p, 0);
    while (eng.has_unfinished()) {
      for (RequestOutput& o : eng.step())
        if (o.finished) {
          EXPECT_TRUE(o.error.empty()) << o.error;
          const int id = std::stoi(o.request_id);
          r.tokens[size_t(id / 100) * prompts.size() + size_t(id % 100)] = o.outputs.at(0).token_ids;
        }
      r.forward_tokens += eng.runner().last_batch().num_tokens();
    }
  }
  r.hit_tokens = eng.scheduler().prefix_cache().stats().hit_tokens;
  return r;
}

TEST(V41ReplayEngine, CompactGenerationsPrefixHitsAndCacheIdentity) {
  if (!std::filesystem::exists(fixture() + "/config.json")) GTEST_SKIP() << "fixture absent";
  // Prompts of 600 and 530 tokens (the second a prefix of the first; cache blocks of 256 tokens).
  std::vector<int32_t> ids(600);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 11) % 300);
  const std::vector<std::vector<int32_t>> prompts = {ids, std::vector<int32_t>(ids.begin(), ids.begin() + 530)};
  const ReplayRun full = run_engine(std::nullopt, std::nullopt, prompts);
  const ReplayRun compact = run_engine("compact", std::nullopt, prompts);
  EXPECT_EQ(compact.tokens, full.tokens);
  EXPECT_NE(compact.seed, full.seed);  // compact and full never share blocks or checkpoints
  // Full prefill hits 512 tokens of either prompt; compact hits end at or before the tail
  // (600 - 140 = 460 and 390: one block). Were a hit to pass the tail start, the tail layers'
  // window rows between them would be missing and the tokens above would differ.
  std::printf("[v41 replay engine] prefix-hit tokens: full %lld, compact keep 140 %lld\n", (long long)full.hit_tokens,
              (long long)compact.hit_tokens);
  EXPECT_GT(compact.hit_tokens, 0);
  EXPECT_EQ(compact.hit_tokens % 256, 0);
  EXPECT_GT(full.hit_tokens, compact.hit_tokens);
  // The smallest keep allowed: deterministic, and the tails are what the model computes.
  const ReplayRun small = run_engine("compact", 14, prompts);
  const ReplayRun small2 = run_engine("compact", 14, prompts);
  EXPECT_EQ(small.tokens, small2.tokens);
  EXPECT_GT(small.hit_tokens, compact.hit_tokens);  // tails at 586 and 516: two blocks
  size_t same = 0;
  while (same < small.tokens[0].size() && small.tokens[0][same] == full.tokens[0][same]) ++same;
  std::printf("[v41 replay engine] keep 14: %zu of %zu greedy tokens equal full prefill's (prompt 600)\n", same,
              full.tokens[0].size());
  EXPECT_EQ(small.tokens.size(), full.tokens.size());
  // Prompt logprobs need every position: those requests run full prefill under compact mode.
  const ReplayRun logprobs = run_engine("compact", 14, prompts, /*prompt_logprobs=*/true);
  EXPECT_EQ(logprobs.tokens, full.tokens);
}

TEST(V41ReplayEngine, KeepBelowWindowPlusRollbackIsRefused) {
  if (!std::filesystem::exists(fixture() + "/config.json")) GTEST_SKIP() << "fixture absent";
  try {
    run_engine("compact", 13, {{5, 6, 7}});
    ADD_FAILURE() << "keep 13 < window 8 + rollback 6 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS=13"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {
// A DeepSeek-V4.1 folder's conversations render in V4.1's chat format (engine/model_loader.cpp
// picks it from config.json's architecture), a V4 folder's in V4's: the tokenizer is the same
// file (assets/default-model's), only the template differs.
TEST(V41ChatFormat, TheCodecFollowsTheModelsArchitecture) {
  const std::string src = std::string(std::getenv("DEEPINFER_SOURCE_DIR") ? std::getenv("DEEPINFER_SOURCE_DIR")
                                                                          : DEEPINFER_TEST_SOURCE_DIR);
  const std::string tok = src + "/assets/default-model/tokenizer.json";
  if (!std::filesystem::exists(tok) || !std::filesystem::exists(fixture() + "/config.json"))
    GTEST_SKIP() << "tokenizer or fixture absent";
  LLMConfig c;
  c.tokenizer = tok;
  std::unique_ptr<TextCodec> v41, v4;
  try {
    v41 = load_codec(c, fixture(), 320);
    v4 = load_codec(c, src + "/tests/data/golden/tiny", 512);
  } catch (const TokenizerError& e) {
    GTEST_SKIP() << "no tokenizer module: " << e.what();
  }
  const std::vector<ChatMessage> conv = {{"user", "Hello"}, {"assistant", "Hi."}, {"system", "Be brief."},
                                         {"user", "Again"}};
  const std::string a = v41->chat_prompt(conv, {}), b = v4->chat_prompt(conv, {});
  EXPECT_NE(a, b);
  EXPECT_NE(a.find("<｜System｜>"), std::string::npos) << a;  // V4.1 marks a later system turn so
  EXPECT_EQ(b.find("<｜System｜>"), std::string::npos) << b;
  EXPECT_NE(a.find("Hello"), std::string::npos) << a;
}
}  // namespace
