#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/numeric.h"

using namespace deepinfer;

TEST(Numeric, Fp8E4M3ExhaustiveRoundTrip) {
  // Every finite code decodes and re-encodes to itself.
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    float f = fp8e4m3_to_f32(uint8_t(c));
    uint8_t back = f32_to_fp8e4m3(f);
    if (f == 0.f) EXPECT_EQ(back & 0x7f, 0);
    else EXPECT_EQ(back, c) << "code " << c << " value " << f;
  }
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.f);
  EXPECT_EQ(f32_to_fp8e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-1e6f), 0xfe);
}

TEST(Numeric, Fp8NearestOnRandomValues) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 30.f);
  for (int i = 0; i < 20000; ++i) {
    float x = nd(rng);
    float q = fp8e4m3_to_f32(f32_to_fp8e4m3(x));
    // No other code is strictly closer.
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;
      float o = fp8e4m3_to_f32(uint8_t(c));
      ASSERT_LE(std::fabs(q - x), std::fabs(o - x) + 1e-12f) << x;
    }
  }
}

TEST(Numeric, Bf16AndFp4AndE8M0) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // tie rounds to even
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  const float vals[] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int c = 0; c < 16; ++c) {
    float f = fp4e2m1_to_f32(uint8_t(c));
    EXPECT_EQ(f, (c & 8 ? -1.f : 1.f) * vals[c & 7]);
    if (c != 8) {
      EXPECT_EQ(f32_to_fp4e2m1(f), c);
    }
  }
  EXPECT_EQ(f32_to_fp4e2m1(2.4f), 4);
  EXPECT_EQ(f32_to_fp4e2m1(100.f), 7);
}
