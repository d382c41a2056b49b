#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "ops/cpu/moe.h"
#include "ops/cpu/router.h"
#include "deepinfer/error.h"
#include "test_util.h"

namespace deepinfer::ops::cpu {
namespace {
using testing::randn;

double sqsp(double x) { return std::sqrt(x > 20 ? x : std::log1p(std::exp(x))); }

TEST(Router, BiasAndHashMatchNaive) {
  const int64_t T = 5, E = 13, K = 3, V = 7;
  auto logits = randn(T * E, 1, 3.0f), bias = randn(E, 2, 0.5f);
  logits[0] = 25.f;  // softplus linear branch
  std::vector<int32_t> tid2eid(V * K), toks = {0, 6, 3, 3, 1};
  for (int64_t i = 0; i < V * K; ++i) tid2eid[i] = int32_t((i * 5 + 1) % E);
  tid2eid[3 * K + 1] = tid2eid[3 * K];  // duplicate ids in a row are legal
  for (bool hash : {false, true}) {
    std::vector<int32_t> ids(T * K);
    std::vector<float> w(T * K);
    route({.logits = logits.data(), .num_tokens = T, .num_experts = E, .topk = K,
           .bias = hash ? nullptr : bias.data(), .tid2eid = hash ? tid2eid.data() : nullptr,
           .token_ids = toks.data(), .vocab_size = V, .normalize = true, .routed_scale = 1.5f,
           .out_ids = ids.data(), .out_weights = w.data()});
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> want(K);
      if (hash) {
        for (int64_t j = 0; j < K; ++j) want[j] = tid2eid[toks[t] * K + j];
      } else {
        std::vector<std::pair<double, int32_t>> s;
        for (int64_t e = 0; e < E; ++e) s.push_back({sqsp(logits[t * E + e]) + bias[e], int32_t(e)});
        std::sort(s.rbegin(), s.rend());
        for (int64_t j = 0; j < K; ++j) want[j] = s[j].second;
      }
      double sum = 0;
      for (auto e : want) sum += sqsp(logits[t * E + e]);
      std::multiset<int32_t> a(ids.begin() + t * K, ids.begin() + t * K + K), b(want.begin(), want.end());
      EXPECT_EQ(a, b);
      for (int64_t j = 0; j < K; ++j) EXPECT_NEAR(w[t * K + j], 1.5 * sqsp(logits[t * E + ids[t * K + j]]) / sum, 1e-6);
    }
  }
  std::vector<int32_t> bad = {9};
  std::vector<int32_t> ids(K);
  std::vector<float> w(K);
  EXPECT_THROW(route({.logits = logits.data(), .num_tokens = 1, .num_experts = E, .topk = K,
                      .tid2eid = tid2eid.data(), .token_ids = bad.data(), .vocab_size = V, .out_ids = ids.data(),
                      .out_weights = w.data()}),
               InvalidArgument);
}

std::vector<double> naive_expert(const float* x, int64_t D, int64_t I, const std::vector<float>& w1,
                                 const std::vector<float>& w3, const std::vector<float>& w2, double L) {
  std::vector<double> act(I), y(D, 0);
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t d = 0; d < D; ++d) g += double(w1[i * D + d]) * x[d], u += double(w3[i * D + d]) * x[d];
    g = std::min(g, L);
    u = std::clamp(u, -L, L);
    act[i] = g / (1 + std::exp(-g)) * u;
  }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t i = 0; i < I; ++i) y[d] += w2[d * I + i] * act[i];
  return y;
}

TEST(Moe, ExpertsAndSharedMatchNaiveWithClamp) {
  const int64_t T = 7, D = 13, I = 9, E = 4, K = 2;
  const float L = 1.0f;  // small limit so both clamps bite
  auto x = randn(T * D, 1);
  std::vector<std::vector<float>> w1, w3, w2;
  std::vector<ExpertF32> ex;
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(randn(I * D, 10 + e, 0.5f));
    w3.push_back(randn(I * D, 20 + e, 0.5f));
    w2.push_back(randn(D * I, 30 + e, 0.5f));
  }
  for (int64_t e = 0; e < E; ++e) ex.push_back({w1[e].data(), w3[e].data(), w2[e].data()});
  std::vector<int32_t> ids = {0, 1, 2, 2, 3, 0, 1, 1, 0, 3, 2, 1, 3, 3};
  auto wts = randn(T * K, 5);
  std::vector<float> y(T * D, 0.f), ys(T * D, 0.f);
  moe_experts(x.data(), T, D, I, ex.data(), E, ids.data(), wts.data(), K, L, y.data());
  swiglu_mlp(x.data(), T, D, I, ex[1], L, ys.data(), false);
  bool clipped = false;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> ref(D, 0);
    for (int64_t j = 0; j < K; ++j) {
      const int e = ids[t * K + j];
      auto o = naive_expert(x.data() + t * D, D, I, w1[e], w3[e], w2[e], L);
      for (int64_t d = 0; d < D; ++d) ref[d] += wts[t * K + j] * o[d];
    }
    auto sref = naive_expert(x.data() + t * D, D, I, w1[1], w3[1], w2[1], L);
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_NEAR(y[t * D + d], ref[d], 1e-4);
      EXPECT_NEAR(ys[t * D + d], sref[d], 1e-4);
    }
    for (int64_t i = 0; i < I && !clipped; ++i) {
      double g = 0;
      for (int64_t d = 0; d < D; ++d) g += double(w1[0][i * D + d]) * x[t * D + d];
      clipped = g > L;
    }
  }
  EXPECT_TRUE(clipped) << "test inputs should exercise the gate clamp";
}


// V4.1's gate_temp divides the logits before sqrtsoftplus (selection and weights alike).
TEST(Router, GateTempDividesLogits) {
  const int64_t T = 3, E = 11, K = 4;
  auto logits = randn(T * E, 31, 4.0f), bias = randn(E, 32, 0.5f);
  logits[2] = 45.f;  // linear above 20 after the division too (45 / 1.7 > 20)
  const float temp = 1.7f;
  std::vector<int32_t> ids(T * K);
  std::vector<float> w(T * K);
  route({.logits = logits.data(), .num_tokens = T, .num_experts = E, .topk = K, .bias = bias.data(),
         .normalize = true, .routed_scale = 1.5f, .gate_temp = temp, .out_ids = ids.data(), .out_weights = w.data()});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<double, int32_t>> s;
    for (int64_t e = 0; e < E; ++e) s.push_back({sqsp(logits[t * E + e] / temp) + bias[e], int32_t(e)});
    std::sort(s.rbegin(), s.rend());
    double sum = 0;
    std::multiset<int32_t> want, got(ids.begin() + t * K, ids.begin() + t * K + K);
    for (int64_t j = 0; j < K; ++j) want.insert(s[j].second), sum += sqsp(logits[t * E + s[j].second] / temp);
    EXPECT_EQ(want, got);
    for (int64_t j = 0; j < K; ++j)
      EXPECT_NEAR(w[t * K + j], 1.5 * sqsp(logits[t * E + ids[t * K + j]] / temp) / sum, 1e-6);
  }
  EXPECT_THROW(route({.logits = logits.data(), .num_tokens = T, .num_experts = E, .topk = K, .bias = bias.data(),
                      .gate_temp = 0.f, .out_ids = ids.data(), .out_weights = w.data()}),
               InternalError);
}

}  // namespace
}  // namespace deepinfer::ops::cpu
