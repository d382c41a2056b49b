// Internal to moe_decode_v9.cu / moe_decode_v14.cu (issue #13): v9's FP4 decode and MMA order
// for one chunk (compute_fp4), shared so that v14's shared-memory ring feeds the same function
// the same operands (bit-identical sums). Include from .cu only.
#pragma once
#include "model/deepseek/cuda/moe_decode_grouped.cuh"
#include "model/deepseek/cuda/moe_fp4_pairs.h"

namespace deepinfer::model::ds::cuda::moe_grouped {

// One FP4 row's 16 words as dequant_row<kFP4, kAlu> builds them (the same bits), except that a
// scale past 2^1 (s > 128) only gets its first factor 2^126 here; returns whether it needs the
// second (fix_big).
__device__ __forceinline__ bool dequant_fp4(const uint4& raw, uint32_t s, uint32_t (&a)[16], uint32_t se, uint32_t so) {
  const uint32_t* rw = reinterpret_cast<const uint32_t*>(&raw);
  const bool big = s > 128;
  const uint32_t m1 = big ? 0x7E807E80u : ((s + 126u) << 7) * 0x10001u;
#pragma unroll
  for (int wi = 0; wi < 4; ++wi) {
    uint32_t o[4];
    fp4_pair_words(rw[wi], o, se, so);
#pragma unroll
    for (int q = 0; q < 4; ++q) a[4 * wi + q] = mul_bf16x2(o[q], m1);
  }
  return big;
}
// The second factor of a big scale (2^(s-127)); rows that are not big are multiplied by 1.0,
// which is exact for every finite bf16 (they are finite: s <= 128 keeps |w| <= 6 * 2^1).
__device__ __forceinline__ void fix_big(uint32_t s, uint32_t (&a)[16]) {
  const uint32_t m2 = s > 128 ? e8m0_bf16x2(s) : 0x3F803F80u;
#pragma unroll
  for (int j = 0; j < 16; ++j) a[j] = mul_bf16x2(a[j], m2);
}

// compute_stage<kFP4, kAlu, MT> with the cheaper decode; same operands, same MMA order.
template <int MT>
__device__ __forceinline__ void compute_fp4(const Stage<ExpertFormat::kFP4, MT>& st, float (&acc)[MT][4]) {
  // fp4_pair_words' sign masks as values the compiler cannot fold (blockIdx.z is 0: launch_format
  // launches a 2-D grid), so each stays one mask shared by two words
  const uint32_t se = kFp4EvenSigns | blockIdx.z, so = kFp4OddSigns | blockIdx.z;
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(st.x);
  uint32_t xb[16];  // B words in the A words' input order (inputs 8wi+q | 8wi+q+4)
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int wi = j / 4, q = j % 4, m1 = 4 * wi + q / 2;
    xb[j] = __byte_perm(xw[m1], xw[m1 + 2], q % 2 ? 0x7632 : 0x5410);
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    uint32_t a0[16], a1[16];
    const bool b0 = dequant_fp4(st.w[m][0][0], st.s[m][0], a0, se, so);
    const bool b1 = dequant_fp4(st.w[m][1][0], st.s[m][1], a1, se, so);
    if (b0 || b1) {  // e8m0 > 128: not in the released checkpoints' FP4 scales, kept exact
      fix_big(st.s[m][0], a0);
      fix_big(st.s[m][1], a1);
    }
#pragma unroll
    for (int s = 0; s < 8; ++s) mma_bf16(acc[m], a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1], xb[2 * s], xb[2 * s + 1]);
  }
}

// Diagnostic probes (variants kMoeDecodeGroupedProbeFirst..): the chunk's loaded words folded by
// xor into an accumulator's bits instead of decoded and multiplied, so the loads stay live and
// the kernel measures its access pattern alone.
template <ExpertFormat F, int MT>
__device__ __forceinline__ void probe_fold(const Stage<F, MT>& st, float (&acc)[MT][4]) {
  uint32_t f = 0;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int v = 0; v < kRawVecs<F>; ++v) f ^= st.w[m][h][v].x ^ st.w[m][h][v].y ^ st.w[m][h][v].z ^ st.w[m][h][v].w;
      f ^= st.s[m][h];
    }
#pragma unroll
  for (int v = 0; v < 4; ++v) f ^= st.x[v].x ^ st.x[v].y ^ st.x[v].z ^ st.x[v].w;
  acc[0][0] = __uint_as_float(__float_as_uint(acc[0][0]) ^ f);
}

}  // namespace deepinfer::model::ds::cuda::moe_grouped
