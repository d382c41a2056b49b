#include <cstring>

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

// ---- engram_widen: stored rows -> the wkv input, bit for bit the host widen ----

// Stored rows of `rows` x `dim`: FP8 codes over every non-NaN code (0x7f / 0xff are NaN), E8M0
// scales cycling through every finite exponent 0..254 from a random start (0 is 2^-127, a
// subnormal f32 scale; 254 overflows large codes to inf, as on the host); bf16/f32 random values.
struct Stored {
  std::vector<uint8_t> values, scales;
};
Stored make_stored(DType dt, int64_t rows, int64_t dim, uint64_t seed) {
  std::mt19937_64 g(seed);
  Stored s;
  const int64_t n = rows * dim;
  if (dt == DType::kF8E4M3) {
    s.values.resize(size_t(n));
    for (auto& c : s.values) {
      do c = uint8_t(g()); while ((c & 0x7f) == 0x7f);
    }
    s.scales.resize(size_t(n / 32));
    const uint64_t start = g() % 255;
    for (size_t i = 0; i < s.scales.size(); ++i) s.scales[i] = uint8_t((start + i) % 255);
  } else {
    const std::vector<float> v = randn(size_t(n), seed, 3.0f);
    if (dt == DType::kBF16) {
      const std::vector<uint16_t> b = to_bf16(v);
      s.values.resize(b.size() * 2);
      std::memcpy(s.values.data(), b.data(), s.values.size());
    } else {
      s.values.resize(v.size() * 4);
      std::memcpy(s.values.data(), v.data(), s.values.size());
    }
  }
  return s;
}

// The CPU path's values: ops::cpu::engram_widen_row per row (f32), then f32_to_bf16 as the CUDA
// backend's host staging did.
std::vector<float> host_widen(DType dt, const Stored& s, int64_t rows, int64_t dim) {
  std::vector<float> out(size_t(rows * dim));
  const size_t row_bytes = dtype_nbytes(dt, dim);
  for (int64_t r = 0; r < rows; ++r)
    ops::cpu::engram_widen_row(dt, s.values.data() + r * row_bytes,
                               dt == DType::kF8E4M3 ? s.scales.data() + r * (dim / 32) : nullptr, dim,
                               out.data() + r * dim);
  return out;
}

template <typename T>
std::vector<T> device_widen(DType dt, const Stored& s, int64_t rows, int64_t dim, DType out_dtype) {
  DevArray<uint8_t> dv(s.values), ds(s.scales.empty() ? std::vector<uint8_t>{0} : s.scales);
  DevArray<T> out(size_t(rows * dim));
  out.poison();
  oc::engram_widen({.values = dv.get(), .scales = ds.get(), .in = dt, .out = out.get(), .out_dtype = out_dtype,
                    .rows = rows, .dim = dim},
                   nullptr);
  DI_CUDA_CHECK(cudaGetLastError());
  return out.download();
}

void widen_case(DType dt, int64_t rows, int64_t dim, uint64_t seed) {
  const Stored s = make_stored(dt, rows, dim, seed);
  const std::vector<float> ref = host_widen(dt, s, rows, dim);
  const std::string cs = std::string(dtype_name(dt)) + " rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
  // f32 output: the host's f32 values, bit for bit.
  const std::vector<float> f = device_widen<float>(dt, s, rows, dim, DType::kF32);
  ASSERT_EQ(f.size(), ref.size());
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += f32_to_bits(f[i]) != f32_to_bits(ref[i]);
  EXPECT_EQ(bad, 0) << cs << " -> f32: " << bad << " values differ from the host widen";
  // bf16 output: f32_to_bf16 of the host's values, bit for bit.
  const std::vector<uint16_t> b = device_widen<uint16_t>(dt, s, rows, dim, DType::kBF16);
  bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += b[i] != f32_to_bf16(ref[i]);
  EXPECT_EQ(bad, 0) << cs << " -> bf16: " << bad << " values differ from the host widen";
  std::printf("DI_CUDA_ERR|engram_widen|%s|0|0|%s\n", cs.c_str(), ::testing::Test::HasFailure() ? "FAIL" : "PASS");
}

TEST(CudaEngramWiden, BitIdenticalToHostWiden) {
  DI_REQUIRE_GPU();
  uint64_t seed = 4100;
  for (int64_t rows : {1, 7, 133, 1001}) {
    widen_case(DType::kF8E4M3, rows, 256, seed += 10);  // release row width
    widen_case(DType::kF8E4M3, rows, 96, seed += 10);   // three scales per row
    widen_case(DType::kBF16, rows, 36, seed += 10);
    widen_case(DType::kF32, rows, 36, seed += 10);
  }
}

// The stored form cannot be NaN-free by construction only: NaN codes / the NaN scale give NaN on
// both sides (payloads may differ between host and device, so checked as NaN, not bits).
TEST(CudaEngramWiden, NanCodesAndScaleStayNan) {
  DI_REQUIRE_GPU();
  const int64_t rows = 3, dim = 64;
  Stored s = make_stored(DType::kF8E4M3, rows, dim, 4200);
  s.values[5] = 0x7f;
  s.values[70] = 0xff;
  s.scales[3] = 0xff;  // row 1, second half
  const std::vector<float> ref = host_widen(DType::kF8E4M3, s, rows, dim);
  const std::vector<float> f = device_widen<float>(DType::kF8E4M3, s, rows, dim, DType::kF32);
  const std::vector<uint16_t> b = device_widen<uint16_t>(DType::kF8E4M3, s, rows, dim, DType::kBF16);
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i])) {
      EXPECT_TRUE(std::isnan(f[i])) << i;
      EXPECT_TRUE(std::isnan(bf16_to_f32(b[i]))) << i;
    } else {
      EXPECT_EQ(f32_to_bits(f[i]), f32_to_bits(ref[i])) << i;
      EXPECT_EQ(b[i], f32_to_bf16(ref[i])) << i;
    }
  }
  EXPECT_TRUE(std::isnan(ref[5]) && std::isnan(ref[70]) && std::isnan(ref[size_t(64 + 32)]));
}

TEST(CudaEngramWiden, RejectsBadArguments) {
  uint8_t c[64] = {};
  uint16_t o[64];
  const oc::EngramWidenParams ok{.values = c, .scales = c, .in = DType::kF8E4M3, .out = o, .out_dtype = DType::kBF16,
                                 .rows = 0, .dim = 32};
  EXPECT_NO_THROW(oc::engram_widen(ok, nullptr));  // no rows: nothing launched
  auto bad = ok;
  bad.dim = 48;  // FP8 needs a scale per 32
  EXPECT_THROW(oc::engram_widen(bad, nullptr), InvalidArgument);
  bad = ok;
  bad.in = DType::kBF16, bad.dim = 6;  // not a multiple of 4
  EXPECT_THROW(oc::engram_widen(bad, nullptr), InvalidArgument);
  bad = ok;
  bad.out_dtype = DType::kF8E4M3;
  EXPECT_THROW(oc::engram_widen(bad, nullptr), InvalidArgument);
  bad = ok;
  bad.in = DType::kF16;
  EXPECT_THROW(oc::engram_widen(bad, nullptr), InvalidArgument);
  bad = ok;
  bad.rows = 1, bad.scales = nullptr;
  EXPECT_THROW(oc::engram_widen(bad, nullptr), InvalidArgument);
}

// A 4,096-token prefill's rows of one Engram layer (24 columns x 256): 25 MB of codes in, 50 MB of
// bf16 out; ~25 us at the H100's 3.35 TB/s.
TEST(CudaEngramWiden, Timing) {
  DI_REQUIRE_GPU();
  const int64_t rows = 4096 * 24, dim = 256;
  const Stored s = make_stored(DType::kF8E4M3, rows, dim, 4300);
  DevArray<uint8_t> dv(s.values), ds(s.scales);
  DevArray<uint16_t> out(size_t(rows * dim));
  const double us = median_us([&](cudaStream_t st) {
    oc::engram_widen({.values = dv.get(), .scales = ds.get(), .in = DType::kF8E4M3, .out = out.get(),
                      .out_dtype = DType::kBF16, .rows = rows, .dim = dim},
                     st);
  }, nullptr);
  const double gb = double(rows * dim * 3 + rows * dim / 32) / 1e9;
  report_time("engram_widen", "98304x256 fp8->bf16", us, std::to_string(gb / (us * 1e-6)) + " GB/s");
}

}  // namespace
}  // namespace deepinfer::cuda
