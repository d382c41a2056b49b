#include "ops/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/gemm.h"

namespace deepinfer::ops::cpu {

namespace {
// act [n, I] = silu(min(g, L)) * clamp(u, -L, L), in place into g.
void clamped_swiglu(float* g, const float* u, int64_t count, float L) {
  for (int64_t i = 0; i < count; ++i) {
    float gv = g[i], uv = u[i];
    if (L > 0.f) {
      gv = std::min(gv, L);
      uv = std::clamp(uv, -L, L);
    }
    g[i] = gv / (1.0f + std::exp(-gv)) * uv;
  }
}

// act [n, I] = silu(min(g, L)) * clamp(u, -L, L) (* row_scale), g and u the halves of gu [n, 2I].
void clamped_swiglu_rows(const float* gu, int64_t n, int64_t I, float L, const float* row_scale, float* act) {
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gu + r * 2 * I;
    float* a = act + r * I;
    for (int64_t i = 0; i < I; ++i) {
      float gv = g[i], uv = g[I + i];
      if (L > 0.f) {
        gv = std::min(gv, L);
        uv = std::clamp(uv, -L, L);
      }
      a[i] = gv / (1.0f + std::exp(-gv)) * uv;
    }
    if (row_scale)
      for (int64_t i = 0; i < I; ++i) a[i] *= row_scale[r];
  }
}

}  // namespace

void expert_forward_packed(const float* x, int64_t n, int64_t D, int64_t I, const PackedWeight& w13,
                           const PackedWeight& w2, float L, float* gu, float* act, float* out, const float* row_scale) {
  DI_CHECK(w13.n == 2 * I && w13.k == D && w2.n == D && w2.k == I, "expert_forward_packed: w13 [", w13.n, ",", w13.k,
           "] w2 [", w2.n, ",", w2.k, "] for D=", D, " I=", I);
  linear_packed(x, n, D, w13, gu, 2 * I);
  clamped_swiglu_rows(gu, n, I, L, row_scale, act);
  linear_packed(act, n, I, w2, out, D);
}

void expert_forward(const float* x, int64_t n, int64_t D, int64_t I, const ExpertF32& e, float L, float* g, float* u,
                    float* out, GemmKind kind, const float* row_scale) {
  linear(x, n, D, e.w1, I, g, kind);
  linear(x, n, D, e.w3, I, u, kind);
  clamped_swiglu(g, u, n * I, L);
  if (row_scale)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < I; ++i) g[r * I + i] *= row_scale[r];
  linear(g, n, I, e.w2, D, out, kind);
}

void swiglu_mlp(const float* x, int64_t T, int64_t D, int64_t I, const ExpertF32& e, float L, float* y,
                bool accumulate) {
  std::vector<float> g(static_cast<size_t>(T * I)), u(size_t(T * I));
  if (!accumulate) {
    expert_forward(x, T, D, I, e, L, g.data(), u.data(), y);
    return;
  }
  std::vector<float> out(static_cast<size_t>(T * D));
  expert_forward(x, T, D, I, e, L, g.data(), u.data(), out.data());
  for (int64_t i = 0; i < T * D; ++i) y[i] += out[i];
}

void moe_experts(const float* x, int64_t T, int64_t D, int64_t I, const ExpertF32* experts, int64_t E,
                 const int32_t* ids, const float* weights, int64_t k, float L, float* y) {
  // Counting sort of (token, slot) pairs by expert.
  std::vector<int64_t> start(size_t(E + 1), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    DI_CHECK(ids[i] >= 0 && ids[i] < E, "moe_experts: expert id ", ids[i], " at ", i);
    start[ids[i] + 1]++;
  }
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<int64_t> pairs(static_cast<size_t>(T * k));
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < T * k; ++i) pairs[fill[ids[i]]++] = i;

  int64_t max_n = 0;
  for (int64_t e = 0; e < E; ++e) max_n = std::max(max_n, start[e + 1] - start[e]);
  std::vector<float> xs(static_cast<size_t>(max_n * D)), g(size_t(max_n * I)), u(size_t(max_n * I)), out(size_t(max_n * D));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = start[e + 1] - start[e];
    if (n == 0) continue;
    const int64_t* pe = pairs.data() + start[e];
    for (int64_t r = 0; r < n; ++r) std::copy_n(x + (pe[r] / k) * D, D, xs.data() + r * D);
    expert_forward(xs.data(), n, D, I, experts[e], L, g.data(), u.data(), out.data());
    // Scatter serially per expert: pairs of one expert hit distinct tokens unless a token lists
    // the expert twice, which then adds twice (as intended).
    for (int64_t r = 0; r < n; ++r) {
      const float w = weights[pe[r]];
      float* yt = y + (pe[r] / k) * D;
      const float* o = out.data() + r * D;
      for (int64_t d = 0; d < D; ++d) yt[d] += w * o[d];
    }
  }
}

}  // namespace deepinfer::ops::cpu
