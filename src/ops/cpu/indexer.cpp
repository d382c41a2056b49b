#include "ops/cpu/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

namespace deepinfer::ops::cpu {
namespace {
// The candidate blocks one token keeps (publish side): best `keep` blocks by max score, the
// newest block pinned; written ascending into out[0..B), -1 padded.
void select_blocks(const std::vector<float>& score, int64_t n, int64_t bs, int64_t B, int32_t* out) {
  const int64_t nb = (n + bs - 1) / bs, keep = std::min(B, nb);
  thread_local std::vector<float> best;
  thread_local std::vector<int32_t> order;
  best.assign(size_t(nb), -INFINITY);
  for (int64_t j = 0; j < n; ++j) best[size_t(j / bs)] = std::max(best[size_t(j / bs)], score[size_t(j)]);
  if (nb > 0) best[size_t(nb - 1)] = INFINITY;  // the block of the newest visible entry
  order.resize(size_t(nb));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t x, int32_t y) {
    return best[size_t(x)] > best[size_t(y)] || (best[size_t(x)] == best[size_t(y)] && x < y);
  });
  std::sort(order.begin(), order.begin() + keep);
  for (int64_t b = 0; b < B; ++b) out[b] = b < keep ? order[size_t(b)] : -1;
}
}  // namespace

void indexer_topk(const IndexerArgs& a) {
  const int64_t Hi = a.num_heads, di = a.head_dim, K = a.topk;
  DI_CHECK(K >= 0 && a.out_rows && a.out_count, "indexer_topk: bad output");
  const bool blocks = a.out_blocks || a.in_blocks;
  DI_CHECK(!blocks || (a.block_size > 0 && a.topk_blocks > 0), "indexer_topk: candidate blocks of size ", a.block_size,
           " x ", a.topk_blocks);
  DI_CHECK(!(a.out_blocks && a.in_blocks), "indexer_topk: a layer both publishes and consumes candidate blocks");
  parallel_for(0, a.num_tokens, [&](int64_t t) {
    const int64_t n = a.cand_count[t];
    const int32_t* cand = a.cand_rows + a.cand_offset[t];
    thread_local std::vector<float> score;  // capacity reused across tokens and calls
    thread_local std::vector<int32_t> order;
    thread_local std::vector<uint8_t> inside;  // consume: candidate j lies in a kept block
    score.assign(size_t(n), 0.f);
    if (a.in_blocks) {
      inside.assign(size_t(n), 0);
      for (int64_t b = 0; b < a.topk_blocks; ++b) {
        const int64_t blk = a.in_blocks[t * a.topk_blocks + b];
        for (int64_t j = blk * a.block_size; blk >= 0 && j < std::min(n, (blk + 1) * a.block_size); ++j)
          inside[size_t(j)] = 1;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      if (a.in_blocks && !inside[size_t(j)]) {
        score[j] = -INFINITY;
        continue;
      }
      const float* k = a.k_pool + int64_t(cand[j]) * di;
      float acc = 0.f;
      for (int64_t h = 0; h < Hi; ++h) {
        const float* q = a.q + (t * Hi + h) * di;
        float dot = 0.f;
        for (int64_t i = 0; i < di; ++i) dot += q[i] * k[i];
        acc += (std::max(dot, 0.f) * a.qk_scale) * (a.w[t * Hi + h] * a.w_scale);
      }
      score[j] = acc;
    }
    if (a.out_scores) std::copy(score.begin(), score.end(), a.out_scores + t * a.scores_stride);
    if (a.out_blocks) select_blocks(score, n, a.block_size, a.topk_blocks, a.out_blocks + t * a.topk_blocks);
    int64_t live = n;  // candidates that may be picked
    if (a.in_blocks) live = std::count(inside.begin(), inside.begin() + n, uint8_t(1));
    const int64_t k = std::min(K, live);
    order.resize(size_t(n));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
      return score[x] > score[y] || (score[x] == score[y] && x < y);
    });
    int32_t* out = a.out_rows + t * K;
    for (int64_t j = 0; j < K; ++j) out[j] = j < k ? cand[order[j]] : -1;
    a.out_count[t] = int32_t(k);
  }, grain_for(2 * Hi * di * std::max<int64_t>(1, a.num_tokens ? a.cand_count[a.num_tokens - 1] : 0)));
}

}  // namespace deepinfer::ops::cpu
