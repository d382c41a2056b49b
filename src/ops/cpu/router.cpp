#include "ops/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"

namespace deepinfer::ops::cpu {

namespace {
float sqrt_softplus(float x) {
  const float sp = x > 20.f ? x : std::log1p(std::exp(x));
  return std::sqrt(sp);
}
}  // namespace

void route(const RouterArgs& a) {
  const int64_t T = a.num_tokens, E = a.num_experts, K = a.topk;
  DI_CHECK(K > 0 && K <= E, "route: topk=", K, " experts=", E);
  DI_CHECK(a.gate_temp > 0.f && std::isfinite(a.gate_temp), "route: gate_temp=", a.gate_temp);
  if (a.tid2eid) {  // validate ids up front: no throwing inside the parallel region
    for (int64_t t = 0; t < T; ++t) {
      const int64_t tok = a.token_ids[t];
      if (tok < 0 || tok >= a.vocab_size)
        DI_THROW(InvalidArgument, "route: token id ", tok, " at position ", t, " outside tid2eid rows [0,",
                 a.vocab_size, ")");
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = a.tid2eid[tok * K + j];
        if (e < 0 || e >= E)
          DI_THROW(InvalidArgument, "route: tid2eid[", tok, "][", j, "] = ", e, " outside [0,", E, ")");
      }
    }
  }
  parallel_for(0, T, [&](int64_t t) {
    thread_local std::vector<float> s, biased;  // capacity reused across tokens
    thread_local std::vector<int32_t> order;
    s.resize(size_t(E));
    if (a.gate_temp == 1.0f)  // x / 1 == x: V4's path, spelled out so it stays bit-identical
      for (int64_t e = 0; e < E; ++e) s[e] = sqrt_softplus(a.logits[t * E + e]);
    else
      for (int64_t e = 0; e < E; ++e) s[e] = sqrt_softplus(a.logits[t * E + e] / a.gate_temp);
    int32_t* ids = a.out_ids + t * K;
    if (a.tid2eid) {
      for (int64_t j = 0; j < K; ++j) ids[j] = a.tid2eid[int64_t(a.token_ids[t]) * K + j];
    } else {
      biased = s;
      if (a.bias)
        for (int64_t e = 0; e < E; ++e) biased[e] += a.bias[e];
      order.resize(size_t(E));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t x, int32_t y) {
        return biased[x] > biased[y] || (biased[x] == biased[y] && x < y);
      });
      for (int64_t j = 0; j < K; ++j) ids[j] = order[j];
    }
    float sum = 0.f;
    for (int64_t j = 0; j < K; ++j) sum += s[ids[j]];
    const float denom = a.normalize ? sum + 1e-20f : 1.0f;
    for (int64_t j = 0; j < K; ++j) a.out_weights[t * K + j] = s[ids[j]] / denom * a.routed_scale;
  }, grain_for(30 * E));
}

}  // namespace deepinfer::ops::cpu
