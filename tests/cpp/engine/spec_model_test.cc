// Speculative decoding on the trained default model (assets/default-model, a DeepSeek-V4 with one
// MTP block) on the CPU: greedy output with the model's own MTP drafter is token-identical to
// plain decoding — requests alone, batched with mixed lengths, with chunked prefill, under forced
// preemption and with a grammar — and so it is for every forced acceptance length 0..L (an
// oracle drafter that knows plain decoding's tokens proposes a correct prefix of each length).
// Skipped when the bundled model is absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "model/drafter.h"
#include "spec_test_util.h"

using namespace deepinfer;
using namespace deepinfer::engine;
using spec_test::DrafterSwap;
using spec_test::OracleDrafter;

namespace {
constexpr int32_t kL = 5;

std::string model_dir() { return default_model_dir(); }

std::filesystem::path source_dir() {
  if (const char* d = std::getenv("DEEPINFER_SOURCE_DIR"); d && *d) return d;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
}

struct SpecSetup {
  int32_t drafts = kL;            // 0: plain decoding
  int64_t max_batched = 2048, max_seqs = 16;
  int64_t cache_blocks = 0;       // > 0: a cache of max_seqs slots and this many paged blocks
  bool varlen = false;
  bool measured_cost = false;  // varlen with the cost curve the engine measures at start-up
  const std::vector<std::vector<int32_t>>* oracle = nullptr;  // oracle drafter over these sequences
  std::function<int32_t(int64_t)> pattern;
  bool grammar = false;
  const std::vector<SamplingParams>* per_request = nullptr;  // request i's params (else `params` for all)
};

struct SpecRun {
  std::vector<std::vector<int32_t>> tokens;
  SchedulerStats stats;
  ModelRunner::Stats runner;
};

SpecRun run(const SpecSetup& s, const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params) {
  model::ModelLoadOptions lo;
  lo.env.accelerator = Accelerator::kCPU;
  lo.limits.max_rollback = kL + 1;
  lo.progress = false;
  std::unique_ptr<model::CausalLM> m = load_model(model_dir(), lo);
  const int64_t vocab = m->vocab_size();
  if (s.oracle)
    m = std::make_unique<DrafterSwap>(std::move(m), std::make_unique<OracleDrafter>(*s.oracle, vocab, s.pattern, kL));
  LLMConfig lc;
  std::unique_ptr<TextCodec> codec = s.grammar ? load_codec(lc, model_dir(), vocab) : nullptr;
  std::unique_ptr<GrammarCompiler> grammar = s.grammar ? make_grammar_compiler(codec.get(), vocab, 1) : nullptr;
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = s.max_batched;
  ec.scheduler.max_num_seqs = s.max_seqs;
  if (s.cache_blocks > 0) ec.kv_cache_memory_bytes = spec_test::cache_bytes(*m, s.max_seqs, s.cache_blocks);
  ec.num_speculative_tokens = s.drafts;
  ec.varlen_drafts = s.varlen;
  if (s.varlen && !s.measured_cost) ec.step_cost = StepCostModel({{1, 1.0}, {16, 1.2}, {64, 2.0}, {256, 6.0}});
  Engine eng(ec, std::move(m), std::move(codec), std::move(grammar));
  for (size_t i = 0; i < prompts.size(); ++i)
    eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompts[i]),
                    s.per_request ? s.per_request->at(i) : params, 0);
  SpecRun r;
  r.tokens.resize(prompts.size());
  while (eng.has_unfinished())
    for (RequestOutput& o : eng.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.finished && !o.outputs.empty()) r.tokens[size_t(std::stoi(o.request_id))] = o.outputs[0].token_ids;
    }
  r.stats = eng.scheduler().stats();
  r.runner = eng.runner().stats();
  return r;
}

// Prompts of mixed lengths (first + (i * 37) % spread tokens after the bos) cut from the held-out
// sample's token ids.
std::vector<std::vector<int32_t>> heldout_prompts(int n, size_t first = 9, size_t spread = 120) {
  const std::filesystem::path f =
      source_dir() / "tests" / "data" / "default_model" / "heldout_sample.jsonl";
  std::ifstream in(f);
  LLMConfig lc;
  std::unique_ptr<TextCodec> codec = load_codec(lc, model_dir(), 8192);
  std::vector<std::vector<int32_t>> out;
  std::string line;
  for (int i = 0; (int)out.size() < n && std::getline(in, line); ++i) {
    const std::string text = nlohmann::json::parse(line).get<std::string>();
    std::vector<int32_t> ids = codec->encode(text);
    const size_t len = first + size_t(i * 37) % spread;
    if (ids.size() < len + 1) continue;
    ids.resize(len);
    ids.insert(ids.begin(), 0);  // bos
    out.push_back(std::move(ids));
  }
  return out;
}

using spec_test::greedy;

class SpecDefaultModel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (model_dir().empty()) GTEST_SKIP() << "the bundled default model is absent";
    // Run outside ctest (e.g. a packed binary on the GPU machine), __FILE__ may be relative to a
    // build folder that is not the working directory: name the variable that points at the data.
    const auto heldout = source_dir() / "tests" / "data" / "default_model" / "heldout_sample.jsonl";
    if (!std::filesystem::exists(heldout))
      GTEST_SKIP() << heldout.string() << " not found: set DEEPINFER_SOURCE_DIR to the source tree";
  }
};
}  // namespace

TEST_F(SpecDefaultModel, GreedyMtpIdenticalAloneBatchedChunkedPreempted) {
  const auto prompts = heldout_prompts(6);
  ASSERT_EQ(prompts.size(), 6u);
  const SamplingParams p = greedy(40);
  SpecSetup plain_setup;
  plain_setup.drafts = 0;
  const SpecRun plain = run(plain_setup, prompts, p);
  // Alone: one request per engine.
  for (size_t i = 0; i < 2; ++i) {
    const SpecRun alone = run({}, {prompts[i]}, p);
    EXPECT_EQ(alone.tokens[0], plain.tokens[i]) << "request " << i << " alone";
    EXPECT_GT(alone.stats.num_accepted_drafts, 0);
  }
  struct Case {
    const char* name;
    int64_t budget;
    int64_t blocks;
  };
  for (const Case& c : {Case{"batched", 2048, 0}, Case{"chunked", 13, 0}}) {
    SpecSetup s;
    s.max_batched = c.budget;
    s.max_seqs = 6;
    s.cache_blocks = c.blocks;
    const SpecRun spec = run(s, prompts, p);
    EXPECT_EQ(spec.tokens, plain.tokens) << c.name;
    EXPECT_GT(spec.stats.num_accepted_drafts, 0) << c.name;
    const double len = 1.0 + double(spec.stats.num_accepted_drafts) / double(std::max<int64_t>(1, spec.stats.num_verify_steps));
    RecordProperty(std::string("acceptance_length_") + c.name, std::to_string(len));
  }
  // Forced preemption: three prompts just under a 256-token block each and three blocks, so the
  // sequences crossing into a second block preempt one another (recomputed from scratch).
  const auto longp = heldout_prompts(3, 226, 12);
  ASSERT_EQ(longp.size(), 3u);
  SpecSetup pp;
  pp.drafts = 0;
  pp.max_seqs = 3;
  const SpecRun plain_long = run(pp, longp, p);
  SpecSetup sp;
  sp.max_seqs = 3;
  sp.cache_blocks = 3;
  const SpecRun pre = run(sp, longp, p);
  EXPECT_EQ(pre.tokens, plain_long.tokens) << "preempted";
  EXPECT_GT(pre.stats.num_preemptions, 0);
  EXPECT_GT(pre.stats.num_accepted_drafts, 0);
}

TEST_F(SpecDefaultModel, EveryForcedAcceptLengthIdentical) {
  const auto prompts = heldout_prompts(4);
  const SamplingParams p = greedy(24);
  SpecSetup plain_setup;
  plain_setup.drafts = 0;
  const SpecRun plain = run(plain_setup, prompts, p);
  std::vector<std::vector<int32_t>> full;
  for (size_t i = 0; i < prompts.size(); ++i) {
    full.push_back(prompts[i]);
    full.back().insert(full.back().end(), plain.tokens[i].begin(), plain.tokens[i].end());
  }
  for (int32_t a = 0; a <= kL; ++a) {
    SpecSetup s;
    s.oracle = &full;
    s.pattern = [a](int64_t) { return a; };
    const SpecRun spec = run(s, prompts, p);
    EXPECT_EQ(spec.tokens, plain.tokens) << "accept " << a;
    EXPECT_GT(spec.stats.num_draft_tokens, 0);
    if (a == 0) { EXPECT_EQ(spec.stats.num_accepted_drafts, 0); }
    // Every draft scheduled at accept length a: min(a, scheduled) accepted (fewer are scheduled
    // near max_tokens), and a rejection whenever a < L.
    EXPECT_GE(spec.stats.num_accepted_drafts * kL, spec.stats.num_draft_tokens * a) << "accept " << a;
    if (a < kL) {
      EXPECT_GT(spec.runner.rollbacks, 0) << "accept " << a;
    }
  }
  SpecSetup mixed;
  mixed.oracle = &full;
  mixed.pattern = [](int64_t pos) { return int32_t((pos * 7 + pos / 3) % (kL + 1)); };
  EXPECT_EQ(run(mixed, prompts, p).tokens, plain.tokens) << "mixed pattern";
}

TEST_F(SpecDefaultModel, GrammarAndVarlenIdentical) {
  const auto prompts = heldout_prompts(4);
  SamplingParams g = greedy(30);
  g.structured_outputs.emplace();
  g.structured_outputs->regex = "( ?[a-z]{1,8}){3,12}\\.";
  g.ignore_eos = false;
  SpecSetup plain_setup;
  plain_setup.drafts = 0;
  plain_setup.grammar = true;
  const SpecRun plain = run(plain_setup, prompts, g);
  SpecSetup s;
  s.grammar = true;
  const SpecRun spec = run(s, prompts, g);
  EXPECT_EQ(spec.tokens, plain.tokens) << "grammar";
  EXPECT_GT(spec.stats.num_draft_tokens, 0);
  // Varlen (a given cost curve): each request's draft length varies, the output does not.
  const SamplingParams p = greedy(40);
  SpecSetup pl;
  pl.drafts = 0;
  const SpecRun plain2 = run(pl, prompts, p);
  SpecSetup v;
  v.varlen = true;
  const SpecRun var = run(v, prompts, p);
  EXPECT_EQ(var.tokens, plain2.tokens) << "varlen";
  EXPECT_GT(var.stats.num_accepted_drafts, 0);
  // The engine's own measurement (verify steps and the MTP drafter's rounds on this CPU).
  SpecSetup vm;
  vm.varlen = true;
  vm.measured_cost = true;
  EXPECT_EQ(run(vm, prompts, p).tokens, plain2.tokens) << "varlen, measured cost";
}

// Requests whose prompt + max_tokens ends just before, at and just past a 256-token block boundary
// (the server saw "needs 3 blocks for 513 tokens, block_table has 2" there with drafting on), with
// shared prompt prefixes so later requests start from prefix-cache hits; output == plain decoding.
TEST_F(SpecDefaultModel, RequestsEndingAroundBlockBoundaries) {
  LLMConfig lc;
  std::unique_ptr<TextCodec> codec = load_codec(lc, model_dir(), 8192);
  std::ifstream in(source_dir() / "tests" / "data" / "default_model" / "heldout_sample.jsonl");
  std::vector<int32_t> text = {0};
  std::string line;
  while (text.size() < 600 && std::getline(in, line)) {
    const std::vector<int32_t> ids = codec->encode(nlohmann::json::parse(line).get<std::string>());
    text.insert(text.end(), ids.begin(), ids.end());
  }
  ASSERT_GE(text.size(), 600u);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int64_t end : {257, 513})
    for (int64_t P : {250, 255, 256, 505, 511, 512}) {
      if (P >= end) continue;
      prompts.emplace_back(text.begin(), text.begin() + P);
      params.push_back(greedy(int(end - P)));
      params.push_back(greedy(int(end - P + 1)));  // one token further: ends 2 past the boundary
      prompts.push_back(prompts.back());
    }
  SpecSetup plain_setup;
  plain_setup.drafts = 0;
  plain_setup.per_request = &params;
  const SpecRun plain = run(plain_setup, prompts, params[0]);
  SpecSetup s;
  s.max_seqs = 4;  // fewer at a time: later requests hit the prefix cache of earlier ones
  s.per_request = &params;
  const SpecRun spec = run(s, prompts, params[0]);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GT(spec.stats.num_accepted_drafts, 0);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(int64_t(spec.tokens[i].size()), *params[i].max_tokens) << "request " << i;
}
