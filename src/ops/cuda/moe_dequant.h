// Device decoders of the release expert-weight encodings (e2m1 nibbles, e4m3 bytes) to bf16 bit
// patterns, shared by the grouped expert GEMM and the decode GEMV. Exact: every e2m1/e4m3 value
// is a bf16 value. The e8m0 scale is core/numeric.h's e8m0_to_f32. Include from .cu files only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace deepinfer::ops::cuda {

// bf16 bits of e2m1 code c (bit 3 sign; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6).
__device__ __forceinline__ uint32_t fp4_bf16_bits(uint32_t c) {
  const uint32_t e = (c >> 1) & 3, m = c & 1;
  const uint32_t mag = e ? ((e + 126) << 7) | (m << 6) : (m ? 0x3f00u : 0u);
  return ((c & 8) << 12) | mag;
}
// bf16 bits of e4m3 byte b ("fn": no infinities, 0x7f/0xff NaN).
__device__ __forceinline__ uint32_t fp8_bf16_bits(uint32_t b) {
  const uint32_t s = (b & 0x80) << 8, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return s | 0x7fc0u;
  if (e) return s | ((e + 120) << 7) | (m << 4);
  if (!m) return s;
  const int p = 31 - __clz(m);  // subnormal m * 2^-9 = 2^(p-9) * (m / 2^p)
  return s | (uint32_t(p - 9 + 127) << 7) | (((m << (3 - p)) & 7) << 4);
}
__device__ __forceinline__ float bf16_bits_f32(uint32_t b) { return __uint_as_float(b << 16); }
// bf16x2 bits of the e8m0 scale (2^(e-127) in both halves; e = 0 is the bf16 subnormal 2^-127).
__device__ __forceinline__ uint32_t e8m0_bf16x2(uint32_t e) {
  const uint32_t b = e == 255 ? 0x7fc0u : e == 0 ? 0x0040u : e << 7;
  return b | (b << 16);
}
// a * b per bf16 half (round to nearest): applies e8m0_bf16x2 scales to decoded pairs.
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}


// ---- table-free decoders (the wgmma kernel's dequantisation) ----
// Moving a code's bits into bf16 position gives value * 2^-bias with ONE bias for every code,
// subnormals included: e4m3 magnitude bits at bf16 bits 4..10 read as value * 2^-120 (e = 0
// lands on bf16 subnormals, m * 2^-129 = (m * 2^-9) * 2^-120), e2m1 magnitude bits at 6..8 as
// value * 2^-126. One bf16x2 multiply by 2^(e-127+bias) then applies the e8m0 scale with the
// single rounding of value * scale (bf16 multiplies keep subnormals). Where 2^(e-127+bias) is
// past bf16's range (biased exponent e + bias > 254: FP8 e > 134, FP4 e > 128, the NaN scale 255)
// it takes two: the exact 2^bias first, then the scale itself.
struct Bf16x2Scale {
  uint32_t m1, m2;  // bf16x2 multipliers; m2 used only when two
  bool two;
};
template <int kBias>  // 120 (e4m3) or 126 (e2m1)
__device__ __forceinline__ Bf16x2Scale bf16x2_scale(uint32_t e) {
  Bf16x2Scale s;
  s.two = e + kBias > 254;
  const uint32_t b1 = s.two ? uint32_t(127 + kBias) << 7 : (e + kBias) << 7;
  s.m1 = b1 | (b1 << 16);
  s.m2 = e8m0_bf16x2(e);
  return s;
}
__device__ __forceinline__ uint32_t apply_scale(uint32_t v, const Bf16x2Scale& s) {
  const uint32_t o = mul_bf16x2(v, s.m1);
  return s.two ? mul_bf16x2(o, s.m2) : o;
}
// e4m3 bytes j, j+1 of w (j = 0 or 2) -> bf16x2 bits of value * 2^-120 (low byte low half). The
// byte permute puts byte j at bits 8..15 and byte j+1 at 24..31 (zeros elsewhere), so each sign is
// already at 15 / 31 and the magnitude moves right by 4. NaN codes (0x7f/0xff) come out as 480:
// callers check fp8_word_has_nan.
template <int j>
__device__ __forceinline__ uint32_t fp8x2_bits_biased(uint32_t w) {
  const uint32_t t = __byte_perm(w, 0u, ((j + 1) << 12) | (4 << 8) | (j << 4) | 4);
  return (t & 0x80008000u) | ((t >> 4) & 0x07f007f0u);
}
__device__ __forceinline__ bool fp8_word_has_nan(uint32_t w) {
  return (((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u) != 0;  // a 0x7f magnitude carries into bit 7
}
// e2m1 nibbles of byte j of w -> bf16x2 bits of value * 2^-126 (low nibble low half); w4 = w << 4.
// The permute puts the low nibble at bits 12..15 (from w4) and the high one at 28..31 (from w);
// the other bits it brings fall outside both masks.
template <int j>
__device__ __forceinline__ uint32_t fp4x2_bits_biased(uint32_t w, uint32_t w4) {
  const uint32_t t = __byte_perm(w4, w, ((4 + j) << 12) | (j << 8) | (j << 4) | j);
  return (t & 0x80008000u) | ((t >> 6) & 0x01c001c0u);
}

}  // namespace deepinfer::ops::cuda
