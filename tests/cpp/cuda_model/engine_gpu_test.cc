// The engine on the GPU model (tiny fixture, production numerics, the engine's defaults).
// SKIPs without a GPU or without the engine module.
//  * device sampling (logits stay on the GPU, ops::cuda::sample) gives the same tokens as host
//    sampling (host logits, engine::sample_rows), greedy and seeded with every sampling knob,
//    n = 2, min_tokens, logprobs (within 1e-5, top-N ids equal), a prompt_logprobs request (its
//    prefill steps take the host path) and grammar masks applied on the device;
//  * decode through replayed CUDA graphs equals eager fixed-shape decode bit for bit through
//    the engine (tokens and logprobs), and graphs are what the engine loads by default;
//  * at DeepSeek-V4's vocabulary (129,280): DeviceSampler vs copying the logits back and
//    sample_rows, same tokens, and the time of each per step (host clock, sync included).
// Lines "[gpu-engine] ..." are collected by tools/gpu_model_check.sh.
#if defined(DEEPINFER_TEST_HAVE_ENGINE)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/env.h"
#include "engine/engine.h"
#include "golden.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::engine {
namespace {
using model::v4::DecodePath;
using model::v4::DeepseekV4CudaModel;

// Allows, at the k-th sampled token, only ids t with (t + k) % 3 == 0: the mask changes every
// step, and a token the device drew outside it would be rejected (finishing the sequence early).
class ModThreeMatcher final : public GrammarMatcher {
 public:
  void fill_bitmask(std::vector<uint32_t>& mask) override {
    std::fill(mask.begin(), mask.end(), 0u);
    for (size_t t = 0; t < mask.size() * 32; ++t)
      if ((t + k_) % 3 == 0) mask[t / 32] |= 1u << (t % 32);
  }
  bool accept_token(int32_t token) override {
    const bool ok = (size_t(token) + k_) % 3 == 0;
    ++k_;
    return ok;
  }
  bool is_terminated() const override { return false; }

 private:
  size_t k_ = 0;
};
class ModThreeCompiler final : public GrammarCompiler {
 public:
  std::unique_ptr<GrammarMatcher> compile(const StructuredOutputsParams&) override {
    return std::make_unique<ModThreeMatcher>();
  }
  int64_t num_distinct_grammars() const override { return 1; }
};

struct EngineRun {
  std::vector<RequestOutput> outputs;  // by request index
  ModelRunner::Stats runner;
  DeviceSampler::Stats sampler;
  int64_t graphs = 0;
  double seconds = 0;
};

std::string fixture() { return deepinfer::testing::golden_dir("tiny"); }

// Loads the model as the engine does (production numerics, graph decode), optionally switching
// the decode path, and runs `prompts` x `params` to completion through the Engine.
// With `ops`, op profiling is on for the whole run and *ops receives its per-op times.
EngineRun run_engine(bool device_sampling, DecodePath path, const std::vector<std::vector<int32_t>>& prompts,
               const std::vector<SamplingParams>& params, bool grammar = false, std::vector<OpTiming>* ops = nullptr) {
  std::unique_ptr<DeepseekV4CudaModel> m = DeepseekV4CudaModel::load(fixture(), model::v4::engine_cuda_options({}));
  if (m->decode_path() != path) m->set_decode_path(path);
  if (ops) m->set_op_profiling(true);
  DeepseekV4CudaModel* raw = m.get();
  EngineConfig ec;
  ec.scheduler.max_num_seqs = 16;
  ec.scheduler.max_num_batched_tokens = 256;  // the long prompt prefills in chunks
  ec.kv_cache_memory_bytes = size_t(64) << 20;
  ec.device_sampling = device_sampling;
  Engine eng(ec, std::move(m), nullptr, grammar ? std::make_unique<ModThreeCompiler>() : nullptr);
  EngineRun r;
  r.outputs.resize(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < prompts.size(); ++i)
    eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompts[i]), params[i % params.size()], 0);
  while (eng.has_unfinished())
    for (RequestOutput& o : eng.step())
      if (o.finished) r.outputs[std::stoul(o.request_id)] = std::move(o);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.runner = eng.runner().stats();
  if (const DeviceSampler* ds = eng.runner().device_sampler()) r.sampler = ds->stats();
  r.graphs = raw->graphs_captured();
  if (ops) {
    *ops = raw->take_op_profile();
    raw->set_op_profiling(false);
  }
  return r;
}

std::vector<std::vector<int32_t>> prompts() {
  const auto in = deepinfer::testing::read_inputs(fixture());
  std::vector<std::vector<int32_t>> p;
  for (const char* name : {"short", "medium", "long"}) p.push_back(in.at(name));
  const std::vector<int32_t>& s = in.at("short");
  for (size_t cut : {5, 17, 29}) p.emplace_back(s.begin(), s.begin() + ptrdiff_t(cut));  // shared prefixes
  return p;
}

std::vector<SamplingParams> mixed_params() {
  std::vector<SamplingParams> ps;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 40;
  greedy.ignore_eos = true;
  greedy.logprobs = 0;
  ps.push_back(greedy);
  SamplingParams seeded;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.max_tokens = 40;
  seeded.ignore_eos = true;
  seeded.seed = 1234;
  ps.push_back(seeded);
  SamplingParams all = seeded;  // every knob, n = 2, logprobs, min_tokens with stop ids
  all.n = 2;
  all.seed = 77;
  all.temperature = 0.7f;
  all.top_k = 20;
  all.min_p = 0.02f;
  all.top_p = 0.9f;
  all.repetition_penalty = 1.2f;
  all.presence_penalty = 0.3f;
  all.frequency_penalty = 0.2f;
  all.logit_bias = {{7, 2.5f}, {100, -3.0f}, {7, 0.5f}};
  all.logprobs = 5;
  all.ignore_eos = false;
  all.min_tokens = 8;
  all.stop_token_ids = {2, 3};
  ps.push_back(all);
  SamplingParams plp = greedy;  // prompt logprobs: its prefill steps sample on the host
  plp.prompt_logprobs = 2;
  plp.logprobs = 3;
  plp.repetition_penalty = 0.8f;
  ps.push_back(plp);
  SamplingParams unseeded = seeded;  // the engine derives the seed from its own
  unseeded.seed.reset();
  unseeded.temperature = 1.3f;
  ps.push_back(unseeded);
  return ps;
}

// Tokens equal; logprobs within `tol` (0: bit-identical), top-N ids equal.
void expect_same(const EngineRun& a, const EngineRun& b, double tol, const char* what) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  double worst = 0;
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    const RequestOutput &x = a.outputs[i], &y = b.outputs[i];
    ASSERT_TRUE(x.error.empty() && y.error.empty()) << what << " request " << i << ": " << x.error << y.error;
    ASSERT_EQ(x.outputs.size(), y.outputs.size()) << what << " request " << i;
    for (size_t k = 0; k < x.outputs.size(); ++k) {
      const CompletionOutput &cx = x.outputs[k], &cy = y.outputs[k];
      EXPECT_EQ(cx.token_ids, cy.token_ids) << what << " request " << i << " sample " << k;
      EXPECT_EQ(cx.finish_reason, cy.finish_reason) << what << " request " << i << " sample " << k;
      ASSERT_EQ(cx.logprobs.has_value(), cy.logprobs.has_value());
      if (!cx.logprobs || cx.token_ids != cy.token_ids) continue;
      for (size_t p = 0; p < cx.logprobs->size(); ++p) {
        const PositionLogprobs &lx = (*cx.logprobs)[p], &ly = (*cy.logprobs)[p];
        ASSERT_EQ(lx.size(), ly.size()) << what << " request " << i << " position " << p;
        for (size_t j = 0; j < lx.size(); ++j) {
          EXPECT_EQ(lx[j].first, ly[j].first) << what << " request " << i << " position " << p << " entry " << j;
          EXPECT_EQ(lx[j].second.rank, ly[j].second.rank) << what << " request " << i << " position " << p;
          worst = std::max(worst, double(std::abs(lx[j].second.logprob - ly[j].second.logprob)));
        }
      }
    }
    if (x.prompt_logprobs || y.prompt_logprobs) {
      ASSERT_TRUE(x.prompt_logprobs && y.prompt_logprobs);
      ASSERT_EQ(x.prompt_logprobs->size(), y.prompt_logprobs->size());
      for (size_t p = 0; p < x.prompt_logprobs->size(); ++p) {
        const auto &px = (*x.prompt_logprobs)[p], &py = (*y.prompt_logprobs)[p];
        ASSERT_EQ(px.has_value(), py.has_value());
        if (!px) continue;
        ASSERT_EQ(px->size(), py->size());
        for (size_t j = 0; j < px->size(); ++j) {
          EXPECT_EQ((*px)[j].first, (*py)[j].first) << what << " prompt position " << p;
          worst = std::max(worst, double(std::abs((*px)[j].second.logprob - (*py)[j].second.logprob)));
        }
      }
    }
  }
  if (tol == 0)
    EXPECT_EQ(worst, 0.0) << what;
  else
    EXPECT_LE(worst, tol) << what;
  std::printf("[gpu-engine] %s: %zu requests equal tokens, max |dlogprob| %.3g\n", what, a.outputs.size(), worst);
}

int64_t total_tokens(const EngineRun& r) {
  int64_t n = 0;
  for (const auto& o : r.outputs)
    for (const auto& c : o.outputs) n += int64_t(c.token_ids.size());
  return n;
}

class GpuEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
    if (!std::filesystem::exists(fixture() + "/config.json")) GTEST_SKIP() << "fixture " << fixture() << " absent";
  }
};

TEST_F(GpuEngine, LoadsWithGraphDecodeByDefault) {
  const char* env = std::getenv("DEEPINFER_CUDA_GRAPHS");
  auto m = DeepseekV4CudaModel::load(fixture(), model::v4::engine_cuda_options({}));
  EXPECT_TRUE(m->supports_device_logits());
  if (!env || !*env) {
    EXPECT_EQ(m->decode_path(), DecodePath::kGraph);
    EXPECT_NE(m->describe().find("decode graphs"), std::string::npos) << m->describe();
  }
  std::printf("[gpu-engine] %s\n", m->describe().c_str());
}

TEST_F(GpuEngine, DeviceSamplingEqualsHostSampling) {
  const auto p = prompts();
  const auto ps = mixed_params();
  run_engine(true, DecodePath::kGraph, p, ps);  // warm-up: cuBLASLt heuristics, graph capture
  const EngineRun dev = run_engine(true, DecodePath::kGraph, p, ps);
  const EngineRun host = run_engine(false, DecodePath::kGraph, p, ps);
  expect_same(dev, host, 1e-5, "device vs host sampling (graph decode)");
  EXPECT_GT(dev.runner.device_steps, 0);
  EXPECT_GT(dev.runner.host_steps, 0);  // the prompt_logprobs request's prefill
  EXPECT_EQ(host.runner.device_steps, 0);
  EXPECT_GT(dev.graphs, 0);
  // Only ids and logprobs come back: a few hundred bytes per row, never a logits row.
  const double d2h_per_row = double(dev.sampler.d2h_bytes) / double(std::max<int64_t>(dev.sampler.rows, 1));
  EXPECT_LT(d2h_per_row, 512.0);
  std::printf("[gpu-engine] device sampling: %lld device steps (%lld rows), %lld host steps; D2H %.0f B/row "
              "(a logits row is %lld B), H2D %.0f B/step; %lld tokens: device %.3f s, host %.3f s\n",
              (long long)dev.runner.device_steps, (long long)dev.sampler.rows, (long long)dev.runner.host_steps,
              d2h_per_row, (long long)(512 * 4),
              double(dev.sampler.h2d_bytes) / double(std::max<int64_t>(dev.sampler.steps, 1)),
              (long long)total_tokens(dev), dev.seconds, host.seconds);
}

TEST_F(GpuEngine, GrammarMaskAppliedOnDevice) {
  const auto p = prompts();
  std::vector<SamplingParams> ps = mixed_params();
  ps.resize(3);  // greedy, seeded, everything
  for (SamplingParams& s : ps) {
    s.structured_outputs = StructuredOutputsParams{};
    s.structured_outputs->regex = "any";  // ModThreeCompiler ignores the spec
  }
  const EngineRun dev = run_engine(true, DecodePath::kGraph, p, ps, true);
  const EngineRun host = run_engine(false, DecodePath::kGraph, p, ps, true);
  expect_same(dev, host, 1e-5, "grammar masks, device vs host");
  EXPECT_GT(dev.runner.device_steps, 0);
  EXPECT_EQ(dev.runner.host_steps, 0);
  for (const auto& o : dev.outputs)
    for (const auto& c : o.outputs) {
      EXPECT_NE(c.finish_reason, "error") << o.request_id;
      for (size_t k = 0; k < c.token_ids.size(); ++k)
        EXPECT_EQ((size_t(c.token_ids[k]) + k) % 3, 0u) << "request " << o.request_id << " token " << k;
    }
}

TEST_F(GpuEngine, GraphReplayEqualsEagerFixedThroughEngine) {
  const auto p = prompts();
  const auto ps = mixed_params();
  const EngineRun graph = run_engine(true, DecodePath::kGraph, p, ps);
  const EngineRun eager = run_engine(true, DecodePath::kFixed, p, ps);
  expect_same(graph, eager, 0.0, "graph replay vs eager fixed-shape decode (engine, device sampling)");
  EXPECT_GT(graph.graphs, 0);
  EXPECT_EQ(eager.graphs, 0);
  // The general (grouped-MoE) decode path rounds differently in production numerics
  // (cuda_model.h, kDefaultDecodePath): agreement printed, not required.
  const EngineRun general = run_engine(true, DecodePath::kGeneral, p, ps);
  int64_t same = 0, total = 0;
  for (size_t i = 0; i < graph.outputs.size(); ++i)
    for (size_t k = 0; k < graph.outputs[i].outputs.size(); ++k) {
      const auto &a = graph.outputs[i].outputs[k].token_ids, &b = general.outputs[i].outputs[k].token_ids;
      size_t n = 0;
      while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
      same += int64_t(n);
      total += int64_t(a.size());
    }
  std::printf("[gpu-engine] graph vs general decode (production): %lld/%lld leading tokens equal; %lld tokens in "
              "graph %.3f s, eager fixed %.3f s, general %.3f s\n",
              (long long)same, (long long)total, (long long)total_tokens(graph), graph.seconds, eager.seconds,
              general.seconds);
}

// Op profiling (bench-flash --breakdown): every step runs eagerly with events around each op; the
// outputs are those of graph replay bit for bit (eager fixed == graph above), no graph is
// captured, and the profile names the model's ops (largest first) with positive times.
TEST_F(GpuEngine, OpProfilingTimesEveryOpAndChangesNothing) {
  const auto p = prompts();
  const auto ps = mixed_params();
  const EngineRun graph = run_engine(true, DecodePath::kGraph, p, ps);
  std::vector<OpTiming> ops;
  const EngineRun timed = run_engine(true, DecodePath::kGraph, p, ps, false, &ops);
  expect_same(graph, timed, 0.0, "op profiling on vs off (graph decode)");
  EXPECT_EQ(timed.graphs, 0) << "op profiling must launch eagerly";
  ASSERT_FALSE(ops.empty());
  double total = 0;
  bool attention = false, linear = false, experts = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_GT(ops[i].calls, 0) << ops[i].op;
    EXPECT_GE(ops[i].ms, 0.0) << ops[i].op;
    if (i > 0) { EXPECT_GE(ops[i - 1].ms, ops[i].ms) << "largest first"; }
    total += ops[i].ms;
    attention |= ops[i].op == "sparse_attention";
    linear |= ops[i].op.rfind("linear ", 0) == 0;
    experts |= ops[i].op == "moe_experts";
  }
  EXPECT_TRUE(attention && linear && experts) << "missing op names";
  EXPECT_GT(total, 0.0);
  std::printf("[gpu-engine] op profiling: %zu op kinds, %.3f ms in all; top: %s %.3f ms (%lld calls)\n", ops.size(),
              total, ops[0].op.c_str(), ops[0].ms, (long long)ops[0].calls);
}

// Batch invariance in bf16 numerics (the engine itself loads production numerics, which
// determinism_test.cc checks on the GPU through DEEPINFER_TEST_ACCELERATOR=nvidia): the CUDA
// model loaded with Numerics::kBf16 and batch_invariant, behind an engine with batch invariance
// on. One greedy and one seeded target (logprobs 4) alone, then inside 1 / 31 / 255 random
// neighbours (random prompt lengths, sampling settings and arrival steps, three token budgets,
// async on and off): its token ids and every logprob bit are those of the request alone.
struct InvReq {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

std::vector<uint32_t> inv_trace(const RequestOutput& o) {
  std::vector<uint32_t> t;
  const CompletionOutput& c = o.outputs.at(0);
  for (int32_t id : c.token_ids) t.push_back(uint32_t(id));
  if (c.logprobs)
    for (const PositionLogprobs& pos : *c.logprobs)
      for (const auto& [id, lp] : pos) {
        uint32_t b;
        std::memcpy(&b, &lp.logprob, 4);
        t.push_back(uint32_t(id));
        t.push_back(b);
        t.push_back(uint32_t(lp.rank));
      }
  return t;
}

std::vector<uint32_t> run_bf16_invariant(const InvReq& target, int target_step, const std::vector<InvReq>& nb,
                                         const std::vector<int>& arrival, int64_t budget, bool async) {
  model::v4::CudaModelOptions o = model::v4::engine_cuda_options({});
  o.numerics = model::v4::gpu::Numerics::kBf16;
  o.batch_invariant = true;
  o.max_seqs = 256;
  o.max_batch_tokens = budget;
  o.max_context = 200;
  o.progress = false;
  EngineConfig ec;
  ec.env.batch_invariant = true;
  ec.env.async_scheduling = async;
  ec.scheduler.max_num_seqs = 256;
  ec.scheduler.max_num_batched_tokens = budget;
  ec.scheduler.max_model_len = 200;
  ec.kv_cache_memory_bytes = size_t(256) << 20;
  ec.seed = 7;
  Engine eng(ec, DeepseekV4CudaModel::load(fixture(), o), nullptr);
  std::vector<uint32_t> got;
  size_t next = 0;
  std::vector<size_t> order(nb.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return arrival[a] < arrival[b]; });
  for (int step = 0; got.empty() && step < 5000; ++step) {
    if (step == target_step) eng.add_request("target", PromptInput::from_token_ids(target.prompt), target.params, 0);
    for (; next < order.size() && arrival[order[next]] <= step; ++next)
      eng.add_request("n" + std::to_string(order[next]), PromptInput::from_token_ids(nb[order[next]].prompt),
                      nb[order[next]].params, 0);
    if (!eng.has_unfinished()) continue;
    for (const RequestOutput& r : eng.step()) {
      EXPECT_TRUE(r.error.empty()) << r.request_id << ": " << r.error;
      if (r.request_id == "target" && r.finished) got = inv_trace(r);
    }
  }
  while (eng.has_unfinished()) eng.step();
  return got;
}

TEST_F(GpuEngine, Bf16NumericsBatchInvariantAloneEqualsRandomBatches) {
  const int64_t vocab = DeepseekV4CudaModel::load(fixture(), model::v4::engine_cuda_options({}))->vocab_size();
  std::mt19937_64 rng(2026);
  int cases = 0;
  for (bool seeded : {false, true}) {
    InvReq target;
    for (int i = 0; i < 29; ++i) target.prompt.push_back(int32_t(3 + (i * 37 + 11) % (vocab - 3)));
    target.params.max_tokens = 12;
    target.params.ignore_eos = true;
    target.params.logprobs = 4;
    if (seeded) {
      target.params.temperature = 0.9f;
      target.params.top_p = 0.95f;
      target.params.seed = 123456789;
    } else {
      target.params.temperature = 0;
    }
    const std::vector<uint32_t> alone = run_bf16_invariant(target, 0, {}, {}, 2048, false);
    ASSERT_GT(alone.size(), 12u);
    struct C { int n; int64_t budget; bool async; };
    for (const C c : {C{1, 61, true}, C{31, 256, false}, C{31, 2048, true}, C{255, 61, true}, C{255, 2048, false}}) {
      std::vector<InvReq> nb;
      std::vector<int> arrival;
      for (int i = 0; i < c.n; ++i) {
        InvReq r;
        const int len = 1 + int(rng() % 150);
        for (int k = 0; k < len; ++k) r.prompt.push_back(int32_t(2 + rng() % uint64_t(vocab - 2)));
        r.params.max_tokens = 1 + int(rng() % 24);
        r.params.ignore_eos = rng() % 2;
        if (rng() % 2) {
          r.params.temperature = 0.7f + 0.1f * float(rng() % 5);
          r.params.top_p = rng() % 2 ? 0.9f : 1.0f;
          r.params.top_k = int(rng() % 3) * 20;
          r.params.seed = rng();
        } else {
          r.params.temperature = 0;
        }
        if (rng() % 4 == 0) r.params.logprobs = int(rng() % 4);
        nb.push_back(std::move(r));
        arrival.push_back(int(rng() % 6));
      }
      const std::vector<uint32_t> got = run_bf16_invariant(target, int(rng() % 4), nb, arrival, c.budget, c.async);
      EXPECT_TRUE(got == alone) << (seeded ? "seeded" : "greedy") << ", " << c.n << " neighbours, budget " << c.budget
                                << (c.async ? ", async" : ", sync");
      ++cases;
    }
  }
  std::printf("[gpu-engine] bf16 numerics, batch invariant: %d cases (1..255 neighbours) equal the request alone\n",
              cases);
}

// Sampling cost at the real vocabulary: device (ids back) vs host (logits back, then
// sample_rows). Random logits (std 2), half greedy rows, half seeded top-k/top-p/min-p rows with
// a repetition penalty; every 4th row asks for 5 logprobs.
TEST_F(GpuEngine, SamplerAtV4VocabDeviceVsHost) {
  const int64_t V = 129280;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> logits(size_t(64 * V));
  for (float& x : logits) x = nd(gen);
  cuda::Stream st;
  cuda::DeviceBuffer dl(logits.size() * sizeof(float));
  cuda::copy_h2d(dl.data(), logits.data(), logits.size() * sizeof(float), st.get());
  SamplingParams greedy, sampled;
  greedy.temperature = 0;
  sampled.temperature = 0.8f;
  sampled.top_k = 50;
  sampled.top_p = 0.9f;
  sampled.min_p = 0.01f;
  sampled.repetition_penalty = 1.1f;
  SamplingParams greedy_lp = greedy, sampled_lp = sampled;
  greedy_lp.logprobs = sampled_lp.logprobs = 5;
  std::vector<int32_t> prompt(200), output(50);
  for (auto& t : prompt) t = int32_t(gen() % V);
  for (auto& t : output) t = int32_t(gen() % V);
  std::unique_ptr<DeviceSampler> ds = DeviceSampler::create(V);
  ASSERT_NE(ds, nullptr);
  for (int64_t B : {1, 8, 32, 64}) {
    std::vector<SamplingRow> rows(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) {
      SamplingRow& r = rows[size_t(i)];
      r.params = i % 4 == 3 ? (i % 2 ? &sampled_lp : &greedy_lp) : (i % 2 ? &sampled : &greedy);
      r.seed = 1000 + uint64_t(i);
      r.position = 250;
      r.prompt_ids = &prompt;
      r.output_ids = &output;
      r.eos_token_id = 1;
    }
    const model::DeviceLogits d{.data = dl.as<float>(), .rows = B, .row_stride = V, .stream = st.get(), .device = 0};
    std::vector<double> dev_ms, host_ms;
    std::vector<SampleResult> got, want;
    for (int rep = 0; rep < 12; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      got = ds->sample(d, rows);
      auto t1 = std::chrono::steady_clock::now();
      Tensor host = Tensor::empty({B, V}, DType::kF32);  // what the host path copies back
      cuda::copy_d2h(host.raw_data(), dl.data(), host.nbytes(), st.get(), true);
      std::vector<SamplingRow> hrows = rows;
      for (int64_t i = 0; i < B; ++i) hrows[size_t(i)].logits = host.data<float>() + i * V;
      want = sample_rows(hrows, V);
      auto t2 = std::chrono::steady_clock::now();
      if (rep < 2) continue;  // warm-up
      dev_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      host_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    for (int64_t i = 0; i < B; ++i) {
      EXPECT_EQ(got[size_t(i)].token, want[size_t(i)].token) << "B " << B << " row " << i;
      EXPECT_EQ(got[size_t(i)].logprobs.rank, want[size_t(i)].logprobs.rank) << "B " << B << " row " << i;
      for (size_t j = 0; j < want[size_t(i)].logprobs.top.size(); ++j)
        EXPECT_EQ(got[size_t(i)].logprobs.top[j].first, want[size_t(i)].logprobs.top[j].first) << "row " << i;
    }
    std::sort(dev_ms.begin(), dev_ms.end());
    std::sort(host_ms.begin(), host_ms.end());
    std::printf("[gpu-engine] sampling V=%lld B=%lld (half greedy, half top-k/p/min-p + rep. penalty, 1/4 logprobs 5): "
                "device %.3f ms (D2H %lld B), host %.3f ms (D2H %lld B + sample_rows), median of 10\n",
                (long long)V, (long long)B, dev_ms[dev_ms.size() / 2], (long long)ds->stats().last_d2h_bytes,
                host_ms[host_ms.size() / 2], (long long)(B * V * 4));
  }
}

// Prefix caching with slot checkpoints queued at the next launch (EngineConfig::
// async_checkpoint_copies: stream-ordered copies into pinned memory, the host does not wait before
// the next step's forward) vs save_slot at once: the same outputs bit for bit (same schedules),
// the same checkpoints saved, hits and restores. Prompts around the 256-token block boundary:
// some checkpoints are prefill chunk ends, the others decode boundaries (those are queued).
struct WaveRun {
  EngineRun run;
  PrefixCacheStats prefix;
};

WaveRun run_prefix_waves(bool queued_copies, const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& sp) {
  auto m = DeepseekV4CudaModel::load(fixture(), model::v4::engine_cuda_options({}));
  EngineConfig ec;
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_num_batched_tokens = 512;
  ec.kv_cache_memory_bytes = size_t(64) << 20;
  ec.async_checkpoint_copies = queued_copies;
  Engine eng(ec, std::move(m), nullptr);
  WaveRun r;
  r.run.outputs.resize(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t wave = 0; wave < 2; ++wave) {  // the first prompt alone, then the rest hit it
    for (size_t i = wave ? 1 : 0; i < (wave ? prompts.size() : 1); ++i)
      eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompts[i]), sp, 0);
    while (eng.has_unfinished())
      for (RequestOutput& o : eng.step())
        if (o.finished) r.run.outputs[std::stoul(o.request_id)] = std::move(o);
  }
  r.run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.run.runner = eng.runner().stats();
  r.prefix = eng.scheduler().prefix_cache().stats();
  return r;
}

TEST_F(GpuEngine, QueuedCheckpointCopiesEqualSaveSlot) {
  std::mt19937 g(5);
  std::vector<int32_t> shared(300);
  for (int32_t& t : shared) t = int32_t(3 + g() % 500);
  std::vector<std::vector<int32_t>> prompts = {shared};
  for (size_t n : {230, 256, 270, 300}) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + ptrdiff_t(n));
    for (int j = 0; j < 7; ++j) p.push_back(int32_t(3 + g() % 500));
    prompts.push_back(std::move(p));
  }
  SamplingParams sp;
  sp.temperature = 0.8f;
  sp.seed = 99;
  sp.max_tokens = 48;  // the 230-token prompts cross the boundary while decoding
  sp.ignore_eos = true;
  sp.logprobs = 2;
  run_prefix_waves(false, prompts, sp);  // warm-up: graphs, cuBLASLt
  const WaveRun a = run_prefix_waves(false, prompts, sp), b = run_prefix_waves(true, prompts, sp);
  expect_same(a.run, b.run, 0, "queued checkpoint copies vs save_slot");
  EXPECT_GT(b.run.runner.checkpoints_saved, 0);
  EXPECT_EQ(a.run.runner.checkpoints_saved, b.run.runner.checkpoints_saved);
  EXPECT_EQ(a.run.runner.restores, b.run.runner.restores);
  EXPECT_GT(b.run.runner.restores, 0);
  EXPECT_EQ(a.prefix.hit_tokens, b.prefix.hit_tokens);
  EXPECT_GT(b.prefix.hit_tokens, 0);
  std::printf("[gpu-engine] queued checkpoint copies: %lld checkpoints, %lld restores, %.3f s vs save_slot %.3f s\n",
              (long long)b.run.runner.checkpoints_saved, (long long)b.run.runner.restores, b.run.seconds, a.run.seconds);
}

}  // namespace
}  // namespace deepinfer::engine
#endif  // DEEPINFER_TEST_HAVE_ENGINE
