// V4.1 QAT round trips on the GPU (ops/cuda/qat.h) against the CPU reference (ops/cpu/qat.h, itself
// checked bit for bit against transformers' deepseek_v41 in tests/cpp/ops/qat_test.cc): equal bit
// patterns (any NaN equal to any NaN) for the round trip, packed bytes and unpacked values, f32 and
// bf16 rows, odd row counts, strided rows, edge-case rows; outputs poisoned first.
#include "ops/cpu/qat.h"
#include "ops/cuda/qat.h"
#include "test_util.h"

#include <cstring>
#include <limits>

namespace deepinfer::cuda {
namespace {
using namespace test;
namespace oc = ops::cuda;
namespace cc = ops::cpu;
using cc::QatFormat;

constexpr QatFormat kFormats[] = {QatFormat::kFp8Ue8m0Block32, QatFormat::kFp4E4m3Block16,
                                  QatFormat::kFp4Ue8m0Block32};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
int64_t mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += !((std::isnan(a[i]) && std::isnan(b[i])) || bits(a[i]) == bits(b[i]));
  return bad;
}

// Rows of mixed magnitudes, plus edge rows (zeros, -0, NaN, Inf, huge, tiny) when n >= 32.
std::vector<float> rows_of(int64_t rows, int64_t ld, int64_t n, uint64_t seed) {
  std::vector<float> x = randn(size_t(rows * ld), seed);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::exp2(float(int(i * 7 % 41) - 20));
  if (rows >= 6) {
    for (int64_t j = 0; j < n; ++j) {
      x[size_t(0 * ld + j)] = 0.0f;
      x[size_t(1 * ld + j)] = -0.0f;
      x[size_t(2 * ld + j)] *= 1e30f;
      x[size_t(3 * ld + j)] *= 1e-38f;
    }
    x[size_t(4 * ld + 1)] = std::numeric_limits<float>::quiet_NaN();
    x[size_t(5 * ld + n - 1)] = -std::numeric_limits<float>::infinity();
  }
  return x;
}

TEST(CudaQat, RoundTripPackUnpackMatchCpu) {
  DI_REQUIRE_GPU();
  Stream s;
  for (QatFormat f : kFormats)
    for (int64_t rows : {1, 7, 133})
      for (int64_t n : {16, 48, 64, 512}) {
        if (n % cc::qat_block(f)) continue;
        const int64_t ld = n + 3;
        const std::vector<float> x = rows_of(rows, ld, n, uint64_t(rows * 1000 + n));
        std::vector<float> want = x;
        cc::qat_round_trip(f, want.data(), rows, n, ld);
        DevArray<float> dx(x);
        oc::qat_round_trip({.x = dx.get(), .dtype = DType::kF32, .format = f, .rows = rows, .n = n, .ld = ld}, s.get());
        const std::string cs = std::string(cc::qat_format_name(f)) + " rows=" + std::to_string(rows) + " n=" + std::to_string(n);
        EXPECT_EQ(mismatches(dx.download(), want), 0) << "round trip " << cs;

        const int64_t rb = cc::qat_packed_row_bytes(f, n);
        std::vector<uint8_t> pw(size_t(rows * rb));
        cc::qat_pack(f, x.data(), rows, n, ld, pw.data());
        DevArray<float> dsrc(x);
        DevArray<uint8_t> dp(size_t(rows * rb));
        dp.poison();
        oc::qat_pack({.x = dsrc.get(), .dtype = DType::kF32, .format = f, .rows = rows, .n = n, .ld = ld, .out = dp.get()},
                     s.get());
        EXPECT_EQ(dp.download(), pw) << "packed bytes " << cs;
        DevArray<float> du(size_t(rows * ld));
        du.poison();
        oc::qat_unpack({.in = dp.get(), .x = du.get(), .dtype = DType::kF32, .format = f, .rows = rows, .n = n, .ld = ld},
                       s.get());
        std::vector<float> got = du.download();
        for (int64_t r = 0; r < rows; ++r)  // the padding columns stay poisoned; compare the rows only
          for (int64_t j = n; j < ld; ++j) got[size_t(r * ld + j)] = want[size_t(r * ld + j)];
        EXPECT_EQ(mismatches(got, want), 0) << "unpacked " << cs;
        report("qat_round_trip", cs, double(mismatches(dx.download(), want)), 0.0);
      }
}

TEST(CudaQat, Bf16RowsMatchCpu) {
  DI_REQUIRE_GPU();
  Stream s;
  for (QatFormat f : kFormats) {
    const int64_t rows = 19, n = 128;
    const std::vector<float> x = bf16_round(rows_of(rows, n, n, 99));
    std::vector<float> want = x;
    cc::qat_round_trip(f, want.data(), rows, n, n);
    DevArray<uint16_t> dx(to_bf16(x));
    oc::qat_round_trip({.x = dx.get(), .dtype = DType::kBF16, .format = f, .rows = rows, .n = n, .ld = n}, s.get());
    EXPECT_EQ(mismatches(from_bf16(dx.download()), want), 0) << cc::qat_format_name(f);  // every output is bf16-exact
  }
}

TEST(CudaQat, SkippedShapesAndErrors) {
  // Argument checks run without a GPU too (they throw before any launch).
  EXPECT_THROW(oc::qat_pack({.x = nullptr, .n = 32, .ld = 32}, nullptr), InvalidArgument);
  float dummy = 0;
  uint8_t out = 0;
  EXPECT_THROW(oc::qat_pack({.x = &dummy, .format = QatFormat::kFp8Ue8m0Block32, .rows = 1, .n = 40, .ld = 40, .out = &out},
                            nullptr),
               InvalidArgument);
  EXPECT_THROW(oc::qat_round_trip({.x = &dummy, .rows = 1, .n = 32, .ld = 16}, nullptr), InvalidArgument);
  DI_REQUIRE_GPU();
  Stream s;
  const std::vector<float> x = randn(3 * 24, 5);
  DevArray<float> dx(x);
  oc::qat_round_trip({.x = dx.get(), .format = QatFormat::kFp4Ue8m0Block32, .rows = 3, .n = 24, .ld = 24}, s.get());
  EXPECT_EQ(mismatches(dx.download(), x), 0);  // not a multiple of 32: untouched, as the reference
}

}  // namespace
}  // namespace deepinfer::cuda
