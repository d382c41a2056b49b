// Scalar encodings used by DeepSeek-V4 checkpoints and caches, as plain functions that
// compile for host and device. All decoders are exact; encoders round to nearest even
// and saturate (fp8 e4m3 to ±448, fp4 e2m1 to ±6), matching torch's casts.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DI_HD __host__ __device__ __forceinline__
#else
#define DI_HD inline
#endif

namespace deepinfer {

DI_HD float bits_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
DI_HD uint32_t f32_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// bfloat16: upper half of an fp32.
DI_HD float bf16_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }
DI_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                        // round to nearest even
  return uint16_t(u >> 16);
}

// IEEE half.
DI_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) {
    float v = float(man) * (1.0f / 16777216.0f);  // 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

// fp8 e4m3 (OCP "fn": no inf, 0x7f/0xff = NaN, max 448).
DI_HD float fp8e4m3_to_f32(uint8_t v) {
  uint32_t sign = uint32_t(v & 0x80) << 24, exp = (v >> 3) & 0xf, man = v & 0x7;
  if (exp == 0xf && man == 0x7) return bits_to_f32(sign | 0x7fc00000u);
  if (exp == 0) {
    float f = float(man) * (1.0f / 512.0f);  // 2^-9
    return sign ? -f : f;
  }
  return bits_to_f32(sign | ((exp + 120) << 23) | (man << 20));
}
DI_HD uint8_t f32_to_fp8e4m3(float f) {
  uint32_t u = f32_to_bits(f);
  uint8_t sign = uint8_t((u >> 24) & 0x80);
  float a = fabsf(f);
  if (a != a) return uint8_t(sign | 0x7f);
  if (a >= 464.0f) return uint8_t(sign | 0x7e);  // saturate (464 = midpoint 448..480 rounds up)
  if (a < 0.015625f) {                           // subnormal range: step 2^-9
    float q = a * 512.0f;
    float r = rintf(q);                          // ties to even
    return uint8_t(sign | uint8_t(r));           // r <= 8 -> 8 is the smallest normal (0x08)
  }
  uint32_t au = f32_to_bits(a);
  uint32_t exp = (au >> 23) - 120;               // >= 1
  uint32_t man = au & 0x7fffff;
  uint32_t keep = man >> 20, rest = man & 0xfffff;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1))) {
    keep++;
    if (keep == 8) { keep = 0; exp++; }
  }
  uint32_t out = (exp << 3) | keep;
  if (out > 0x7e) out = 0x7e;
  return uint8_t(sign | out);
}

// e8m0: a power-of-two scale 2^(e-127); 0xff is NaN.
DI_HD float e8m0_to_f32(uint8_t e) {
  if (e == 0xff) return bits_to_f32(0x7fc00000u);
  if (e == 0) return bits_to_f32(0x00400000u);  // 2^-127 (subnormal)
  return bits_to_f32(uint32_t(e) << 23);
}

// fp4 e2m1: bit 3 sign, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
DI_HD float fp4e2m1_to_f32(uint8_t nib) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float m = mag[nib & 7];
  return (nib & 8) ? -m : m;
}
// Round to nearest e2m1 value, ties to the even code, saturating at 6.
DI_HD uint8_t f32_to_fp4e2m1(float f) {
  float a = fabsf(f);
  uint8_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return uint8_t(code | ((f32_to_bits(f) >> 28) & 8));
}

}  // namespace deepinfer
