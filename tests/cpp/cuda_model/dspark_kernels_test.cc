// dspark_tail (the DSpark drafter's greedy Markov tail on the device) vs its host twin: random
// non-zero inputs, odd sizes, sequences drafting 0 .. B drafts, outputs poisoned first so an
// unwritten drafted row fails. Bad arguments are refused before any CUDA call (runs without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "deepinfer/error.h"
#include "model/deepseek/cuda/dspark_kernels.h"
#include "ops/cuda/runtime.h"
#include "../cuda/test_util.h"

namespace deepinfer::model::ds::cuda {
namespace cuda = deepinfer::cuda;
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * (d(g) + 1e-3f);
  return v;
}
using cuda::test::down;
using cuda::test::up;

TEST(DSparkKernels, TailMatchesHost) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  for (const int64_t V : {317, 1031, 4099}) {
    const int64_t S = 4, B = 5, D = 37, Rk = 13;
    const std::vector<int32_t> anchor = {3, int32_t(V - 1), 0, 101}, drafts = {5, 0, 3, 1};
    std::vector<float> logits = randn(size_t(S * B * V), 1 + uint32_t(V), 2.f), xhat = randn(size_t(S * B * D), 2);
    const std::vector<float> emb = randn(size_t(V * Rk), 3), head = randn(size_t(V * Rk), 4, 0.5f);
    const std::vector<float> conf = randn(size_t(D + Rk), 5, 0.1f);
    std::vector<int32_t> tok(size_t(S * B), -7);
    std::vector<float> lp(size_t(S * B), NAN), cl(size_t(S * B), NAN);
    DSparkTailParams h{.logits = logits.data(), .xhat = xhat.data(), .mk_embed = emb.data(), .mk_head = head.data(),
                       .conf = conf.data(), .anchor = anchor.data(), .num_drafts = drafts.data(), .tokens = tok.data(),
                       .logprobs = lp.data(), .conf_logits = cl.data(), .seqs = S, .block = B, .vocab = V,
                       .dim = D, .rank = Rk};
    cuda::DeviceBuffer dl = up(logits), dx = up(xhat), de = up(emb), dh = up(head), dc = up(conf), da = up(anchor),
                       dd = up(drafts), dt = up(tok), dlp = up(lp), dcl = up(cl);
    dspark_tail_host(h);
    DSparkTailParams p = h;
    p.logits = dl.as<float>(), p.xhat = dx.as<float>(), p.mk_embed = de.as<float>(), p.mk_head = dh.as<float>();
    p.conf = dc.as<float>(), p.anchor = da.as<int32_t>(), p.num_drafts = dd.as<int32_t>();
    p.tokens = dt.as<int32_t>(), p.logprobs = dlp.as<float>(), p.conf_logits = dcl.as<float>();
    dspark_tail(p, nullptr);
    const std::vector<float> gl = down<float>(dl, logits.size()), glp = down<float>(dlp, lp.size());
    const std::vector<float> gcl = down<float>(dcl, cl.size());
    const std::vector<int32_t> gt = down<int32_t>(dt, tok.size());
    double dlog = 0;
    for (int64_t j = 0; j < S; ++j)
      for (int64_t i = 0; i < drafts[size_t(j)]; ++i) {
        const size_t t = size_t(j * B + i);
        EXPECT_EQ(gt[t], tok[t]) << "V " << V << " seq " << j << " draft " << i;
        EXPECT_NEAR(glp[t], lp[t], 1e-5 * (1 + std::fabs(lp[t])));
        EXPECT_NEAR(gcl[t], cl[t], 1e-6 * (1 + std::fabs(cl[t])));
        for (int64_t v = 0; v < V; ++v)
          dlog = std::max(dlog, std::fabs(double(gl[t * V + v]) - double(logits[t * V + v])));
      }
    EXPECT_LE(dlog, 1e-5) << "V " << V;
    // Rows past num_drafts are left alone (the head logits stay).
    EXPECT_EQ(gt[size_t(1 * B)], -7);
  }
}

TEST(DSparkKernels, TailRefusesBadArguments) {
  float f = 0;
  int32_t i = 0;
  DSparkTailParams p{.logits = &f, .xhat = &f, .mk_embed = &f, .mk_head = &f, .conf = &f, .anchor = &i,
                     .num_drafts = &i, .tokens = &i, .logprobs = &f, .conf_logits = &f, .seqs = 1, .block = 1,
                     .vocab = 1, .dim = 1, .rank = 1};
  DSparkTailParams q = p;
  q.mk_head = nullptr;
  EXPECT_THROW(dspark_tail(q, nullptr), InvalidArgument);
  q = p;
  q.rank = 1 << 20;
  EXPECT_THROW(dspark_tail(q, nullptr), InvalidArgument);
  q = p;
  q.block = 0;
  EXPECT_THROW(dspark_tail_host(q), InvalidArgument);
  q = p;
  i = 5;  // anchor out of the vocabulary
  q.num_drafts = &i;
  EXPECT_THROW(dspark_tail_host(q), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::model::ds::cuda
