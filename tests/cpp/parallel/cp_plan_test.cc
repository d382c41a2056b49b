// Balanced context-parallel chunking: coverage, alignment, tiny prompts, the closed-form work
// model against a brute-force sum, and the paired plan's imbalance against a contiguous split.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "deepinfer/error.h"
#include "parallel/cp_plan.h"

using namespace deepinfer;
using namespace deepinfer::parallel;

namespace {

// The spans of all ranks, sorted, tile [cached, cached + n) exactly; each rank's spans ascend,
// are non-empty and do not touch; inner boundaries are multiples of align.
void expect_valid(const CpPlan& plan, int64_t cached, int64_t n, int32_t cp, int64_t align) {
  ASSERT_EQ(plan.cp, cp);
  ASSERT_EQ(plan.spans.size(), size_t(cp));
  std::vector<CpSpan> all;
  int64_t tokens = 0;
  for (int32_t r = 0; r < cp; ++r) {
    const auto& spans = plan.spans[size_t(r)];
    for (size_t i = 0; i < spans.size(); ++i) {
      EXPECT_LT(spans[i].begin, spans[i].end) << "rank " << r << " span " << i;
      if (i > 0) { EXPECT_LT(spans[i - 1].end, spans[i].begin) << "rank " << r << " spans touch or overlap"; }
      all.push_back(spans[i]);
    }
    tokens += plan.tokens_of(r);
  }
  EXPECT_EQ(tokens, n);
  std::sort(all.begin(), all.end(), [](const CpSpan& a, const CpSpan& b) { return a.begin < b.begin; });
  int64_t at = cached;
  for (const CpSpan& s : all) {
    EXPECT_EQ(s.begin, at) << "gap or overlap at " << at;
    for (int64_t edge : {s.begin, s.end})
      if (edge != cached && edge != cached + n) { EXPECT_EQ(edge % align, 0) << "unaligned boundary " << edge; }
    at = s.end;
  }
  EXPECT_EQ(at, cached + n);
}

// The model's definition, one query at a time.
double brute_work(const CpSpan& s, int64_t window, int64_t ratio, int64_t topk) {
  double w = 0;
  for (int64_t p = s.begin; p < s.end; ++p) {
    w += double(std::min(p + 1, window));
    if (ratio > 0) {
      const int64_t entries = (p + 1) / ratio;
      w += double(topk > 0 ? std::min(entries, topk) : entries);
    }
  }
  return w;
}

}  // namespace

TEST(CpPlan, PairsMirroredChunks) {
  // cp = 2, 16 tokens, align 1 -> 4 chunks of 4: rank 0 = {0..4, 12..16}, rank 1 = {4..12}.
  CpPlan p = balanced_cp_plan(0, 16, 2, 1);
  EXPECT_EQ(p.spans[0], (std::vector<CpSpan>{{0, 4}, {12, 16}}));
  EXPECT_EQ(p.spans[1], (std::vector<CpSpan>{{4, 12}}));  // the middle pair meets: one span
  // With a cached prefix of 100 and align 4: boundaries at multiples of 4 inside [100, 140).
  p = balanced_cp_plan(100, 40, 2, 4);
  expect_valid(p, 100, 40, 2, 4);
  EXPECT_EQ(p.spans[0], (std::vector<CpSpan>{{100, 112}, {132, 140}}));  // 110 -> 112, 130 -> 132
  EXPECT_EQ(p.spans[1], (std::vector<CpSpan>{{112, 132}}));
  // cp = 1: the whole range.
  p = balanced_cp_plan(7, 9, 1, 128);
  EXPECT_EQ(p.spans[0], (std::vector<CpSpan>{{7, 16}}));
}

TEST(CpPlan, CoverageAndAlignmentRandomized) {
  std::mt19937_64 rng(3);
  for (int it = 0; it < 3000; ++it) {
    const int32_t cp = int32_t(1 + rng() % 9);
    const int64_t align = std::vector<int64_t>{1, 4, 16, 128}[rng() % 4];
    const int64_t cached = int64_t(rng() % 3) == 0 ? 0 : int64_t(rng() % 5000);
    const int64_t n = int64_t(rng() % (it % 3 == 0 ? 40 : 20000));
    expect_valid(balanced_cp_plan(cached, n, cp, align), cached, n, cp, align);
    expect_valid(contiguous_cp_plan(cached, n, cp, align), cached, n, cp, align);
    if (HasFailure()) {
      ADD_FAILURE() << "cached " << cached << " n " << n << " cp " << cp << " align " << align;
      return;
    }
  }
}

TEST(CpPlan, TinyPromptsLeaveRanksEmpty) {
  // 3 tokens over cp = 4 (8 chunks): most ranks have nothing, the plan still tiles the range.
  CpPlan p = balanced_cp_plan(0, 3, 4, 1);
  expect_valid(p, 0, 3, 4, 1);
  int empty = 0;
  for (int32_t r = 0; r < 4; ++r) empty += int(p.tokens_of(r) == 0);
  EXPECT_GE(empty, 1);
  // Fewer tokens than one aligned block: one rank takes it all.
  p = balanced_cp_plan(5, 100, 4, 128);
  expect_valid(p, 5, 100, 4, 128);
  int busy = 0;
  for (int32_t r = 0; r < 4; ++r) busy += int(p.tokens_of(r) > 0);
  EXPECT_EQ(busy, 1);
  // Nothing to compute.
  p = balanced_cp_plan(42, 0, 3, 16);
  expect_valid(p, 42, 0, 3, 16);
  for (int32_t r = 0; r < 3; ++r) EXPECT_TRUE(p.spans[size_t(r)].empty());
  EXPECT_EQ(cp_imbalance(p, 128, 4, 512), 1.0);
}

TEST(CpPlan, WorkMatchesBruteForce) {
  std::mt19937_64 rng(5);
  for (int it = 0; it < 2000; ++it) {
    const int64_t b = int64_t(rng() % 3000), e = b + int64_t(rng() % 700);
    const int64_t window = std::vector<int64_t>{0, 1, 7, 128}[rng() % 4];
    const int64_t ratio = std::vector<int64_t>{0, 1, 2, 4, 128}[rng() % 5];
    const int64_t topk = std::vector<int64_t>{0, 1, 8, 512}[rng() % 4];
    ASSERT_EQ(cp_work({b, e}, window, ratio, topk), brute_work({b, e}, window, ratio, topk))
        << "[" << b << "," << e << ") W" << window << " m" << ratio << " k" << topk;
  }
  // Full causal attention (window 0, ratio 1, dense): a query at p reads p + 1 keys.
  EXPECT_EQ(cp_work({0, 4}, 0, 1, 0), 1 + 2 + 3 + 4);
  EXPECT_EQ(cp_work({10, 10}, 128, 4, 512), 0);
  // Huge positions stay exact (128-bit sums): 1e9 queries of a 128 window near 1e12.
  EXPECT_EQ(cp_work({1'000'000'000'000, 1'001'000'000'000}, 128, 0, 0), 128.0 * 1e9);
}

TEST(CpPlan, PairedBeatsContiguous) {
  // Layer kinds of DeepSeek-V4: window 128 everywhere; CSA: ratio 4, top-512, plus its indexer's
  // dense scan over all ratio-4 blocks (the part that grows with the position); HCA: ratio 128
  // dense; full causal attention for reference.
  struct Kind { const char* name; int64_t window, ratio, topk; };
  const Kind kinds[] = {{"full causal", 0, 1, 0},  {"SWA w128", 128, 0, 0}, {"CSA w128 m4 top512", 128, 4, 512},
                        {"CSA indexer m4", 0, 4, 0}, {"HCA w128 m128", 128, 128, 0}};
  for (int32_t cp : {2, 4, 8}) {
    for (int64_t cached : {int64_t(0), int64_t(65536)}) {
      for (int64_t n : {int64_t(4096), int64_t(32768), int64_t(131072), int64_t(1000003)}) {
        const CpPlan paired = balanced_cp_plan(cached, n, cp, 128);
        const CpPlan naive = contiguous_cp_plan(cached, n, cp, 128);
        expect_valid(paired, cached, n, cp, 128);
        std::printf("  cp%d cached %6lld new %7lld:", cp, (long long)cached, (long long)n);
        for (const Kind& k : kinds) {
          const double a = cp_imbalance(paired, k.window, k.ratio, k.topk);
          const double b = cp_imbalance(naive, k.window, k.ratio, k.topk);
          std::printf("  %s %.3f/%.3f", k.name, a, b);
          EXPECT_LE(a, b + 1e-9) << k.name << " cp " << cp << " n " << n;
          // Chunks are n / 2cp tokens, rounded to 128: the paired plan is within a rounding
          // block per chunk of perfect balance.
          EXPECT_LE(a, 1.0 + 4.0 * 128 * cp / double(n) + 1e-3) << k.name << " cp " << cp << " n " << n;
        }
        std::printf("\n");
      }
    }
  }
}

TEST(CpPlan, BadArguments) {
  EXPECT_THROW(balanced_cp_plan(-1, 10, 2, 1), InvalidArgument);
  EXPECT_THROW(balanced_cp_plan(0, -1, 2, 1), InvalidArgument);
  EXPECT_THROW(balanced_cp_plan(0, 10, 0, 1), InvalidArgument);
  EXPECT_THROW(balanced_cp_plan(0, 10, 2, 0), InvalidArgument);
  EXPECT_THROW(balanced_cp_plan(INT64_MAX, 10, 2, 1), InvalidArgument);
  EXPECT_THROW(contiguous_cp_plan(0, 10, -3, 1), InvalidArgument);
  EXPECT_THROW(cp_work({5, 4}, 1, 1, 1), InvalidArgument);
  EXPECT_THROW(cp_work({-1, 4}, 1, 1, 1), InvalidArgument);
  EXPECT_THROW(cp_work({0, 4}, -1, 1, 1), InvalidArgument);
  EXPECT_THROW(cp_work({0, 4}, 1, -1, 1), InvalidArgument);
  EXPECT_THROW(cp_work({0, 4}, 1, 1, -1), InvalidArgument);
  const CpPlan p = balanced_cp_plan(0, 10, 2, 1);
  EXPECT_THROW(p.tokens_of(2), InvalidArgument);
  EXPECT_THROW(p.tokens_of(-1), InvalidArgument);
  CpPlan broken = p;
  broken.cp = 3;
  EXPECT_THROW(cp_imbalance(broken, 1, 1, 1), InvalidArgument);
  try {
    balanced_cp_plan(0, 10, 2, 0);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("align"), std::string::npos) << e.what();
  }
}
