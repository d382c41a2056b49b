#include "ops/cpu/router.h"
#include "ops/cuda/router.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

constexpr double kTolWeights = 1e-6;  // same fp32 formula, sqrt/log1p within an ulp

void run_case(int64_t T_, int E, int k, bool hash, DType table_dt, uint64_t seed, float gate_temp = 1.0f) {
  const int64_t V = 1000;
  std::vector<float> logits = randn(T_ * E, seed, 2.0f);
  logits[0] = 25.f;  // softplus's linear branch
  std::vector<float> bias = randn(E, seed + 1, 0.05f);
  std::mt19937_64 g(seed);
  std::vector<int32_t> tokens(T_), table(V * k);
  for (auto& t : tokens) t = int32_t(g() % V);
  for (auto& e : table) e = int32_t(g() % E);
  std::vector<int32_t> ref_ids(T_ * k);
  std::vector<float> ref_w(T_ * k);
  ops::cpu::route({.logits = logits.data(), .num_tokens = T_, .num_experts = E, .topk = k,
                   .bias = hash ? nullptr : bias.data(), .tid2eid = hash ? table.data() : nullptr,
                   .token_ids = tokens.data(), .vocab_size = V, .routed_scale = 1.5f, .gate_temp = gate_temp,
                   .out_ids = ref_ids.data(),
                   .out_weights = ref_w.data()});
  std::vector<int64_t> table64(table.begin(), table.end());
  DevArray<float> dl(logits), db(bias), dw(T_ * k);
  DevArray<int32_t> dtok(tokens), dt32(table), dids(T_ * k), dflag(std::vector<int32_t>{0});
  DevArray<int64_t> dt64(table64);
  dw.poison();
  dids.poison();
  oc::router({.logits = dl.get(), .logits_stride = E, .bias = hash ? nullptr : db.get(),
              .tid2eid = hash ? (table_dt == DType::kI64 ? (const void*)dt64.get() : (const void*)dt32.get()) : nullptr,
              .tid2eid_dtype = table_dt, .token_ids = dtok.get(), .vocab = V, .expert_ids = dids.get(),
              .weights = dw.get(), .tokens = T_, .num_experts = E, .topk = k, .route_scale = 1.5f,
              .gate_temp = gate_temp, .error_flag = dflag.get()},
             nullptr);
  EXPECT_EQ(dids.download(), ref_ids);
  EXPECT_EQ(dflag.download()[0], 0);
  const std::string cs = std::string(hash ? (table_dt == DType::kI64 ? "hash i64" : "hash i32") : "bias") +
                         " T=" + std::to_string(T_) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
                         " gate_temp=" + std::to_string(gate_temp);
  report("router", cs, max_rel_err(dw.download(), ref_w), kTolWeights);
}

TEST(CudaRouter, MatchesCpuTwin) {
  DI_REQUIRE_GPU();
  uint64_t seed = 300;
  for (int64_t T_ : {int64_t(1), int64_t(7), int64_t(64), int64_t(133)}) {
    run_case(T_, 256, 6, false, DType::kI32, ++seed);
    run_case(T_, 256, 6, true, DType::kI32, ++seed);
    run_case(T_, 256, 6, true, DType::kI64, ++seed);
    run_case(T_, 8, 2, false, DType::kI32, ++seed);  // tiny config
    run_case(T_, 133, 5, false, DType::kI32, ++seed);  // not a multiple of the warp
    run_case(T_, 384, 6, false, DType::kI32, ++seed, 1.3f);  // V4.1: gate_temp divides the logits
    run_case(T_, 6, 3, false, DType::kI32, ++seed, 0.7f);
  }
}

TEST(CudaRouter, FlagsOutOfRangeTokenIds) {
  DI_REQUIRE_GPU();
  std::vector<float> logits = randn(8, 1);
  DevArray<float> dl(logits), dw(2);
  DevArray<int32_t> dtok(std::vector<int32_t>{5}), dtab(std::vector<int32_t>{0, 1, 2, 3}), dids(2),
      dflag(std::vector<int32_t>{0});
  oc::router({.logits = dl.get(), .logits_stride = 8, .tid2eid = dtab.get(), .token_ids = dtok.get(), .vocab = 2,
              .expert_ids = dids.get(), .weights = dw.get(), .tokens = 1, .num_experts = 8, .topk = 2,
              .error_flag = dflag.get()},
             nullptr);
  EXPECT_EQ(dflag.download()[0], 1);
}

TEST(CudaRouter, RejectsBothBiasAndTable) {
  float f = 0;
  int32_t i = 0;
  EXPECT_THROW(oc::router({.logits = &f, .logits_stride = 8, .bias = &f, .tid2eid = &i, .token_ids = &i, .vocab = 1,
                           .expert_ids = &i, .weights = &f, .tokens = 1, .num_experts = 8, .topk = 2},
                          nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
