// Glue kernels of the GPU forward vs their host twins, random non-zero inputs, odd sizes,
// outputs poisoned (0xFF = NaN) first so an unwritten element fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "model/deepseek/cuda/glue_kernels.h"
#include "ops/cuda/runtime.h"
#include "../cuda/test_util.h"

namespace deepinfer::model::ds::cuda {
namespace cuda = deepinfer::cuda;
using ops::cpu::GatherRowsArgs;
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g) + (d(g) == 0.f ? 1e-3f : 0.f);
  return v;
}
using cuda::test::down;
using cuda::test::up;
std::vector<uint16_t> bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}

TEST(GlueKernels, GatherRowsMatchesHostAllDtypes) {
  DI_REQUIRE_GPU();
  for (int64_t width : {1, 19, 64, 111}) {
    for (int mode = 0; mode < 4; ++mode) {
      const bool s32 = mode & 1, d32 = mode & 2;
      const int64_t ra = 13, rb = 7, rows = 11, dst_rows = 17, sa = width + 3, sb = width, ds = width + 5;
      std::vector<float> a = randn(size_t(ra * sa), 1 + uint32_t(width)), b = randn(size_t(rb * sb), 7);
      std::vector<int64_t> si(rows), di(rows);
      for (int64_t i = 0; i < rows; ++i) {
        si[i] = i % 3 == 0 ? -(i % rb) - 1 : (i * 5) % ra;
        di[i] = (i * 3 + 1) % dst_rows;  // distinct targets
      }
      GatherRowsArgs p{.a_stride = sa, .b_stride = sb, .src_dtype = s32 ? DType::kF32 : DType::kBF16,
                         .dst_stride = ds, .dst_dtype = d32 ? DType::kF32 : DType::kBF16, .rows = rows, .width = width};
      // host
      std::vector<uint16_t> a16 = bf16(a), b16 = bf16(b);
      const size_t dn = size_t(dst_rows * ds);
      std::vector<float> ref32(dn, 0.f);
      std::vector<uint16_t> ref16(dn, 0);
      GatherRowsArgs h = p;
      h.src_a = s32 ? (const void*)a.data() : (const void*)a16.data();
      h.src_b = s32 ? (const void*)b.data() : (const void*)b16.data();
      h.src_index = si.data();
      h.dst_index = di.data();
      h.dst = d32 ? (void*)ref32.data() : (void*)ref16.data();
      ops::cpu::gather_rows(h);
      // device (dst pre-filled with the same zeros outside the written rows)
      cuda::DeviceBuffer da = s32 ? up(a) : up(a16), db = s32 ? up(b) : up(b16), dsi = up(si), ddi = up(di);
      cuda::DeviceBuffer dd = d32 ? up(std::vector<float>(dn, 0.f)) : up(std::vector<uint16_t>(dn, 0));
      GatherRowsArgs g = p;
      g.src_a = da.data();
      g.src_b = db.data();
      g.src_index = dsi.as<int64_t>();
      g.dst_index = ddi.as<int64_t>();
      g.dst = dd.data();
      ds::cuda::gather_rows(g, nullptr);
      DI_CUDA_CHECK(cudaDeviceSynchronize());
      if (d32)
        EXPECT_EQ(down<float>(dd, dn), ref32) << "width " << width << " mode " << mode;
      else
        EXPECT_EQ(down<uint16_t>(dd, dn), ref16) << "width " << width << " mode " << mode;
    }
  }
}

TEST(GlueKernels, PositionBiasAndCombineMatchHost) {
  DI_REQUIRE_GPU();
  const int64_t rows = 37, width = 45, m = 4, stride = 2 * width;
  std::vector<float> z = randn(size_t(rows * stride), 3), bias = randn(size_t(m * width), 4);
  std::vector<int64_t> pos(rows);
  for (int64_t i = 0; i < rows; ++i) pos[i] = 1000 + i * 7;
  std::vector<float> zr = z;
  ops::cpu::add_position_bias({.z = zr.data(), .z_stride = stride, .bias = bias.data(), .pos = pos.data(), .m = m,
                          .rows = rows, .width = width});
  cuda::DeviceBuffer dz = up(z), dbias = up(bias), dpos = up(pos);
  ds::cuda::add_position_bias({.z = dz.as<float>(), .z_stride = stride, .bias = dbias.as<float>(), .pos = dpos.as<int64_t>(),
                     .m = m, .rows = rows, .width = width},
                    nullptr);
  EXPECT_EQ(down<float>(dz, z.size()), zr);

  const int64_t T = 9, K = 3, D = 133;
  std::vector<float> ye = randn(size_t(T * K * D), 5), sh = randn(size_t(T * D), 6);
  std::vector<int64_t> r(T * K);
  for (int64_t i = 0; i < T * K; ++i) r[i] = i % 4 == 3 ? -1 : (i * 7) % (T * K);
  std::vector<float> out(size_t(T * D), 0.f);
  ops::cpu::moe_combine({.ye = ye.data(), .rows = r.data(), .shared = sh.data(), .out = out.data(), .tokens = T, .topk = K,
                    .dim = D});
  cuda::DeviceBuffer dye = up(ye), dsh = up(sh), dr = up(r), dout = up(std::vector<float>(out.size(), NAN));
  ds::cuda::moe_combine({.ye = dye.as<float>(), .rows = dr.as<int64_t>(), .shared = dsh.as<float>(), .out = dout.as<float>(),
               .tokens = T, .topk = K, .dim = D},
              nullptr);
  EXPECT_EQ(down<float>(dout, out.size()), out);  // same order of additions: bit exact
}

// Greedy picks of the MTP drafter on the device: argmax (lowest id on ties, planted twice per row,
// one row all equal) and the log-softmax value, vs a host loop in double. Odd sizes, padded stride.
TEST(GlueKernels, GreedyRowsMatchHost) {
  DI_REQUIRE_GPU();
  const int64_t rows = 13, V = 1237, stride = 1240;
  std::vector<float> x = randn(size_t(rows * stride), 21);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * stride;
    for (int64_t v = V; v < stride; ++v) row[v] = 100.f;  // beyond the vocabulary: never picked
    if (r % 3 == 0) row[(r * 97) % V] = row[(r * 97 + 511) % V] = 9.f;  // a tie: the lower id wins
  }
  std::fill(x.begin() + 5 * stride, x.begin() + 5 * stride + V, -2.5f);  // all equal: id 0
  cuda::DeviceBuffer dx = up(x), dt(size_t(rows) * 4), dl(size_t(rows) * 4);
  ds::cuda::greedy_rows(dx.as<float>(), stride, rows, V, dt.as<int32_t>(), dl.as<float>(), nullptr);
  const std::vector<int32_t> tok = down<int32_t>(dt, size_t(rows));
  const std::vector<float> lp = down<float>(dl, size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * stride;
    const int64_t want = std::max_element(row, row + V) - row;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - double(row[want]));
    EXPECT_EQ(tok[size_t(r)], want) << "row " << r;
    EXPECT_NEAR(lp[size_t(r)], -std::log(sum), 1e-5) << "row " << r;
  }
  EXPECT_EQ(tok[5], 0);
}

// DSpark taps: the stream mean at a layer's input, written at a column offset of a wider row (the
// tap buffer holds several layers' taps per token), bit for bit the CPU backend's formula.
TEST(GlueKernels, StreamMeanMatchesHostBitForBit) {
  DI_REQUIRE_GPU();
  for (int64_t T : {1, 7, 133}) {
    const int64_t n = 4, D = 37, stride = 3 * D + 5, col = D;
    const std::vector<float> x = randn(size_t(T * n * D), 31 + uint32_t(T));
    std::vector<float> want(size_t(T * stride), -7.f);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < D; ++c) {
        float s = 0.f;
        for (int64_t k = 0; k < n; ++k) s += x[size_t((t * n + k) * D + c)];
        want[size_t(t * stride + col + c)] = s / float(n);
      }
    cuda::DeviceBuffer dx = up(x), dout = up(std::vector<float>(size_t(T * stride), -7.f));
    ds::cuda::stream_mean(dx.as<float>(), dout.as<float>() + col, stride, T, n, D, nullptr);
    EXPECT_EQ(down<float>(dout, size_t(T * stride)), want) << "T=" << T;  // other columns untouched
  }
}

TEST(GlueKernels, BadArgumentsAreTyped) {  // no GPU needed: validation runs before any CUDA call
  GatherRowsArgs p{.src_dtype = DType::kI32, .rows = 1, .width = 4};
  EXPECT_THROW(ds::cuda::gather_rows(p, nullptr), InvalidArgument);
  GatherRowsArgs q{.a_stride = 2, .dst_stride = 4, .rows = 1, .width = 4};
  int dummy[8];
  q.src_a = dummy;
  q.dst = dummy;
  EXPECT_THROW(ds::cuda::gather_rows(q, nullptr), InvalidArgument);
  EXPECT_THROW(ds::cuda::add_position_bias({.m = 0, .rows = 1, .width = 1}, nullptr), InvalidArgument);
  EXPECT_THROW(ds::cuda::moe_combine({.tokens = 1, .topk = 1, .dim = 4}, nullptr), InvalidArgument);
  float f = 0;
  int32_t t = 0;
  EXPECT_THROW(ds::cuda::greedy_rows(&f, 4, 1, 8, &t, &f, nullptr), InvalidArgument);  // stride < vocab
  EXPECT_THROW(ds::cuda::greedy_rows(nullptr, 8, 1, 8, &t, &f, nullptr), InvalidArgument);
  EXPECT_THROW(ds::cuda::stream_mean(&f, &f, 2, 1, 4, 8, nullptr), InvalidArgument);  // stride < dim
  EXPECT_THROW(ds::cuda::stream_mean(nullptr, &f, 8, 1, 4, 8, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::model::ds::cuda
