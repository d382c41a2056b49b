// Batch invariance and deterministic sampling on the CPU (issue #12): with
// DEEPINFER_BATCH_INVARIANT=1 one request's token ids and logprobs (values, ranks, top lists) are
// bit-identical alone and inside random batches of 1..255 neighbours with random prompt lengths,
// sampling settings, chunk budgets and arrival steps, greedy and seeded (seq_seed), with
// asynchronous scheduling on and off, and with speculative decoding (the MTP drafter) on. Real
// DeepSeek-V4 checkpoints: the golden `tiny` fixture (vocab 512, window 16: cheap enough for 255
// neighbours) and the bundled default model.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "test_accelerator.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
std::string source_dir() {
  const char* s = std::getenv("DEEPINFER_SOURCE_DIR");
  return s ? s : DEEPINFER_TEST_SOURCE_DIR;
}

struct Setup {
  std::string model;
  int64_t budget = 2048;     // max_num_batched_tokens: small values chunk every prompt
  bool async = true;
  int32_t drafts = 0;        // speculative tokens (0: off)
  bool invariant = true;
};

std::unique_ptr<Engine> make_engine(const Setup& s) {
  EnvConfig env;
  env.accelerator = test::test_accelerator();  // DEEPINFER_TEST_ACCELERATOR=nvidia: the same checks on the GPU
  env.batch_invariant = s.invariant;
  env.async_scheduling = s.async;
  env.use_nextn_decode = s.drafts;
  EngineConfig ec;
  ec.env = env;
  ec.scheduler.max_num_seqs = 256;
  ec.scheduler.max_num_batched_tokens = s.budget;
  ec.scheduler.max_model_len = 160;
  ec.scheduler.prefix_cache.enabled = !s.async;  // both kinds of step: sync runs cache on, async off
  ec.num_speculative_tokens = s.drafts;
  ec.seed = 7;
  auto model = load_model(s.model, {.env = env,
                                    .limits = {.max_num_seqs = 256, .max_num_batched_tokens = s.budget,
                                               .max_model_len = 160, .max_rollback = s.drafts + 1},
                                    .progress = false});
  return std::make_unique<Engine>(ec, std::move(model), nullptr);
}

struct Req {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

Req random_request(std::mt19937_64& rng, int64_t vocab, int max_prompt, int max_out) {
  Req r;
  const int len = 1 + int(rng() % uint64_t(max_prompt));
  for (int i = 0; i < len; ++i) r.prompt.push_back(int32_t(2 + rng() % uint64_t(vocab - 2)));
  SamplingParams& p = r.params;
  p.max_tokens = 1 + int(rng() % uint64_t(max_out));
  p.ignore_eos = rng() % 2;
  if (rng() % 2) {
    p.temperature = 0.7f + 0.1f * float(rng() % 5);
    p.top_p = rng() % 2 ? 0.9f : 1.0f;
    p.top_k = int(rng() % 3) * 20;
    p.seed = rng();
  } else {
    p.temperature = 0;
  }
  if (rng() % 4 == 0) p.logprobs = int(rng() % 4);
  return r;
}

// The target's ids and every logprob field, bit for bit.
struct Trace {
  std::vector<int32_t> ids;
  std::vector<uint32_t> bits;  // logprob bits, ranks, top ids and top logprob bits, in order
  std::string finish;
  bool operator==(const Trace&) const = default;
};

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

Trace trace_of(const RequestOutput& o) {
  Trace t;
  const CompletionOutput& c = o.outputs.at(0);
  t.ids = c.token_ids;
  t.finish = c.finish_reason;
  if (c.logprobs)
    for (const PositionLogprobs& pos : *c.logprobs)
      for (const auto& [id, lp] : pos) {
        t.bits.push_back(uint32_t(id));
        t.bits.push_back(bits_of(lp.logprob));
        t.bits.push_back(uint32_t(lp.rank));
      }
  return t;
}

// Runs `target` with `neighbours`, each arriving at its step (target at `target_step`), and
// returns the target's trace. Checks the cache's books every step.
Trace run(const Setup& s, const Req& target, int target_step, const std::vector<Req>& neighbours,
          const std::vector<int>& arrival) {
  auto eng = make_engine(s);
  Trace got;
  bool done = false;
  size_t next = 0;
  std::vector<size_t> order(neighbours.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return arrival[a] < arrival[b]; });
  for (int step = 0; !done; ++step) {
    EXPECT_LT(step, 5000) << "no progress";
    if (step >= 5000) break;
    if (step == target_step) eng->add_request("target", PromptInput::from_token_ids(target.prompt), target.params, 0);
    for (; next < order.size() && arrival[order[next]] <= step; ++next)
      eng->add_request("n" + std::to_string(order[next]), PromptInput::from_token_ids(neighbours[order[next]].prompt),
                       neighbours[order[next]].params, 0);
    if (!eng->has_unfinished()) continue;
    for (const RequestOutput& o : eng->step()) {
      EXPECT_TRUE(o.error.empty()) << o.request_id << ": " << o.error;
      if (o.request_id == "target" && o.finished) {
        got = trace_of(o);
        done = true;
      }
    }
    eng->cache().check_invariants();
  }
  while (eng->has_unfinished()) eng->step();  // the rest drain; every block comes back
  EXPECT_EQ(eng->cache().num_free_blocks(), eng->cache().geometry().num_blocks);
  return got;
}

Req target_request(int64_t vocab, bool seeded, int prompt_len, int out) {
  Req t;
  for (int i = 0; i < prompt_len; ++i) t.prompt.push_back(int32_t(3 + (i * 37 + 11) % (vocab - 3)));
  t.params.max_tokens = out;
  t.params.ignore_eos = true;
  t.params.logprobs = 4;
  if (seeded) {
    t.params.temperature = 0.9f;
    t.params.top_p = 0.95f;
    t.params.seed = 123456789;  // seq_seed
  } else {
    t.params.temperature = 0;
  }
  return t;
}

struct Case {
  int neighbours;
  int64_t budget;
  bool async;
};

void check_invariance(const std::string& model, int64_t vocab, const std::vector<Case>& cases, int max_prompt,
                      int max_out, uint64_t seed) {
  for (bool seeded : {false, true}) {
    const Req target = target_request(vocab, seeded, 29, 12);
    const Trace alone = run({.model = model, .budget = 2048, .async = false}, target, 0, {}, {});
    ASSERT_EQ(alone.ids.size(), 12u);
    ASSERT_FALSE(alone.bits.empty());
    std::mt19937_64 rng(seed + seeded);
    for (const Case& c : cases) {
      std::vector<Req> nb;
      std::vector<int> arrival;
      for (int i = 0; i < c.neighbours; ++i) {
        nb.push_back(random_request(rng, vocab, max_prompt, max_out));
        arrival.push_back(int(rng() % 6));
      }
      const int target_step = int(rng() % 4);
      const Trace got = run({.model = model, .budget = c.budget, .async = c.async}, target, target_step, nb, arrival);
      EXPECT_EQ(got.ids, alone.ids) << (seeded ? "seeded" : "greedy") << ", " << c.neighbours << " neighbours, budget "
                                    << c.budget << (c.async ? ", async" : ", sync");
      EXPECT_TRUE(got == alone) << "logprobs differ: " << (seeded ? "seeded" : "greedy") << ", " << c.neighbours
                                << " neighbours, budget " << c.budget << (c.async ? ", async" : ", sync");
    }
  }
}
}  // namespace

TEST(BatchInvariance, TinyFixtureAloneEqualsRandomBatchesUpTo255Neighbours) {
  const std::string model = source_dir() + "/tests/data/golden/tiny";
  ASSERT_TRUE(std::filesystem::exists(model + "/config.json")) << model;
  check_invariance(model, 512,
                   {{1, 2048, true}, {3, 7, false}, {17, 5, true}, {64, 33, false}, {120, 61, true}, {255, 300, true}},
                   24, 6, 11);
}

TEST(BatchInvariance, DefaultModelAloneEqualsRandomBatches) {
  const std::string model = default_model_dir();
  if (model.empty()) GTEST_SKIP() << "the bundled default model is not found";
  check_invariance(model, 8192, {{2, 9, true}, {11, 2048, false}, {40, 23, true}}, 20, 5, 23);
}

// Speculative decoding (the default model's MTP drafter, synchronous steps): greedy tokens and
// logprobs equal plain decoding's, alone and batched.
TEST(BatchInvariance, SpeculativeDecodingGivesThePlainTrace) {
  const std::string model = default_model_dir();
  if (model.empty()) GTEST_SKIP() << "the bundled default model is not found";
  const Req target = target_request(8192, false, 17, 10);
  const Trace plain = run({.model = model, .async = false}, target, 0, {}, {});
  std::mt19937_64 rng(5);
  std::vector<Req> nb;
  std::vector<int> arrival;
  for (int i = 0; i < 6; ++i) {
    nb.push_back(random_request(rng, 8192, 12, 6));
    nb.back().params.temperature = 0;
    arrival.push_back(int(rng() % 3));
  }
  EXPECT_TRUE(run({.model = model, .async = false, .drafts = 3}, target, 0, {}, {}) == plain);
  EXPECT_TRUE(run({.model = model, .budget = 11, .async = false, .drafts = 2}, target, 1, nb, arrival) == plain);
}

// The knob reaches the CPU backend (its description names the mode).
TEST(BatchInvariance, DescribeNamesTheMode) {
  if (test::test_accelerator() != Accelerator::kCPU) GTEST_SKIP() << "checks the CPU backend's description";
  const std::string model = source_dir() + "/tests/data/golden/tiny";
  EnvConfig env;
  env.accelerator = Accelerator::kCPU;
  env.batch_invariant = true;
  auto m = load_model(model, {.env = env, .limits = {}, .progress = false});
  EXPECT_NE(m->describe().find("batch-invariant"), std::string::npos) << m->describe();
  env.batch_invariant = false;
  EXPECT_EQ(load_model(model, {.env = env, .limits = {}, .progress = false})->describe().find("batch-invariant"),
            std::string::npos);
}

// Without the knob: the V4 CPU backend's products all run on the packed kernel (ops/cpu
// gemm_packed.cpp, one in-order sum per element for any M; OpenBLAS blocked by M and moved these
// bits before), so the same batches leave the target's logprob bits unchanged on this machine too.
// (The knob still adds the same bits across CPUs and the OpenBLAS fallbacks: V4.1's linears.)
TEST(BatchInvariance, WithoutTheKnobTheV4CpuPathIsInvariantToo) {
  if (test::test_accelerator() != Accelerator::kCPU) GTEST_SKIP() << "the control is about the CPU's BLAS blocking";
  const std::string model = source_dir() + "/tests/data/golden/tiny";
  const Req target = target_request(512, false, 29, 12);
  const Trace alone = run({.model = model, .async = false, .invariant = false}, target, 0, {}, {});
  std::mt19937_64 rng(3);
  std::vector<Req> nb;
  std::vector<int> arrival;
  for (int i = 0; i < 17; ++i) {
    nb.push_back(random_request(rng, 512, 24, 6));
    arrival.push_back(int(rng() % 3));
  }
  const Trace got = run({.model = model, .budget = 5, .async = true, .invariant = false}, target, 0, nb, arrival);
  EXPECT_TRUE(got == alone) << "batched logprobs differ from the lone run's without batch invariance";
}
