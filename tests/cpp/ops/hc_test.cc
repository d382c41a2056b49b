#include <gtest/gtest.h>

#include <cmath>

#include "ops/cpu/hc.h"
#include "test_util.h"

namespace deepinfer::ops::cpu {
namespace {
using testing::randn;

double sig(double x) { return 1 / (1 + std::exp(-x)); }

// Direct transcription of MODEL-DEEPSEEK-V4.md §2 for one token, in double.
void naive_hc(const float* X, int64_t n, int64_t D, const float* fn, const float* base, const float* scale, int iters,
              double eps_rms, double eps, std::vector<double>& u, std::vector<double>& post,
              std::vector<double>& C, std::vector<double>* pre_out = nullptr) {
  const int64_t nd = n * D, rows = (2 + n) * n;
  double ss = 0;
  for (int64_t i = 0; i < nd; ++i) ss += double(X[i]) * X[i];
  const double r = 1 / std::sqrt(ss / nd + eps_rms);
  std::vector<double> m(rows, 0);
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t i = 0; i < nd; ++i) m[j] += fn[j * nd + i] * (X[i] * r);
  std::vector<double> pre(n);
  post.assign(n, 0);
  for (int64_t k = 0; k < n; ++k) {
    pre[k] = sig(m[k] * scale[0] + base[k]) + eps;
    post[k] = 2 * sig(m[n + k] * scale[1] + base[n + k]);
  }
  C.assign(n * n, 0);
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t k = 0; k < n; ++k) s += std::exp(m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k]);
    for (int64_t k = 0; k < n; ++k)
      C[j * n + k] = std::exp(m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k]) / s + eps;
  }
  auto cols = [&] {
    for (int64_t k = 0; k < n; ++k) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += C[j * n + k];
      for (int64_t j = 0; j < n; ++j) C[j * n + k] /= s + eps;
    }
  };
  auto rowsn = [&] {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t k = 0; k < n; ++k) s += C[j * n + k];
      for (int64_t k = 0; k < n; ++k) C[j * n + k] /= s + eps;
    }
  };
  cols();
  for (int i = 0; i < iters - 1; ++i) {
    rowsn();
    cols();
  }
  if (pre_out) *pre_out = pre;
  u.assign(D, 0);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t d = 0; d < D; ++d) u[d] += pre[k] * X[k * D + d];
}

TEST(Hc, PrePostMatchNaive) {
  HcSpec s{.n = 4, .dim = 37, .sinkhorn_iters = 20, .rms_eps = 1e-6f, .hc_eps = 1e-6f};
  const int64_t T = 5, nd = s.n * s.dim, rows = (2 + s.n) * s.n;
  auto X = randn(T * nd, 1), fn = randn(rows * nd, 2, 0.05f), base = randn(rows, 3, 0.5f);
  auto scale = randn(3, 4, 0.3f, 1.0f), y = randn(T * s.dim, 5);
  std::vector<float> u(T * s.dim), post(T * s.n), comb(T * s.n * s.n), Xo(T * nd);
  hc_pre(X.data(), T, s, fn.data(), base.data(), scale.data(), u.data(), post.data(), comb.data());
  hc_post(X.data(), y.data(), post.data(), comb.data(), T, s, Xo.data());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> ru, rp, rc;
    naive_hc(X.data() + t * nd, s.n, s.dim, fn.data(), base.data(), scale.data(), 20, 1e-6, 1e-6, ru, rp, rc);
    for (int64_t d = 0; d < s.dim; ++d) EXPECT_NEAR(u[t * s.dim + d], ru[d], 1e-4);
    for (int64_t k = 0; k < s.n; ++k) EXPECT_NEAR(post[t * s.n + k], rp[k], 1e-5);
    for (int64_t i = 0; i < s.n * s.n; ++i) EXPECT_NEAR(comb[t * s.n * s.n + i], rc[i], 1e-5);
    for (int64_t k = 0; k < s.n; ++k)
      for (int64_t d = 0; d < s.dim; ++d) {
        double ref = rp[k] * y[t * s.dim + d];
        for (int64_t j = 0; j < s.n; ++j) ref += rc[j * s.n + k] * X[t * nd + j * s.dim + d];
        EXPECT_NEAR(Xo[t * nd + k * s.dim + d], ref, 1e-4);
      }
  }
}

// The mix logits on the packed kernel (spec.fn_packed, the CPU backend's fast path) vs gemm():
// the same sites up to the products' summation order; a token alone gives its batch's bits.
TEST(Hc, PackedFnMatchesGemmAndIsRowStable) {
  HcSpec s{.n = 4, .dim = 37, .sinkhorn_iters = 20, .rms_eps = 1e-6f, .hc_eps = 1e-6f};
  const int64_t T = 29, nd = s.n * s.dim, rows = (2 + s.n) * s.n;
  auto X = randn(T * nd, 11), fn = randn(rows * nd, 12, 0.05f), base = randn(rows, 13, 0.5f);
  auto scale = randn(3, 14, 0.3f, 1.0f);
  const PackedWeight P = pack_weight(fn.data(), rows, nd, nd);
  std::vector<float> u(T * s.dim), post(T * s.n), comb(T * s.n * s.n), u2 = u, post2 = post, comb2 = comb;
  hc_pre(X.data(), T, s, fn.data(), base.data(), scale.data(), u.data(), post.data(), comb.data());
  HcSpec sp = s;
  sp.fn_packed = &P;
  hc_pre(X.data(), T, sp, fn.data(), base.data(), scale.data(), u2.data(), post2.data(), comb2.data());
  for (size_t i = 0; i < u.size(); ++i) ASSERT_NEAR(u2[i], u[i], 1e-5) << i;
  for (size_t i = 0; i < comb.size(); ++i) ASSERT_NEAR(comb2[i], comb[i], 1e-5) << i;
  for (int64_t t : {int64_t(0), int64_t(17), T - 1}) {
    std::vector<float> u1(s.dim), p1(s.n), c1(s.n * s.n);
    hc_pre(X.data() + t * nd, 1, sp, fn.data(), base.data(), scale.data(), u1.data(), p1.data(), c1.data());
    for (int64_t d = 0; d < s.dim; ++d) ASSERT_EQ(u1[d], u2[t * s.dim + d]) << t;
    for (int64_t i = 0; i < s.n * s.n; ++i) ASSERT_EQ(c1[i], comb2[t * s.n * s.n + i]) << t;
  }
}

TEST(Hc, HeadMatchesNaive) {
  HcSpec s{.n = 3, .dim = 11};
  const int64_t T = 4, nd = s.n * s.dim;
  auto X = randn(T * nd, 6), fn = randn(s.n * nd, 7, 0.05f), base = randn(s.n, 8, 0.5f), scale = randn(1, 9);
  std::vector<float> h(T * s.dim);
  hc_head(X.data(), T, s, fn.data(), base.data(), scale.data(), h.data());
  for (int64_t t = 0; t < T; ++t) {
    const float* x = X.data() + t * nd;
    double ss = 0;
    for (int64_t i = 0; i < nd; ++i) ss += double(x[i]) * x[i];
    const double r = 1 / std::sqrt(ss / nd + 1e-6);
    for (int64_t d = 0; d < s.dim; ++d) {
      double ref = 0;
      for (int64_t k = 0; k < s.n; ++k) {
        double m = 0;
        for (int64_t i = 0; i < nd; ++i) m += fn[k * nd + i] * x[i] * r;
        ref += (sig(m * scale[0] + base[k]) + 1e-6) * x[k * s.dim + d];
      }
      EXPECT_NEAR(h[t * s.dim + d], ref, 1e-4);
    }
  }
}


// Single-pass wiring pieces (V4.1): hc_mix gives exactly hc_pre's post/comb and the pre weights that
// hc_pre collapses with; hc_collapse with them reproduces hc_pre's u bit for bit, and with null
// weights it is stream 0 (the one-hot start).
TEST(Hc, MixAndCollapseSplitPre) {
  HcSpec s{.n = 4, .dim = 29, .sinkhorn_iters = 7, .rms_eps = 1e-20f, .hc_eps = 1e-6f};
  const int64_t T = 7, nd = s.n * s.dim, rows = (2 + s.n) * s.n;
  auto X = randn(T * nd, 11), fn = randn(rows * nd, 12, 0.05f), base = randn(rows, 13, 0.5f);
  auto scale = randn(3, 14, 0.3f, 1.0f);
  std::vector<float> u(T * s.dim), post(T * s.n), comb(T * s.n * s.n);
  hc_pre(X.data(), T, s, fn.data(), base.data(), scale.data(), u.data(), post.data(), comb.data());
  std::vector<float> pre2(T * s.n), post2(T * s.n), comb2(T * s.n * s.n), u2(T * s.dim), u0(T * s.dim);
  hc_mix(X.data(), T, s, fn.data(), base.data(), scale.data(), pre2.data(), post2.data(), comb2.data());
  EXPECT_EQ(post, post2);
  EXPECT_EQ(comb, comb2);
  hc_collapse(X.data(), T, s, pre2.data(), u2.data());
  EXPECT_EQ(u, u2);
  hc_collapse(X.data(), T, s, nullptr, u0.data());
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> ru, rp, rc, rpre;
    naive_hc(X.data() + t * nd, s.n, s.dim, fn.data(), base.data(), scale.data(), 7, 1e-20, 1e-6, ru, rp, rc, &rpre);
    for (int64_t k = 0; k < s.n; ++k) EXPECT_NEAR(pre2[t * s.n + k], rpre[k], 1e-5);
    for (int64_t d = 0; d < s.dim; ++d) EXPECT_NEAR(u2[t * s.dim + d], ru[d], 1e-4);
    for (int64_t d = 0; d < s.dim; ++d) EXPECT_EQ(u0[t * s.dim + d], X[t * nd + d]);  // stream 0, exactly
  }
}

}  // namespace
}  // namespace deepinfer::ops::cpu
