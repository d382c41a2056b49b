// Device sampler vs the CPU sampler (engine::sample_rows, compiled into this binary): same
// logits, params, histories, masks and Philox keys -> the same tokens, ranks and top-N ids;
// logprobs within a float ulp. Batches mix every parameter class row by row; outputs and the
// workspace are poisoned before each run; rows split over 1-8 blocks (a cluster per row) agree
// with the CPU and are batch-invariant bit for bit. Argument checks run without a GPU.
#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>

#include "engine/philox.h"
#include "engine/sampler.h"
#include "ops/cuda/sampling.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

constexpr int kMaxTop = 20;
constexpr double kTolLogprob = 1e-6;  // max-normalised; lse in fp64, one float rounding
constexpr double kTieMargin = 1e-12;  // |u - CDF boundary| below this counts as a tie (sampling.h)

// Parameter classes, cycled over the rows of a batch.
enum Class {
  kGreedy, kGreedyProcessed, kTemperature, kTopK1, kTopK, kTopP, kMinP, kTopKTopPMinP, kPenalties,
  kBiasMaskBanned, kEverything, kTies, kNothingAllowed, kNumClasses
};
const char* class_name(int c) {
  static const char* n[] = {"greedy", "greedy+processing", "temperature", "top_k=1", "top_k", "top_p", "min_p",
                            "top_k+top_p+min_p", "penalties", "bias+mask+banned", "everything", "ties",
                            "nothing allowed"};
  return n[c];
}

struct RowData {
  std::vector<float> logits;
  SamplingParams params;
  std::vector<int32_t> prompt, output;
  std::vector<uint32_t> mask;
  bool has_mask = false;
  uint64_t seed = 0;
  uint32_t sample_index = 0;
  int64_t position = 0;
  int32_t eos = -1;
};

RowData make_row(int cls, int64_t V, uint64_t seed) {
  std::mt19937_64 g(seed);
  auto id = [&] { return int32_t(g() % uint64_t(V)); };
  RowData r;
  const float scale = (seed % 3 == 0) ? 6.0f : 2.0f;  // peaked and flat rows
  r.logits = randn(size_t(V), seed, scale);
  if (cls == kTies)  // few distinct values: many exact ties among kept tokens
    for (float& x : r.logits) x = std::round(x);
  r.seed = g();
  r.sample_index = uint32_t(g() % 4);
  r.position = int64_t(g() % 100000);
  r.eos = id();
  for (int i = 0; i < 12; ++i) r.prompt.push_back(id());
  for (int i = 0; i < 9; ++i) r.output.push_back(i % 3 == 0 && !r.output.empty() ? r.output.back() : id());
  SamplingParams& p = r.params;
  p.temperature = 0.8f;
  p.logprobs = int(seed % 3 == 0 ? 0 : (seed % 3 == 1 ? 3 : kMaxTop));
  switch (cls) {
    case kGreedy: p.temperature = 0; break;
    case kGreedyProcessed:
      p.temperature = 0;
      p.repetition_penalty = 1.5f;
      p.logit_bias = {{id(), 3.0f}, {id(), -2.5f}};
      break;
    case kTemperature: p.temperature = 1.3f; break;
    case kTopK1: p.top_k = 1; break;
    case kTopK: p.top_k = 1 + int(g() % 60); break;
    case kTopP: p.top_p = 0.9f; break;
    case kMinP: p.min_p = 0.05f; break;
    case kTopKTopPMinP:
      p.top_k = 40;
      p.top_p = 0.75f;
      p.min_p = 0.01f;
      break;
    case kPenalties:
      p.repetition_penalty = 1.3f;
      p.presence_penalty = 0.7f;
      p.frequency_penalty = 0.45f;
      p.top_p = 0.95f;
      break;
    case kBiasMaskBanned:
    case kEverything: {
      const int32_t dup = id();
      p.logit_bias = {{dup, 1.75f}, {id(), -4.0f}, {dup, 0.3f}};  // repeated id: adds in order
      p.min_tokens = 100;
      p.stop_token_ids = {id(), id()};
      r.has_mask = true;
      if (cls == kEverything) {
        p.top_k = 25;
        p.top_p = 0.8f;
        p.min_p = 0.02f;
        p.temperature = 0.6f;
        p.repetition_penalty = 0.9f;  // < 1: rewards repeats
        p.presence_penalty = -0.5f;
        p.frequency_penalty = 0.2f;
      }
      break;
    }
    case kTies: p.top_k = 30; p.top_p = 0.9f; break;
    case kNothingAllowed: r.has_mask = true; break;
  }
  if (r.has_mask) {
    r.mask.assign(size_t((V + 31) / 32), 0u);
    if (cls != kNothingAllowed)
      for (auto& w : r.mask) w = uint32_t(g()) | uint32_t(g());  // ~75% allowed
  }
  return r;
}

engine::SamplingRow cpu_row(const RowData& r) {
  return {.logits = r.logits.data(), .params = &r.params, .seed = r.seed, .sample_index = r.sample_index,
          .position = r.position, .prompt_ids = &r.prompt, .output_ids = &r.output,
          .allowed_mask = r.has_mask ? &r.mask : nullptr, .eos_token_id = r.eos};
}

// The GPU-side flattening of a batch: row params and the shared entry lists.
struct HostBatch {
  std::vector<oc::SamplingRowParams> rows;
  std::vector<int32_t> bias_ids, banned, pen_ids, pen_counts;
  std::vector<float> bias_vals, logits;
  std::vector<uint32_t> mask;
};

HostBatch flatten(const std::vector<RowData>& data, int64_t V, int64_t stride) {
  HostBatch h;
  const int64_t words = (V + 31) / 32;
  h.logits.assign(size_t(data.size() * stride), 1e30f);  // padding never read
  h.mask.assign(size_t(data.size() * words), 0u);
  for (size_t i = 0; i < data.size(); ++i) {
    const RowData& d = data[i];
    const SamplingParams& p = d.params;
    std::copy(d.logits.begin(), d.logits.end(), h.logits.begin() + int64_t(i) * stride);
    if (d.has_mask) std::copy(d.mask.begin(), d.mask.end(), h.mask.begin() + int64_t(i) * words);
    oc::SamplingRowParams r{.temperature = p.temperature, .top_p = p.top_p, .min_p = p.min_p, .top_k = p.top_k,
                            .repetition_penalty = p.repetition_penalty, .presence_penalty = p.presence_penalty,
                            .frequency_penalty = p.frequency_penalty, .top_logprobs = p.logprobs.value_or(0),
                            .seed = d.seed, .sample_index = d.sample_index, .position = d.position,
                            .eos_token_id = d.eos, .has_mask = d.has_mask};
    r.bias_begin = int32_t(h.bias_ids.size());
    for (auto [t, b] : p.logit_bias) {
      h.bias_ids.push_back(t);
      h.bias_vals.push_back(b);
    }
    r.bias_end = int32_t(h.bias_ids.size());
    r.banned_begin = int32_t(h.banned.size());
    if (int64_t(d.output.size()) < p.min_tokens) {
      h.banned.push_back(d.eos);
      for (int32_t t : p.stop_token_ids) h.banned.push_back(t);
    }
    r.banned_end = int32_t(h.banned.size());
    r.penalty_begin = int32_t(h.pen_ids.size());
    oc::make_penalty_entries(d.prompt, d.output, V, h.pen_ids, h.pen_counts);
    r.penalty_end = int32_t(h.pen_ids.size());
    h.rows.push_back(r);
  }
  return h;
}

// Device copies of a HostBatch plus poisoned outputs; fills `p`.
struct DevBatch {
  DevArray<float> logits, bias_vals, lps, top_lps;
  DevArray<int32_t> bias_ids, banned, pen_ids, pen_counts, tokens, ranks, top_ids;
  DevArray<uint32_t> mask;
  DevArray<oc::SamplingRowParams> rows;
  DevArray<double> ws;
  oc::SampleParams p;

  DevBatch(const HostBatch& h, int64_t B, int64_t V, int64_t stride)
      : logits(h.logits), bias_vals(h.bias_vals), lps(B), top_lps(B * kMaxTop), bias_ids(h.bias_ids),
        banned(h.banned), pen_ids(h.pen_ids), pen_counts(h.pen_counts), tokens(B), ranks(B), top_ids(B * kMaxTop),
        mask(h.mask), rows(h.rows), ws(size_t(B * V)) {
    p = {.logits = logits.get(), .logits_stride = stride, .batch = B, .vocab = V, .rows = rows.get(),
         .bias_ids = bias_ids.get(), .bias_values = bias_vals.get(), .num_bias = int64_t(h.bias_ids.size()),
         .banned_ids = banned.get(), .num_banned = int64_t(h.banned.size()), .penalty_ids = pen_ids.get(),
         .penalty_counts = pen_counts.get(), .num_penalty = int64_t(h.pen_ids.size()), .allowed_mask = mask.get(),
         .mask_stride = (V + 31) / 32, .tokens = tokens.get(), .logprobs = lps.get(), .ranks = ranks.get(),
         .top_ids = top_ids.get(), .top_logprobs = top_lps.get(), .max_top_logprobs = kMaxTop,
         .workspace = ws.get(), .workspace_bytes = ws.n * sizeof(double)};
  }
  void poison() {
    for (auto* a : {&lps, &top_lps}) a->poison();
    for (auto* a : {&tokens, &ranks, &top_ids}) a->poison();
    ws.poison();
  }
};

// A token mismatch is a tie when both tokens are kept by the CPU and u lies within kTieMargin
// of the CPU's CDF boundary between them (the only place fp64 summation order can decide).
bool is_tie(const engine::SamplingRow& row, int64_t V, int32_t a, int32_t b) {
  if (row.params->greedy()) return false;
  const std::vector<double> prob = engine::processed_probs(row, V);
  if (a < 0 || b < 0 || a >= V || b >= V || prob[size_t(a)] <= 0 || prob[size_t(b)] <= 0) return false;
  const double u = engine::philox_uniform(row.seed, row.sample_index, row.position);
  double acc = 0;
  for (int64_t t = 0; t <= std::min(a, b); ++t) acc += prob[size_t(t)];
  return std::fabs(u - acc) < kTieMargin;
}

// blocks: the split per row (0 = sampling_blocks_per_row(V), the production choice).
void run_case(int64_t V, int64_t B, int64_t stride, int only_class, uint64_t seed, int blocks = 0) {
  std::vector<RowData> data;
  for (int64_t i = 0; i < B; ++i)
    data.push_back(make_row(only_class >= 0 ? only_class : int((i + seed) % kNumClasses), V, seed * 1000 + i));
  std::vector<engine::SamplingRow> rows;
  for (const RowData& d : data) rows.push_back(cpu_row(d));
  const std::vector<engine::SampleResult> ref = engine::sample_rows(rows, V);

  const HostBatch h = flatten(data, V, stride);
  DevBatch dev(h, B, V, stride);
  oc::check_sampling_rows(h.rows, dev.p);
  dev.poison();
  oc::sample(dev.p, nullptr, blocks);
  const auto tokens = dev.tokens.download(), ranks = dev.ranks.download(), top_ids = dev.top_ids.download();
  const auto lps = dev.lps.download(), top_lps = dev.top_lps.download();

  int mismatches = 0, ties = 0;
  std::vector<float> got_lp, ref_lp;
  for (int64_t i = 0; i < B; ++i) {
    const engine::SampleResult& r = ref[size_t(i)];
    const std::string what = std::string(class_name(only_class >= 0 ? only_class : int((i + seed) % kNumClasses))) +
                             " row " + std::to_string(i);
    if (tokens[size_t(i)] != r.token) {
      if (is_tie(rows[size_t(i)], V, tokens[size_t(i)], r.token)) {
        ++ties;
        continue;
      }
      ++mismatches;
      ADD_FAILURE() << what << ": gpu token " << tokens[size_t(i)] << " cpu " << r.token;
      continue;
    }
    EXPECT_EQ(ranks[size_t(i)], r.logprobs.rank) << what;
    got_lp.push_back(lps[size_t(i)]);
    ref_lp.push_back(r.logprobs.logprob);
    const size_t n = r.logprobs.top.size();
    for (size_t j = 0; j < size_t(kMaxTop); ++j) {
      const size_t k = size_t(i) * kMaxTop + j;
      if (j < n) {
        EXPECT_EQ(top_ids[k], r.logprobs.top[j].first) << what << " top " << j;
        got_lp.push_back(top_lps[k]);
        ref_lp.push_back(r.logprobs.top[j].second);
      } else {
        EXPECT_EQ(top_ids[k], -1) << what << " unused top slot " << j;
        EXPECT_EQ(top_lps[k], -INFINITY) << what << " unused top slot " << j;
      }
    }
  }
  const std::string cs = "V=" + std::to_string(V) + " B=" + std::to_string(B) +
                         (stride != V ? " strided" : "") +
                         (only_class >= 0 ? std::string(" ") + class_name(only_class) : " mixed") +
                         (blocks ? " blocks=" + std::to_string(blocks) : "");
  report("sampling_tokens", cs, double(mismatches) / double(B), 0.0);
  if (ties) std::printf("sampling: %s: %d near-tie draws (|u - boundary| < %g)\n", cs.c_str(), ties, kTieMargin);
  report("sampling_logprobs", cs, max_rel_err(got_lp, ref_lp), kTolLogprob);
}

TEST(CudaSampling, MatchesCpuSampler) {
  DI_REQUIRE_GPU();
  uint64_t seed = 7000;
  for (int64_t V : {int64_t(7), int64_t(1000), int64_t(129280)}) {
    for (int c = 0; c < kNumClasses; ++c) run_case(V, 1, V, c, ++seed);  // each class alone
    for (int64_t B : {int64_t(7), int64_t(64)}) run_case(V, B, V, -1, ++seed);  // mixed batches
    run_case(V, 7, V + 37, -1, ++seed);  // padded row stride
  }
}

// Many draws of one flat row at consecutive positions: the token distribution path, not
// just a few draws, must agree (each position is a fresh Philox counter).
TEST(CudaSampling, ManyPositionsAgree) {
  DI_REQUIRE_GPU();
  const int64_t V = 1000, B = 64;
  std::vector<RowData> data;
  for (int64_t i = 0; i < B; ++i) {
    RowData r = make_row(kTopKTopPMinP, V, 42);
    r.position = 1000 + i;
    r.params.top_k = 0;  // top-p + min-p over the whole vocab
    data.push_back(std::move(r));
  }
  std::vector<engine::SamplingRow> rows;
  for (const RowData& d : data) rows.push_back(cpu_row(d));
  const auto ref = engine::sample_rows(rows, V);
  const HostBatch h = flatten(data, V, V);
  DevBatch dev(h, B, V, V);
  dev.poison();
  oc::sample(dev.p, nullptr);
  const auto tokens = dev.tokens.download();
  int mismatches = 0;
  for (int64_t i = 0; i < B; ++i) mismatches += tokens[size_t(i)] != ref[size_t(i)].token;
  report("sampling_tokens", "V=1000 B=64 positions", double(mismatches) / double(B), 0.0);
}

TEST(CudaSampling, DeterministicAcrossRuns) {
  DI_REQUIRE_GPU();
  const int64_t V = 129280, B = 7;
  std::vector<RowData> data;
  for (int64_t i = 0; i < B; ++i) data.push_back(make_row(kEverything, V, 99 + i));
  const HostBatch h = flatten(data, V, V);
  DevBatch dev(h, B, V, V);
  dev.poison();
  oc::sample(dev.p, nullptr);
  const auto t1 = dev.tokens.download();
  const auto l1 = dev.top_lps.download();
  dev.poison();
  oc::sample(dev.p, nullptr);
  EXPECT_EQ(dev.tokens.download(), t1);
  const auto l2 = dev.top_lps.download();
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)));
}

// Odd vocabularies (1, 7, 4097: one id past a block's share, 200,003) at the production split and
// forced ones (1 block; 8 blocks, most of them idle at V = 7), every class in mixed batches of 13.
TEST(CudaSampling, OddVocabsAndSplitsMatchCpu) {
  DI_REQUIRE_GPU();
  uint64_t seed = 9100;
  for (int64_t V : {int64_t(1), int64_t(7), int64_t(1000), int64_t(4097), int64_t(200003)})
    for (int blocks : {0, 1, 3, 8}) run_case(V, kNumClasses, V, -1, ++seed, blocks);
  for (int blocks : {1, 8}) run_case(129280, kNumClasses, 129280 + 5, -1, ++seed, blocks);  // strided
}

// A small case for compute-sanitizer (memcheck, racecheck): every class over 8 blocks at
// V = 4097 and over 3 blocks at V = 7 (idle blocks), with logprobs and top-N.
TEST(CudaSampling, SmallVocabsOverManyBlocks) {
  DI_REQUIRE_GPU();
  run_case(4097, kNumClasses, 4097, -1, 9500, 8);
  run_case(7, kNumClasses, 7, -1, 9501, 3);
}

struct DevOut {
  std::vector<int32_t> tokens, ranks, top_ids;
  std::vector<float> lps, top_lps;
};
DevOut run_dev(const std::vector<RowData>& data, int64_t V, int blocks) {
  const int64_t B = int64_t(data.size());
  const HostBatch h = flatten(data, V, V);
  DevBatch dev(h, B, V, V);
  oc::check_sampling_rows(h.rows, dev.p);
  dev.poison();
  oc::sample(dev.p, nullptr, blocks);
  return {dev.tokens.download(), dev.ranks.download(), dev.top_ids.download(), dev.lps.download(),
          dev.top_lps.download()};
}
template <typename T>
bool same_bits(const std::vector<T>& batch, size_t row, size_t width, const std::vector<T>& alone) {
  return std::memcmp(batch.data() + row * width, alone.data(), width * sizeof(T)) == 0;
}

// Batch invariance: each row of a batch of 9 gives the same token, logprob, rank and top-N, bit
// for bit, as the row sampled alone (the split depends on the vocabulary only), at the one-block
// split (V = 1000), forced 8 blocks, and the production 8 blocks at V = 129,280 and 200,003.
TEST(CudaSampling, BatchInvariantRowAloneEqualsBatchOf9) {
  DI_REQUIRE_GPU();
  const std::pair<int64_t, int> cases[] = {{1000, 0}, {1000, 8}, {129280, 0}, {200003, 0}};
  for (auto [V, blocks] : cases) {
    for (int shift : {0, 9}) {  // two batches of 9 cover all 13 classes
      std::vector<RowData> data;
      for (int i = 0; i < 9; ++i) data.push_back(make_row((i + shift) % kNumClasses, V, 777 + 31 * i + shift));
      const DevOut all = run_dev(data, V, blocks);
      int bad = 0;
      for (size_t i = 0; i < data.size(); ++i) {
        const DevOut one = run_dev({data[i]}, V, blocks);
        const bool same = same_bits(all.tokens, i, 1, one.tokens) && same_bits(all.ranks, i, 1, one.ranks) &&
                          same_bits(all.lps, i, 1, one.lps) && same_bits(all.top_ids, i, kMaxTop, one.top_ids) &&
                          same_bits(all.top_lps, i, kMaxTop, one.top_lps);
        bad += !same;
        EXPECT_TRUE(same) << "V=" << V << " blocks=" << blocks << " row " << i << " ("
                          << class_name(int((i + size_t(shift)) % kNumClasses)) << "): batch token "
                          << all.tokens[i] << ", alone " << one.tokens[0];
      }
      const std::string cs = "V=" + std::to_string(V) + " blocks=" + std::to_string(blocks ? blocks : oc::sampling_blocks_per_row(V)) +
                             " classes from " + std::to_string(shift);
      report("sampling_batch_invariant", cs, double(bad), 0.0);
    }
  }
}

TEST(CudaTiming, Sampler) {
  DI_REQUIRE_GPU();
  Stream st;
  const int64_t V = 129280;
  for (int64_t B : {int64_t(1), int64_t(64)}) {
    for (int cls : {int(kGreedy), int(kTopKTopPMinP), int(kTopP)}) {
      std::vector<RowData> data;
      for (int64_t i = 0; i < B; ++i) {
        data.push_back(make_row(cls, V, 5 + i));
        data.back().params.logprobs.reset();
      }
      HostBatch h = flatten(data, V, V);
      for (auto& r : h.rows) r.top_logprobs = 0;
      DevBatch dev(h, B, V, V);
      oc::SampleParams p = dev.p;
      p.logprobs = nullptr;
      p.ranks = nullptr;
      p.top_ids = nullptr;
      p.top_logprobs = nullptr;
      p.max_top_logprobs = 0;
      for (int i = 0; i < 3; ++i) oc::sample(p, st.get());
      std::vector<double> t;
      Event a(true), b(true);
      for (int i = 0; i < 20; ++i) {
        a.record(st.get());
        oc::sample(p, st.get());
        b.record(st.get());
        b.synchronize();
        t.push_back(1e3 * b.elapsed_ms_since(a));
      }
      std::sort(t.begin(), t.end());
      report_time("sampler", std::string(class_name(cls)) + " B=" + std::to_string(B) + " V=129280", t[t.size() / 2],
                  std::to_string(oc::sampling_blocks_per_row(V)) + " blocks per row");
    }
  }
}

// The split's gain: one block per row (the previous design's parallelism) vs the production
// split, per launch in a graph of 20, V = 129,280, batch 1 / 8 / 32 / 64; greedy (with and
// without 5 logprobs), top-k+top-p+min-p, top-p alone, penalties + top-p.
TEST(CudaTiming, SamplerSplit) {
  DI_REQUIRE_GPU();
  Stream st;
  const int64_t V = 129280;
  for (int64_t B : {int64_t(1), int64_t(8), int64_t(32), int64_t(64)}) {
    for (int cls : {int(kGreedy), -1, int(kTopKTopPMinP), int(kTopP), int(kPenalties)}) {
      std::vector<RowData> data;
      for (int64_t i = 0; i < B; ++i) {
        data.push_back(make_row(cls < 0 ? int(kGreedy) : cls, V, 5 + i));
        data.back().params.logprobs.reset();
        if (cls < 0) data.back().params.logprobs = 5;
      }
      HostBatch h = flatten(data, V, V);
      DevBatch dev(h, B, V, V);
      oc::SampleParams p = dev.p;
      if (cls >= 0) {
        p.logprobs = nullptr;
        p.ranks = nullptr;
        p.top_ids = nullptr;
        p.top_logprobs = nullptr;
        p.max_top_logprobs = 0;
      }
      const std::string name = cls < 0 ? std::string("greedy+logprobs5") : std::string(class_name(cls));
      double one = 0;
      for (int blocks : {1, 0}) {
        const double us = graph_launch_us([&](cudaStream_t s) { oc::sample(p, s, blocks); }, st.get());
        if (blocks == 1) one = us;
        const int nb = blocks ? blocks : oc::sampling_blocks_per_row(V);
        report_time("sampler_graph", name + " B=" + std::to_string(B) + " blocks=" + std::to_string(nb), us,
                    blocks ? "one block per row" : std::to_string(one / us).substr(0, 5) + "x vs 1 block");
      }
    }
  }
}

// ---- argument checks: run everywhere (no CUDA call happens before them) ----

oc::SampleParams valid_params(float* f, int32_t* i, oc::SamplingRowParams* rows, double* ws) {
  return {.logits = f, .logits_stride = 10, .batch = 1, .vocab = 10, .rows = rows, .tokens = i,
          .workspace = ws, .workspace_bytes = oc::sampling_workspace_bytes(1, 10)};
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no InvalidArgument>";
}

TEST(CudaSampling, RejectsBadArguments) {
  float f[10] = {};
  int32_t i[10] = {};
  double ws[10] = {};
  oc::SamplingRowParams row;
  auto with = [&](const std::function<void(oc::SampleParams&)>& edit) {
    oc::SampleParams p = valid_params(f, i, &row, ws);
    edit(p);
    return error_of([&] { oc::sample(p, nullptr); });
  };
  EXPECT_NE(with([](auto& p) { p.logits = nullptr; }).find("null logits"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.vocab = 0; }).find("vocab 0"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.logits_stride = 9; }).find("logits_stride 9"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.batch = -1; }).find("batch -1"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.workspace_bytes = 8; }).find("workspace of 8 bytes"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.num_bias = 2; }).find("num_bias 2"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.num_banned = 1; }).find("num_banned 1"), std::string::npos);
  EXPECT_NE(with([](auto& p) { p.num_penalty = 3; }).find("num_penalty 3"), std::string::npos);
  EXPECT_NE(with([&](auto& p) { p.allowed_mask = reinterpret_cast<const uint32_t*>(i); p.mask_stride = 0; })
                .find("mask_stride 0"),
            std::string::npos);
  EXPECT_NE(with([](auto& p) { p.max_top_logprobs = oc::kSamplingMaxTopLogprobs + 1; }).find("max_top_logprobs"),
            std::string::npos);
  EXPECT_NE(with([](auto& p) { p.max_top_logprobs = 5; }).find("null top_ids"), std::string::npos);
  oc::SampleParams p = valid_params(f, i, &row, ws);
  EXPECT_NE(error_of([&] { oc::sample(p, nullptr, 9); }).find("blocks_per_row 9"), std::string::npos);
  EXPECT_NE(error_of([&] { oc::sample(p, nullptr, -1); }).find("blocks_per_row -1"), std::string::npos);
}

TEST(CudaSampling, BlocksPerRowDependsOnVocabOnly) {
  EXPECT_EQ(oc::sampling_blocks_per_row(1), 1);
  EXPECT_EQ(oc::sampling_blocks_per_row(4096), 1);
  EXPECT_EQ(oc::sampling_blocks_per_row(4097), 2);
  EXPECT_EQ(oc::sampling_blocks_per_row(129280), 8);
  EXPECT_EQ(oc::sampling_blocks_per_row(200003), 8);
}

TEST(CudaSampling, RejectsBadRows) {
  oc::SampleParams p = valid_params(nullptr, nullptr, nullptr, nullptr);
  p.batch = 2;
  p.num_bias = 3;
  p.max_top_logprobs = 5;
  auto bad_row1 = [&](const std::function<void(oc::SamplingRowParams&)>& edit) {
    std::vector<oc::SamplingRowParams> rows(2);
    edit(rows[1]);
    return error_of([&] { oc::check_sampling_rows(rows, p); });
  };
  EXPECT_EQ(bad_row1([](auto&) {}), "<no InvalidArgument>");
  EXPECT_NE(bad_row1([](auto& r) { r.top_p = 0; }).find("row 1: top_p"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.min_p = 1.5f; }).find("row 1: min_p"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.temperature = -1; }).find("row 1: temperature"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.temperature = NAN; }).find("row 1: temperature"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.top_k = -2; }).find("row 1: top_k"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.repetition_penalty = 0; }).find("row 1: repetition_penalty"),
            std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.top_logprobs = 6; }).find("row 1: top_logprobs 6"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.eos_token_id = 10; }).find("row 1: eos_token_id"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.has_mask = 1; }).find("row 1: has_mask"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.bias_end = 4; }).find("row 1: bias range"), std::string::npos);
  EXPECT_NE(bad_row1([](auto& r) { r.penalty_begin = 1; }).find("row 1: penalty range"), std::string::npos);
  std::vector<oc::SamplingRowParams> one(1);
  EXPECT_NE(error_of([&] { oc::check_sampling_rows(one, p); }).find("rows has 1 entries"), std::string::npos);
}

TEST(CudaSampling, PenaltyEntriesAreUniqueWithOutputCounts) {
  std::vector<int32_t> ids, counts;
  const std::vector<int32_t> prompt{5, 3, 5, -1, 99}, output{3, 7, 3, 3, 100};
  oc::make_penalty_entries(prompt, output, 100, ids, counts);
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 5, 7, 99}));
  EXPECT_EQ(counts, (std::vector<int32_t>{3, 0, 1, 0}));
}

}  // namespace
}  // namespace deepinfer::cuda
