#include "ops/cpu/engram.h"
#include "ops/cuda/engram.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// Same fp32 formula, sums in another order: ~1e-6 relative on the gate, times |value|.
constexpr double kTol = 2e-5;

void run_case(int64_t T_, int n, int64_t D, uint64_t seed) {
  std::vector<float> X = randn(T_ * n * D, seed), kv = randn(T_ * (n + 1) * D, seed + 1);
  std::vector<float> w = randn(n * D, seed + 2, 0.3f, 1.0f);
  std::vector<uint8_t> dead(size_t(T_), 0);
  for (int64_t t = 2; t < T_; t += 5) dead[size_t(t)] = 1;
  std::vector<float> ref = X;
  ops::cpu::engram_inject({.x = ref.data(), .kv = kv.data(), .w = w.data(), .dead = dead.data(), .tokens = T_,
                           .n = n, .dim = D, .eps = 1e-20f});
  DevArray<float> dx(X), dkv(kv), dw(w);
  DevArray<uint8_t> dd(dead);
  oc::engram_inject({.x = dx.get(), .x_stride = n * D, .kv = dkv.get(), .kv_stride = (n + 1) * D, .w = dw.get(),
                     .dead = dd.get(), .tokens = T_, .n = n, .dim = D, .eps = 1e-20f},
                    nullptr);
  const std::vector<float> got = dx.download();
  report("engram_inject", "T=" + std::to_string(T_) + " n=" + std::to_string(n) + " D=" + std::to_string(D),
         max_rel_err(got, ref), kTol);
  for (int64_t t = 2; t < T_; t += 5)  // DEAD tokens are untouched, exactly
    for (int64_t i = 0; i < n * D; ++i) ASSERT_EQ(got[size_t(t * n * D + i)], X[size_t(t * n * D + i)]);
}

TEST(CudaEngram, MatchesCpuTwin) {
  DI_REQUIRE_GPU();
  uint64_t seed = 4000;
  for (int64_t T_ : token_counts()) {
    run_case(T_, 4, 5120, seed += 10);  // release width
    run_case(T_, 4, 37, seed += 10);    // odd
  }
}

TEST(CudaEngram, RejectsBadShapes) {
  float f = 0;
  EXPECT_THROW(oc::engram_inject({.x = &f, .x_stride = 1, .kv = &f, .kv_stride = 1, .w = &f, .tokens = 1, .n = 4,
                                  .dim = 8},
                                 nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
