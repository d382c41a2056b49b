// Adaptive drafting (spec_adaptive.h): the gate's cost threshold, stops, re-probes and probes,
// with hand-fed step times; verify_decided (the device sampler's decisions) against verify_drafts.
#include <gtest/gtest.h>

#include <random>

#include "deepinfer/error.h"
#include "engine/philox.h"
#include "engine/spec_adaptive.h"
#include "engine/spec_verify.h"

namespace deepinfer::engine {
namespace {
using Kind = DraftGate::StepKind;

TEST(DraftGate, ThresholdIsDraftingOverPlainStepTimePerBucket) {
  DraftGate g;
  EXPECT_FALSE(g.threshold(8).has_value());
  g.observe_step(Kind::kDrafting, 8, 0.006, 1);
  EXPECT_FALSE(g.threshold(8).has_value()) << "no plain time yet";
  g.observe_step(Kind::kPlain, 8, 0.002, 2);
  ASSERT_TRUE(g.threshold(8).has_value());
  EXPECT_DOUBLE_EQ(*g.threshold(8), 3.0);
  EXPECT_DOUBLE_EQ(*g.threshold(15), 3.0) << "8..15 sequences share a bucket";
  EXPECT_FALSE(g.threshold(16).has_value()) << "another batch size bucket";
  g.observe_step(Kind::kOther, 8, 1.0, 3);  // mixed steps are not timed
  EXPECT_DOUBLE_EQ(*g.threshold(8), 3.0);
  // The first samples seed with their minimum (one-off captures); later ones are clamped.
  g.observe_step(Kind::kPlain, 8, 0.5, 4);
  EXPECT_DOUBLE_EQ(*g.threshold(8), 3.0);
  g.observe_step(Kind::kPlain, 8, 0.001, 5);
  EXPECT_DOUBLE_EQ(*g.threshold(8), 6.0);
}

TEST(DraftGate, StopsWhenAcceptanceCannotPayAndReprobesWithDoubling) {
  DraftGateConfig c;
  c.min_verifies = 4;
  c.off_steps = 10;
  c.max_off_steps = 40;
  DraftGate g(c);
  g.observe_step(Kind::kDrafting, 4, 0.004, 0);
  g.observe_step(Kind::kPlain, 4, 0.001, 1);  // threshold 4 tokens per verify step
  DraftGate::Seq s;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(g.drafts(s, 10 + i, 4)) << "not judged before min_verifies";
    g.observe_verify(s, 2);
  }
  g.observe_verify(s, 3);
  EXPECT_DOUBLE_EQ(s.tokens_per_verify, 2.25);
  EXPECT_FALSE(g.drafts(s, 20, 4)) << "2.25 tokens per verify step < 4";
  EXPECT_EQ(g.stats().requests_stopped, 1);
  EXPECT_DOUBLE_EQ(g.stats().stopped_tokens_per_verify, 2.25);
  EXPECT_DOUBLE_EQ(g.stats().last_threshold, 4.0);
  EXPECT_FALSE(g.drafts(s, 29, 4));
  EXPECT_TRUE(g.drafts(s, 30, 4)) << "re-probe after off_steps";
  EXPECT_EQ(g.stats().reprobes, 1);
  EXPECT_EQ(s.verifies, 0);
  for (int i = 0; i < 4; ++i) g.observe_verify(s, 1);
  EXPECT_FALSE(g.drafts(s, 31, 4));
  EXPECT_EQ(s.off_until, 31 + 20) << "the second stop lasts twice as long";
  EXPECT_EQ(g.stats().requests_stopped, 1) << "counted once per request";
  EXPECT_EQ(g.stats().stops, 2);
  EXPECT_TRUE(g.drafts(s, 51, 4));
  for (int i = 0; i < 4; ++i) g.observe_verify(s, 6);
  EXPECT_TRUE(g.drafts(s, 52, 4)) << "6 tokens per verify step pay";
  EXPECT_EQ(s.off_period, 0) << "a re-probe that pays resets the doubling";
}

TEST(DraftGate, HighAcceptanceKeepsDrafting) {
  DraftGate g;
  g.observe_step(Kind::kDrafting, 1, 0.0019, 0);
  g.observe_step(Kind::kPlain, 1, 0.00085, 1);
  DraftGate::Seq s;
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(g.drafts(s, i, 1));
    g.observe_verify(s, 5);
  }
  EXPECT_EQ(g.stats().stops, 0);
}

// In a batch the batch's mean decides: a low-acceptance request keeps drafting beside others that
// pay (stopping it alone would not make the step cheaper), and a high one stops with a batch that
// does not.
TEST(DraftGate, TheBatchMeanDecidesInABatch) {
  DraftGate g;
  g.observe_step(Kind::kDrafting, 8, 0.004, 0);
  g.observe_step(Kind::kPlain, 8, 0.001, 1);  // threshold 4
  DraftGate::Seq low, high;
  for (int i = 0; i < 4; ++i) g.observe_verify(low, 1), g.observe_verify(high, 6);
  EXPECT_TRUE(g.drafts(low, 10, 8, 4.5)) << "batch mean 4.5 pays";
  EXPECT_FALSE(g.drafts(high, 10, 8, 2.0)) << "batch mean 2 does not";
  EXPECT_DOUBLE_EQ(g.stats().stopped_tokens_per_verify, 6.0) << "its own average is reported";
}

TEST(DraftGate, ProbesOnlyWhenJudgeableAndPlainTimeUnknownOrStale) {
  DraftGateConfig c;
  c.probe_every = 100;
  DraftGate g(c);
  EXPECT_FALSE(g.wants_probe(10, 8, true)) << "no drafting time yet";
  g.observe_step(Kind::kDrafting, 8, 0.004, 10);
  EXPECT_FALSE(g.wants_probe(11, 8, false)) << "nobody to judge";
  EXPECT_TRUE(g.wants_probe(11, 8, true));
  g.probe_started(11);
  EXPECT_FALSE(g.wants_probe(12, 8, true)) << "at most one probe per 64 steps";
  g.observe_step(Kind::kPlain, 8, 0.001, 13);
  EXPECT_FALSE(g.wants_probe(90, 8, true));
  EXPECT_TRUE(g.wants_probe(114, 8, true)) << "plain time older than probe_every";
  EXPECT_EQ(g.stats().probes, 1);
}

// The device decides each sampled draft with rejection_sample's rule; verify_decided must then give
// verify_drafts' result, for every mix of greedy and sampled drafts and accept pattern.
TEST(SpecVerify, DecidedEqualsVerifyDrafts) {
  std::mt19937_64 g(5);
  const int64_t V = 11;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t L = 1 + size_t(g() % 5);
    std::vector<int32_t> drafts(L), draws(L + 1);
    std::vector<std::vector<float>> q(L);
    std::vector<std::vector<double>> p(L);
    std::vector<int32_t> acc(L), res(L);
    const VerifyKey key{g(), uint32_t(g() % 3), int64_t(g() % 1000)};
    for (size_t i = 0; i < L; ++i) {
      const bool sampled = g() % 3 != 0;
      drafts[i] = int32_t(g() % uint64_t(V));
      draws[i] = g() % 2 ? drafts[i] : int32_t(g() % uint64_t(V));
      p[i].assign(size_t(V), 0.0);
      double s = 0;
      for (auto& x : p[i]) s += x = double(g() % 100 + 1);
      for (auto& x : p[i]) x /= s;
      if (sampled) {
        q[i].assign(size_t(V), 0.f);
        for (auto& x : q[i]) x = float(g() % 50 + 1);
        const int64_t pos = key.first_position + int64_t(i);
        bool a = false;
        res[i] = rejection_sample(p[i], q[i], drafts[i],
                                  philox_uniform(key.seed, key.sample_index, pos, DrawStream::kSpecAccept),
                                  philox_uniform(key.seed, key.sample_index, pos, DrawStream::kSpecResidual), &a);
        acc[i] = a;
      } else {
        acc[i] = -1;
        res[i] = -1;
      }
    }
    draws[L] = int32_t(g() % uint64_t(V));
    const TargetProbs tp = [&](int32_t i) { return p[size_t(i)]; };
    const VerifyResult want = verify_drafts(drafts, draws, q, tp, key);
    const VerifyResult got = verify_decided(drafts, draws, acc, res);
    EXPECT_EQ(got.num_accepted, want.num_accepted) << "trial " << trial;
    EXPECT_EQ(got.tokens, want.tokens) << "trial " << trial;
  }
}

TEST(SpecVerify, DecidedRejectsADraftWithoutQ) {
  const std::vector<int32_t> drafts{3, 4}, draws{3, 4, 5}, acc{1, -2}, res{3, 0};
  try {
    verify_decided(drafts, draws, acc, res);
    ADD_FAILURE() << "accepted a q = 0 decision";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("not drawn from its recorded distribution"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace deepinfer::engine
