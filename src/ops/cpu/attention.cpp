#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

namespace deepinfer::ops::cpu {

void sparse_attention(const SparseAttnArgs& a) {
  const int64_t T = a.num_tokens, H = a.num_heads, d = a.head_dim;
  DI_CHECK(a.q && a.out && a.sink && a.win_begin && a.win_count, "sparse_attention: missing inputs");
  // Work item = (token, head). One pass with an online softmax (running max, rescaled sums) that
  // starts from the sink logit, so no per-item buffers are needed; a GPU kernel does the same.
  parallel_for(0, T * H, [&](int64_t th) {
    const int64_t t = th / H, h = th % H;
    const float* q = a.q + th * d;
    float* o = a.out + th * d;
    std::fill(o, o + d, 0.f);
    float mx = a.sink[h], denom = 1.0f;  // exp(sink - mx)
    int64_t nkeys = 0;
    auto visit = [&](const float* k) {
      float dot = 0.f;
      for (int64_t i = 0; i < d; ++i) dot += q[i] * k[i];
      const float s = dot * a.scale;
      if (s > mx) {
        const float c = std::exp(mx - s);
        denom *= c;
        for (int64_t i = 0; i < d; ++i) o[i] *= c;
        mx = s;
      }
      const float p = std::exp(s - mx);
      denom += p;
      for (int64_t i = 0; i < d; ++i) o[i] += p * k[i];
      ++nkeys;
    };
    const int64_t nw = a.win_count[t];
    for (int64_t j = 0; j < nw; ++j) visit(a.win_kv + (int64_t(a.win_begin[t]) + j) * d);
    const int64_t nc = a.cmp_count ? a.cmp_count[t] : 0;
    for (int64_t j = 0; j < nc; ++j) {
      const int32_t r = a.cmp_rows[a.cmp_offset[t] + j];
      if (r >= 0) visit(a.cmp_kv + int64_t(r) * d);
    }
    const float inv = nkeys == 0 ? 0.f : 1.0f / denom;
    for (int64_t i = 0; i < d; ++i) o[i] *= inv;
  }, grain_for(4 * d * (a.cmp_count ? 64 : 32)));
}

}  // namespace deepinfer::ops::cpu
