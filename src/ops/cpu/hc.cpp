#include "ops/cpu/hc.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "core/parallel.h"
#include "ops/cpu/parallel_grain.h"
#include "ops/cpu/gemm.h"

namespace deepinfer::ops::cpu {

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Σ x[i]^2 in double (each square exact) in one fixed order: 8 lane sums (lane l adds the
// i = l mod 8 terms in increasing i), folded 4+4, 2+2, 1+1, then the n % 8 tail in order. Eight
// independent chains instead of one: the sum does not wait on the adder's latency per element.
double sum_squares(const float* x, int64_t n) {
  typedef double D8 __attribute__((vector_size(8 * sizeof(double))));
  const int64_t n8 = n - n % 8;
  D8 acc = D8{};
  for (int64_t i = 0; i < n8; i += 8) {
    const D8 v = {x[i], x[i + 1], x[i + 2], x[i + 3], x[i + 4], x[i + 5], x[i + 6], x[i + 7]};
    acc = acc + v * v;
  }
  double l[8];
  __builtin_memcpy(l, &acc, sizeof(l));
  for (int w = 4; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) l[i] = l[i] + l[i + w];
  double s = l[0];
  for (int64_t i = n8; i < n; ++i) s = s + double(x[i]) * x[i];
  return s;
}

// mix[t, :] = rsqrt(mean(X[t]^2) + eps) * (fn @ X[t]): one GEMM over all tokens, then the
// per-token RMS factor (equal to normalising X first, as transformers does).
std::vector<float> mix_logits(const float* X, int64_t T, const HcSpec& s, const float* fn, int64_t rows) {
  const int64_t nd = s.n * s.dim;
  std::vector<float> mix(static_cast<size_t>(T * rows));
  if (s.fn_packed && s.gemm == GemmKind::kFast) {
    DI_CHECK(s.fn_packed->n == rows && s.fn_packed->k == nd, "hc: packed fn [", s.fn_packed->n, ",", s.fn_packed->k,
             "] for [", rows, ",", nd, "]");
    linear_packed(X, T, nd, *s.fn_packed, mix.data(), rows);
  } else {
    gemm(s.gemm, T, rows, nd, X, nd, fn, nd, /*trans_b=*/true, mix.data(), rows);
  }
  parallel_for(0, T, [&](int64_t t) {
    const double ss = sum_squares(X + t * nd, nd);
    const float r = 1.0f / std::sqrt(float(ss / double(nd)) + s.rms_eps);
    for (int64_t j = 0; j < rows; ++j) mix[t * rows + j] *= r;
  }, grain_for(2 * nd));
  return mix;
}

// Σ_k w[k]·X[t,k,:] into out [D].
void collapse(const float* x, const float* w, const HcSpec& s, float* out) {
  for (int64_t d = 0; d < s.dim; ++d) {
    float acc = 0.f;
    for (int64_t k = 0; k < s.n; ++k) acc += w[k] * x[k * s.dim + d];
    out[d] = acc;
  }
}
}  // namespace

namespace {
// The site's pre, post and comb of one token from its mix logits m [(2+n)n].
void site_weights(const float* m, const HcSpec& s, const float* base, const float* scale, float* pre, float* post,
                  float* c) {
  const int64_t n = s.n;
  for (int64_t k = 0; k < n; ++k) pre[k] = sigmoid(m[k] * scale[0] + base[k]) + s.hc_eps;
  for (int64_t k = 0; k < n; ++k) post[k] = 2.0f * sigmoid(m[n + k] * scale[1] + base[n + k]);
  for (int64_t j = 0; j < n; ++j) {  // softmax over k in each row j; c[j*n + k]
    float mx = -INFINITY;
    for (int64_t k = 0; k < n; ++k) {
      c[j * n + k] = m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k];
      mx = std::max(mx, c[j * n + k]);
    }
    float sum = 0.f;
    for (int64_t k = 0; k < n; ++k) sum += (c[j * n + k] = std::exp(c[j * n + k] - mx));
    for (int64_t k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / sum + s.hc_eps;
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < n; ++k) {
      float cs = 0.f;
      for (int64_t j = 0; j < n; ++j) cs += c[j * n + k];
      for (int64_t j = 0; j < n; ++j) c[j * n + k] /= (cs + s.hc_eps);
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float rs = 0.f;
      for (int64_t k = 0; k < n; ++k) rs += c[j * n + k];
      for (int64_t k = 0; k < n; ++k) c[j * n + k] /= (rs + s.hc_eps);
    }
  };
  col_norm();
  for (int64_t it = 0; it + 1 < s.sinkhorn_iters; ++it) {
    row_norm();
    col_norm();
  }
}
}  // namespace

void hc_pre(const float* X, int64_t T, const HcSpec& s, const float* fn, const float* base, const float* scale,
            float* u, float* post, float* comb) {
  const int64_t n = s.n, rows = (2 + n) * n;
  DI_CHECK(n > 0 && n <= 16, "hc_mult=", n);
  std::vector<float> mix = mix_logits(X, T, s, fn, rows);
  parallel_for(0, T, [&](int64_t t) {
    float pre[16];
    site_weights(mix.data() + t * rows, s, base, scale, pre, post + t * n, comb + t * n * n);
    collapse(X + t * n * s.dim, pre, s, u + t * s.dim);
  }, grain_for(2 * n * s.dim + 40 * n * n * s.sinkhorn_iters));
}

void hc_mix(const float* X, int64_t T, const HcSpec& s, const float* fn, const float* base, const float* scale,
            float* pre, float* post, float* comb) {
  const int64_t n = s.n, rows = (2 + n) * n;
  DI_CHECK(n > 0 && n <= 16, "hc_mult=", n);
  std::vector<float> mix = mix_logits(X, T, s, fn, rows);
  parallel_for(0, T, [&](int64_t t) {
    site_weights(mix.data() + t * rows, s, base, scale, pre + t * n, post + t * n, comb + t * n * n);
  }, grain_for(40 * n * n * s.sinkhorn_iters));
}

void hc_collapse(const float* X, int64_t T, const HcSpec& s, const float* w, float* u) {
  const int64_t n = s.n;
  DI_CHECK(n > 0 && n <= 16, "hc_mult=", n);
  parallel_for(0, T, [&](int64_t t) {
    float one_hot[16] = {1.0f};
    collapse(X + t * n * s.dim, w ? w + t * n : one_hot, s, u + t * s.dim);
  }, grain_for(2 * n * s.dim));
}

void hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t T, const HcSpec& s,
             float* X_out) {
  const int64_t n = s.n, D = s.dim;
  parallel_for(0, T, [&](int64_t t) {
    const float* x = X + t * n * D;
    const float* c = comb + t * n * n;
    const float* yt = y + t * D;
    for (int64_t k = 0; k < n; ++k) {
      float* o = X_out + (t * n + k) * D;
      const float pk = post[t * n + k];
      for (int64_t d = 0; d < D; ++d) o[d] = pk * yt[d];
      for (int64_t j = 0; j < n; ++j) {
        const float w = c[j * n + k];
        const float* xj = x + j * D;
        for (int64_t d = 0; d < D; ++d) o[d] += w * xj[d];
      }
    }
  }, grain_for(2 * n * n * D));
}

void hc_head(const float* X, int64_t T, const HcSpec& s, const float* fn, const float* base, const float* scale,
             float* h) {
  const int64_t n = s.n;
  DI_CHECK(n > 0 && n <= 16, "hc_mult=", n);
  std::vector<float> mix = mix_logits(X, T, s, fn, n);
  parallel_for(0, T, [&](int64_t t) {
    float pre[16];
    for (int64_t k = 0; k < n; ++k) pre[k] = sigmoid(mix[t * n + k] * scale[0] + base[k]) + s.hc_eps;
    collapse(X + t * n * s.dim, pre, s, h + t * s.dim);
  }, grain_for(2 * n * s.dim));
}

}  // namespace deepinfer::ops::cpu
