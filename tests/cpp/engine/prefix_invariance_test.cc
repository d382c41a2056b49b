// Prefix caching on a real DeepSeek-V4 checkpoint, bit for bit (issue #16): with
// DEEPINFER_BATCH_INVARIANT=1 every request's token ids and logprob bits with the cache on equal
// those of the request run alone with the cache off — hits at both block boundaries and inside a
// block, concurrent requests sharing the prefix, a small cache that evicts it under pressure, a
// host tier it spills to and comes back from, chunked prefill, grammars and speculative decoding
// (the fixture's MTP drafter). The golden `tiny` fixture (vocab 512, window 16, 256-token blocks)
// keeps it cheap. The toy-model tests (prefix_cache_test.cc) cover the same paths exactly by
// construction; these show the real model's slot state (window rings, compressor and indexer
// partials, MTP ring) is restored exactly. DEEPINFER_TEST_ACCELERATOR=nvidia runs them on the GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "engine/engine.h"
#include "engine/kv_transfer.h"
#include "engine/model_loader.h"
#include "test_accelerator.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
constexpr int64_t kBlock = 256;  // the fixture's cache block
constexpr int64_t kMaxLen = 1024;

std::string source_dir() {
  const char* s = std::getenv("DEEPINFER_SOURCE_DIR");
  return s ? s : DEEPINFER_TEST_SOURCE_DIR;
}
std::string tiny_dir() { return source_dir() + "/tests/data/golden/tiny"; }

struct CacheSetup {
  std::string model = tiny_dir();
  bool prefix = true;
  bool async = true;
  int64_t budget = 2048;       // max_num_batched_tokens
  int64_t max_seqs = 8;
  int64_t cache_blocks = 0;    // device cache blocks (0: enough for everything)
  int64_t host_blocks = 0;     // host tier
  int32_t drafts = 0;
  bool grammar = false;        // a toy codec over the fixture's vocabulary + the grammar compiler
};

std::unique_ptr<Engine> make_engine(const CacheSetup& s) {
  EnvConfig env;
  env.accelerator = test::test_accelerator();
  env.batch_invariant = true;
  env.async_scheduling = s.async;
  env.use_nextn_decode = s.drafts;
  EngineConfig ec;
  ec.env = env;
  ec.scheduler.max_num_seqs = s.max_seqs;
  ec.scheduler.max_num_batched_tokens = s.budget;
  ec.scheduler.max_model_len = kMaxLen;
  ec.scheduler.prefix_cache.enabled = s.prefix;
  ec.num_speculative_tokens = s.drafts;
  ec.seed = 11;
  auto model = load_model(s.model, {.env = env,
                                       .limits = {.max_num_seqs = s.max_seqs, .max_num_batched_tokens = s.budget,
                                                  .max_model_len = kMaxLen, .max_rollback = s.drafts + 1},
                                       .progress = false});
  const kv::CacheGeometry unit = model->plan_cache(size_t(1) << 30, 1);  // per-block / per-slot bytes
  EXPECT_EQ(unit.block_tokens, kBlock);
  if (s.cache_blocks > 0)
    ec.kv_cache_memory_bytes = size_t(s.max_seqs) * unit.bytes_per_slot + size_t(s.cache_blocks) * unit.bytes_per_block;
  ec.prefix_host_bytes = size_t(s.host_blocks) * unit.bytes_per_block;  // the paged rows of a block
  std::unique_ptr<TextCodec> codec;
  std::unique_ptr<GrammarCompiler> grammar;
  if (s.grammar) {
    codec = make_toy_codec(model->vocab_size());
    grammar = make_grammar_compiler(codec.get(), model->vocab_size(), model->eos_token_id(), 1);
  }
  return std::make_unique<Engine>(ec, std::move(model), std::move(codec), std::move(grammar));
}

struct Req {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// Token ids and every logprob field (ids, value bits, ranks), in order.
struct Trace {
  std::vector<int32_t> ids;
  std::vector<uint32_t> bits;
  std::string finish, error;
  bool operator==(const Trace&) const = default;
};

Trace trace_of(const RequestOutput& o) {
  Trace t;
  t.error = o.error;
  if (o.outputs.empty()) return t;
  const CompletionOutput& c = o.outputs[0];
  t.ids = c.token_ids;
  t.finish = c.finish_reason;
  if (c.logprobs)
    for (const PositionLogprobs& pos : *c.logprobs)
      for (const auto& [id, lp] : pos) {
        uint32_t b;
        std::memcpy(&b, &lp.logprob, 4);
        t.bits.insert(t.bits.end(), {uint32_t(id), b, uint32_t(lp.rank)});
      }
  return t;
}

struct Outcome {
  std::vector<Trace> traces;       // by request
  std::vector<int64_t> cached;     // num_cached_tokens by request
  PrefixCacheStats prefix;
  int64_t evictions = 0, to_host = 0, from_host = 0;
};

// Each wave is added once the previous one finished; the requests of a wave run concurrently.
Outcome run_waves(const CacheSetup& s, const std::vector<Req>& reqs, const std::vector<size_t>& waves) {
  auto eng = make_engine(s);
  Outcome r;
  r.traces.resize(reqs.size());
  r.cached.resize(reqs.size(), -1);
  size_t next = 0;
  for (size_t w = 0; w <= waves.size(); ++w) {
    const size_t end = w < waves.size() ? waves[w] : reqs.size();
    for (; next < end; ++next)
      eng->add_request(std::to_string(next), PromptInput::from_token_ids(reqs[next].prompt), reqs[next].params, 0);
    for (int step = 0; eng->has_unfinished(); ++step) {
      EXPECT_LT(step, 4000) << "no progress";
      if (step >= 4000) break;
      for (const RequestOutput& o : eng->step())
        if (o.finished) {
          const size_t i = std::stoul(o.request_id);
          r.traces[i] = trace_of(o);
          r.cached[i] = o.num_cached_tokens;
        }
      eng->cache().check_invariants();
    }
  }
  EXPECT_EQ(eng->cache().num_free_blocks(), eng->cache().geometry().num_blocks);
  r.prefix = eng->scheduler().prefix_cache().stats();
  r.evictions = eng->cache().num_evictions();
  r.to_host = eng->runner().stats().blocks_to_host;
  r.from_host = eng->runner().stats().blocks_from_host;
  return r;
}

std::vector<int32_t> random_tokens(uint32_t seed, size_t n) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(3 + g() % 500);
  return t;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

SamplingParams params_for(size_t i, int max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = 3;
  if (i % 2) {
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.seed = 4000 + i;  // seq_seed
  } else {
    p.temperature = 0;
  }
  return p;
}

// A 300-token shared prefix (one block + 44) taken to different lengths: hits at its block boundary
// exactly and from inside the next block, plus unrelated prompts that fill a small cache.
std::vector<int32_t> shared_prefix() { return random_tokens(1, kBlock + 44); }

std::vector<Req> workload(int max_tokens) {
  const std::vector<int32_t> shared = shared_prefix();
  auto head = [&](int64_t n) { return std::vector<int32_t>(shared.begin(), shared.begin() + n); };
  const std::vector<std::vector<int32_t>> prompts = {
      cat(shared, random_tokens(10, 20)),          // computes the prefix
      cat(head(kBlock), random_tokens(11, 30)),    // hit at 256 (its end)
      cat(shared, random_tokens(12, 5)),           // hit at 256, inside the next block
      random_tokens(13, 2 * kBlock + 100),         // unrelated: fills a small cache
      cat(head(kBlock + 20), random_tokens(14, 40)),  // hit (or host tier / recompute)
      random_tokens(16, 2 * kBlock + 30),          // unrelated
      cat(shared, random_tokens(17, 61)),          // hit (or host tier / recompute)
  };
  std::vector<Req> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) reqs.push_back({prompts[i], params_for(i, max_tokens)});
  return reqs;
}

const std::vector<size_t> kWaves = {1, 3, 4, 5, 6};

// The reference: each request alone, cache off, synchronous steps.
std::vector<Trace> alone(const std::vector<Req>& reqs, const CacheSetup& base = {}) {
  std::vector<Trace> t;
  for (const Req& r : reqs) {
    CacheSetup s = base;
    s.prefix = false;
    s.async = false;
    t.push_back(run_waves(s, {r}, {}).traces[0]);
  }
  return t;
}

void expect_traces(const std::vector<Trace>& want, const Outcome& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.traces.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(got.traces[i].error.empty()) << what << ", request " << i << ": " << got.traces[i].error;
    EXPECT_FALSE(want[i].ids.empty()) << what << ", request " << i;
    EXPECT_EQ(got.traces[i].ids, want[i].ids) << what << ", request " << i;
    EXPECT_TRUE(got.traces[i] == want[i]) << what << ", request " << i << ": logprob bits differ";
  }
}
}  // namespace

TEST(PrefixCacheInvariance, HitsEvictionHostTierAndChunkingBitIdentical) {
  if (!std::filesystem::exists(tiny_dir() + "/config.json")) GTEST_SKIP() << "no fixture at " << tiny_dir();
  const std::vector<Req> reqs = workload(6);
  const std::vector<Trace> ref = alone(reqs);
  // Room for everything: every shared request hits.
  const Outcome all = run_waves({}, reqs, kWaves);
  expect_traces(ref, all, "large cache");
  for (size_t i : {1, 2, 4, 6}) EXPECT_EQ(all.cached[i], kBlock) << "request " << i;
  // Pressure: two sequences, 3 blocks (one unrelated prompt fills them): the prefix is evicted,
  // shared requests wait for blocks.
  const Outcome small = run_waves({.max_seqs = 2, .cache_blocks = 3}, reqs, kWaves);
  expect_traces(ref, small, "small cache");
  EXPECT_GT(small.evictions, 0);
  EXPECT_GT(small.prefix.num_hits, 0);
  EXPECT_EQ(small.cached[6], 0) << "the unrelated prompt should have evicted the prefix";
  // The same pressure with a host tier and chunked prefill (chunks cut at block boundaries,
  // synchronous steps): evicted blocks spill and come back on the hit.
  const Outcome host =
      run_waves({.async = false, .budget = 61, .max_seqs = 2, .cache_blocks = 3, .host_blocks = 8}, reqs, kWaves);
  expect_traces(ref, host, "small cache + host tier, chunked");
  EXPECT_GT(host.to_host, 0);
  EXPECT_GT(host.from_host, 0);
  EXPECT_EQ(host.cached[6], kBlock) << "the host tier kept the prefix";
}

// Speculative decoding (the default model's MTP drafter, pipelined steps) with grammars, greedy
// and seeded (rejection-sampled) drafts: hits, eviction and the host tier give the traces of
// each request alone with the cache off (drafting too).
TEST(PrefixCacheInvariance, SpeculativeAndGrammarHitsBitIdentical) {
  const std::string model = default_model_dir();
  if (model.empty()) GTEST_SKIP() << "the bundled default model is not found";
  const std::vector<int32_t> shared = shared_prefix();
  std::vector<Req> reqs = {{cat(shared, random_tokens(20, 20)), params_for(0, 8)},
                           {cat(shared, random_tokens(21, 9)), params_for(1, 8)},
                           {random_tokens(22, 2 * kBlock + 90), params_for(3, 8)},
                           {cat(std::vector<int32_t>(shared.begin(), shared.begin() + kBlock), random_tokens(23, 3)),
                            params_for(2, 8)}};
  for (size_t i : {1, 3}) {
    reqs[i].params.structured_outputs.emplace();
    reqs[i].params.structured_outputs->regex = "[a-z]{2,6}(-[a-z0-9]{1,4}){1,3}";
    reqs[i].params.ignore_eos = false;
  }
  const CacheSetup spec{.model = model, .drafts = 2, .grammar = true};
  const std::vector<Trace> ref = alone(reqs, spec);
  const Outcome hit = run_waves(spec, reqs, {1, 2, 3});
  expect_traces(ref, hit, "drafting + grammar");
  EXPECT_EQ(hit.cached[1], kBlock);
  EXPECT_EQ(hit.cached[3], kBlock);
  CacheSetup pressed = spec;
  pressed.max_seqs = 2;
  pressed.cache_blocks = 3;
  pressed.host_blocks = 8;
  const Outcome p = run_waves(pressed, reqs, {1, 2, 3});
  expect_traces(ref, p, "drafting + grammar, small cache + host tier");
  EXPECT_GT(p.from_host, 0);
  EXPECT_EQ(p.cached[3], kBlock);
}

namespace {
// One request on an existing engine; its trace and how many prompt tokens came from the cache.
Trace run_on(Engine& eng, const Req& r, int64_t* cached) {
  eng.add_request("x", PromptInput::from_token_ids(r.prompt), r.params, 0);
  for (int step = 0; eng.has_unfinished() && step < 4000; ++step)
    for (const RequestOutput& o : eng.step())
      if (o.finished) {
        *cached = o.num_cached_tokens;
        return trace_of(o);
      }
  ADD_FAILURE() << "the request did not finish";
  return {};
}
}  // namespace

// Prefill/decode disaggregation's hand-off on real checkpoints (issue #18, engine/kv_transfer.h): a
// prompt prefilled on engine A, its bundle (paged blocks + slot checkpoint, through the wire codec)
// imported into engine B; the request on B hits [0, N), computes only the tail, and its tokens and
// logprob bits equal the request alone with the cache off — greedy and seeded, without and with
// MTP drafting. With DEEPINFER_TEST_ACCELERATOR=nvidia the blocks go device -> host -> device.
TEST(PrefixCacheInvariance, DisaggregatedHandOffBitIdentical) {
  struct Case {
    std::string model;
    int32_t drafts;
  };
  std::vector<Case> cases = {{tiny_dir(), 0}};
  if (!default_model_dir().empty()) cases.push_back({default_model_dir(), 2});
  if (!std::filesystem::exists(tiny_dir() + "/config.json")) GTEST_SKIP() << "no fixture at " << tiny_dir();
  for (const Case& c : cases)
    for (size_t kind : {0, 1}) {  // greedy, seeded
      const std::string what = c.model + (kind ? ", seeded" : ", greedy") + ", drafts " + std::to_string(c.drafts);
      const CacheSetup s{.model = c.model, .drafts = c.drafts};
      const Req req{random_tokens(30 + uint32_t(kind), 2 * kBlock + 37), params_for(kind, 8)};
      const Trace ref = alone({req}, s)[0];
      auto a = make_engine(s);
      Req first = req;
      first.params.max_tokens = 1;
      int64_t cached = -1;
      run_on(*a, first, &cached);
      const engine::KvBundle bundle = a->export_prefix(req.prompt);
      ASSERT_EQ(bundle.num_tokens(), 2 * kBlock) << what;
      const engine::KvBundle wire = engine::decode_kv_bundle(engine::encode_kv_bundle(bundle));
      auto b = make_engine(s);
      EXPECT_EQ(b->import_prefix(wire), 2 * kBlock) << what;
      const Trace got = run_on(*b, req, &cached);
      EXPECT_EQ(cached, 2 * kBlock) << what << ": the decode engine should hit the imported prefix";
      EXPECT_EQ(got.ids, ref.ids) << what;
      EXPECT_TRUE(got == ref) << what << ": logprob bits differ from the request alone";
    }
}

// The device hop (issue #18): export_prefix(prompt, /*device=*/true) leaves the block payload in
// device memory (the gather kernel, block_copy.h), import_prefix scatters it from there; the
// decode engine's ids and logprob bits equal the request alone, as through the host hop. A CPU
// engine refuses a device export by name. On the GPU: DEEPINFER_TEST_ACCELERATOR=nvidia.
TEST(PrefixCacheInvariance, DisaggregatedDeviceHandOffBitIdentical) {
  if (!std::filesystem::exists(tiny_dir() + "/config.json")) GTEST_SKIP() << "no fixture at " << tiny_dir();
  std::vector<std::pair<std::string, int32_t>> cases = {{tiny_dir(), 0}};
  if (!default_model_dir().empty()) cases.push_back({default_model_dir(), 2});
  for (const auto& [model, drafts] : cases) {
    const CacheSetup s{.model = model, .drafts = drafts};
    const Req req{random_tokens(41, 2 * kBlock + 53), params_for(0, 8)};
    auto a = make_engine(s);
    Req first = req;
    first.params.max_tokens = 1;
    int64_t cached = -1;
    run_on(*a, first, &cached);
    if (a->model().device_ordinal() < 0) {
      EXPECT_THROW(a->export_prefix(req.prompt, /*device=*/true), InvalidArgument);
      continue;
    }
    const Trace ref = alone({req}, s)[0];
    const KvBundle host = a->export_prefix(req.prompt);
    const KvBundle dev = a->export_prefix(req.prompt, /*device=*/true);
    ASSERT_EQ(dev.num_tokens(), 2 * kBlock) << model;
    ASSERT_TRUE(dev.on_device() && dev.blocks.empty()) << model;
    EXPECT_EQ(dev.device_blocks.bytes, host.blocks.size()) << model;
    EXPECT_EQ(dev.checkpoint.bytes, host.checkpoint.bytes) << model;
    EXPECT_THROW(encode_kv_bundle(dev), InvalidArgument) << model << ": a device bundle is not on the host";
    auto b = make_engine(s);
    EXPECT_EQ(b->import_prefix(dev), 2 * kBlock) << model;
    const Trace got = run_on(*b, req, &cached);
    EXPECT_EQ(cached, 2 * kBlock) << model << ": the decode engine should hit the imported prefix";
    EXPECT_EQ(got.ids, ref.ids) << model;
    EXPECT_TRUE(got == ref) << model << ": logprob bits differ from the request alone";
  }
}
