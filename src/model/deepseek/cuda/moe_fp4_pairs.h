// FP4 (e2m1) nibbles -> unscaled bf16x2 words for the grouped MoE decode (issue #13), host and
// device, so the CPU tests can hold the fast form to the reference form bit for bit.
//
// Encoding (moe_decode_grouped.cuh, v1..v3 "kAlu"): nibble c = s e1 e0 m becomes the bf16 bits
// (c & 8) << 12 | (c & 7) << 6, i.e. e2m1(c) * 2^-126 exactly (e = 0 is the subnormal
// m * 2^-127); a later bf16x2 multiply by 2^(scale - 1) gives the dequantised weight (exact).
// Word q (0..3) of a 32-bit word w of 8 nibbles pairs nibble q (low half) with nibble q + 4
// (high half): that pairing fixes the MMA's k order, so it must not change (bit identity).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DI_FP4_HD __host__ __device__ __forceinline__
#else
#define DI_FP4_HD inline
#endif

namespace deepinfer::model::ds::cuda::moe_grouped {

// The reference form (v1..v3's fp4_pair_bits): per word one shift for the magnitudes, one for
// the signs and two masks: 15 integer instructions per 32-bit word of weights (4 words).
DI_FP4_HD uint32_t fp4_pair_bits_ref(uint32_t w, int q) {
  const uint32_t u = q == 0 ? w << 6 : q == 1 ? w << 2 : q == 2 ? w >> 2 : w >> 6;  // [8:6], [24:22]
  const uint32_t v = w << (12 - 4 * q);                                              // bits 15, 31
  return (u & 0x01C001C0u) | (v & 0x80008000u);
}

// The same four words in 13 instructions (v9): the sign bits are pre-masked by nibble parity
// (even nibbles: 0x08080808, odd: 0x80808080) so that after word q's sign shift (12 - 4q) the
// only set bits besides 15 and 31 fall inside the magnitude field 0x01C001C0 (the sign of nibble
// q +- 2 lands on bit 7 or 23). One bit-select (u & C) | (b & ~C) with the single immediate C
// then builds the word: 2 masks + 4 magnitude shifts + 3 sign shifts + 4 selects, where the
// reference needs 7 shifts + 8 masks for the same bits.
constexpr uint32_t kFp4MagField = 0x01C001C0u;  // bf16x2 bits [8:6], [24:22]: the e2m1 magnitudes

// (a & kFp4MagField) | (b & ~kFp4MagField) as one LOP3 on the device: written in C, the compiler
// folds b & ~mask into the sign masks and emits two LOP3 per word again (the reference's count).
DI_FP4_HD uint32_t mag_select(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t d;  // LUT 0xE4 = (a & c) | (b & ~c) for a = 0xF0, b = 0xCC, c = 0xAA
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(d) : "r"(a), "r"(b), "n"(kFp4MagField));
  return d;
#else
  return (a & kFp4MagField) | (b & ~kFp4MagField);
#endif
}

// The sign masks are arguments (kFp4EvenSigns, kFp4OddSigns) because with them as constants the
// device compiler moves each mask past its shift ((w << 12) & 0x80808000, ...), one mask per
// word again; kernels pass values it cannot fold (moe_decode_v9.cu).
constexpr uint32_t kFp4EvenSigns = 0x08080808u, kFp4OddSigns = 0x80808080u;
DI_FP4_HD void fp4_pair_words(uint32_t w, uint32_t (&o)[4], uint32_t even_signs = kFp4EvenSigns,
                              uint32_t odd_signs = kFp4OddSigns) {
  const uint32_t se = w & even_signs, so = w & odd_signs;
  o[0] = mag_select(w << 6, se << 12);
  o[1] = mag_select(w << 2, so << 8);
  o[2] = mag_select(w >> 2, se << 4);
  o[3] = mag_select(w >> 6, so);
}

}  // namespace deepinfer::model::ds::cuda::moe_grouped

#undef DI_FP4_HD
