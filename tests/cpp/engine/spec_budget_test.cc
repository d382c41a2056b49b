// Variable-length verification's pieces (engine/spec_budget.h): the step cost curve, the
// confidence calibration and the draft-length planner, the planner checked against brute force
// over every combination of draft lengths on random small cases.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "deepinfer/error.h"
#include "engine/spec_budget.h"
#include "engine/toy_drafter.h"
#include "engine/toy_model.h"

using namespace deepinfer;
using namespace deepinfer::engine;

TEST(StepCostModel, InterpolatesAndRefusesBadPoints) {
  const StepCostModel c({{16, 2.0}, {1, 1.0}, {64, 5.0}});
  EXPECT_DOUBLE_EQ(c.predict(1), 1.0);
  EXPECT_DOUBLE_EQ(c.predict(0), 1.0);  // flat before the first point
  EXPECT_NEAR(c.predict(6), 1.0 + 5.0 / 15.0, 1e-12);
  EXPECT_NEAR(c.predict(40), 3.5, 1e-12);
  EXPECT_NEAR(c.predict(112), 8.0, 1e-12);  // extended along the last segment
  EXPECT_DOUBLE_EQ(StepCostModel().predict(1000), 1.0);
  EXPECT_THROW(StepCostModel({{0, 1.0}}), InvalidArgument);
  EXPECT_THROW(StepCostModel({{4, -1.0}}), InvalidArgument);
  EXPECT_THROW(StepCostModel({{4, 1.0}, {4, 2.0}}), InvalidArgument);
  EXPECT_THROW(StepCostModel({{4, std::nan("")}}), InvalidArgument);
}

TEST(AcceptanceModel, CalibratesTowardsObservedRates) {
  AcceptanceModel m;
  EXPECT_NEAR(m.predict(0, 0.9f), 0.9, 1e-6);  // no observations: the raw probability
  // Position 1 drafts of confidence ~0.9 are accepted only 30% of the time.
  for (int i = 0; i < 1000; ++i) m.observe(1, 0.91f, i % 10 < 3);
  EXPECT_NEAR(m.predict(1, 0.95f), 0.3, 0.01);
  EXPECT_NEAR(m.predict(0, 0.95f), 0.95, 1e-6);  // other positions untouched
  EXPECT_NEAR(m.predict(1, 0.15f), 0.15, 1e-6);  // other deciles untouched
  EXPECT_EQ(m.num_observed(), 1000);
  // Out-of-range input is clamped, never a crash.
  EXPECT_GE(m.predict(99, std::nanf("")), 0.0);
  EXPECT_LE(m.predict(-3, 7.f), 1.0);
}

namespace {
double rate(const std::vector<DraftCandidate>& c, const std::vector<int32_t>& len, int64_t base,
            const StepCostModel& cost) {
  double value = double(c.size());
  int64_t extra = 0;
  for (size_t s = 0; s < c.size(); ++s) {
    double prod = 1;
    for (int32_t i = 0; i < len[s]; ++i) value += prod *= c[s].accept[size_t(i)];
    extra += len[s];
  }
  return value / cost.predict(base + extra);
}
}  // namespace

TEST(ChooseDraftLengths, MatchesBruteForce) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t S = 1 + gen() % 3, L = 1 + gen() % 4;
    std::vector<DraftCandidate> c(S);
    for (auto& x : c)
      for (size_t i = 0; i < L; ++i) x.accept.push_back(trial % 5 == 0 ? 1.0 : u(gen));
    // A convex-ish curve: a flat head then a slope, as measured steps look.
    const double knee = double(1 + gen() % 12), slope = 0.02 + 0.3 * u(gen);
    const StepCostModel cost({{1, 1.0}, {int64_t(knee) + 1, 1.0 + 0.01 * knee}, {200, 1.0 + 0.01 * knee + slope * (199 - knee)}});
    const int64_t base = int64_t(S) + int64_t(gen() % 5), max_extra = int64_t(gen() % (S * L + 2));
    const std::vector<int32_t> got = choose_draft_lengths(c, base, max_extra, cost);
    ASSERT_EQ(got.size(), S);
    int64_t used = 0;
    for (int32_t g : got) used += g;
    EXPECT_LE(used, max_extra) << "trial " << trial;
    // Brute force over every length vector within the budget.
    double best = 0;
    std::vector<int32_t> len(S, 0);
    for (;;) {
      int64_t n = 0;
      for (int32_t l : len) n += l;
      if (n <= max_extra) best = std::max(best, rate(c, len, base, cost));
      size_t k = 0;
      while (k < S && len[k] == int32_t(L)) len[k++] = 0;
      if (k == S) break;
      len[k]++;
    }
    // The planner takes gains in falling order: optimal whenever each sequence's gains fall,
    // which products of probabilities do.
    EXPECT_NEAR(rate(c, got, base, cost), best, 1e-9 * best) << "trial " << trial;
  }
}

TEST(ChooseDraftLengths, FreeDraftsAreAllTakenAndCostlyOnesNone) {
  const std::vector<DraftCandidate> c = {{{0.9, 0.8, 0.7}}, {{0.5, 0.1, 0.05}}};
  // Flat cost: every draft with a chance of acceptance is worth verifying.
  EXPECT_EQ(choose_draft_lengths(c, 2, 100, StepCostModel({{1, 1.0}, {64, 1.0}})), (std::vector<int32_t>{3, 3}));
  // Each token doubles the step: no draft pays.
  EXPECT_EQ(choose_draft_lengths(c, 2, 100, StepCostModel({{1, 1.0}, {2, 2.0}, {3, 3.0}})),
            (std::vector<int32_t>{0, 0}));
  // Budget of 2 extra tokens: the two best gains (0.9, 0.72).
  EXPECT_EQ(choose_draft_lengths(c, 2, 2, StepCostModel({{1, 1.0}, {64, 1.0}})), (std::vector<int32_t>{2, 0}));
  // Zero acceptance stops a sequence's gains.
  EXPECT_EQ(choose_draft_lengths({{{0.0, 1.0}}}, 1, 10, StepCostModel()), (std::vector<int32_t>{0}));
}

// The drafter's rounds count in the step time: a longer verified run asks for more rounds next.
TEST(ChooseDraftLengths, DraftRoundCostCounts) {
  const std::vector<DraftCandidate> c = {{{0.9, 0.8, 0.7}}, {{0.5, 0.1, 0.05}}};
  StepCostModel cost({{1, 1.0}, {64, 1.0}});  // verifying is free
  cost.set_draft_rounds({{1, 10.0}, {64, 10.0}});
  EXPECT_EQ(choose_draft_lengths(c, 2, 100, cost), (std::vector<int32_t>{0, 0}));  // 2 rounds cost 21x
  cost.set_draft_rounds({{2, 0.5}});
  EXPECT_EQ(choose_draft_lengths(c, 2, 100, cost), (std::vector<int32_t>{3, 3}));  // 4.68 / 2 > 2 / 1
  cost.set_draft_rounds({{1, 0.1}, {64, 0.7}});
  EXPECT_NEAR(cost.predict_draft_round(32), 0.1 + 0.6 * 31.0 / 63.0, 1e-12);
  EXPECT_DOUBLE_EQ(cost.predict_draft_round(200), 0.1 + 0.6 * 199.0 / 63.0);
  EXPECT_DOUBLE_EQ(StepCostModel().predict_draft_round(8), 0.0);
  EXPECT_THROW(cost.set_draft_rounds({{4, -1.0}}), InvalidArgument);
  EXPECT_THROW(cost.set_draft_rounds({{0, 1.0}}), InvalidArgument);
}

TEST(MeasureStepCost, ToyModelCurveCoversTheVerifySizes) {
  ToyModelConfig tc;
  tc.max_rollback = 6;
  ToyModel m(tc);
  const kv::CacheGeometry g = m.plan_cache(size_t(1) << 24, 8);
  m.allocate_cache(g);
  const StepCostModel c = measure_step_cost(m, g, 48, 8, false, 2);
  ASSERT_FALSE(c.empty());
  std::vector<int64_t> sizes;
  for (const auto& [t, s] : c.points()) {
    sizes.push_back(t);
    EXPECT_GT(s, 0);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 48}));
  EXPECT_TRUE(c.draft_points().empty());  // no drafter: drafting costs nothing
  // With a drafter: one further round's cost at 1 and 8 sequences.
  m.set_drafter(std::make_unique<ToyDrafter>(tc, 4, [](int64_t) { return 4; }));
  const StepCostModel d = measure_step_cost(m, g, 48, 8, false, 2);
  ASSERT_EQ(d.draft_points().size(), 2u);
  EXPECT_EQ(d.draft_points()[0].first, 1);
  EXPECT_EQ(d.draft_points()[1].first, 8);
  for (const auto& [n, sec] : d.draft_points()) EXPECT_GE(sec, 0.0) << n;
}
