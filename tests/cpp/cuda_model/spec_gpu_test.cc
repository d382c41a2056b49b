// Speculative decoding on the GPU model (issue #11): the V4 MTP drafter on the CUDA backend.
//  * the drafter's rounds through replayed CUDA graphs equal eager fixed-shape rounds bit for bit
//    and the general path within fp32 rounding (exact numerics); greedy drafts picked on the
//    device equal the host's argmax of the same logits;
//  * greedy speculative output through the Engine is token-identical to plain decoding, batched
//    and alone, in exact, bf16 and production numerics, with the drafter on graphs and on the
//    general path;
//  * timings (printed, "[spec-gpu] ..." lines): the verify cost curve (step time against tokens
//    per sequence at batch 1..64), the drafter's round cost on graphs vs the general path, and
//    engine decode tokens/s with drafting on vs off at batch 1/8/32/64 on the default model.
// SKIPs without a GPU, the engine module or the fixtures.
#if defined(DEEPINFER_TEST_HAVE_ENGINE)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "golden.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "mtp_rounds.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::engine {
namespace {
using model::v4::DecodePath;
using model::v4::DeepseekV4CudaModel;
using model::v4::gpu::Numerics;
constexpr int32_t kL = 5;

// The source tree (DEEPINFER_SOURCE_DIR when set: prebuilt binaries run in another checkout).
std::filesystem::path source_dir() {
  const char* env = std::getenv("DEEPINFER_SOURCE_DIR");
  return env && *env ? env : DEEPINFER_TEST_SOURCE_DIR;
}

std::string default_model() { return (source_dir() / "assets" / "default-model").string(); }

std::unique_ptr<DeepseekV4CudaModel> load(const std::string& dir, Numerics n, DecodePath path,
                                          bool batch_invariant = false) {
  model::v4::CudaModelOptions o;
  o.numerics = n;
  o.batch_invariant = batch_invariant;
  o.decode = path;
  o.progress = false;
  o.max_batch_tokens = 2048;
  o.max_seqs = 64;
  o.max_context = 4096;
  o.max_rollback = kL + 1;
  return DeepseekV4CudaModel::load(dir, o);
}

struct SpecRun {
  std::vector<std::vector<int32_t>> tokens;
  SchedulerStats stats;
  ModelRunner::Stats runner;
  DraftGate::Stats gate;
  int64_t sampler_d2h = 0;
  double seconds = 0;
  int64_t graphs = 0;
  int64_t output_tokens = 0;
  std::vector<RequestMetrics> metrics;  // per request (timed pass)
  double acceptance_length() const {
    return 1.0 + double(stats.num_accepted_drafts) / double(std::max<int64_t>(1, stats.num_verify_steps));
  }
  std::string per_position() const {
    std::string s;
    for (size_t i = 0; i < stats.draft_verified_at.size(); ++i) {
      char b[32];
      std::snprintf(b, sizeof b, "%s%.3f", i ? " " : "",
                    double(stats.draft_accepted_at[i]) / double(std::max<int64_t>(1, stats.draft_verified_at[i])));
      s += b;
    }
    return s;
  }
};

// Sampled drafting: device draft picks + device verify (DEEPINFER_DEVICE_DRAFT_SAMPLING) and
// adaptive drafting (off unless asked, so the figures below time drafting itself).
struct SpecOpts {
  bool device_drafts = true;
  bool adaptive = false;
};

SpecRun run_engine(std::unique_ptr<DeepseekV4CudaModel> m, int32_t drafts,
                   const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params, int64_t max_seqs,
                   bool varlen = false, bool warm = false, bool prefix_cache = true, SpecOpts so = {}) {
  DeepseekV4CudaModel* raw = m.get();
  EngineConfig ec;
  ec.env.device_draft_sampling = so.device_drafts;
  ec.adaptive_drafts = so.adaptive;
  ec.scheduler.max_num_seqs = max_seqs;
  ec.scheduler.max_num_batched_tokens = 2048;
  ec.kv_cache_memory_bytes = size_t(512) << 20;
  ec.num_speculative_tokens = drafts;
  ec.varlen_drafts = varlen;  // the step-cost curve is measured at start-up (on the GPU)
  // Prefix caching off and no drafting: asynchronous scheduling (engine.h) is on.
  ec.scheduler.prefix_cache.enabled = prefix_cache;
  Engine eng(ec, std::move(m), nullptr, nullptr);
  if (warm) {  // the same requests once first: graphs of the step shapes captured, prompts cached
    for (size_t i = 0; i < prompts.size(); ++i)
      eng.add_request("w" + std::to_string(i), PromptInput::from_token_ids(prompts[i]), params, 0);
    while (eng.has_unfinished()) eng.step();
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams pi = params;
    if (pi.seed) pi.seed = *pi.seed + i;  // seeded requests: one stream each
    eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompts[i]), pi, 0);
  }
  SpecRun r;
  r.tokens.resize(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  while (eng.has_unfinished())
    for (RequestOutput& o : eng.step()) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      if (o.finished && !o.outputs.empty()) r.tokens[std::stoul(o.request_id)] = o.outputs[0].token_ids;
      if (o.finished) r.metrics.push_back(o.metrics);
    }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stats = eng.scheduler().stats();
  r.runner = eng.runner().stats();
  r.gate = eng.scheduler().draft_gate().stats();
  if (eng.runner().device_sampler()) r.sampler_d2h = eng.runner().device_sampler()->stats().d2h_bytes;
  r.graphs = raw->graphs_captured();
  for (const auto& t : r.tokens) r.output_tokens += int64_t(t.size());
  return r;
}

SamplingParams greedy(int n) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

// The default model: held-out text (never trained on), mixed lengths, bos first. Fixtures: their
// golden inputs and prefixes of them.
std::vector<std::vector<int32_t>> prompts_for(const std::string& dir, int n) {
  std::vector<std::vector<int32_t>> out;
  if (dir == default_model()) {
    std::ifstream in(source_dir() / "tests" / "data" / "default_model" / "heldout_sample.jsonl");
    std::unique_ptr<TextCodec> codec = load_codec(LLMConfig{}, dir, 8192);
    std::string line;
    for (int i = 0; int(out.size()) < n && std::getline(in, line); ++i) {
      std::vector<int32_t> ids = codec->encode(nlohmann::json::parse(line).get<std::string>());
      const size_t len = 9 + size_t(i * 37) % 120;
      if (ids.size() < len + 1) continue;
      ids.resize(len);
      ids.insert(ids.begin(), 0);
      out.push_back(std::move(ids));
    }
    for (size_t i = 0; int(out.size()) < n; ++i) out.push_back(out[i]);  // cycle to fill a batch
    return out;
  }
  const auto in = deepinfer::testing::read_inputs(dir);
  const std::vector<int32_t>& s = in.at("short");
  for (int i = 0; int(out.size()) < n; ++i) {
    const size_t cut = std::min(s.size(), size_t(5 + (i * 11) % 40));
    out.emplace_back(s.begin(), s.begin() + ptrdiff_t(cut));
  }
  return out;
}

struct Case {
  std::string name, dir;
  Numerics numerics;
  // DEEPINFER_BATCH_INVARIANT's kernels (one MoE path for every step size). Without them, bf16
  // decode steps (moe_decode_grouped) and verify steps above its 256 tokens (grouped expert GEMM;
  // above 64 before it) round differently, so greedy identity is asserted there for batches whose
  // verify steps stay at or below 64 tokens (10 sequences x 6 tokens).
  bool invariant = false;
  int prompts = 12;
};

class GpuSpec : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
    if (!std::filesystem::exists(GetParam().dir + "/config.json")) GTEST_SKIP() << GetParam().dir << " absent";
  }
};

TEST_P(GpuSpec, MtpRoundsGraphEqualsEagerAndGeneral) {
  const Case& c = GetParam();
  const auto graph = load(c.dir, c.numerics, DecodePath::kGraph);
  ASSERT_NE(graph->drafter(), nullptr) << c.dir;
  const auto a = deepinfer::testing::run_mtp_rounds(*graph, kL, 12, 4);
  const auto fixed = deepinfer::testing::run_mtp_rounds(*load(c.dir, c.numerics, DecodePath::kFixed), kL, 12, 4);
  const auto general = deepinfer::testing::run_mtp_rounds(*load(c.dir, c.numerics, DecodePath::kGeneral), kL, 12, 4);
  EXPECT_GT(graph->graphs_captured(), 1) << "target and drafter graphs";
  EXPECT_EQ(a.drafts, fixed.drafts) << c.name;
  EXPECT_EQ(deepinfer::testing::max_abs_diff(a.logits, fixed.logits), 0.f) << c.name << ": graph replay vs eager";
  // Device greedy picks (no logits copied) vs the host's argmax of the same rows.
  for (const auto* r : {&a, &fixed, &general}) {
    EXPECT_EQ(r->drafts_no_logits, r->drafts) << c.name;
    EXPECT_LT(deepinfer::testing::max_abs_diff(r->logprobs_no_logits, r->logprobs), 1e-4) << c.name;
  }
  const float vs_general = deepinfer::testing::max_abs_diff(a.logits, general.logits);
  if (c.numerics == Numerics::kExact) {
    EXPECT_EQ(a.drafts, general.drafts) << c.name;
    EXPECT_LT(vs_general, 1e-3) << c.name;
  }
  int64_t same = 0;
  for (size_t i = 0; i < a.drafts.size() && i < general.drafts.size(); ++i) same += a.drafts[i] == general.drafts[i];
  std::printf("[spec-gpu] %s drafter rounds: graph == eager fixed (%zu logits); vs general max|d| %.3g, drafts "
              "equal %lld/%zu; graphs %lld\n",
              c.name.c_str(), a.logits.size(), vs_general, (long long)same, a.drafts.size(),
              (long long)graph->graphs_captured());
}

TEST_P(GpuSpec, GreedyOutputIdenticalToPlain) {
  const Case& c = GetParam();
  const auto prompts = prompts_for(c.dir, c.prompts);
  const SamplingParams p = greedy(40);
  const int64_t S = c.prompts;
  const SpecRun plain = run_engine(load(c.dir, c.numerics, DecodePath::kGraph, c.invariant), 0, prompts, p, S);
  const SpecRun spec = run_engine(load(c.dir, c.numerics, DecodePath::kGraph, c.invariant), kL, prompts, p, S);
  auto eager_drafter = load(c.dir, c.numerics, DecodePath::kGraph, c.invariant);
  eager_drafter->set_mtp_fixed_shapes(false);
  const SpecRun spec_general = run_engine(std::move(eager_drafter), kL, prompts, p, 16);
  EXPECT_EQ(spec.tokens, plain.tokens) << c.name << " batched";
  EXPECT_EQ(spec_general.tokens, plain.tokens) << c.name << " batched, drafter on the general path";
  // Alone: against plain decoding alone (bf16 plain decoding itself need not be batch-invariant:
  // a batch pads to another graph bucket; printed).
  int64_t batch_invariant = 0;
  for (size_t i = 0; i < 2; ++i) {
    const SpecRun alone = run_engine(load(c.dir, c.numerics, DecodePath::kGraph, c.invariant), kL, {prompts[i]}, p, 1);
    const SpecRun plain_alone =
        run_engine(load(c.dir, c.numerics, DecodePath::kGraph, c.invariant), 0, {prompts[i]}, p, 1);
    EXPECT_EQ(alone.tokens[0], plain_alone.tokens[0]) << c.name << " request " << i << " alone";
    batch_invariant += plain_alone.tokens[0] == plain.tokens[i];
    if (c.invariant) { EXPECT_EQ(plain_alone.tokens[0], plain.tokens[i]) << c.name << " request " << i; }
  }
  EXPECT_GT(spec.runner.verify_steps, 0) << c.name;
  EXPECT_GT(spec.runner.device_steps, 0) << c.name;
  if (c.dir == default_model()) { EXPECT_GT(spec.acceptance_length(), 2.0) << c.name; }  // a trained MTP head
  int64_t equal = 0;
  for (size_t i = 0; i < prompts.size(); ++i) equal += spec.tokens[i] == plain.tokens[i];
  std::printf("[spec-gpu] %s greedy identity: %lld/%zu requests equal; acceptance length %.2f (per position %s); "
              "plain %.3f s, spec %.3f s (drafter general %.3f s), %lld graphs; plain alone == plain batched %lld/2\n",
              c.name.c_str(), (long long)equal, prompts.size(), spec.acceptance_length(), spec.per_position().c_str(),
              plain.seconds, spec.seconds, spec_general.seconds, (long long)spec.graphs, (long long)batch_invariant);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuSpec,
    ::testing::Values(
        Case{"tiny_official_exact", deepinfer::testing::golden_dir("tiny_official"), Numerics::kExact},
        Case{"tiny_official_bf16", deepinfer::testing::golden_dir("tiny_official"), Numerics::kBf16, false, 10},
        Case{"tiny_official_bf16_invariant", deepinfer::testing::golden_dir("tiny_official"), Numerics::kBf16, true, 32},
        Case{"default_exact", default_model(), Numerics::kExact},
        Case{"default_bf16", default_model(), Numerics::kBf16, false, 10},
        Case{"default_production", default_model(), Numerics::kProduction, false, 10},
        Case{"default_production_invariant", default_model(), Numerics::kProduction, true, 32}),
    [](const auto& info) { return info.param.name; });

class GpuSpecTiming : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
    if (!std::filesystem::exists(default_model() + "/config.json")) GTEST_SKIP() << "default model absent";
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Step time against verify tokens per sequence (the cost curve varlen plans with), on the engine's
// path: production numerics, graphs, device logits, hidden rows of every token for the drafter.
// Then the drafter's propose() of kL greedy drafts after a 1-token step, graphs vs general path.
TEST_F(GpuSpecTiming, VerifyCostCurveAndDrafterRounds) {
  auto m = load(default_model(), Numerics::kProduction, DecodePath::kGraph);
  const int64_t S = 64, ctx = 40, reps = 20;
  m->allocate_cache_for(S, 1024);
  const kv::CacheGeometry& g = m->cache_geometry();
  std::vector<std::vector<int32_t>> tables;
  model::ForwardBatch pre;
  for (int32_t s = 0; s < S; ++s) {
    tables.push_back(model::slot_block_table(g, s));
    m->reset_slot(s);
    pre.seqs.push_back({.cache_slot = s, .block_table = tables.back(), .num_computed_tokens = 0, .num_new_tokens = ctx});
    for (int64_t j = 0; j < ctx; ++j) pre.token_ids.push_back(int32_t((s * 31 + j * 7) % 8000 + 2));
  }
  m->run(pre, {});
  auto verify_batch = [&](int64_t B, int64_t k) {
    model::ForwardBatch b;
    for (int32_t s = 0; s < B; ++s) {
      b.seqs.push_back({.cache_slot = s, .block_table = tables[size_t(s)], .num_computed_tokens = ctx,
                        .num_new_tokens = int32_t(k)});
      for (int64_t j = 0; j < k; ++j) b.token_ids.push_back(int32_t((s + j * 13) % 8000 + 2));
    }
    for (int64_t t = 0; t < b.num_tokens(); ++t) b.logits_indices.push_back(int32_t(t)), b.hidden_indices.push_back(int32_t(t));
    return b;
  };
  const model::ForwardOptions dev{.logits_on_device = true, .hidden_to_host = false};
  for (int64_t B : {1, 8, 32, 64}) {
    std::string line;
    for (int64_t k = 1; k <= kL + 1; ++k) {
      const model::ForwardBatch b = verify_batch(B, k);
      double ms = 0;
      for (int64_t r = 0; r < reps + 3; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        m->run(b, dev);
        m->synchronize();
        if (r >= 3) ms += ms_since(t0);
        for (int32_t s = 0; s < B; ++s) m->rollback(s, ctx + k, ctx);
      }
      char buf[64];
      std::snprintf(buf, sizeof buf, " k=%lld %.3f", (long long)k, ms / double(reps));
      line += buf;
    }
    std::printf("[spec-gpu] verify cost, batch %lld, ms per step (tokens per sequence k):%s\n", (long long)B,
                line.c_str());
  }
  for (bool graphs : {true, false}) {
    m->set_mtp_fixed_shapes(graphs);
    for (int64_t B : {1, 8, 32, 64}) {
      const model::ForwardBatch b = verify_batch(B, 1);
      double step_ms = 0, draft_ms = 0;
      for (int64_t r = 0; r < reps + 3; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        const model::ForwardOutput o = m->run(b, dev);
        m->synchronize();
        const double t_step = ms_since(t0);
        model::DraftBatch db;
        for (int32_t s = 0; s < B; ++s)
          db.seqs.push_back({.cache_slot = s, .block_table = tables[size_t(s)], .first_position = ctx,
                             .num_positions = 1, .next_tokens = {int32_t(s + 5)}, .num_drafts = kL,
                             .first_hidden_row = s});
        db.target_hidden = o.hidden;
        t0 = std::chrono::steady_clock::now();
        const auto p = m->drafter()->propose(db);
        const double t_draft = ms_since(t0);
        ASSERT_EQ(int64_t(p.size()), B);
        if (r >= 3) step_ms += t_step, draft_ms += t_draft;
        for (int32_t s = 0; s < B; ++s) m->rollback(s, ctx + kL, ctx);
      }
      std::printf("[spec-gpu] drafter (%s), batch %lld: 1-token target step %.3f ms, propose %d greedy drafts %.3f ms "
                  "(%.3f ms per round)\n",
                  graphs ? "graphs" : "general path", (long long)B, step_ms / double(reps), kL,
                  draft_ms / double(reps), draft_ms / double(reps) / kL);
    }
  }
}

// Decode tokens/s through the Engine, drafting off vs on (kL greedy MTP drafts), held-out prompts,
// 64 new tokens each, the engine's own model options (production numerics, graphs).
TEST_F(GpuSpecTiming, EngineTokensPerSecondSpecOnOff) {
  const SamplingParams p = greedy(64);
  for (int64_t B : {1, 8, 32, 64}) {
    const auto prompts = prompts_for(default_model(), int(B));
    // Each engine runs the requests twice and times the second pass (graphs captured, prompts
    // found in the prefix cache: the pass is mostly decode).
    auto run = [&](int32_t drafts, bool varlen, bool drafter_graphs, bool prefix_cache = true) {
      auto m = load(default_model(), Numerics::kProduction, DecodePath::kGraph);
      m->set_mtp_fixed_shapes(drafter_graphs);
      return run_engine(std::move(m), drafts, prompts, p, B, varlen, /*warm=*/true, prefix_cache);
    };
    const SpecRun off = run(0, false, true);
    const SpecRun off_async = run(0, false, true, /*prefix_cache=*/false);  // asynchronous scheduling
    // (Asynchronous steps may compose batches differently, so bf16 tokens may differ: printed.)
    const SpecRun on = run(kL, false, true);
    const SpecRun on_general = run(kL, false, false);
    int64_t same = 0;
    for (size_t i = 0; i < prompts.size(); ++i) same += on.tokens[i] == off.tokens[i];
    if (B * (kL + 1) <= 64) {  // see Case::invariant
      EXPECT_EQ(on.tokens, off.tokens) << "batch " << B;
    }
    const double t_off = double(off.output_tokens) / off.seconds, t_on = double(on.output_tokens) / on.seconds;
    if (B >= 32) {  // varlen: per-sequence draft lengths under the measured cost curve
      const SpecRun var = run(kL, true, true);
      std::printf("[spec-gpu] engine batch %lld varlen: %.1f tok/s (%.2fx plain), acceptance length %.2f, %lld drafts "
                  "verified in %lld verify steps\n",
                  (long long)B, double(var.output_tokens) / var.seconds,
                  double(var.output_tokens) / var.seconds / t_off, var.acceptance_length(),
                  (long long)var.stats.num_draft_tokens, (long long)var.stats.num_verify_steps);
    }
    std::printf("[spec-gpu] engine batch %lld: spec output == plain for %lld/%zu requests\n", (long long)B,
                (long long)same, prompts.size());
    std::printf("[spec-gpu] engine batch %lld: plain %.1f tok/s (async scheduling, no prefix cache: %.1f, tokens %s), spec L=%d "
                "%.1f tok/s (%.2fx; drafter on the general path %.1f tok/s), acceptance length %.2f, per position %s; "
                "spec draft %.3f s / verify %.3f s over both passes, timed pass %.3f s\n",
                (long long)B, t_off, double(off_async.output_tokens) / off_async.seconds,
                off_async.tokens == off.tokens ? "equal" : "differ", kL, t_on, t_on / t_off,
                double(on_general.output_tokens) / on_general.seconds,
                on.acceptance_length(), on.per_position().c_str(), on.runner.draft_time_s, on.runner.verify_time_s,
                on.seconds);
  }
}

// Tokens/s and acceptance against the draft length L (1..kL) at batch 1, 8 and 32, drafter on
// graphs, same prompts and passes as above (L = 0: plain decoding).
TEST_F(GpuSpecTiming, DraftLengthSweep) {
  const SamplingParams p = greedy(64);
  for (int64_t B : {1, 8, 32}) {
    const auto prompts = prompts_for(default_model(), int(B));
    std::string line;
    double base = 0;
    for (int32_t L = 0; L <= kL; ++L) {
      const SpecRun r =
          run_engine(load(default_model(), Numerics::kProduction, DecodePath::kGraph), L, prompts, p, B, false, true);
      const double tps = double(r.output_tokens) / r.seconds;
      if (L == 0) base = tps;
      char buf[160];
      std::snprintf(buf, sizeof buf, " | L=%d %.0f tok/s %.2fx acc %.2f", L, tps, tps / base,
                    L ? r.acceptance_length() : 1.0);
      line += buf;
    }
    std::printf("[spec-gpu] draft length sweep, batch %lld%s\n", (long long)B, line.c_str());
  }
}

SamplingParams sampled(int n, uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.max_tokens = n;
  p.ignore_eos = true;
  p.seed = seed;
  return p;
}

// Sampled drafts picked and rejection-sampled on the device (only ids and decisions come back)
// against the host path (logits copied, the same rules on the host): same tokens for every seeded
// request (the fp64 sums differ in order only, sampling.h), twice the same on the device, and
// every verify step sampled on the device.
TEST_F(GpuSpecTiming, SampledDraftsOnTheDeviceEqualTheHostPath) {
  const auto prompts = prompts_for(default_model(), 12);
  const SamplingParams p = sampled(48, 4242);
  auto run = [&](bool device) {
    return run_engine(load(default_model(), Numerics::kProduction, DecodePath::kGraph), kL, prompts, p, 12, false, false,
                      true, {.device_drafts = device});
  };
  const SpecRun dev = run(true), dev2 = run(true), host = run(false);
  int64_t same = 0;
  for (size_t i = 0; i < prompts.size(); ++i) same += dev.tokens[i] == host.tokens[i];
  EXPECT_EQ(dev.tokens, dev2.tokens) << "device drafting is deterministic";
  EXPECT_EQ(dev.tokens, host.tokens) << same << "/" << prompts.size() << " requests equal";
  EXPECT_EQ(dev.runner.host_steps, 0) << "every step, verify steps included, sampled on the device";
  EXPECT_GT(host.runner.host_steps, 0);
  EXPECT_GT(dev.runner.verify_steps, 0);
  EXPECT_GT(dev.acceptance_length(), 1.5);
  std::printf("[spec-gpu] sampled drafts device vs host: %lld/%zu requests equal; acceptance %.2f / %.2f; "
              "draft %.3f s / %.3f s, verify %.3f s / %.3f s; device sampler d2h %.1f KB\n",
              (long long)same, prompts.size(), dev.acceptance_length(), host.acceptance_length(), dev.runner.draft_time_s,
              host.runner.draft_time_s, dev.runner.verify_time_s, host.runner.verify_time_s, dev.sampler_d2h / 1e3);
}

// Decode tokens/s with sampled drafts (temperature 1, top-p 0.95, seeded): plain, drafts picked
// on the host (before), on the device, and on the device with adaptive drafting; greedy drafts for
// comparison. Same passes as EngineTokensPerSecondSpecOnOff.
TEST_F(GpuSpecTiming, SampledDraftsTokensPerSecond) {
  for (int64_t B : {1, 8, 64}) {
    const auto prompts = prompts_for(default_model(), int(B));
    auto run = [&](int32_t drafts, const SamplingParams& sp, SpecOpts so) {
      return run_engine(load(default_model(), Numerics::kProduction, DecodePath::kGraph), drafts, prompts, sp, B, false,
                        true, true, so);
    };
    const SamplingParams s = sampled(64, 77), g = greedy(64);
    const SpecRun plain = run(0, s, {}), host = run(kL, s, {.device_drafts = false}), dev = run(kL, s, {});
    const SpecRun adapt = run(kL, s, {.adaptive = true}), gplain = run(0, g, {}), gdraft = run(kL, g, {});
    auto tps = [](const SpecRun& r) { return double(r.output_tokens) / r.seconds; };
    std::printf("[spec-gpu] sampled B=%lld: plain %.0f tok/s | drafts host %.0f (%.2fx, acc %.2f, draft %.3f s) | "
                "device %.0f (%.2fx, acc %.2f, draft %.3f s) | device+adaptive %.0f (%.2fx, %lld stopped, threshold "
                "%.2f) || greedy plain %.0f, greedy drafts %.0f (%.2fx, acc %.2f)\n",
                (long long)B, tps(plain), tps(host), tps(host) / tps(plain), host.acceptance_length(),
                host.runner.draft_time_s, tps(dev), tps(dev) / tps(plain), dev.acceptance_length(),
                dev.runner.draft_time_s, tps(adapt), tps(adapt) / tps(plain), (long long)adapt.gate.requests_stopped,
                adapt.gate.last_threshold, tps(gplain), tps(gdraft), tps(gdraft) / tps(gplain),
                gdraft.acceptance_length());
  }
}

// Adaptive drafting's batch-mean rule against drafting always and plain decoding (issue #11):
// 256 new tokens per request (long enough for stops and re-probes), the default model on held-out
// prompts (acceptance is real) and, when DEEPINFER_SPEC_RANDOM_MODEL names one, a random-weight
// model (make-default-model: acceptance ~0). Printed: tok/s, acceptance length, per-request
// acceptance (min / median / max), the share of verifying (request, step) pairs, plain steps.
TEST_F(GpuSpecTiming, AdaptiveRuleAgainstAlwaysAndPlain) {
  std::vector<std::pair<std::string, std::string>> models{{"trained", default_model()}};
  if (const char* r = std::getenv("DEEPINFER_SPEC_RANDOM_MODEL"); r && *r) models.push_back({"random", r});
  for (const auto& [label, dir] : models) {
    std::vector<std::vector<int32_t>> all;
    if (dir == default_model()) {
      all = prompts_for(dir, 64);
    } else {
      for (int i = 0; i < 64; ++i) {
        std::vector<int32_t> p{0};
        for (int j = 0; j < 9 + (i * 37) % 120; ++j) p.push_back(2 + (i * 7919 + j * 104729) % 8000);
        all.push_back(p);
      }
    }
    for (int64_t B : {8, 64}) {
      if (label == "random" && B == 8) continue;  // the device call's time
      const std::vector<std::vector<int32_t>> prompts(all.begin(), all.begin() + B);
      for (bool sampled_run : {true, false}) {
        const SamplingParams sp = sampled_run ? sampled(256, 91) : greedy(256);
        auto run = [&](int32_t drafts, bool adaptive) {
          return run_engine(load(dir, Numerics::kProduction, DecodePath::kGraph), drafts, prompts, sp, B, false, true,
                            true, {.adaptive = adaptive});
        };
        const SpecRun plain = run(0, false), always = run(kL, false), adapt = run(kL, true);
        auto tps = [](const SpecRun& r) { return double(r.output_tokens) / r.seconds; };
        std::vector<double> acc;
        int64_t verifies = 0, tokens = 0;
        for (const RequestMetrics& m : adapt.metrics) {
          acc.push_back(1.0 + double(m.num_accepted_draft_tokens) / double(std::max<int64_t>(1, m.num_verify_steps)));
          verifies += m.num_verify_steps, tokens += m.num_generation_tokens;
        }
        std::sort(acc.begin(), acc.end());
        if (!sampled_run && B * (kL + 1) <= 64) { EXPECT_EQ(adapt.tokens, plain.tokens) << label << " B=" << B; }
        std::printf("[spec-gpu] adaptive %s B=%lld %s: plain %.0f tok/s | always %.0f (%.2fx, acc %.2f) | adaptive %.0f "
                    "(%.2fx, %.2fx always; acc %.2f, per request %.2f / %.2f / %.2f; %lld verify steps for %lld tokens; "
                    "steps: %lld drafter, %lld plain; %lld stops, %lld re-probes, %lld probes, threshold %.2f)\n",
                    label.c_str(), (long long)B, sampled_run ? "T=1" : "greedy", tps(plain), tps(always),
                    tps(always) / tps(plain), always.acceptance_length(), tps(adapt), tps(adapt) / tps(plain),
                    tps(adapt) / tps(always), adapt.acceptance_length(), acc.empty() ? 0 : acc.front(),
                    acc.empty() ? 0 : acc[acc.size() / 2], acc.empty() ? 0 : acc.back(), (long long)verifies,
                    (long long)tokens, (long long)adapt.stats.num_drafter_steps, (long long)adapt.stats.num_plain_steps,
                    (long long)adapt.gate.stops, (long long)adapt.gate.reprobes, (long long)adapt.gate.probes,
                    adapt.gate.last_threshold);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::engine
#endif  // DEEPINFER_TEST_HAVE_ENGINE
