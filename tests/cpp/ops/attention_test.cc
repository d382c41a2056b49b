#include <gtest/gtest.h>

#include <cmath>

#include "ops/cpu/attention.h"
#include "test_util.h"

namespace deepinfer::ops::cpu {
namespace {
using testing::randn;

TEST(SparseAttention, MatchesSoftmaxWithSink) {
  const int64_t T = 6, H = 3, d = 19, nwin = 30, ncmp = 11;
  auto q = randn(T * H * d, 1), win = randn(nwin * d, 2), cmp = randn(ncmp * d, 3), sink = randn(H, 4);
  std::vector<int32_t> wb = {0, 3, 7, 10, 29, 0}, wc = {1, 5, 16, 20, 1, 0};
  std::vector<int32_t> rows = {4, -1, 0, 10, 2, 2, 7};  // token lists below; -1 skipped
  std::vector<int64_t> off = {0, 0, 1, 3, 0, 5};
  std::vector<int32_t> cnt = {0, 1, 2, 3, 5, 0};  // last token: no keys at all -> zeros
  std::vector<float> out(T * H * d, NAN);
  SparseAttnArgs a{.q = q.data(), .num_tokens = T, .num_heads = H, .head_dim = d, .win_kv = win.data(),
                   .win_begin = wb.data(), .win_count = wc.data(), .cmp_kv = cmp.data(), .cmp_rows = rows.data(),
                   .cmp_offset = off.data(), .cmp_count = cnt.data(), .sink = sink.data(),
                   .scale = 1.0f / std::sqrt(float(d)), .out = out.data()};
  sparse_attention(a);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<const float*> keys;
    for (int j = 0; j < wc[t]; ++j) keys.push_back(win.data() + (wb[t] + j) * d);
    for (int j = 0; j < cnt[t]; ++j)
      if (rows[off[t] + j] >= 0) keys.push_back(cmp.data() + rows[off[t] + j] * d);
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.data() + (t * H + h) * d;
      std::vector<double> s;
      for (auto k : keys) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += double(qh[i]) * k[i];
        s.push_back(dot / std::sqrt(double(d)));
      }
      double den = std::exp(double(sink[h]));
      for (double v : s) den += std::exp(v);
      for (int64_t i = 0; i < d; ++i) {
        double o = 0;
        for (size_t j = 0; j < keys.size(); ++j) o += std::exp(s[j]) / den * keys[j][i];
        if (keys.empty()) o = 0;
        EXPECT_NEAR(out[(t * H + h) * d + i], o, 2e-5) << t << " " << h << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops::cpu
