#include "ops/cuda/swiglu.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

constexpr double kTolF32 = 1e-6, kTolBf16 = 8e-3;

// Direct formula (the CPU twin only exists fused inside ops::cpu::swiglu_mlp).
float ref_swiglu(float g, float u, float limit, float w) {
  if (limit > 0) {
    u = std::min(std::max(u, -limit), limit);
    g = std::min(g, limit);
  }
  return w * (g / (1.0f + std::exp(-g)) * u);
}

void run_case(int64_t rows, int64_t inter, float limit, bool weighted, bool bf16, uint64_t seed) {
  // Fused [rows, 2*inter] gate|up like the fused W1;W3 GEMM output; std 4 so both clamps bite.
  std::vector<float> gu = randn(rows * 2 * inter, seed, 4.0f);
  if (bf16) gu = bf16_round(gu);
  std::vector<float> rw = randn(rows, seed + 1, 0.3f, 0.5f);
  std::vector<float> ref(rows * inter);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < inter; ++c)
      ref[r * inter + c] = ref_swiglu(gu[r * 2 * inter + c], gu[r * 2 * inter + inter + c], limit, weighted ? rw[r] : 1.f);
  DevArray<float> drw(rw);
  std::vector<float> out;
  auto run = [&](auto& din, auto& dout, DType dt) {
    dout.poison();
    oc::swiglu({.gate = din.get(), .gate_stride = 2 * inter, .up = din.get() + inter, .up_stride = 2 * inter,
                .in_dtype = dt, .row_weight = weighted ? drw.get() : nullptr, .out = dout.get(), .out_stride = inter,
                .out_dtype = dt, .rows = rows, .inter = inter, .limit = limit},
               nullptr);
  };
  if (bf16) {
    DevArray<uint16_t> din(to_bf16(gu)), dout(rows * inter);
    run(din, dout, DType::kBF16);
    out = from_bf16(dout.download());
  } else {
    DevArray<float> din(gu), dout(rows * inter);
    run(din, dout, DType::kF32);
    out = dout.download();
  }
  const std::string cs = std::string(bf16 ? "bf16" : "f32") + " rows=" + std::to_string(rows) + " I=" +
                         std::to_string(inter) + " limit=" + std::to_string(int(limit)) + (weighted ? " weighted" : "");
  report("swiglu", cs, max_rel_err(out, ref), bf16 ? kTolBf16 : kTolF32);
}

TEST(CudaSwiglu, MatchesDirectFormula) {
  DI_REQUIRE_GPU();
  uint64_t seed = 500;
  for (int64_t rows : token_counts())
    for (float limit : {10.0f, 1.0f, 0.0f}) {
      run_case(rows, 2048, limit, false, true, ++seed);
      run_case(rows, 133, limit, true, false, ++seed);
    }
  run_case(64, 2048, 10.0f, true, true, ++seed);
}

}  // namespace
}  // namespace deepinfer::cuda
