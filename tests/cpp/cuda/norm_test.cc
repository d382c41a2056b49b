#include "ops/cpu/rmsnorm.h"
#include "ops/cuda/norm.h"
#include "test_util.h"

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;

// bf16 output: one rounding of 2^-9 relative; f32: order of the sum of squares only.
constexpr double kTolBf16 = 8e-3, kTolF32 = 2e-6;

void run_case(int64_t rows, int64_t dim, bool bf16, bool weighted, int64_t pad, bool in_place) {
  const int64_t stride = dim + pad;
  std::vector<float> x = randn(rows * stride, 10 + rows + dim, 2.0f, 0.3f);
  std::vector<float> w = randn(dim, 20 + dim, 0.1f, 1.0f);
  if (bf16) {
    x = bf16_round(x);
    w = bf16_round(w);
  }
  std::vector<float> ref(rows * stride);
  ops::cpu::rmsnorm(x.data(), stride, weighted ? w.data() : nullptr, ref.data(), stride, rows, dim, 1e-6f);

  std::vector<float> out(rows * stride);
  if (bf16) {
    DevArray<uint16_t> dx(to_bf16(x)), dw(to_bf16(w)), dy(rows * stride);
    dy.poison();
    oc::rmsnorm({.x = dx.get(), .x_dtype = DType::kBF16, .x_stride = stride, .w = weighted ? dw.get() : nullptr,
                 .w_dtype = DType::kBF16, .y = in_place ? dx.get() : dy.get(), .y_dtype = DType::kBF16,
                 .y_stride = stride, .rows = rows, .dim = dim},
                nullptr);
    out = from_bf16(in_place ? dx.download() : dy.download());
  } else {
    DevArray<float> dx(x), dw(w), dy(rows * stride);
    dy.poison();
    oc::rmsnorm({.x = dx.get(), .x_dtype = DType::kF32, .x_stride = stride, .w = weighted ? dw.get() : nullptr,
                 .w_dtype = DType::kF32, .y = in_place ? dx.get() : dy.get(), .y_dtype = DType::kF32,
                 .y_stride = stride, .rows = rows, .dim = dim},
                nullptr);
    out = in_place ? dx.download() : dy.download();
  }
  // Compare only the dim columns (padding is not written).
  std::vector<float> o2, r2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) {
      o2.push_back(out[r * stride + c]);
      r2.push_back(ref[r * stride + c]);
    }
  const std::string cs = std::string(bf16 ? "bf16" : "f32") + " rows=" + std::to_string(rows) +
                         " dim=" + std::to_string(dim) + (weighted ? "" : " unweighted") + (pad ? " strided" : "") +
                         (in_place ? " inplace" : "");
  report("rmsnorm", cs, max_rel_err(o2, r2), bf16 ? kTolBf16 : kTolF32);
}

TEST(CudaRmsNorm, MatchesCpuTwin) {
  DI_REQUIRE_GPU();
  for (int64_t rows : token_counts())
    for (int64_t dim : {int64_t(4096), int64_t(512), int64_t(133)}) {
      run_case(rows, dim, true, true, 0, false);
      run_case(rows, dim, false, true, 0, false);
    }
  run_case(7, 512, true, false, 64, false);   // per-head q norm shape, strided
  run_case(133, 1024, true, true, 0, true);   // in place
  run_case(64, 4096, false, false, 3, true);
}

TEST(CudaRmsNorm, RejectsBadStrides) {
  int dummy = 0;
  EXPECT_THROW(oc::rmsnorm({.x = &dummy, .x_stride = 4, .y = &dummy, .y_stride = 8, .rows = 1, .dim = 8}, nullptr),
               InvalidArgument);
  EXPECT_THROW(oc::rmsnorm({.x = &dummy, .x_dtype = DType::kI32, .x_stride = 8, .y = &dummy, .y_stride = 8,
                            .rows = 1, .dim = 8},
                           nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::cuda
