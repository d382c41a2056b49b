#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

namespace deepinfer::ops::cpu {

void sparse_attention(const SparseAttnArgs& a) {
  const int64_t T = a.num_tokens, H = a.num_heads, d = a.head_dim;
  DI_CHECK(a.q && a.out && a.sink && a.win_begin && a.win_count, "sparse_attention: missing inputs");
  // Work item = (token, head); each gathers its key list once per token into a small buffer.
  parallel_for(0, T * H, [&](int64_t th) {
    const int64_t t = th / H, h = th % H;
    const float* q = a.q + th * d;
    float* o = a.out + th * d;
    const int64_t nw = a.win_count[t];
    const int64_t nc = a.cmp_count ? a.cmp_count[t] : 0;
    std::vector<const float*> keys;
    keys.reserve(size_t(nw + nc));
    for (int64_t j = 0; j < nw; ++j) keys.push_back(a.win_kv + (int64_t(a.win_begin[t]) + j) * d);
    for (int64_t j = 0; j < nc; ++j) {
      const int32_t r = a.cmp_rows[a.cmp_offset[t] + j];
      if (r >= 0) keys.push_back(a.cmp_kv + int64_t(r) * d);
    }
    std::vector<float> s(keys.size());
    float mx = a.sink[h];
    for (size_t j = 0; j < keys.size(); ++j) {
      float dot = 0.f;
      for (int64_t i = 0; i < d; ++i) dot += q[i] * keys[j][i];
      s[j] = dot * a.scale;
      mx = std::max(mx, s[j]);
    }
    float denom = std::exp(a.sink[h] - mx);
    std::fill(o, o + d, 0.f);
    for (size_t j = 0; j < keys.size(); ++j) {
      const float p = std::exp(s[j] - mx);
      denom += p;
      for (int64_t i = 0; i < d; ++i) o[i] += p * keys[j][i];
    }
    const float inv = keys.empty() ? 0.f : 1.0f / denom;
    for (int64_t i = 0; i < d; ++i) o[i] *= inv;
  }, grain_for(4 * d * (a.cmp_count ? 64 : 32)));
}

}  // namespace deepinfer::ops::cpu
