// V4.1 QAT round trips (ops/cpu/qat.h): bit-exact against the reference's own outputs
// (tests/data/golden/v41_qat, made by transformers' deepseek_v41 functions) and against a direct
// formula twin written here independently (frexp/ldexp powers of two, nearest-value searches over
// the e4m3 and e2m1 grids) on random rows of odd counts; edge cases; packed storage; errors.
#include "ops/cpu/qat.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include "deepinfer/error.h"

namespace deepinfer::ops::cpu {
namespace {

constexpr QatFormat kFormats[] = {QatFormat::kFp8Ue8m0Block32, QatFormat::kFp4E4m3Block16,
                                  QatFormat::kFp4Ue8m0Block32};
const char* fixture_name(QatFormat f) {
  return f == QatFormat::kFp8Ue8m0Block32 ? "fp8_ue8m0_b32" : f == QatFormat::kFp4E4m3Block16 ? "fp4_e4m3_b16"
                                                                                             : "fp4_ue8m0_b32";
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Equal bit patterns, any NaN equal to any NaN.
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

// ---------------- the formula twin (independent of qat.h's helpers) ----------------
float twin_pow2ceil(float t) {  // 2^ceil(log2 t) for a normal positive t; NaN/Inf -> +Inf
  if (!std::isfinite(t)) return std::numeric_limits<float>::infinity();
  int e;
  const float m = std::frexp(t, &e);  // t = m 2^e, m in [0.5, 1)
  return m == 0.5f ? std::ldexp(1.0f, e - 1) : std::ldexp(1.0f, e);
}
std::vector<float> e4m3_grid() {  // the 127 non-negative finite e4m3 values by code 0..126
  std::vector<float> g;
  for (int c = 0; c < 127; ++c) {
    const int e = c >> 3, m = c & 7;
    g.push_back(e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7));
  }
  return g;
}
float twin_e4m3(float v) {  // torch's cast: nearest, ties to the even code, NaN past 464
  static const std::vector<float> g = e4m3_grid();
  if (std::isnan(v) || std::fabs(v) > 464.0f) return std::numeric_limits<float>::quiet_NaN();
  const double a = std::fabs(double(v));
  int best = 0;
  for (int c = 1; c < 127; ++c) {
    const double d = std::fabs(a - g[c]), db = std::fabs(a - g[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return std::signbit(v) ? -g[best] : g[best];
}
float twin_e2m1(float q) {  // nearest of the grid, ties to the even index; the value of -0 is +0
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  if (std::isnan(q)) return 0.0f;
  const float a = std::fabs(q);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const float d = std::fabs(a - grid[c]), db = std::fabs(a - grid[best]);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return best == 0 ? 0.0f : (std::signbit(q) ? -grid[best] : grid[best]);
}
float twin_clamp(float v, float lim) { return std::isnan(v) ? v : std::min(std::max(v, -lim), lim); }

std::vector<float> twin_round_trip(QatFormat f, const std::vector<float>& x, int64_t n) {
  const int b = qat_block(f);
  std::vector<float> y = x;
  if (n % b) return y;
  for (size_t j0 = 0; j0 < x.size(); j0 += size_t(b)) {
    float amax = 0;
    bool nan = false;
    for (int i = 0; i < b; ++i) {
      nan |= std::isnan(x[j0 + i]);
      amax = std::max(amax, std::fabs(x[j0 + i]));
    }
    if (nan) amax = std::numeric_limits<float>::quiet_NaN();
    float s;
    if (f == QatFormat::kFp8Ue8m0Block32) s = twin_pow2ceil((nan ? amax : std::max(amax, 1e-4f)) * float(1.0 / 448.0));
    else if (f == QatFormat::kFp4Ue8m0Block32)
      s = twin_pow2ceil((nan ? amax : std::max(amax, std::ldexp(6.0f, -126))) * float(1.0 / 6.0));
    else s = twin_e4m3((nan ? amax : std::max(amax, std::ldexp(6.0f, -9))) / 6.0f);
    for (int i = 0; i < b; ++i) {
      const float q = x[j0 + i] / s;
      y[j0 + i] = (f == QatFormat::kFp8Ue8m0Block32 ? twin_e4m3(twin_clamp(q, 448)) : twin_e2m1(twin_clamp(q, 6))) * s;
    }
  }
  return y;
}

std::filesystem::path qat_fixture() {
  const char* s = std::getenv("DEEPINFER_SOURCE_DIR");
  const std::filesystem::path root = s ? s : std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "..";
  return root / "tests" / "data" / "golden" / "v41_qat";
}
std::vector<float> read_f32(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), {});
  std::vector<float> v(raw.size() / 4);
  std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!same(got[i], want[i])) {
      ++bad;
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << " (0x" << std::hex << bits(got[i]) << "), want "
                    << want[i] << " (0x" << bits(want[i]) << std::dec << ")";
    }
}

std::vector<float> packed_round_trip(QatFormat f, const std::vector<float>& x, int64_t rows, int64_t n) {
  std::vector<uint8_t> p(size_t(rows * qat_packed_row_bytes(f, n)));
  qat_pack(f, x.data(), rows, n, n, p.data());
  std::vector<float> y(x.size());
  qat_unpack(f, p.data(), rows, n, y.data(), n);
  return y;
}

TEST(V41Qat, MatchesTheReferenceBitForBit) {
  const auto dir = qat_fixture();
  if (!std::filesystem::exists(dir / "fp8_ue8m0_b32_in.f32")) GTEST_SKIP() << dir << " absent";
  for (QatFormat f : kFormats) {
    const std::string name = fixture_name(f);
    const std::vector<float> in = read_f32(dir / (name + "_in.f32")), want = read_f32(dir / (name + "_out.f32"));
    ASSERT_EQ(in.size(), want.size());
    ASSERT_EQ(in.size() % 64, 0u);
    std::vector<float> got = in;
    qat_round_trip(f, got.data(), int64_t(in.size() / 64), 64, 64);
    expect_same(got, want, name + " round trip vs reference");
    expect_same(packed_round_trip(f, in, int64_t(in.size() / 64), 64), want, name + " packed vs reference");
    expect_same(twin_round_trip(f, in, 64), want, name + " twin vs reference");
    const std::vector<float> skip = read_f32(dir / (name + "_skip_in.f32"));
    const int64_t sn = qat_block(f) * 3 / 2;
    std::vector<float> s = skip;
    qat_round_trip(f, s.data(), int64_t(skip.size()) / sn, sn, sn);
    expect_same(s, skip, name + " skipped shape left unchanged");
  }
}

TEST(V41Qat, MatchesTheTwinOnRandomRows) {
  std::mt19937 gen(17);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(-20.0f, 20.0f);
  for (QatFormat f : kFormats)
    for (int64_t rows : {1, 19, 111})
      for (int64_t n : {16, 32, 96, 512}) {
        if (n % qat_block(f)) continue;
        std::vector<float> x(size_t(rows * n));
        for (size_t i = 0; i < x.size(); ++i) {
          const float scale = std::exp2(ud(gen) * (i % 7 == 0 ? 2.0f : 0.3f));  // rows of mixed magnitudes
          do x[i] = nd(gen) * scale; while (x[i] == 0.0f);
        }
        std::vector<float> got = x;
        qat_round_trip(f, got.data(), rows, n, n);
        std::vector<float> want;
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> row(x.begin() + r * n, x.begin() + (r + 1) * n);
          auto y = twin_round_trip(f, row, n);
          want.insert(want.end(), y.begin(), y.end());
        }
        const std::string what = std::string(qat_format_name(f)) + " rows=" + std::to_string(rows) + " n=" + std::to_string(n);
        expect_same(got, want, what);
        expect_same(packed_round_trip(f, x, rows, n), got, what + " packed");
      }
}

TEST(V41Qat, EdgeCases) {
  for (QatFormat f : kFormats) {
    const int b = qat_block(f);
    std::vector<float> z(64, 0.0f), nz(64, -0.0f);
    qat_round_trip(f, z.data(), 1, 64, 64);
    qat_round_trip(f, nz.data(), 1, 64, 64);
    for (int i = 0; i < 64; ++i) {
      EXPECT_EQ(bits(z[i]), 0u) << qat_format_name(f);
      // FP8 keeps -0 (e4m3 code 0x80); the reference's FP4 table decodes code 8 as +0.
      EXPECT_EQ(bits(nz[i]), qat_is_fp8(f) ? 0x80000000u : 0u) << qat_format_name(f);
    }
    // A NaN (or Inf) poisons its own block only.
    std::vector<float> x(64, 1.5f);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    x[b + 1] = std::numeric_limits<float>::infinity();
    if (2 * b < 64) x[2 * b] = 2.0f;
    qat_round_trip(f, x.data(), 1, 64, 64);
    for (int i = 0; i < 64; ++i) EXPECT_EQ(std::isnan(x[i]), i < 2 * b) << qat_format_name(f) << " i=" << i;
    // Huge and tiny finite values stay finite and keep their sign (except FP4-e4m3, below).
    std::vector<float> h(64);
    for (int i = 0; i < 64; ++i) h[i] = (i % 2 ? -1.0f : 1.0f) * (i < 32 ? 3e30f : 1e-30f) * float(1 + i % 5);
    if (f != QatFormat::kFp4E4m3Block16) {
      qat_round_trip(f, h.data(), 1, 64, 64);
      for (int i = 0; i < 64; ++i) EXPECT_TRUE(std::isfinite(h[i])) << qat_format_name(f) << " i=" << i;
      EXPECT_LT(h[1], 0.0f);
    }
  }
  // The FP4-e4m3 scale is an unclamped e4m3 cast of amax/6: amax 2784 -> 464 -> 448, above -> NaN.
  for (auto [amax, nan] : {std::pair<float, bool>{2784.0f, false}, {2784.5f, true}, {1e30f, true}}) {
    std::vector<float> x(16, 1.0f);
    x[0] = amax;
    qat_round_trip(QatFormat::kFp4E4m3Block16, x.data(), 1, 16, 16);
    EXPECT_EQ(std::isnan(x[5]), nan) << amax;
  }
}

TEST(V41Qat, NanCodesAreCanonical) {
  // NaN elements pack to one code whatever the NaN's sign bit (x86 makes -inf/inf = 0xffc00000, CUDA
  // 0x7fffffff): FP8 0x7f, FP4 code 0; the block's scale byte marks the NaN and decodes it.
  const float neg_nan = bits_to_f32(0xffc00000u), inf = std::numeric_limits<float>::infinity();
  for (QatFormat f : {QatFormat::kFp8Ue8m0Block32, QatFormat::kFp4Ue8m0Block32, QatFormat::kFp4E4m3Block16}) {
    const int64_t n = 32;
    std::vector<float> x(size_t(3 * n), 1.0f);
    x[0] = -inf;      // row 0: -inf / inf scale -> NaN
    x[size_t(n)] = neg_nan;  // row 1: a NaN with the sign bit set
    x[size_t(2 * n) + 3] = bits_to_f32(0x7fc00000u);  // row 2: a positive NaN
    std::vector<uint8_t> p(size_t(3 * qat_packed_row_bytes(f, n)));
    qat_pack(f, x.data(), 3, n, n, p.data());
    const int64_t rb = qat_packed_row_bytes(f, n);
    const auto code = [&](int64_t r, int64_t j) {
      const uint8_t* row = p.data() + r * rb;
      return qat_is_fp8(f) ? row[j] : uint8_t((row[j / 2] >> (4 * (j % 2))) & 0xf);
    };
    EXPECT_EQ(code(1, 0), qat_is_fp8(f) ? 0x7f : 0) << qat_format_name(f);
    EXPECT_EQ(code(2, 3), qat_is_fp8(f) ? 0x7f : 0) << qat_format_name(f);
    if (f != QatFormat::kFp4E4m3Block16) { EXPECT_EQ(code(0, 0), qat_is_fp8(f) ? 0x7f : 0) << qat_format_name(f); }
    std::vector<float> y(x.size());
    qat_unpack(f, p.data(), 3, n, y.data(), n);
    for (int64_t r = 0; r < 3; ++r) EXPECT_TRUE(std::isnan(y[size_t(r * n + (r == 2 ? 3 : 0))])) << r;
  }
}

TEST(V41Qat, PackedLayout) {
  // amax 448 / 6 give scale 1 exactly (448*fl(1/448) == 6*fl(1/6) == 1): codes are the values'.
  std::vector<float> x(32, 0.0f);
  x[0] = 448.0f;
  x[1] = -1.0f;
  std::vector<uint8_t> p(size_t(qat_packed_row_bytes(QatFormat::kFp8Ue8m0Block32, 32)));
  ASSERT_EQ(p.size(), 33u);
  qat_pack(QatFormat::kFp8Ue8m0Block32, x.data(), 1, 32, 32, p.data());
  EXPECT_EQ(p[0], 0x7e);
  EXPECT_EQ(p[1], 0xb8);  // -1.0
  EXPECT_EQ(p[32], 127);  // 2^0
  x.assign(32, 0.0f);
  x[0] = 1.0f;  // code 2
  x[1] = 6.0f;  // code 7: element 1 in the high nibble
  x[2] = -0.5f; // code 9
  p.assign(size_t(qat_packed_row_bytes(QatFormat::kFp4Ue8m0Block32, 32)), 0);
  ASSERT_EQ(p.size(), 17u);
  qat_pack(QatFormat::kFp4Ue8m0Block32, x.data(), 1, 32, 32, p.data());
  EXPECT_EQ(p[0], 0x72);
  EXPECT_EQ(p[1], 0x09);
  EXPECT_EQ(p[16], 127);
  p.assign(size_t(qat_packed_row_bytes(QatFormat::kFp4E4m3Block16, 32)), 0);
  ASSERT_EQ(p.size(), 18u);
  qat_pack(QatFormat::kFp4E4m3Block16, x.data(), 1, 32, 32, p.data());
  EXPECT_EQ(p[0], 0x72);
  EXPECT_EQ(p[16], 0x38);  // e4m3(6/6) = 1.0
  EXPECT_EQ(p[17], 0x01);  // second block all zero: scale e4m3(2^-9 * 6 / 6) = smallest subnormal
  // Real row sizes of §6: 528 B window, 288 B compressed entry, 68 B index key.
  EXPECT_EQ(qat_packed_row_bytes(QatFormat::kFp8Ue8m0Block32, 512), 528);
  EXPECT_EQ(qat_packed_row_bytes(QatFormat::kFp4E4m3Block16, 512), 288);
  EXPECT_EQ(qat_packed_row_bytes(QatFormat::kFp4Ue8m0Block32, 128), 68);
}

TEST(V41Qat, StridedRowsAndErrors) {
  std::vector<float> x(3 * 40, 7.0f);
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 32; ++j) x[size_t(r * 40 + j)] = 0.3f * float(j - 15) + 0.01f * float(r);
  std::vector<float> want = x;
  for (int r = 0; r < 3; ++r) {
    std::vector<float> row(want.begin() + r * 40, want.begin() + r * 40 + 32);
    row = twin_round_trip(QatFormat::kFp4Ue8m0Block32, row, 32);
    std::copy(row.begin(), row.end(), want.begin() + r * 40);
  }
  qat_round_trip(QatFormat::kFp4Ue8m0Block32, x.data(), 3, 32, 40);
  expect_same(x, want, "strided");  // padding (7.0) untouched
  std::vector<uint8_t> p(64);
  EXPECT_THROW(qat_pack(QatFormat::kFp8Ue8m0Block32, x.data(), 1, 48, 48, p.data()), InvalidArgument);
  EXPECT_THROW(qat_unpack(QatFormat::kFp4E4m3Block16, p.data(), 1, 24, x.data(), 24), InvalidArgument);
  EXPECT_THROW(qat_round_trip(QatFormat::kFp8Ue8m0Block32, x.data(), 1, 32, 16), InvalidArgument);
}

}  // namespace
}  // namespace deepinfer::ops::cpu
