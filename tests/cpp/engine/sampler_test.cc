#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "deepinfer/error.h"
#include "engine/philox.h"
#include "engine/sampler.h"

using namespace deepinfer;
using namespace deepinfer::engine;

TEST(Philox, KnownAnswers) {
  // Random123 kat_vectors for philox4x32_10.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (Philox4x32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (Philox4x32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (Philox4x32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, UniformInRangeAndKeyed) {
  double s = 0;
  for (int i = 0; i < 100000; ++i) {
    double u = philox_uniform(7, 0, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    s += u;
  }
  EXPECT_NEAR(s / 100000, 0.5, 0.005);  // 5 sigma
  EXPECT_EQ(philox_uniform(7, 0, 5), philox_uniform(7, 0, 5));
  EXPECT_NE(philox_uniform(7, 0, 5), philox_uniform(8, 0, 5));
  EXPECT_NE(philox_uniform(7, 0, 5), philox_uniform(7, 1, 5));
}

namespace {
std::vector<float> kLogits = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.0f, 1.5f, 0.2f};
constexpr int64_t kV = 8;

SamplingRow row(const SamplingParams& p, int64_t pos = 0, uint64_t seed = 1234) {
  SamplingRow r;
  r.logits = kLogits.data();
  r.params = &p;
  r.seed = seed;
  r.position = pos;
  r.eos_token_id = 1;
  return r;
}

// Pearson chi-square of `draws` draws against `prob`; bins with zero prob must stay empty.
double chi_square(const SamplingParams& p, const std::vector<double>& prob, int draws) {
  std::vector<int> count(kV, 0);
  for (int i = 0; i < draws; ++i) {
    SamplingRow r = row(p, i);
    count[size_t(sample_rows({&r, 1}, kV)[0].token)]++;
  }
  double chi = 0;
  for (int t = 0; t < kV; ++t) {
    if (prob[size_t(t)] == 0) {
      EXPECT_EQ(count[size_t(t)], 0) << "token " << t << " was removed but drawn";
      continue;
    }
    double e = draws * prob[size_t(t)];
    chi += (count[size_t(t)] - e) * (count[size_t(t)] - e) / e;
  }
  return chi;
}

std::vector<double> softmax(const std::vector<float>& l, float temp) {
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp(double(l[i]) / temp);
  for (double& x : p) x /= s;
  return p;
}
}  // namespace

TEST(Sampler, GreedyIsArgmax) {
  SamplingParams p;
  p.temperature = 0;
  SamplingRow r = row(p);
  EXPECT_EQ(sample_rows({&r, 1}, kV)[0].token, 3);
}

TEST(Sampler, SeededDrawsRepeatAndIgnoreNeighbours) {
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<SamplingRow> rows;
  for (int i = 0; i < 16; ++i) rows.push_back(row(p, i));
  auto a = sample_rows(rows, kV);
  for (int i = 0; i < 16; ++i) {
    SamplingRow alone = row(p, i);
    EXPECT_EQ(sample_rows({&alone, 1}, kV)[0].token, a[size_t(i)].token) << "position " << i;
  }
}

TEST(Sampler, ChiSquareFullDistribution) {
  SamplingParams p;
  p.temperature = 0.7f;
  // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
  EXPECT_LT(chi_square(p, softmax(kLogits, 0.7f), 20000), 24.3);
}

TEST(Sampler, ChiSquareTopKTopPMinP) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 5;   // keeps 3, 6, 0, 1, 7
  p.top_p = 0.8f;
  auto full = softmax(kLogits, 1.0f);
  // Within the top-5 set, renormalised, best-first: 3, 6, 0, 1, 7; keep the prefix reaching 0.8.
  std::vector<int> order = {3, 6, 0, 1, 7};
  double mass = 0;
  for (int t : order) mass += full[size_t(t)];
  std::vector<double> expect(kV, 0.0);
  double acc = 0;
  for (int t : order) {
    expect[size_t(t)] = full[size_t(t)];
    acc += full[size_t(t)] / mass;
    if (acc >= 0.8) break;
  }
  double s = 0;
  for (double x : expect) s += x;
  for (double& x : expect) x /= s;
  SamplingRow r = row(p);
  auto got = processed_probs(r, kV);
  for (int t = 0; t < kV; ++t) EXPECT_NEAR(got[size_t(t)], expect[size_t(t)], 1e-6) << t;
  EXPECT_LT(chi_square(p, expect, 20000), 24.3);

  SamplingParams q;
  q.min_p = 0.3f;  // keep tokens with prob >= 0.3 * pmax
  SamplingRow rq = row(q);
  auto pm = processed_probs(rq, kV);
  double pmax = full[3];
  for (int t = 0; t < kV; ++t) EXPECT_EQ(pm[size_t(t)] > 0, full[size_t(t)] >= 0.3 * pmax) << t;
}

TEST(Sampler, PenaltiesBiasAndMinTokens) {
  SamplingParams p;
  p.temperature = 0;
  std::vector<int32_t> prompt = {3}, out = {3, 6};
  SamplingRow r = row(p);
  r.prompt_ids = &prompt;
  r.output_ids = &out;
  p.repetition_penalty = 2.0f;  // 3: 2.0 -> 1.0, 6: 1.5 -> 0.75, so 0 (1.0) ties 3 and wins by id
  auto l = processed_logits(r, kV);
  EXPECT_FLOAT_EQ(l[3], 1.0f);
  EXPECT_FLOAT_EQ(l[6], 0.75f);
  EXPECT_EQ(sample_rows({&r, 1}, kV)[0].token, 0);
  p.repetition_penalty = 1.0f;
  p.frequency_penalty = 1.0f;
  p.presence_penalty = 0.5f;
  l = processed_logits(r, kV);
  EXPECT_FLOAT_EQ(l[3], 2.0f - 1.5f);
  EXPECT_FLOAT_EQ(l[6], 1.5f - 1.5f);
  p.frequency_penalty = p.presence_penalty = 0;
  p.logit_bias = {{5, 10.0f}};
  EXPECT_EQ(sample_rows({&r, 1}, kV)[0].token, 5);
  p.logit_bias = {{1, 10.0f}};  // EOS boosted, but min_tokens masks it
  p.min_tokens = 3;
  EXPECT_EQ(sample_rows({&r, 1}, kV)[0].token, 3);
  p.min_tokens = 2;
  EXPECT_EQ(sample_rows({&r, 1}, kV)[0].token, 1);
}

TEST(Sampler, GrammarMaskAndLogprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 3;
  std::vector<uint32_t> mask = {(1u << 2) | (1u << 5)};
  SamplingRow r = row(p);
  r.allowed_mask = &mask;
  auto res = sample_rows({&r, 1}, kV)[0];
  EXPECT_EQ(res.token, 2);
  // Logprobs are of the raw logits: a direct log-softmax.
  double s = 0;
  for (float x : kLogits) s += std::exp(double(x));
  EXPECT_NEAR(res.logprobs.logprob, kLogits[2] - std::log(s), 1e-5);
  EXPECT_EQ(res.logprobs.rank, 7);
  ASSERT_EQ(res.logprobs.top.size(), 3u);
  EXPECT_EQ(res.logprobs.top[0].first, 3);
  EXPECT_EQ(res.logprobs.top[1].first, 6);
  EXPECT_EQ(res.logprobs.top[2].first, 0);
  EXPECT_NEAR(res.logprobs.top[0].second, kLogits[3] - std::log(s), 1e-5);
}

TEST(SamplingParamsValidate, RejectsBadValuesNamingTheField) {
  auto expect_bad = [](SamplingParams p, const char* field) {
    try {
      p.validate(100);
      FAIL() << "accepted bad " << field;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  SamplingParams p;
  p.temperature = -1; expect_bad(p, "temperature"); p = {};
  p.top_p = 0; expect_bad(p, "top_p"); p = {};
  p.top_k = -2; expect_bad(p, "top_k"); p = {};
  p.n = 0; expect_bad(p, "n"); p = {};
  p.max_tokens = 0; expect_bad(p, "max_tokens"); p = {};
  p.stop_token_ids = {100}; expect_bad(p, "stop_token_ids"); p = {};
  p.logit_bias = {{-1, 1.0f}}; expect_bad(p, "logit_bias"); p = {};
  p.structured_outputs = StructuredOutputsParams{}; expect_bad(p, "structured_outputs"); p = {};
  p.min_tokens = 20; expect_bad(p, "min_tokens"); p = {};
  EXPECT_NO_THROW(p.validate(100));
}

// Large vocabulary with many tied logits: the fast top-k/top-p ordering (selection for short
// prefixes, radix sort for long ones) must keep exactly the set a plain comparison sort keeps
// (best first, ties by lower id), and greedy must pick the lowest id among tied maxima.
TEST(Sampler, LargeVocabTiesMatchPlainSort) {
  const int64_t V = 20000;
  std::vector<float> logits(static_cast<size_t>(V));
  for (int64_t t = 0; t < V; ++t) logits[size_t(t)] = float((t * 7919) % 61) * 0.05f - 1.0f;  // 61 distinct values
  auto reference = [&](const SamplingParams& p) {
    std::vector<double> prob(static_cast<size_t>(V));
    float mx = -INFINITY;
    for (float x : logits) mx = std::max(mx, x / p.temperature);
    double sum = 0;
    for (int64_t t = 0; t < V; ++t) sum += prob[size_t(t)] = std::exp(double(logits[size_t(t)] / p.temperature) - mx);
    for (double& x : prob) x /= sum;
    std::vector<int32_t> ids(static_cast<size_t>(V));
    for (int64_t t = 0; t < V; ++t) ids[size_t(t)] = int32_t(t);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      const float ka = float(prob[size_t(a)]), kb = float(prob[size_t(b)]);
      return ka > kb || (ka == kb && a < b);
    });
    size_t keep = p.top_k > 0 ? std::min<size_t>(size_t(p.top_k), ids.size()) : ids.size();
    if (p.top_p < 1.0f) {
      double mass = 0, acc = 0;
      for (size_t i = 0; i < keep; ++i) mass += prob[size_t(ids[i])];
      size_t i = 0;
      for (; i < keep; ++i) {
        acc += prob[size_t(ids[i])];
        if (acc >= p.top_p * mass) { ++i; break; }
      }
      keep = std::max<size_t>(1, std::min(i, keep));
    }
    std::vector<bool> kept(static_cast<size_t>(V), false);
    for (size_t i = 0; i < keep; ++i) kept[size_t(ids[i])] = true;
    return kept;
  };
  for (auto [k, tp] : {std::pair<int, float>{0, 0.5f}, {0, 0.95f}, {100, 1.0f}, {5000, 0.9f}, {37, 0.99f}}) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.top_k = k;
    p.top_p = tp;
    SamplingRow r;
    r.logits = logits.data();
    r.params = &p;
    auto got = processed_probs(r, V);
    auto want = reference(p);
    for (int64_t t = 0; t < V; ++t) ASSERT_EQ(got[size_t(t)] > 0, bool(want[size_t(t)])) << "k=" << k << " p=" << tp << " t=" << t;
  }
  SamplingParams g;
  g.temperature = 0;
  SamplingRow r;
  r.logits = logits.data();
  r.params = &g;
  const int32_t best = sample_rows({&r, 1}, V)[0].token;
  for (int64_t t = 0; t < V; ++t) {
    ASSERT_LE(logits[size_t(t)], logits[size_t(best)]);
    if (t < best) {
      ASSERT_LT(logits[size_t(t)], logits[size_t(best)]);
    }
  }
}
