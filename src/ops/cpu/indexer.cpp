#include "ops/cpu/indexer.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

namespace deepinfer::ops::cpu {

void indexer_topk(const IndexerArgs& a) {
  const int64_t Hi = a.num_heads, di = a.head_dim, K = a.topk;
  DI_CHECK(K >= 0 && a.out_rows && a.out_count, "indexer_topk: bad output");
  parallel_for(0, a.num_tokens, [&](int64_t t) {
    const int64_t n = a.cand_count[t];
    const int32_t* cand = a.cand_rows + a.cand_offset[t];
    thread_local std::vector<float> score;  // capacity reused across tokens and calls
    thread_local std::vector<int32_t> order;
    score.assign(size_t(n), 0.f);
    for (int64_t j = 0; j < n; ++j) {
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
    const int64_t k = std::min(K, n);
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
