// Speculative rejection sampling is distribution-exact: chi-square tests of the emitted tokens
// against the target distribution, for hand-made p and q (overlapping, disjoint supports, equal,
// one-hot), at every position of a multi-draft verify, and end to end through the engine (the
// toy model with a drafter whose q differs from p). The acceptance rate matches sum min(p, q).
// Draws are Philox-keyed, so every run of these tests sees the same numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "engine/philox.h"
#include "engine/sampler.h"
#include "engine/spec_verify.h"
#include "engine/toy_drafter.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

namespace {
// Upper 1e-4 quantile of chi-square with `df` degrees of freedom (Wilson-Hilferty).
double chi2_critical(int df) {
  const double z = 3.719, k = double(df);
  const double c = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * c * c * c;
}

// Pearson's statistic of `counts` against `n` draws from `p`; a count where p is 0 fails at once.
void expect_distributed_as(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n,
                           const std::string& what) {
  ASSERT_EQ(counts.size(), p.size());
  double stat = 0;
  int cells = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] <= 0) {
      EXPECT_EQ(counts[t], 0) << what << ": token " << t << " has target probability 0";
      continue;
    }
    const double e = double(n) * p[t];
    stat += (double(counts[t]) - e) * (double(counts[t]) - e) / e;
    ++cells;
  }
  if (cells < 2) return;
  EXPECT_LT(stat, chi2_critical(cells - 1)) << what << ": chi-square " << stat << " over " << cells << " cells, n " << n;
}

std::vector<double> normalised(std::vector<double> v) {
  const double s = std::accumulate(v.begin(), v.end(), 0.0);
  for (double& x : v) x /= s;
  return v;
}

int32_t draw_p(const std::vector<double>& p, double u) {
  double acc = 0;
  int32_t last = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] <= 0) continue;
    last = int32_t(t);
    acc += p[t];
    if (u < acc) break;
  }
  return last;
}
}  // namespace

TEST(RejectionSampling, EmittedTokenFollowsTargetForHandMadePQ) {
  struct Case {
    const char* name;
    std::vector<double> p, q;
  };
  const std::vector<Case> cases = {
      {"overlapping", normalised({5, 1, 3, 0.5, 2, 4, 1}), normalised({1, 4, 3, 2, 0.5, 1, 3})},
      {"q outside p", normalised({0, 3, 0, 5, 2, 0, 1}), normalised({2, 1, 3, 1, 0, 4, 1})},
      {"p outside q", normalised({2, 1, 3, 1, 4, 2, 1}), normalised({0, 0, 5, 1, 0, 3, 0})},
      {"equal", normalised({3, 1, 4, 1, 5, 9, 2}), normalised({3, 1, 4, 1, 5, 9, 2})},
      {"sharp q", normalised({1, 1, 1, 1, 1, 1, 1}), normalised({0.01, 0.01, 50, 0.01, 0.01, 0.01, 0.01})},
  };
  const int64_t n = 60000;
  for (const Case& c : cases) {
    const std::vector<float> q(c.q.begin(), c.q.end());
    std::vector<int64_t> counts(c.p.size(), 0);
    int64_t accepted = 0;
    for (int64_t trial = 0; trial < n; ++trial) {
      const uint64_t seed = 0x5eed0000 + uint64_t(trial);
      const int32_t d = draw_weighted(q, philox_uniform(seed, 0, 0, DrawStream::kSpecDraft));
      bool acc = false;
      const int32_t tok = rejection_sample(c.p, q, d, philox_uniform(seed, 0, 0, DrawStream::kSpecAccept),
                                           philox_uniform(seed, 0, 0, DrawStream::kSpecResidual), &acc);
      counts[size_t(tok)]++;
      accepted += acc;
    }
    expect_distributed_as(counts, c.p, n, c.name);
    double beta = 0;  // acceptance probability of rejection sampling: sum min(p, q)
    for (size_t t = 0; t < c.p.size(); ++t) beta += std::min(c.p[t], c.q[t]);
    const double sd = std::sqrt(beta * (1 - beta) / double(n)) + 1e-9;
    EXPECT_NEAR(double(accepted) / double(n), beta, 5 * sd + 1e-12) << c.name;
  }
}

// A three-draft verify with a different (p_i, q_i) per position: the token emitted at every
// position reached is distributed as p_i (the bonus too), and the accepted length averages
// sum_j prod_{i<=j} beta_i. One-hot drafts (empty q) coupled to the target's draw do the same.
TEST(RejectionSampling, EveryPositionOfAVerifyFollowsTarget) {
  const std::vector<std::vector<double>> p = {normalised({4, 1, 2, 0, 3, 1}), normalised({1, 1, 5, 2, 0, 1}),
                                              normalised({2, 2, 1, 1, 3, 1}), normalised({0, 5, 1, 1, 1, 2})};
  const std::vector<std::vector<double>> qd = {normalised({3, 2, 2, 1, 1, 1}), normalised({1, 2, 4, 2, 1, 0}),
                                               normalised({1, 4, 1, 1, 2, 1})};
  std::vector<std::vector<float>> q;
  for (const auto& v : qd) q.emplace_back(v.begin(), v.end());
  const int64_t n = 60000;
  for (bool one_hot : {false, true}) {
    std::vector<std::vector<int64_t>> counts(4, std::vector<int64_t>(6, 0));
    std::vector<int64_t> reached(4, 0);
    int64_t accepted_total = 0;
    for (int64_t trial = 0; trial < n; ++trial) {
      const uint64_t seed = 0xabc00000 + uint64_t(trial);
      const int64_t pos0 = 40;
      std::vector<int32_t> drafts, draws;
      for (int i = 0; i < 3; ++i)
        drafts.push_back(one_hot ? int32_t((trial + i) % 6 == 3 ? 2 : (trial * 7 + i) % 6)
                                 : draw_weighted(q[size_t(i)], philox_uniform(seed, 0, pos0 + i, DrawStream::kSpecDraft)));
      for (int i = 0; i < 4; ++i) draws.push_back(draw_p(p[size_t(i)], philox_uniform(seed, 0, pos0 + i)));
      const VerifyResult v =
          one_hot ? verify_drafts(drafts, draws)
                  : verify_drafts(drafts, draws, q, [&](int32_t row) { return p[size_t(row)]; }, {seed, 0, pos0});
      ASSERT_EQ(int32_t(v.tokens.size()), v.num_accepted + 1);
      for (size_t i = 0; i < v.tokens.size(); ++i) {
        counts[i][size_t(v.tokens[i])]++;
        reached[i]++;
      }
      accepted_total += v.num_accepted;
    }
    for (int i = 0; i < 4; ++i)
      expect_distributed_as(counts[size_t(i)], p[size_t(i)], reached[size_t(i)],
                            std::string(one_hot ? "one-hot" : "sampled") + " position " + std::to_string(i));
    if (!one_hot) {
      double expect = 0, prod = 1;
      for (int i = 0; i < 3; ++i) {
        double beta = 0;
        for (int t = 0; t < 6; ++t) beta += std::min(p[size_t(i)][size_t(t)], qd[size_t(i)][size_t(t)]);
        prod *= beta;
        expect += prod;
      }
      EXPECT_NEAR(double(accepted_total) / double(n), expect, 0.02);
    }
  }
}

TEST(RejectionSampling, RefusesADraftOutsideQ) {
  const std::vector<double> p = {0.5, 0.5};
  const std::vector<float> q = {1.f, 0.f};
  bool acc = false;
  EXPECT_THROW(rejection_sample(p, q, 1, 0.5, 0.5, &acc), InternalError);
  EXPECT_THROW(verify_drafts(std::vector<int32_t>{0, 1}, std::vector<int32_t>{0, 1}), InternalError);
}

namespace {
struct ToyRun {
  std::vector<std::vector<int32_t>> tokens;  // per request, in request order
  SchedulerStats stats;
};

// `n` single-prompt requests (seeds 1000 + i) of `max_tokens` tokens through the engine on the
// toy model, drafting `drafts` per step with a picker-mode ToyDrafter (q = perturbed p).
ToyRun run_toy(const SamplingParams& base, int n, int32_t drafts, float noise, bool sampled_drafts = true) {
  ToyModelConfig tc;
  tc.max_rollback = 6;
  auto model = std::make_unique<ToyModel>(tc);
  auto d = std::make_unique<ToyDrafter>(tc, 5, [](int64_t) { return 5; });
  d->use_picker(noise);
  if (drafts > 0) model->set_drafter(std::move(d));
  EngineConfig ec;
  ec.scheduler.max_num_seqs = 64;
  ec.scheduler.max_num_batched_tokens = 512;
  ec.num_speculative_tokens = drafts;
  ec.sampled_drafts = sampled_drafts;
  Engine eng(ec, std::move(model), nullptr);
  const std::vector<int32_t> prompt = {0, 40, 41, 97, 98, 120};
  for (int i = 0; i < n; ++i) {
    SamplingParams p = base;
    p.seed = 1000 + uint64_t(i);
    eng.add_request(std::to_string(i), PromptInput::from_token_ids(prompt), p, 0);
  }
  ToyRun r;
  r.tokens.resize(size_t(n));
  while (eng.has_unfinished())
    for (RequestOutput& o : eng.step())
      if (o.finished) r.tokens[size_t(std::stoi(o.request_id))] = o.outputs[0].token_ids;
  r.stats = eng.scheduler().stats();
  return r;
}
}  // namespace

// End to end: the joint distribution of the first two sampled tokens with speculative decoding
// (q from perturbed logits, rejection sampling) equals the toy model's exact one; seeds repeat.
TEST(RejectionSampling, EngineOutputFollowsTheModel) {
  SamplingParams sp;
  sp.temperature = 1.3f;
  sp.top_k = 4;
  sp.max_tokens = 4;
  sp.ignore_eos = true;
  const int n = 2500;
  const ToyRun spec = run_toy(sp, n, 4, 2.0f);
  EXPECT_GT(spec.stats.num_accepted_drafts, 0);
  EXPECT_LT(spec.stats.num_accepted_drafts, spec.stats.num_draft_tokens) << "q != p: some drafts rejected";
  // Exact joint of (token 1, token 2) from the cache-free reference.
  ToyModelConfig tc;
  const std::vector<int32_t> prompt = {0, 40, 41, 97, 98, 120};
  auto probs_after = [&](const std::vector<int32_t>& history, const std::vector<int32_t>& out) {
    const std::vector<float> l = ToyModel::reference_logits(tc, history);
    SamplingRow row;
    row.logits = l.data() + (history.size() - 1) * size_t(tc.vocab_size);
    row.params = &sp;
    row.prompt_ids = &prompt;
    row.output_ids = &out;
    return processed_probs(row, tc.vocab_size);
  };
  const std::vector<double> p1 = probs_after(prompt, {});
  std::map<std::pair<int32_t, int32_t>, double> joint;
  for (int32_t a = 0; a < tc.vocab_size; ++a) {
    if (p1[size_t(a)] <= 0) continue;
    std::vector<int32_t> h = prompt;
    h.push_back(a);
    const std::vector<double> p2 = probs_after(h, {a});
    for (int32_t b = 0; b < tc.vocab_size; ++b)
      if (p2[size_t(b)] > 0) joint[{a, b}] = p1[size_t(a)] * p2[size_t(b)];
  }
  ASSERT_EQ(joint.size(), 16u);
  std::vector<double> pj;
  std::vector<int64_t> counts;
  std::map<std::pair<int32_t, int32_t>, size_t> cell;
  for (const auto& [k, v] : joint) cell[k] = pj.size(), pj.push_back(v), counts.push_back(0);
  for (const auto& t : spec.tokens) {
    ASSERT_EQ(t.size(), 4u);
    auto it = cell.find({t[0], t[1]});
    ASSERT_NE(it, cell.end()) << "tokens " << t[0] << ", " << t[1] << " have probability 0";
    counts[it->second]++;
  }
  expect_distributed_as(counts, pj, n, "engine joint of tokens 1-2");
  // A seed gives the same tokens every run.
  const ToyRun again = run_toy(sp, 200, 4, 2.0f);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(again.tokens[size_t(i)], spec.tokens[size_t(i)]) << "request " << i;
  // Greedy drafts for sampling requests (sampled_drafts off): identical to plain decoding.
  const ToyRun plain = run_toy(sp, 200, 0, 0.f);
  const ToyRun coupled = run_toy(sp, 200, 4, 2.0f, /*sampled_drafts=*/false);
  EXPECT_EQ(plain.tokens, coupled.tokens);
  EXPECT_GT(coupled.stats.num_draft_tokens, 0);
}
