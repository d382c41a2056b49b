#include <cstring>

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

// The warp-per-row kernel (dim <= 1,024 at >= 1,024 rows), the register-row block kernel (<= 4,096)
// and its two-pass form (wider) against the legacy two-pass kernel, bit for bit: every dtype mix, weighted
// and not, padded strides, in place, odd widths on each side of every kernel boundary.
TEST(CudaRmsNorm, FastKernelsBitIdenticalToLegacy) {
  DI_REQUIRE_GPU();
  int cases = 0;
  for (int64_t rows : {int64_t(1), int64_t(7), int64_t(133), int64_t(1031)})  // 1,031: the warp kernel's rows
    for (int64_t dim : {int64_t(1), int64_t(37), int64_t(256), int64_t(300), int64_t(512), int64_t(1000),
                        int64_t(1024), int64_t(1025), int64_t(3000), int64_t(4096), int64_t(4097), int64_t(7001)})
      for (DType xd : {DType::kF32, DType::kBF16})
        for (DType yd : {DType::kF32, DType::kBF16})
          for (int variant = 0; variant < 3; ++variant) {  // 0 weighted bf16 w, 1 unweighted + padded, 2 in place
            if (variant == 2 && xd != yd) continue;
            const int64_t pad = variant == 1 ? 5 : 0, stride = dim + pad;
            const uint64_t seed = 900 + rows * 13 + dim;
            const size_t xb = xd == DType::kF32 ? 4 : 2, yb = yd == DType::kF32 ? 4 : 2;
            std::vector<float> xv = randn(size_t(rows * stride), seed, 1.5f, 0.2f);
            DevArray<float> xf(xv), w(randn(size_t(dim), seed + 1, 0.2f, 1.0f));
            DevArray<uint16_t> xh(to_bf16(xv));
            DevArray<uint8_t> y_ref(size_t(rows * stride) * yb), y(size_t(rows * stride) * yb);
            DevArray<uint8_t> x_ref(size_t(rows * stride) * xb), x_got(size_t(rows * stride) * xb);
            const void* x0 = xd == DType::kF32 ? static_cast<const void*>(xf.get()) : xh.get();
            auto run = [&](bool legacy, DevArray<uint8_t>& yo, DevArray<uint8_t>& xo) {
              void* out = yo.get();
              const void* in = x0;
              if (variant == 2) {  // in place: y aliases a copy of x
                DI_CUDA_CHECK(cudaMemcpy(xo.get(), x0, xo.n, cudaMemcpyDeviceToDevice));
                in = out = xo.get();
              } else {
                yo.poison();
              }
              oc::rmsnorm({.x = in, .x_dtype = xd, .x_stride = stride, .w = variant == 1 ? nullptr : w.get(),
                           .w_dtype = DType::kF32, .y = out, .y_dtype = variant == 2 ? xd : yd, .y_stride = stride,
                           .rows = rows, .dim = dim, .legacy = legacy},
                          nullptr);
              return variant == 2 ? xo.download() : yo.download();
            };
            const std::vector<uint8_t> ref = run(true, y_ref, x_ref), got = run(false, y, x_got);
            // Compare the dim columns of every row (padding is not written).
            const size_t ob = variant == 2 ? xb : yb;
            int bad = 0;
            for (int64_t r = 0; r < rows; ++r)
              bad += std::memcmp(got.data() + r * stride * ob, ref.data() + r * stride * ob, size_t(dim) * ob) != 0;
            EXPECT_EQ(bad, 0) << "rows=" << rows << " dim=" << dim << " x " << dtype_name(xd) << " y "
                              << dtype_name(yd) << " variant " << variant << ": " << bad << " rows differ";
            ++cases;
          }
  EXPECT_EQ(cases, 4 * 12 * 10);
}

// A row's bits do not depend on the rows around it: row 5 alone (the block kernel) equals row 5 of
// 1,031 (the warp kernel up to 1,024 wide, 8 rows a block; the block kernel beyond).
TEST(CudaRmsNorm, BatchInvariant) {
  DI_REQUIRE_GPU();
  for (int64_t dim : {int64_t(512), int64_t(1000), int64_t(4096)}) {
    const int64_t rows = 1031;
    const std::vector<float> xv = randn(size_t(rows * dim), 77 + dim, 1.0f, 0.1f);
    DevArray<float> x(xv), x5(std::vector<float>(xv.begin() + 5 * dim, xv.begin() + 6 * dim));
    DevArray<float> w(randn(size_t(dim), 78, 0.2f, 1.0f));
    DevArray<uint16_t> y(static_cast<size_t>(rows * dim)), y5(static_cast<size_t>(dim));
    oc::rmsnorm({.x = x.get(), .x_dtype = DType::kF32, .x_stride = dim, .w = w.get(), .w_dtype = DType::kF32,
                 .y = y.get(), .y_stride = dim, .rows = rows, .dim = dim},
                nullptr);
    oc::rmsnorm({.x = x5.get(), .x_dtype = DType::kF32, .x_stride = dim, .w = w.get(), .w_dtype = DType::kF32,
                 .y = y5.get(), .y_stride = dim, .rows = 1, .dim = dim},
                nullptr);
    const std::vector<uint16_t> all = y.download(), one = y5.download();
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + 5 * dim, size_t(dim) * 2)) << "dim=" << dim;
  }
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
