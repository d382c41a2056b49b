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

}  // namespace deepinfer::ops::cuda
