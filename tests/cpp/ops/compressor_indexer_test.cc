#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "ops/cpu/compressor.h"
#include "ops/cpu/indexer.h"
#include "deepinfer/error.h"
#include "test_util.h"

namespace deepinfer::ops::cpu {
namespace {
using testing::randn;

// Block b per MODEL-DEEPSEEK-V4.md §3.3, dimension e: list the (token, column) slots explicitly.
double naive_block(const std::vector<float>& a, const std::vector<float>& z, int64_t c, int64_t m, bool overlap,
                   int64_t b, int64_t e) {
  std::vector<std::pair<int64_t, int64_t>> slots;
  if (overlap) {
    const int64_t d = c / 2;
    for (int64_t t = m * (b - 1); t < m * b; ++t)
      if (t >= 0) slots.push_back({t, e});
    for (int64_t t = m * b; t < m * b + m; ++t) slots.push_back({t, d + e});
  } else {
    for (int64_t t = m * b; t < m * b + m; ++t) slots.push_back({t, e});
  }
  double den = 0, num = 0;
  for (auto [t, col] : slots) den += std::exp(double(z[t * c + col]));
  for (auto [t, col] : slots) num += std::exp(double(z[t * c + col])) / den * a[t * c + col];
  return num;
}

TEST(CompressorPool, OverlappingAndDisjointMatchNaive) {
  for (bool overlap : {true, false}) {
    const int64_t m = overlap ? 4 : 5, d = 7, c = overlap ? 2 * d : d, ntok = 6 * m + 3;
    auto a = randn(ntok * c, 1), z = randn(ntok * c, 2, 2.0f);
    const int64_t nb = ntok / m;
    std::vector<float> out(nb * d);
    compressor_pool({.a = a.data(), .z = z.data(), .row0 = 0, .n_rows = ntok, .width = c, .ratio = m,
                     .overlap = overlap, .first_block = 0, .n_blocks = nb, .out = out.data()});
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t e = 0; e < d; ++e) EXPECT_NEAR(out[b * d + e], naive_block(a, z, c, m, overlap, b, e), 1e-5);
    // Same blocks from a window of rows that starts mid-sequence (the incremental form).
    const int64_t first = 3, row0 = overlap ? m * (first - 1) : m * first;
    std::vector<float> out2((nb - first) * d);
    compressor_pool({.a = a.data() + row0 * c, .z = z.data() + row0 * c, .row0 = row0, .n_rows = ntok - row0,
                     .width = c, .ratio = m, .overlap = overlap, .first_block = first, .n_blocks = nb - first,
                     .out = out2.data()});
    for (size_t i = 0; i < out2.size(); ++i) EXPECT_EQ(out2[i], out[first * d + i]);
  }
}

TEST(CompressorPool, MissingRowsAreAnInternalError) {
  std::vector<float> a(8 * 4, 1.f), out(4);
  EXPECT_THROW(compressor_pool({.a = a.data(), .z = a.data(), .row0 = 5, .n_rows = 7, .width = 4, .ratio = 4,
                                .overlap = true, .first_block = 2, .n_blocks = 1, .out = out.data()}),
               InternalError);
}

TEST(Indexer, ScoresAndTopKMatchNaive) {
  const int64_t T = 4, Hi = 5, di = 9, rows = 23, K = 6;
  auto q = randn(T * Hi * di, 1), w = randn(T * Hi, 2), k = randn(rows * di, 3);
  std::vector<int32_t> cand = {3, 1, 4, 15, 9, 2, 6, 5, 22, 8, 7, 0, 11};
  std::vector<int64_t> off = {0, 0, 0, 2};
  std::vector<int32_t> cnt = {0, 4, 13, 11};
  std::vector<int32_t> sel(T * K), scount(T);
  std::vector<float> scores(T * 13, 0.f);
  const float qs = 1 / std::sqrt(float(di)), ws = 1 / std::sqrt(float(Hi));
  indexer_topk({.q = q.data(), .w = w.data(), .num_tokens = T, .num_heads = Hi, .head_dim = di, .k_pool = k.data(),
                .cand_rows = cand.data(), .cand_offset = off.data(), .cand_count = cnt.data(), .qk_scale = qs,
                .w_scale = ws, .topk = K, .out_rows = sel.data(), .out_count = scount.data(),
                .out_scores = scores.data(), .scores_stride = 13});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<double, int32_t>> ref;
    for (int j = 0; j < cnt[t]; ++j) {
      const int32_t r = cand[off[t] + j];
      double s = 0;
      for (int64_t h = 0; h < Hi; ++h) {
        double dot = 0;
        for (int64_t i = 0; i < di; ++i) dot += double(q[(t * Hi + h) * di + i]) * k[r * di + i];
        s += std::max(dot, 0.0) * qs * w[t * Hi + h] * ws;
      }
      EXPECT_NEAR(scores[t * 13 + j], s, 1e-5);
      ref.push_back({s, r});
    }
    std::sort(ref.rbegin(), ref.rend());
    const int64_t n = std::min<int64_t>(K, cnt[t]);
    ASSERT_EQ(scount[t], n);
    std::set<int32_t> want, got;
    for (int64_t j = 0; j < n; ++j) want.insert(ref[j].second), got.insert(sel[t * K + j]);
    EXPECT_EQ(want, got) << "token " << t;
    for (int64_t j = n; j < K; ++j) EXPECT_EQ(sel[t * K + j], -1);
  }
}


// Two-level top-k (V4.1): the candidate source keeps the best blocks by max score with the newest
// block pinned, its own top-k unfiltered; a later index source scores only inside the kept blocks.
// Candidate j of token t is entry j (V4.1 lists every finished entry in order); odd sizes.
TEST(Indexer, TwoLevelCandidateBlocksMatchNaive) {
  const int64_t T = 5, Hi = 3, di = 7, rows = 41, K = 5, bs = 3, B = 4;
  std::vector<int32_t> all(rows);
  for (int32_t i = 0; i < rows; ++i) all[size_t(i)] = i;
  std::vector<int64_t> off(T, 0);
  std::vector<int32_t> cnt = {0, 2, 11, 29, 41};
  const float qs = 1 / std::sqrt(float(di)), ws = 1 / std::sqrt(float(Hi));
  auto k = randn(rows * di, 23);
  auto naive_scores = [&](const std::vector<float>& q, const std::vector<float>& w, int64_t t) {
    std::vector<double> sc(static_cast<size_t>(cnt[t]));  // not size_t(...): clang reads that as a function declaration
    for (int64_t j = 0; j < cnt[t]; ++j)
      for (int64_t h = 0; h < Hi; ++h) {
        double dot = 0;
        for (int64_t i = 0; i < di; ++i) dot += double(q[(t * Hi + h) * di + i]) * k[j * di + i];
        sc[size_t(j)] += std::max(dot, 0.0) * qs * w[t * Hi + h] * ws;
      }
    return sc;
  };
  // Publish.
  auto q1 = randn(T * Hi * di, 21), w1 = randn(T * Hi, 22);
  std::vector<int32_t> sel1(T * K), n1(T), blocks(T * B, 7);
  IndexerArgs a{.q = q1.data(), .w = w1.data(), .num_tokens = T, .num_heads = Hi, .head_dim = di, .k_pool = k.data(),
                .cand_rows = all.data(), .cand_offset = off.data(), .cand_count = cnt.data(), .qk_scale = qs,
                .w_scale = ws, .topk = K, .out_rows = sel1.data(), .out_count = n1.data(), .block_size = bs,
                .topk_blocks = B, .out_blocks = blocks.data()};
  indexer_topk(a);
  for (int64_t t = 0; t < T; ++t) {
    const auto sc = naive_scores(q1, w1, t);
    const int64_t nb = (cnt[t] + bs - 1) / bs;
    std::vector<std::pair<double, int32_t>> best;  // (-score, block): ascending = best first, lower block on ties
    for (int64_t b = 0; b < nb; ++b) {
      double m = -INFINITY;
      for (int64_t j = b * bs; j < std::min<int64_t>(cnt[t], (b + 1) * bs); ++j) m = std::max(m, sc[size_t(j)]);
      best.push_back({b == nb - 1 ? -INFINITY : -m, int32_t(b)});
    }
    std::sort(best.begin(), best.end());
    std::set<int32_t> want;
    for (int64_t b = 0; b < std::min(B, nb); ++b) want.insert(best[size_t(b)].second);
    std::vector<int32_t> got(blocks.begin() + t * B, blocks.begin() + t * B + B);
    std::vector<int32_t> expect(want.begin(), want.end());
    expect.resize(size_t(B), -1);
    EXPECT_EQ(got, expect) << "token " << t;
    // Its own top-k is over every entry.
    std::vector<std::pair<double, int32_t>> r;
    for (int64_t j = 0; j < cnt[t]; ++j) r.push_back({-sc[size_t(j)], int32_t(j)});
    std::sort(r.begin(), r.end());
    ASSERT_EQ(n1[t], std::min<int64_t>(K, cnt[t]));
    std::set<int32_t> ws1, gs1;
    for (int64_t j = 0; j < n1[t]; ++j) ws1.insert(r[size_t(j)].second), gs1.insert(sel1[t * K + j]);
    EXPECT_EQ(ws1, gs1);
  }
  // Consume: another query, scored inside the published blocks only.
  auto q2 = randn(T * Hi * di, 24), w2 = randn(T * Hi, 25);
  std::vector<int32_t> sel2(T * K), n2(T);
  a.q = q2.data();
  a.w = w2.data();
  a.out_rows = sel2.data();
  a.out_count = n2.data();
  a.out_blocks = nullptr;
  a.in_blocks = blocks.data();
  indexer_topk(a);
  for (int64_t t = 0; t < T; ++t) {
    const auto sc = naive_scores(q2, w2, t);
    std::vector<std::pair<double, int32_t>> r;
    for (int64_t b = 0; b < B; ++b) {
      const int32_t blk = blocks[t * B + b];
      for (int64_t j = blk * bs; blk >= 0 && j < std::min<int64_t>(cnt[t], (blk + 1) * bs); ++j)
        r.push_back({-sc[size_t(j)], int32_t(j)});
    }
    std::sort(r.begin(), r.end());
    const int64_t n = std::min<int64_t>(K, int64_t(r.size()));
    ASSERT_EQ(n2[t], n) << "token " << t;
    std::set<int32_t> want, got;
    for (int64_t j = 0; j < n; ++j) want.insert(r[size_t(j)].second), got.insert(sel2[t * K + j]);
    EXPECT_EQ(want, got) << "token " << t;
    for (int64_t j = n; j < K; ++j) EXPECT_EQ(sel2[t * K + j], -1);
  }
  // A layer cannot both publish and consume; blocks need a size.
  a.out_blocks = blocks.data();
  EXPECT_THROW(indexer_topk(a), InternalError);
  a.out_blocks = nullptr;
  a.block_size = 0;
  EXPECT_THROW(indexer_topk(a), InternalError);
}

}  // namespace
}  // namespace deepinfer::ops::cpu
