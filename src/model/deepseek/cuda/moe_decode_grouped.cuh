// Internal to moe_decode*.cu (issue #13): the device pieces of the grouped MoE decode that its
// kernels share — v1..v4 (register-staged loads, moe_decode.cu) and v5 (shared-memory staging by
// cp.async, moe_decode_v5.cu). Both feed compute_stage the same operands, so every variant sums
// the same products in the same order (bit-identical; MoeDecodeGrouped tests). Include from .cu only.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "core/numeric.h"
#include "model/deepseek/cuda/moe_decode.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/moe_dequant.h"

namespace deepinfer::model::ds::cuda::moe_grouped {
using deepinfer::cuda::from_f32;
using deepinfer::cuda::to_f32;
using ops::cuda::ExpertFormat;

// Rounded to the storage dtype like the grouped path's GEMM output, then clamped SwiGLU.
template <typename T>
__device__ __forceinline__ float swiglu_act(float g, float u, float wt, float limit) {
  g = to_f32(from_f32<T>(g));
  u = to_f32(from_f32<T>(u));
  if (limit > 0.f) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  return wt * (g / (1.0f + expf(-g)) * u);
}

constexpr int kTileM = kMoeDecodeTileM;
constexpr int kChunk = 128;  // inputs per K chunk: lane t of a quad owns inputs [32t, 32t + 32)

// 16-byte vectors one lane loads per weight row and chunk (32 inputs).
template <ExpertFormat F>
constexpr int kRawVecs = F == ExpertFormat::kFP4 ? 1 : F == ExpertFormat::kFP8 ? 2 : 4;
using ops::cuda::e8m0_bf16x2;
using ops::cuda::mul_bf16x2;

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// Byte -> bf16 bits: FP4 both nibbles as bf16x2 (low nibble in the low half), FP8 one bf16.
template <ExpertFormat F>
__device__ __forceinline__ void fill_lut(uint32_t* lut) {
  if constexpr (F == ExpertFormat::kFP4)
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
      lut[i] = ops::cuda::fp4_bf16_bits(i & 15) | (ops::cuda::fp4_bf16_bits(i >> 4) << 16);
  else if constexpr (F == ExpertFormat::kFP8)
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = ops::cuda::fp8_bf16_bits(i);
}

// FP4 without a table (kAlu; the table's random per-lane reads conflict on shared-memory banks,
// ~3.5 ways for random bytes, which capped the first version near 1.8 TB/s): nibble c as the
// bf16 bits (c & 8) << 12 | (c & 7) << 6 is e2m1(c) * 2^-126 exactly (e = 0 is the subnormal
// m * 2^-127), so one bf16x2 multiply by 2^(s-1) gives e2m1(c) * 2^(s-127) (exact: a bf16).
// Word q of a 32-bit word of 8 nibbles pairs nibbles q (low half) and q + 4 (high half): one
// shift for the magnitudes, one for the signs, one select.
__device__ __forceinline__ uint32_t fp4_pair_bits(uint32_t w, int q) {
  const uint32_t u = q == 0 ? w << 6 : q == 1 ? w << 2 : q == 2 ? w >> 2 : w >> 6;  // [8:6], [24:22]
  const uint32_t v = w << (12 - 4 * q);                                              // bits 15, 31
  return (u & 0x01C001C0u) | (v & 0x80008000u);
}

// One chunk's registers of a lane: its 32 inputs of the warp's 2*MT weight rows (raw, + scale
// byte) and of its B column (32 bf16 of the column's token; zeros past the tile or past K).
template <ExpertFormat F, int MT>
struct Stage {
  uint4 w[MT][2][kRawVecs<F>];
  uint32_t s[MT][2];
  uint4 x[4];
};

template <ExpertFormat F, int MT>
__device__ __forceinline__ void load_stage(Stage<F, MT>& st, const uint8_t* w, const uint8_t* sc,
                                           const int64_t (&rows)[MT][2], int64_t K, int64_t p0,
                                           const __nv_bfloat16* col) {
  const bool ok = p0 < K;  // K % 32 == 0: a lane's 32 inputs are all in or all out
  const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = rows[m][h];
      const uint4* src;
      if constexpr (F == ExpertFormat::kFP4) src = reinterpret_cast<const uint4*>(w + r * (K / 2) + p0 / 2);
      else if constexpr (F == ExpertFormat::kFP8) src = reinterpret_cast<const uint4*>(w + r * K + p0);
      else src = reinterpret_cast<const uint4*>(w + (r * K + p0) * 2);
#pragma unroll
      for (int v = 0; v < kRawVecs<F>; ++v) st.w[m][h][v] = ok ? __ldg(src + v) : z;
      if constexpr (F == ExpertFormat::kFP4) st.s[m][h] = ok ? __ldg(sc + r * (K / 32) + p0 / 32) : 127u;
      else if constexpr (F == ExpertFormat::kFP8) st.s[m][h] = ok ? __ldg(sc + r * ((K + 127) / 128) + p0 / 128) : 127u;
    }
  const uint4* xs = reinterpret_cast<const uint4*>(col + p0);
#pragma unroll
  for (int v = 0; v < 4; ++v) st.x[v] = ok && col ? __ldg(xs + v) : z;
}

// The 16 bf16x2 words of one row's 32 inputs, scale applied (exact). Word j holds inputs 2j, 2j+1,
// except FP4 with kAlu: word j = 4*wi + q holds inputs 8*wi + q and 8*wi + q + 4.
template <ExpertFormat F, bool kAlu>
__device__ __forceinline__ void dequant_row(const uint4 (&raw)[kRawVecs<F>], uint32_t s, const uint32_t* lut,
                                            uint32_t (&a)[16]) {
  const uint32_t* rw = reinterpret_cast<const uint32_t*>(raw);
  if constexpr (F == ExpertFormat::kFP4 && kAlu) {
    const bool big = s > 128;  // 2^(s-1) past bf16's range: 2^126 first, then the scale
    const uint32_t m1 = big ? 0x7E807E80u : ((s + 126u) << 7) * 0x10001u;
#pragma unroll
    for (int j = 0; j < 16; ++j) a[j] = mul_bf16x2(fp4_pair_bits(rw[j / 4], j % 4), m1);
    if (big) {
      const uint32_t m2 = e8m0_bf16x2(s);
#pragma unroll
      for (int j = 0; j < 16; ++j) a[j] = mul_bf16x2(a[j], m2);
    }
  } else if constexpr (F == ExpertFormat::kFP4) {
    const uint32_t s2 = e8m0_bf16x2(s);
#pragma unroll
    for (int q = 0; q < 16; ++q) a[q] = mul_bf16x2(lut[(rw[q / 4] >> (8 * (q % 4))) & 0xff], s2);
  } else if constexpr (F == ExpertFormat::kFP8) {
    const uint32_t s2 = e8m0_bf16x2(s);
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      const uint32_t word = rw[q / 2], sh = 16 * (q % 2);
      a[q] = mul_bf16x2(lut[(word >> sh) & 0xff] | (lut[(word >> (sh + 8)) & 0xff] << 16), s2);
    }
  } else {
#pragma unroll
    for (int q = 0; q < 16; ++q) a[q] = rw[q];
  }
}

// The chunk's 8 MMA k-steps per m-tile. k-step s takes, per lane, inputs 4s..4s+3 of its 32:
// A {row g: 4s, 4s+1 | row g+8: same | row g: 4s+2, 4s+3 | row g+8: same}, B {4s, 4s+1 | 4s+2, 4s+3}
// of its column — the MMA's k index 2t+j is input 32t+4s+j, 2t+8+j is 32t+4s+2+j.
template <ExpertFormat F, bool kAlu, int MT>
__device__ __forceinline__ void compute_stage(const Stage<F, MT>& st, const uint32_t* lut, float (&acc)[MT][4]) {
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(st.x);
  uint32_t xb[16];  // B words in the A words' input order (kAlu FP4: inputs 8wi+q | 8wi+q+4)
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if constexpr (F == ExpertFormat::kFP4 && kAlu) {
      const int wi = j / 4, q = j % 4, m1 = 4 * wi + q / 2;
      xb[j] = __byte_perm(xw[m1], xw[m1 + 2], q % 2 ? 0x7632 : 0x5410);
    } else {
      xb[j] = xw[j];
    }
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    uint32_t a0[16], a1[16];
    dequant_row<F, kAlu>(st.w[m][0], st.s[m][0], lut, a0);
    dequant_row<F, kAlu>(st.w[m][1], st.s[m][1], lut, a1);
#pragma unroll
    for (int s = 0; s < 8; ++s) mma_bf16(acc[m], a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1], xb[2 * s], xb[2 * s + 1]);
  }
}

// acc[m] += the warp's rows · its columns over all K, chunks in order; S register stages (the
// loads of S - 1 chunks in flight while one is computed). The sums do not depend on MT, W or S.
template <ExpertFormat F, bool kAlu, int MT, int S>
__device__ __forceinline__ void run_rows(const uint8_t* w, const uint8_t* sc, const int64_t (&rows)[MT][2], int64_t K,
                                         const __nv_bfloat16* col, int t, const uint32_t* lut, float (&acc)[MT][4]) {
  const int64_t nc = (K + kChunk - 1) / kChunk;
  Stage<F, MT> st[S];
#pragma unroll
  for (int u = 0; u < S - 1; ++u) load_stage<F, MT>(st[u], w, sc, rows, K, u * kChunk + 32 * t, col);
  for (int64_t c = 0; c < nc; c += S) {
#pragma unroll
    for (int u = 0; u < S; ++u) {
      if (c + u < nc) {
        if (c + u + S - 1 < nc) load_stage<F, MT>(st[(u + S - 1) % S], w, sc, rows, K, (c + u + S - 1) * kChunk + 32 * t, col);
        compute_stage<F, kAlu, MT>(st[u], lut, acc);
      }
    }
  }
}

struct TileRows {
  int e = 0, n = 0;
  int64_t r0 = 0;
};
__device__ __forceinline__ TileRows tile_rows(const MoeDecodeGroupedParams& p) {
  const int32_t code = p.tiles[blockIdx.x];
  TileRows tr;
  tr.e = code >> 16;
  tr.r0 = p.seg[tr.e] + int64_t(code & 0xffff) * kTileM;
  const int64_t left = int64_t(p.seg[tr.e + 1]) - tr.r0;
  tr.n = int(left < kTileM ? left : kTileM);
  return tr;
}

// Epilogues (every variant): a lane's accumulators are A rows g, g + 8 of its m-tiles times
// columns 2t, 2t + 1 (mma.sync m16n8 C layout). Up: gate (rows 0-7) and up (rows 8-15) of gate
// row i0 + 8m + g -> act of the tile's sorted rows; down: output rows j0 + 16m + 8h + g -> ye.
template <int MT>
__device__ __forceinline__ void store_up(const MoeDecodeGroupedParams& p, const TileRows& tr, int64_t i0, int g, int t,
                                         const float (&acc)[MT][4]) {
  const int64_t I = p.inter;
  __nv_bfloat16* act = static_cast<__nv_bfloat16*>(p.act);
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const int64_t i = i0 + 8 * m + g;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int c = 2 * t + q;
      if (i < I && c < tr.n) {
        const int64_t r = tr.r0 + c;
        act[r * I + i] = __float2bfloat16_rn(swiglu_act<__nv_bfloat16>(acc[m][q], acc[m][2 + q], p.perm_w[r], p.limit));
      }
    }
  }
}
template <int MT>
__device__ __forceinline__ void store_down(const MoeDecodeGroupedParams& p, const TileRows& tr, int64_t j0, int g,
                                           int t, const float (&acc)[MT][4]) {
  const int64_t D = p.dim;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t j = j0 + 16 * m + 8 * h + g;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int c = 2 * t + q;
        if (j < D && c < tr.n) p.ye[(tr.r0 + c) * D + j] = acc[m][2 * h + q];
      }
    }
}

// Launches the shared-memory ring's up and down kernels (moe_decode_v5.cu); shape = variant 5..8 (moe_decode.h).
void launch_v5(const MoeDecodeGroupedParams& p, int shape, cudaStream_t stream);
// Launches variants 9..13 (moe_decode_v9.cu): v3's sums with fewer instructions per FP4 byte, in
// v3's / v2's / v1's warp shape, 2 m-tiles x 2 stages, or 2 m-tiles with loads in chunk pairs
// (shape = the variant number; FP4 only).
void launch_v9(const MoeDecodeGroupedParams& p, int shape, cudaStream_t stream);
// Variants 14..16 (moe_decode_v14.cu): FP4 rows by bulk copies into a shared-memory ring; only
// where v14_supported (FP4, dim and inter multiples of 128, 16-byte aligned x and act).
bool v14_supported(const MoeDecodeGroupedParams& p);
void launch_v14(const MoeDecodeGroupedParams& p, int shape, cudaStream_t stream);

}  // namespace deepinfer::model::ds::cuda::moe_grouped
