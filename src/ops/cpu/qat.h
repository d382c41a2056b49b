// DeepSeek-V4.1's QAT cache round trips (MODEL-DEEPSEEK-V41.md §6, V41-REFERENCE-NOTES.md §4):
// part of the model's numerics, applied in every mode (the fp32 reference included).
//
//   kFp8Ue8m0Block32  window K=V after kv_norm + RoPE, whole vector, blocks of 32:
//                     s = pow2ceil(max(amax, 1e-4) * fl(1/448)); x <- e4m3(clamp(x / s, +-448)) * s
//   kFp4E4m3Block16   compressed entries after RoPE, blocks of 16:
//                     s = e4m3(max(amax, 6*2^-9) / 6) (true division); x <- e2m1(clamp(x / s, +-6)) * s
//   kFp4Ue8m0Block32  index keys after RoPE and index queries, blocks of 32:
//                     s = pow2ceil(max(amax, 6*2^-126) * fl(1/6)); x <- e2m1(clamp(x / s, +-6)) * s
//
// Bit-exact to transformers' deepseek_v41 (_fake_quant_fp8_block / _fake_quant_fp4_block):
//  - pow2ceil(t) is 2^(exponent field - 127 + (mantissa != 0)) read from t's bits, not a log;
//  - fl(1/448), fl(1/6) are the fp32 reciprocals, MULTIPLIED (the e4m3-scale format divides);
//  - every step is one IEEE fp32 operation, round to nearest even;
//  - e4m3 is torch's float->float8_e4m3fn cast: RNE, and |v| > 464 becomes NaN (it rounds onto the
//    NaN code; only the unclamped FP4 scale amax/6 can get there: blocks with amax > 2784);
//  - e2m1 uses the reference's thresholds (ties to the even code); the code's sign is signbit(q),
//    and code 8 decodes to +0 (so FP4 maps -0 and tiny negatives to +0; FP8 keeps -0);
//  - a row whose length is not a multiple of the block is left untouched, as the reference does.
// NaN / Inf policy (the reference's, mirrored): a NaN or +-Inf anywhere in a block makes the whole
// block NaN (amax propagates it into the scale); an FP4-e4m3 block with amax / 6 > 464 is NaN.
//
// Packed storage (what a cache may keep; unpack(pack(x)) == round_trip(x) bit for bit), per row:
//   [codes | scales]: FP8 one e4m3 byte per value; FP4 two codes per byte, element 2k in the LOW
//   nibble; then one scale byte per block: E8M0 (2^(b-127); 0xFF = a NaN block) for the ue8m0
//   formats, the e4m3 code for kFp4E4m3Block16. Packing needs whole blocks (InvalidArgument).
#pragma once
#include <cstdint>

#include "core/numeric.h"

namespace deepinfer::ops::cpu {

enum class QatFormat : uint8_t { kFp8Ue8m0Block32, kFp4E4m3Block16, kFp4Ue8m0Block32 };

DI_HD int qat_block(QatFormat f) { return f == QatFormat::kFp4E4m3Block16 ? 16 : 32; }
DI_HD bool qat_is_fp8(QatFormat f) { return f == QatFormat::kFp8Ue8m0Block32; }
// Bytes of the codes / of one whole packed row of n values (n a multiple of the block).
DI_HD int64_t qat_code_bytes(QatFormat f, int64_t n) { return qat_is_fp8(f) ? n : n / 2; }
DI_HD int64_t qat_packed_row_bytes(QatFormat f, int64_t n) { return qat_code_bytes(f, n) + n / qat_block(f); }
const char* qat_format_name(QatFormat f);

// x [rows, n] fp32 with row stride ld >= n, rounded in place.
void qat_round_trip(QatFormat f, float* x, int64_t rows, int64_t n, int64_t ld);
// x [rows, n] -> out [rows, qat_packed_row_bytes(f, n)]; and back to x [rows, n] (stride ld).
void qat_pack(QatFormat f, const float* x, int64_t rows, int64_t n, int64_t ld, uint8_t* out);
void qat_unpack(QatFormat f, const uint8_t* in, int64_t rows, int64_t n, float* x, int64_t ld);

// ---- the scalar steps, shared with the CUDA kernels (ops/cuda/qat.cu) ----
namespace qat {

DI_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DI_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// 2^k as fp32, exactly (0 below 2^-149, +inf from 2^128).
DI_HD float exp2i(int32_t k) {
  if (k >= 128) return bits_to_f32(0x7f800000u);
  if (k >= -126) return bits_to_f32(uint32_t(k + 127) << 23);
  if (k >= -149) return bits_to_f32(1u << (k + 149));
  return 0.0f;
}
// The reference's pow2ceil exponent: exponent field - 127, plus one for a nonzero mantissa.
DI_HD int32_t pow2ceil_exponent(float t) {
  const uint32_t b = f32_to_bits(t);
  return int32_t((b >> 23) & 0xffu) - 127 + ((b & 0x7fffffu) != 0 ? 1 : 0);
}
// torch's float -> float8_e4m3fn: round to nearest even; |v| > 464 or ±Inf -> NaN (0x7f | sign).
// A NaN input gives 0x7f whatever its sign bit: the sign of a NaN is not data, and the host and the
// GPU make NaNs with different signs (x86's inf/inf is 0xffc00000, CUDA's is 0x7fffffff), so the
// canonical code keeps packed rows byte-identical between the CPU and CUDA kernels.
DI_HD uint8_t e4m3_cast(float v) {
  if (v != v) return 0x7f;
  const uint8_t sign = uint8_t((f32_to_bits(v) >> 24) & 0x80u);
  const float a = fabsf(v);
  if (!(a <= 464.0f)) return uint8_t(sign | 0x7f);
  return f32_to_fp8e4m3(v);  // RNE, exact up to 464 (where it would start to saturate)
}
// The reference's e2m1 code of a value already clamped to [-6, 6]; NaN gives code 0 (sign dropped,
// see e4m3_cast: e2m1 has no NaN, the block's scale byte carries it and the block decodes to NaN).
DI_HD uint8_t e2m1_code(float q) {
  if (q != q) return 0;
  const float a = fabsf(q);
  const uint8_t code = uint8_t((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                               (a >= 3.5f) + (a > 5.0f));
  return uint8_t(code | ((f32_to_bits(q) >> 28) & 8u));
}
// The reference's e2m1 table: code 8 is +0.
DI_HD float e2m1_value(uint8_t code) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8u) && (code & 7u) ? -mag[code & 7u] : mag[code & 7u];
}
// torch.clamp: NaN stays NaN.
DI_HD float clamp(float v, float lim) { return v != v ? v : (v < -lim ? -lim : (v > lim ? lim : v)); }
// clamp_min with NaN propagation.
DI_HD float floor_at(float v, float lo) { return v != v ? v : (v < lo ? lo : v); }

// Scale of a block from its amax (NaN if any element was NaN). `scale_byte` is what packing stores.
DI_HD float block_scale(QatFormat f, float amax, uint8_t* scale_byte) {
  if (f == QatFormat::kFp4E4m3Block16) {
    const uint8_t code = e4m3_cast(div_rn(floor_at(amax, 0.01171875f), 6.0f));  // 6 * 2^-9
    *scale_byte = code;
    return fp8e4m3_to_f32(code);
  }
  const float floor_v = f == QatFormat::kFp8Ue8m0Block32 ? 1e-4f : bits_to_f32(0x01c00000u);  // 6 * 2^-126
  const float recip = f == QatFormat::kFp8Ue8m0Block32 ? float(1.0 / 448.0) : float(1.0 / 6.0);
  const int32_t k = pow2ceil_exponent(mul_rn(floor_at(amax, floor_v), recip));
  *scale_byte = uint8_t(k + 127 >= 255 ? 255 : (k + 127 <= 0 ? 0 : k + 127));
  return exp2i(k);
}
// One element given its block's scale: the code to store, and the value it decodes to.
DI_HD uint8_t element_code(QatFormat f, float v, float s) {
  const float q = div_rn(v, s);
  return qat_is_fp8(f) ? e4m3_cast(clamp(q, 448.0f)) : e2m1_code(clamp(q, 6.0f));
}
DI_HD float element_value(QatFormat f, uint8_t code, float s) {
  return mul_rn(qat_is_fp8(f) ? fp8e4m3_to_f32(code) : e2m1_value(code), s);
}
// Decoded scale of a stored scale byte (E8M0 0xFF = NaN block).
DI_HD float scale_of_byte(QatFormat f, uint8_t b) {
  if (f == QatFormat::kFp4E4m3Block16) return fp8e4m3_to_f32(b);
  return b == 0xff ? bits_to_f32(0x7fc00000u) : exp2i(int32_t(b) - 127);
}

}  // namespace qat
}  // namespace deepinfer::ops::cpu
