// Grouped expert GEMM on Hopper warpgroup MMA (grouped_gemm_sm90.h). One block = 2 warpgroups
// (256 threads) computes a 128 x 256 output tile: warpgroup g owns rows 64g..64g+63 (tile 2j+g of
// the expert) with 128 f32 accumulators per thread (m64n256k16 bf16 wgmma). Why this shape: the
// dequantised weight slab (256 x 64 per K step) feeds both warpgroups, so each dequantised weight
// serves 128 rows instead of 64; dequantisation, not the MMA, is the cost to spread.
//
// Per K step of 64 (one 128-byte swizzle atom wide):
//   global -> smem by cp.async (kStages-deep ring): the activation rows gathered through x_rows,
//     written straight into wgmma's 128B-swizzled K-major layout, and the raw weight bytes
//     (FP4/FP8, linear) or the bf16 weights (plain, swizzled, read by wgmma in place);
//   FP4/FP8: raw -> bf16 into one of two swizzled B tiles, done by the same warps while the
//     previous step's wgmma runs asynchronously on the tensor cores: by bit arithmetic (FP4 by
//     default; moe_dequant.h) or through a lookup table + the exact power-of-two multiply, as the
//     mma.sync kernel (FP8 by default: measured faster there, see grouped_gemm_wgmma);
//   fence.proxy.async + barrier, then 4 wgmma (k16 slices) per warpgroup, committed as one group.
// The lookup table has 32 copies (one per lane: entry b of lane l at b * 32 + l), so the random
// byte lookups of a warp never collide on a bank.
//
// Numerics: fp32 accumulation, k16 slices in increasing k for every row whatever its neighbours
// (batch invariant); plain weights go through the identical MMA sequence, so FP4/FP8 equal their
// bf16 dequantisation bit for bit. Zero-filled rows/columns/k past the segment, N and K add 0.
#include "ops/cuda/grouped_gemm_sm90.h"

#include <cuda_bf16.h>

#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/moe_dequant.h"
#include "ops/cuda/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH__) && !DI_WGMMA_ENABLED
// Device passes other than sm_90a (sm_100a) compile the kernel body out, leaving its helpers
// unreferenced; that is by design, not a mistake to warn about.
#pragma nv_diag_suppress 177
#endif

namespace deepinfer::ops::cuda {
namespace {

constexpr int WM = kWgmmaTileM, WN = kWgmmaTileN, BK = 64, kThreads = 256;
constexpr int kAtomRow = BK * 2;  // bytes of one swizzled row (64 bf16)

// The stage layout of format F.
template <ExpertFormat F>
struct Layout {
  // raw bytes of one weight row per K step; chunk = 16 bytes = kElems weights
  static constexpr int kRawRow = F == ExpertFormat::kFP4 ? 32 : F == ExpertFormat::kFP8 ? 64 : kAtomRow;
  static constexpr int kElems = F == ExpertFormat::kFP4 ? 32 : F == ExpertFormat::kFP8 ? 16 : 8;
  static constexpr int kChunksPerRow = kRawRow / 16;
  static constexpr int kChunks = WN * kChunksPerRow / kThreads;  // per thread: FP4 2, FP8 4, plain 8
  static constexpr int kAStage = WM * kAtomRow;                  // 16 KB
  static constexpr int kStage = kAStage + WN * kRawRow;          // multiple of 1024 (atom alignment)
  static constexpr int kBTile = WN * kAtomRow;                   // one bf16 B tile, 32 KB
  static constexpr int kBs = F == ExpertFormat::kPlain ? 0 : 2 * kBTile;
};
// kTable: round one's table dequantisation (GroupedGemmKernel::kWgmmaTable, kept for timing);
// otherwise bit arithmetic (moe_dequant.h), which frees the table's 32 KB for one more stage.
template <ExpertFormat F, bool kTable = false>
struct Cfg : Layout<F> {
  using L = Layout<F>;
  // cp.async ring depth: as deep as the 227 KB of shared memory allow (prefetch distance
  // kStages - 2 steps, with one block per SM the only latency hiding there is).
  static constexpr int kStages = F == ExpertFormat::kPlain ? 4 : F == ExpertFormat::kFP4 ? (kTable ? 5 : 6) : (kTable ? 4 : 5);
  static constexpr int kLut = F == ExpertFormat::kPlain || !kTable ? 0 : 256 * 32 * 4;
  // + 1024: the dynamic smem base is aligned up to an atom by hand.
  // Table: FP4 217 KB, FP8 225 KB; bits: FP4 209 KB, FP8 225 KB; plain 193 KB: one block per SM.
  static constexpr int kBytes = kStages * L::kStage + L::kBs + kLut + 1024;
};
// Raw chunks per thread when kT threads share the copies / dequantisation of a stage.
template <ExpertFormat F, int kT>
constexpr int kChunksOf = WN * Cfg<F>::kChunksPerRow / kT;

static_assert(Cfg<ExpertFormat::kFP8>::kBytes + WM * 8 <= 227 * 1024, "FP8 shared memory over the sm_90 limit");
static_assert(Cfg<ExpertFormat::kFP4>::kBytes + WM * 8 <= 227 * 1024, "FP4 shared memory over the sm_90 limit");
static_assert(Cfg<ExpertFormat::kFP8, true>::kBytes + WM * 8 <= 227 * 1024, "FP8 shared memory over the sm_90 limit");
static_assert(Cfg<ExpertFormat::kFP4, true>::kBytes + WM * 8 <= 227 * 1024, "FP4 shared memory over the sm_90 limit");

// Byte offset of 16-byte chunk c of row r in a swizzled K-major tile.
__device__ __forceinline__ uint32_t sw(int r, int c) { return uint32_t(r * kAtomRow + ((c ^ (r & 7)) << 4)); }

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// cp.async of K step k0: A (128 gathered rows) into the swizzled A stage, the weight rows
// n0..n0+255 into the B part. Rows past the segment / N and k past K are zero-filled.
// kT threads (thread index tid) share the copies.
template <ExpertFormat F, int kT = kThreads>
__device__ __forceinline__ void issue_stage(const GroupedGemmParams& p, const int64_t* xrow, int64_t k0,
                                            const uint8_t* w, int64_t n0, uint32_t st, int tid) {
  using C = Cfg<F>;
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(p.x);
#pragma unroll
  for (int j = 0; j < WM * 8 / kT; ++j) {
    const int i = tid + j * kT, r = i / 8, ch = i % 8;
    const int64_t k = k0 + ch * 8;
    const bool ok = xrow[r] >= 0 && k < p.K;
    cp_async16(st + sw(r, ch), ok ? x + xrow[r] * p.ldx + k : x, ok ? 16 : 0);
  }
#pragma unroll
  for (int j = 0; j < kChunksOf<F, kT>; ++j) {
    const int i = tid + j * kT, r = i / C::kChunksPerRow, ch = i % C::kChunksPerRow;
    const int64_t n = n0 + r, k = k0 + ch * C::kElems;
    const bool ok = n < p.N && k < p.K;  // K % 32 == 0: a chunk is all in or all out
    const uint8_t* src = w;
    if (ok) {
      if constexpr (F == ExpertFormat::kFP4) src = w + n * (p.K / 2) + k / 2;
      else if constexpr (F == ExpertFormat::kFP8) src = w + n * p.K + k;
      else src = w + (n * p.K + k) * 2;
    }
    const uint32_t dst = F == ExpertFormat::kPlain ? sw(r, ch) : uint32_t(r * C::kRawRow + ch * 16);
    cp_async16(st + C::kAStage + dst, src, ok ? 16 : 0);
  }
}

// The e8m0 scales of the thread's raw chunks in step k0 (127 = 1.0 past N or K).
template <ExpertFormat F, int kT = kThreads>
__device__ __forceinline__ void load_scales(const GroupedGemmParams& p, const uint8_t* sc, int64_t n0, int64_t k0,
                                            uint32_t (&s)[kChunksOf<F, kT>], int tid) {
  using C = Cfg<F>;
  constexpr int blk = F == ExpertFormat::kFP4 ? 32 : 128;
  const int64_t ns = (p.K + blk - 1) / blk;
#pragma unroll
  for (int j = 0; j < kChunksOf<F, kT>; ++j) {
    const int i = tid + j * kT, r = i / C::kChunksPerRow, ch = i % C::kChunksPerRow;
    const int64_t n = n0 + r, k = k0 + ch * C::kElems;
    s[j] = n < p.N && k < p.K ? __ldg(sc + n * ns + k / blk) : 127u;
  }
}

// Lane-replicated table: FP4 byte -> bf16x2 of its nibbles (low nibble low half); FP8 byte -> bf16.
template <ExpertFormat F>
__device__ void fill_lut(uint32_t* lut) {
  for (int i = threadIdx.x; i < 256 * 32; i += kThreads) {
    const uint32_t b = uint32_t(i) >> 5;
    lut[i] = F == ExpertFormat::kFP4 ? fp4_bf16_bits(b & 15) | (fp4_bf16_bits(b >> 4) << 16) : fp8_bf16_bits(b);
  }
}

// Table-free decode of one raw 32-bit word with e8m0 scale e: FP4 8 nibbles -> o[0..3], FP8 4
// bytes -> o[0..1] (bf16x2, lower k in the low half). An FP8 word holding a NaN code takes the
// exact per-byte decoder (never in real weights; keeps NaN a NaN).
template <ExpertFormat F>
__device__ __forceinline__ void decode_word(uint32_t w, const Bf16x2Scale& s, uint32_t* o) {
  if constexpr (F == ExpertFormat::kFP4) {
    const uint32_t w4 = w << 4;
    o[0] = apply_scale(fp4x2_bits_biased<0>(w, w4), s);
    o[1] = apply_scale(fp4x2_bits_biased<1>(w, w4), s);
    o[2] = apply_scale(fp4x2_bits_biased<2>(w, w4), s);
    o[3] = apply_scale(fp4x2_bits_biased<3>(w, w4), s);
  } else {
    if (fp8_word_has_nan(w)) {
      o[0] = mul_bf16x2(fp8_bf16_bits(w & 0xff) | (fp8_bf16_bits((w >> 8) & 0xff) << 16), s.m2);
      o[1] = mul_bf16x2(fp8_bf16_bits((w >> 16) & 0xff) | (fp8_bf16_bits(w >> 24) << 16), s.m2);
    } else {
      o[0] = apply_scale(fp8x2_bits_biased<0>(w), s);
      o[1] = apply_scale(fp8x2_bits_biased<2>(w), s);
    }
  }
}

// Raw weight stage -> swizzled bf16 B tile, table-free (decode_word).
template <ExpertFormat F, int kT = kThreads>
__device__ __forceinline__ void dequant_bits(const uint8_t* raw, uint8_t* bs, const uint32_t (&s)[kChunksOf<F, kT>],
                                             int tid) {
  using C = Cfg<F>;
#pragma unroll
  for (int j = 0; j < kChunksOf<F, kT>; ++j) {
    const int i = tid + j * kT, r = i / C::kChunksPerRow, ch = i % C::kChunksPerRow;
    const Bf16x2Scale sc = bf16x2_scale<F == ExpertFormat::kFP4 ? 126 : 120>(s[j]);
    const uint4 rv = *reinterpret_cast<const uint4*>(raw + r * C::kRawRow + ch * 16);
    const uint32_t w[4] = {rv.x, rv.y, rv.z, rv.w};
    if constexpr (F == ExpertFormat::kFP4) {  // 16 bytes -> 32 bf16 = 4 swizzle chunks, one word each
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t o[4];
        decode_word<F>(w[q], sc, o);
        *reinterpret_cast<uint4*>(bs + sw(r, 4 * ch + q)) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    } else {  // 16 bytes -> 16 bf16 = 2 swizzle chunks, two words each
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        uint32_t o[4];
        decode_word<F>(w[2 * q], sc, o);
        decode_word<F>(w[2 * q + 1], sc, o + 2);
        *reinterpret_cast<uint4*>(bs + sw(r, 2 * ch + q)) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
}

// Raw weight stage -> swizzled bf16 B tile. lut: this lane's column of the table.
template <ExpertFormat F>
__device__ __forceinline__ void dequant(const uint8_t* raw, uint8_t* bs, const uint32_t* lut,
                                        const uint32_t (&s)[Cfg<F>::kChunks]) {
  using C = Cfg<F>;
#pragma unroll
  for (int j = 0; j < C::kChunks; ++j) {
    const int i = threadIdx.x + j * kThreads, r = i / C::kChunksPerRow, ch = i % C::kChunksPerRow;
    const uint32_t s2 = e8m0_bf16x2(s[j]);
    const uint4 rv = *reinterpret_cast<const uint4*>(raw + r * C::kRawRow + ch * 16);
    const uint32_t w[4] = {rv.x, rv.y, rv.z, rv.w};
    if constexpr (F == ExpertFormat::kFP4) {  // 16 bytes -> 32 bf16 = 4 swizzle chunks
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint4 o;
        o.x = mul_bf16x2(lut[(w[q] & 0xff) * 32], s2);
        o.y = mul_bf16x2(lut[((w[q] >> 8) & 0xff) * 32], s2);
        o.z = mul_bf16x2(lut[((w[q] >> 16) & 0xff) * 32], s2);
        o.w = mul_bf16x2(lut[(w[q] >> 24) * 32], s2);
        *reinterpret_cast<uint4*>(bs + sw(r, 4 * ch + q)) = o;
      }
    } else {  // 16 e4m3 bytes -> 16 bf16 = 2 swizzle chunks
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        uint32_t o[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const uint32_t word = w[2 * q + b / 2], sh = 16 * (b % 2);
          o[b] = mul_bf16x2(lut[((word >> sh) & 0xff) * 32] | (lut[((word >> (sh + 8)) & 0xff) * 32] << 16), s2);
        }
        *reinterpret_cast<uint4*>(bs + sw(r, 2 * ch + q)) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
}

__device__ __forceinline__ void fence_acc(float (&acc)[128]) {
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::fence_operand(acc[i]);
}

// The 4 k16 wgmmas of one K step for this warpgroup: A rows at a_addr, B tile at b_addr.
__device__ __forceinline__ void mma_step(float (&acc)[128], uint32_t a_addr, uint32_t b_addr) {
  fence_acc(acc);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk)
    wgmma::mma_m64n256k16(acc, wgmma::desc_sw128(a_addr + kk * 32), wgmma::desc_sw128(b_addr + kk * 32), 1);
  wgmma::commit();
  fence_acc(acc);
}

// Rows of this warpgroup inside the segment, columns inside N; pairs stored together when aligned.
// wg: the warpgroup's 64-row half of the block tile.
__device__ __forceinline__ void store_tile(const GroupedGemmParams& p, const float (&acc)[128], int64_t row0,
                                           int64_t row_end, int64_t n0, int wg) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const bool f32 = p.y_dtype == DType::kF32;
  const bool vec = p.ldy % 2 == 0 && (reinterpret_cast<uintptr_t>(p.y) & (f32 ? 7 : 3)) == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t a = row0 + wg * 64 + warp * 16 + lane / 4 + 8 * h;
    if (a >= row_end) continue;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int64_t n = n0 + 8 * j + 2 * (lane % 4);
      if (n >= p.N) continue;
      const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
      const bool both = n + 1 < p.N;
      if (f32) {
        float* y = static_cast<float*>(p.y) + a * p.ldy + n;
        if (both && vec) *reinterpret_cast<float2*>(y) = make_float2(v0, v1);
        else { y[0] = v0; if (both) y[1] = v1; }
      } else {
        __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y) + a * p.ldy + n;
        if (both && vec) *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(v0, v1);
        else { y[0] = __float2bfloat16_rn(v0); if (both) y[1] = __float2bfloat16_rn(v1); }
      }
    }
  }
}

template <ExpertFormat F, bool kTable>
__global__ void __launch_bounds__(kThreads, 1) grouped_gemm_wgmma_kernel(const __grid_constant__ GroupedGemmParams p) {
#if DI_WGMMA_ENABLED
  using C = Cfg<F, kTable>;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int64_t xrow[WM];
  // 1-D grid, the column block fastest: blocks running together share their activation rows
  // (L2 hits) and each expert's weights are read once.
  const int64_t ncol = (p.N + WN - 1) / WN, tile = int64_t(blockIdx.x) / ncol;
  if (tile >= *p.num_tiles) return;
  const int32_t code = p.tiles[tile];
  const int t = code & 0xffff;
  if (t & 1) return;  // the second half of the block of tile t - 1
  const int e = code >> 16;
  const int64_t row0 = p.seg[e] + int64_t(t) * kGroupedTileM, row_end = p.seg[e + 1];
  const int64_t n0 = (int64_t(blockIdx.x) % ncol) * WN;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid < WM) {
    const int64_t a = row0 + tid;
    xrow[tid] = a < row_end ? (p.x_rows ? p.x_rows[a] : a) : -1;
  }
  const uint32_t base_raw = smem_u32(smem_raw), pad = ((base_raw + 1023) & ~1023u) - base_raw;
  uint8_t* smem = smem_raw + pad;
  const uint32_t sbase = base_raw + pad;
  uint8_t* bs = smem + C::kStages * C::kStage;
  const uint32_t* lut = reinterpret_cast<const uint32_t*>(bs + C::kBs) + tid % 32;
  if constexpr (F != ExpertFormat::kPlain && kTable) fill_lut<F>(reinterpret_cast<uint32_t*>(bs + C::kBs));
  __syncthreads();  // xrow, table

  const uint8_t* w = static_cast<const uint8_t*>(p.w[e]);
  const uint8_t* sc = F == ExpertFormat::kPlain ? nullptr : p.scale[e];
  const int nk = int((p.K + BK - 1) / BK);
  auto stage = [&](int i) { return sbase + uint32_t((i % C::kStages) * C::kStage); };
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < nk) issue_stage<F>(p, xrow, int64_t(s) * BK, w, n0, stage(s), tid);
    cp_async_commit();
  }
  uint32_t scl[C::kChunks];
  if constexpr (F != ExpertFormat::kPlain) load_scales<F>(p, sc, n0, 0, scl, tid);
  cp_async_wait<C::kStages - 2>();
  __syncthreads();  // step 0 landed
  if constexpr (F != ExpertFormat::kPlain) {
    if constexpr (kTable) dequant<F>(smem + C::kAStage, bs, lut, scl);
    else dequant_bits<F>(smem + C::kAStage, bs, scl, tid);
    if (nk > 1) load_scales<F>(p, sc, n0, BK, scl, tid);
  }
  wgmma::fence_proxy_async();
  __syncthreads();

  const bool active = row0 + wg * 64 < row_end;  // warpgroup-uniform: rows of its tile exist
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  for (int i = 0; i < nk; ++i) {
    // step i: A in stage(i), B in bf16 tile i % 2 (plain: in stage(i)); ready, fenced, synced
    const uint32_t a_addr = stage(i) + uint32_t(wg * 64 * kAtomRow);
    const uint32_t b_addr = F == ExpertFormat::kPlain ? stage(i) + C::kAStage : sbase + uint32_t(C::kStages * C::kStage + (i & 1) * C::kBTile);
    if (active) {
      mma_step(acc, a_addr, b_addr);
      wgmma::wait<1>();  // step i-1's MMAs done: its stage and B tile are free for this warpgroup
      fence_acc(acc);
    }
    cp_async_wait<C::kStages - 3>();  // step i+1 landed (this thread's copies)
    __syncthreads();               // ... for all threads; step i-1 free in both warpgroups
    if (i + C::kStages - 1 < nk) issue_stage<F>(p, xrow, int64_t(i + C::kStages - 1) * BK, w, n0, stage(i + C::kStages - 1), tid);
    cp_async_commit();
    if (i + 1 < nk) {
      if constexpr (F != ExpertFormat::kPlain) {
        const uint8_t* raw = smem + ((i + 1) % C::kStages) * C::kStage + C::kAStage;
        if constexpr (kTable) dequant<F>(raw, bs + ((i + 1) & 1) * C::kBTile, lut, scl);
        else dequant_bits<F>(raw, bs + ((i + 1) & 1) * C::kBTile, scl, tid);
        if (i + 2 < nk) load_scales<F>(p, sc, n0, int64_t(i + 2) * BK, scl, tid);
      }
      wgmma::fence_proxy_async();
    }
    __syncthreads();
  }
  if (active) {
    wgmma::wait<0>();
    fence_acc(acc);
    store_tile(p, acc, row0, row_end, n0, wg);
  }
#else
  __trap();  // never launched: the host dispatches here only on sm_90
#endif
}

// ---- warp-specialised variant (GroupedGemmKernel::kWgmmaWs, FP4/FP8; experimental) ----
// 3 warpgroups. WG0, the producer: cp.async of A + raw weights into the kStages ring, table-free
// dequantisation into a 2-deep ring of bf16 B tiles. WG1/WG2, the consumers (rows 0..63 / 64..127):
// wait, 4 wgmma, commit, keep one MMA group in flight across steps. No block-wide barrier in the
// loop: full[b] (128 producer arrivals) says B tile b and its A stage are ready; empty[s] (one
// arrival per consumer warp, 8) says both consumers finished the step that used ring stage s.
// The producer waits for step i-1's release after publishing step i, which frees both the ring
// stage it prefetches into and the B tile step i+1 dequantises into. Registers: 384 threads fit
// 168 each, enough for the 128 accumulators without setmaxnreg.
constexpr int kWsThreads = 384, kWsProducer = 128;

template <ExpertFormat F>
__global__ void __launch_bounds__(kWsThreads, 1) grouped_gemm_wgmma_ws_kernel(const __grid_constant__ GroupedGemmParams p) {
#if DI_WGMMA_ENABLED
  using C = Cfg<F>;
  constexpr int kP = kWsProducer;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int64_t xrow[WM];
  __shared__ __align__(8) uint64_t bars[2 + C::kStages];
  const int64_t ncol = (p.N + WN - 1) / WN, tile = int64_t(blockIdx.x) / ncol;
  if (tile >= *p.num_tiles) return;
  const int32_t code = p.tiles[tile];
  const int t = code & 0xffff;
  if (t & 1) return;
  const int e = code >> 16;
  const int64_t row0 = p.seg[e] + int64_t(t) * kGroupedTileM, row_end = p.seg[e + 1];
  const int64_t n0 = (int64_t(blockIdx.x) % ncol) * WN;
  // warp-uniform as far as the compiler can tell (a plain tid / 128 makes it serialise the wgmmas)
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (tid < WM) {
    const int64_t a = row0 + tid;
    xrow[tid] = a < row_end ? (p.x_rows ? p.x_rows[a] : a) : -1;
  }
  const uint32_t full0 = smem_u32(&bars[0]), empty0 = smem_u32(&bars[2]);
  if (tid == 0) {
    wgmma::mbar_init(full0, kP);
    wgmma::mbar_init(full0 + 8, kP);
    for (int s = 0; s < C::kStages; ++s) wgmma::mbar_init(empty0 + 8 * s, 8);
    wgmma::mbar_init_fence();
  }
  const uint32_t base_raw = smem_u32(smem_raw), pad = ((base_raw + 1023) & ~1023u) - base_raw;
  uint8_t* smem = smem_raw + pad;
  const uint32_t sbase = base_raw + pad, bsbase = sbase + uint32_t(C::kStages * C::kStage);
  uint8_t* bs = smem + C::kStages * C::kStage;
  __syncthreads();  // xrow, barriers

  const int nk = int((p.K + BK - 1) / BK);
  auto stage = [&](int i) { return sbase + uint32_t((i % C::kStages) * C::kStage); };
  if (wg == 0) {
    const uint8_t* w = static_cast<const uint8_t*>(p.w[e]);
    const uint8_t* sc = p.scale[e];
#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
      if (s < nk) issue_stage<F, kP>(p, xrow, int64_t(s) * BK, w, n0, stage(s), tid);
      cp_async_commit();
    }
    uint32_t scl[kChunksOf<F, kP>];
    load_scales<F, kP>(p, sc, n0, 0, scl, tid);
    for (int i = 0; i < nk; ++i) {
      cp_async_wait<C::kStages - 2>();  // step i landed (this thread's copies; the barrier gathers all)
      dequant_bits<F, kP>(smem + (i % C::kStages) * C::kStage + C::kAStage, bs + (i & 1) * C::kBTile, scl, tid);
      if (i + 1 < nk) load_scales<F, kP>(p, sc, n0, int64_t(i + 1) * BK, scl, tid);
      wgmma::fence_proxy_async();  // dequantised B and cp.async'd A -> visible to wgmma
      wgmma::mbar_arrive(full0 + 8 * (i & 1));
      if (i >= 1) wgmma::mbar_wait(empty0 + 8 * ((i - 1) % C::kStages), uint32_t((i - 1) / C::kStages) & 1);
      const int j = i + C::kStages - 1;  // into the stage of step i - 1, now free
      if (j < nk) issue_stage<F, kP>(p, xrow, int64_t(j) * BK, w, n0, stage(j), tid);
      cp_async_commit();
    }
  } else {
    const int cw = wg - 1, lane = tid % 32;
    const bool active = row0 + cw * 64 < row_end;  // warpgroup-uniform; an idle one still signals
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    for (int i = 0; i < nk; ++i) {
      wgmma::mbar_wait(full0 + 8 * (i & 1), uint32_t(i >> 1) & 1);
      if (active) {
        mma_step(acc, stage(i) + uint32_t(cw * 64 * kAtomRow), bsbase + uint32_t((i & 1) * C::kBTile));
        wgmma::wait<1>();  // step i-1's MMAs done
        fence_acc(acc);
      }
      if (i >= 1 && lane == 0) wgmma::mbar_arrive(empty0 + 8 * ((i - 1) % C::kStages));
    }
    if (active) {
      wgmma::wait<0>();
      fence_acc(acc);
      store_tile(p, acc, row0, row_end, n0, cw);
    }
  }
#else
  __trap();
#endif
}

template <ExpertFormat F>
void launch_ws(const GroupedGemmParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = Cfg<F>::kBytes;
  DI_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_wgmma_ws_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  grouped_gemm_wgmma_ws_kernel<F><<<grid, kWsThreads, smem, stream>>>(p);
}

template <ExpertFormat F, bool kTable = false>
void launch(const GroupedGemmParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int smem = Cfg<F, kTable>::kBytes;
  DI_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_wgmma_kernel<F, kTable>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  grouped_gemm_wgmma_kernel<F, kTable><<<grid, kThreads, smem, stream>>>(p);
}

// ---- swap-AB variant (GroupedGemmKernel::kWgmmaSwapAB): y^T = W x^T for few rows per expert ----
// One block = one warpgroup (128 threads) = one 64-row segment tile x one 64-feature slab. The
// expert's weight rows are wgmma's A operand straight from registers (m64 = the 64 features):
// each thread loads its fragment's raw bytes from global memory (16-byte loads, the 4 lanes of a
// quad share one: a warp request touches 8 rows x 16 bytes), picks its bytes with prmt and decodes
// them into bf16x2 registers (decode_word: an FP4 byte or an FP8 pair per register). The tile's
// token rows are B in shared memory (cp.async, 128B-swizzled K-major, a 3-deep ring), wgmma's n =
// the smallest of 8/16/32/64 covering the tile's rows, so empty rows cost (almost) nothing and no
// bf16 weight tile round-trips shared memory. The next K step's weight bytes are loaded before
// this step's MMAs (one step of register prefetch); latency is otherwise hidden by occupancy
// (~40 KB smem or less, several blocks per SM).
// Numerics: fp32 accumulation, k16 slices in increasing k (per row the same sequence whatever n
// and the neighbours: batch invariant, as far as the MMA's own per-element order does not depend
// on n; tested), the same bf16 weights as the other kernels. Another MMA shape could order a k16
// slice differently, so bit-identity with them is not guaranteed; on the H200 it held at every
// V4-Flash shape measured (8-4,096 tokens, FP4 and FP8: PERFORMANCE.md "round three").
constexpr int kSwThreads = 128, kSwFeat = 64, kSwStages = 3;
__device__ __forceinline__ void fence_reg(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// Raw weight bytes of one K step (64 inputs) for this thread's two fragment rows (g, g + 8).
template <ExpertFormat F>
struct SwRaw {
  // FP4: 2 rows x 2 segments (32 inputs, 16 bytes); FP8: 2 rows x 4 slices (16 inputs, 16 bytes);
  // plain: 2 rows x 4 slices x 2 words (k 2t and 2t + 8).
  static constexpr int kVec = F == ExpertFormat::kFP4 ? 4 : F == ExpertFormat::kFP8 ? 8 : 0;
  uint4 v[kVec > 0 ? kVec : 1];
  uint32_t plain[F == ExpertFormat::kPlain ? 16 : 1];
  uint32_t s[F == ExpertFormat::kFP4 ? 4 : 2];  // e8m0 scales: FP4 [row][seg], FP8 [row]
};

template <ExpertFormat F>
__device__ __forceinline__ void sw_load(const GroupedGemmParams& p, const uint8_t* w, const uint8_t* sc, int64_t nrow,
                                        int64_t k0, int t, SwRaw<F>& r) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = nrow + 8 * h;
    const bool nok = n < p.N;
    if constexpr (F == ExpertFormat::kFP4) {
      const int64_t ns = p.K / 32;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int64_t k = k0 + 32 * s;
        const bool ok = nok && k < p.K;
        r.v[2 * h + s] = ok ? __ldg(reinterpret_cast<const uint4*>(w + n * (p.K / 2) + k / 2)) : make_uint4(0, 0, 0, 0);
        r.s[2 * h + s] = ok ? __ldg(sc + n * ns + k / 32) : 127u;
      }
    } else if constexpr (F == ExpertFormat::kFP8) {
      const int64_t ns = (p.K + 127) / 128;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int64_t k = k0 + 16 * kk;
        const bool ok = nok && k < p.K;
        r.v[4 * h + kk] = ok ? __ldg(reinterpret_cast<const uint4*>(w + n * p.K + k)) : make_uint4(0, 0, 0, 0);
      }
      r.s[h] = nok && k0 < p.K ? __ldg(sc + n * ns + k0 / 128) : 127u;
    } else {
      const uint32_t* wp = reinterpret_cast<const uint32_t*>(w);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int64_t k = k0 + 16 * kk + 8 * q + 2 * t;
          r.plain[8 * h + 2 * kk + q] = nok && k < p.K ? __ldg(wp + (n * p.K + k) / 2) : 0u;
        }
    }
  }
}

// Raw bytes -> the 4 k16 A fragments of the step: a[kk] = {row g k 2t, row g+8 k 2t, row g k 2t+8,
// row g+8 k 2t+8} (bf16x2 each).
template <ExpertFormat F>
__device__ __forceinline__ void sw_frag(const SwRaw<F>& r, int t, uint32_t (&a)[4][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (F == ExpertFormat::kFP4) {
      const uint32_t sel = uint32_t(t) | (uint32_t(t + 4) << 4);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint4 v = r.v[2 * h + s];
        // byte t of each word: segment bytes t, 4+t, 8+t, 12+t = inputs 2t, 8+2t, 16+2t, 24+2t
        const uint32_t word = __byte_perm(__byte_perm(v.x, v.y, sel), __byte_perm(v.z, v.w, sel), 0x5410);
        uint32_t o[4];
        decode_word<F>(word, bf16x2_scale<126>(r.s[2 * h + s]), o);
        a[2 * s][h] = o[0];
        a[2 * s][2 + h] = o[1];
        a[2 * s + 1][h] = o[2];
        a[2 * s + 1][2 + h] = o[3];
      }
    } else if constexpr (F == ExpertFormat::kFP8) {
      const uint32_t sel = uint32_t(2 * t) | (uint32_t(2 * t + 1) << 4);
      const Bf16x2Scale sc = bf16x2_scale<120>(r.s[h]);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint4 v = r.v[4 * h + kk];
        // bytes 2t, 2t+1 (inputs 2t..) and 8+2t, 9+2t of the slice's 16
        const uint32_t word = __byte_perm(__byte_perm(v.x, v.y, sel), __byte_perm(v.z, v.w, sel), 0x5410);
        uint32_t o[4];
        decode_word<F>(word, sc, o);
        a[kk][h] = o[0];
        a[kk][2 + h] = o[1];
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        a[kk][h] = r.plain[8 * h + 2 * kk];
        a[kk][2 + h] = r.plain[8 * h + 2 * kk + 1];
      }
    }
  }
}

template <int NT>
__device__ __forceinline__ void sw_mma(float (&d)[NT / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (NT == 8) wgmma::mma_m64n8k16_rs(d, a, db, 1);
  else if constexpr (NT == 16) wgmma::mma_m64n16k16_rs(d, a, db, 1);
  else if constexpr (NT == 32) wgmma::mma_m64n32k16_rs(d, a, db, 1);
  else wgmma::mma_m64n64k16_rs(d, a, db, 1);
}

// cp.async of K step k0's token rows 0..NT-1 (gathered through xrow; -1 / past K: zero-filled).
template <int NT>
__device__ __forceinline__ void sw_issue_x(const GroupedGemmParams& p, const int64_t* xrow, int64_t k0, uint32_t st,
                                           int tid) {
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(p.x);
  constexpr int kChunks = NT * 8;
#pragma unroll
  for (int j = 0; j < (kChunks + kSwThreads - 1) / kSwThreads; ++j) {
    const int i = tid + j * kSwThreads;
    if (kChunks % kSwThreads == 0 || i < kChunks) {
      const int r = i / 8, ch = i % 8;
      const int64_t k = k0 + ch * 8;
      const bool ok = xrow[r] >= 0 && k < p.K;
      cp_async16(st + sw(r, ch), ok ? x + xrow[r] * p.ldx + k : x, ok ? 16 : 0);
    }
  }
}

template <ExpertFormat F, int NT>
__device__ __forceinline__ void sw_tile(const GroupedGemmParams& p, const int64_t* xrow, uint32_t sbase, int e,
                                        int64_t row0, int64_t row_end, int64_t f0) {
  constexpr int kStage = NT * kAtomRow;  // NT token rows x 64 bf16
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const uint8_t* w = static_cast<const uint8_t*>(p.w[e]);
  const uint8_t* sc = F == ExpertFormat::kPlain ? nullptr : p.scale[e];
  const int64_t nrow = f0 + warp * 16 + g;
  const int nk = int((p.K + BK - 1) / BK);
#pragma unroll
  for (int s = 0; s < kSwStages - 1; ++s) {
    if (s < nk) sw_issue_x<NT>(p, xrow, int64_t(s) * BK, sbase + uint32_t(s * kStage), tid);
    cp_async_commit();
  }
  SwRaw<F> cur, nxt;
  sw_load<F>(p, w, sc, nrow, 0, t, cur);
  float acc[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) acc[i] = 0.f;
  for (int i = 0; i < nk; ++i) {
    if (i + 1 < nk) sw_load<F>(p, w, sc, nrow, int64_t(i + 1) * BK, t, nxt);
    uint32_t a[4][4];
    sw_frag<F>(cur, t, a);
    cp_async_wait<kSwStages - 2>();  // step i landed (this thread's copies)
    wgmma::fence_proxy_async();
    __syncthreads();                 // ... all threads'; every thread's step i-1 MMAs done (wait<0>)
    {
      const int j = i + kSwStages - 1;  // into the slot of step i - 1
      if (j < nk) sw_issue_x<NT>(p, xrow, int64_t(j) * BK, sbase + uint32_t((j % kSwStages) * kStage), tid);
      cp_async_commit();
    }
    const uint32_t b = sbase + uint32_t((i % kSwStages) * kStage);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) fence_reg(a[kk][q]);
#pragma unroll
    for (int q = 0; q < NT / 2; ++q) wgmma::fence_operand(acc[q]);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) sw_mma<NT>(acc, a[kk], wgmma::desc_sw128(b + kk * 32));
    wgmma::commit();
    wgmma::wait<0>();
#pragma unroll
    for (int q = 0; q < NT / 2; ++q) wgmma::fence_operand(acc[q]);
    // the A registers stay allocated until the MMAs that read them are done
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) fence_reg(a[kk][q]);
    cur = nxt;
  }
  // d[4j + 2h + q]: feature nrow + 8h, token 8j + 2t + q
  const bool f32 = p.y_dtype == DType::kF32;
#pragma unroll
  for (int j = 0; j < NT / 8; ++j)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int64_t a = row0 + 8 * j + 2 * t + q;
      if (a >= row_end) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t n = nrow + 8 * h;
        if (n >= p.N) continue;
        const float v = acc[4 * j + 2 * h + q];
        if (f32) static_cast<float*>(p.y)[a * p.ldy + n] = v;
        else static_cast<__nv_bfloat16*>(p.y)[a * p.ldy + n] = __float2bfloat16_rn(v);
      }
    }
}

template <ExpertFormat F>
__global__ void __launch_bounds__(kSwThreads) grouped_gemm_swapab_kernel(const __grid_constant__ GroupedGemmParams p) {
#if DI_WGMMA_ENABLED
  extern __shared__ __align__(16) uint8_t smem_raw[];
  __shared__ int64_t xrow[kGroupedTileM];
  // 1-D grid, the feature slab fastest (blocks running together share the tile's token rows).
  const int64_t nslab = (p.N + kSwFeat - 1) / kSwFeat, tile = int64_t(blockIdx.x) / nslab;
  if (tile >= *p.num_tiles) return;
  const int32_t code = p.tiles[tile];
  const int e = code >> 16;
  const int64_t row0 = p.seg[e] + int64_t(code & 0xffff) * kGroupedTileM;
  const int64_t seg_end = p.seg[e + 1], row_end = seg_end < row0 + kGroupedTileM ? seg_end : row0 + kGroupedTileM;
  const int64_t f0 = (int64_t(blockIdx.x) % nslab) * kSwFeat;
  const int tid = threadIdx.x;
  if (tid < kGroupedTileM) {
    const int64_t a = row0 + tid;
    xrow[tid] = a < row_end ? (p.x_rows ? p.x_rows[a] : a) : -1;
  }
  const uint32_t base_raw = smem_u32(smem_raw), pad = ((base_raw + 1023) & ~1023u) - base_raw;
  const uint32_t sbase = base_raw + pad;
  __syncthreads();  // xrow
  const int64_t rows = row_end - row0;  // 1..64, block-uniform
  if (rows <= 8) sw_tile<F, 8>(p, xrow, sbase, e, row0, row_end, f0);
  else if (rows <= 16) sw_tile<F, 16>(p, xrow, sbase, e, row0, row_end, f0);
  else if (rows <= 32) sw_tile<F, 32>(p, xrow, sbase, e, row0, row_end, f0);
  else sw_tile<F, 64>(p, xrow, sbase, e, row0, row_end, f0);
#else
  __trap();
#endif
}

template <ExpertFormat F>
void launch_swapab(const GroupedGemmParams& p, cudaStream_t stream) {
  const int64_t blocks = p.max_tiles * ((p.N + kSwFeat - 1) / kSwFeat);
  if (blocks >= (int64_t(1) << 31))
    DI_THROW(InvalidArgument, "grouped_gemm (wgmma swap-AB): grid too large (tiles ", p.max_tiles, ", N ", p.N, ")");
  constexpr int smem = kSwStages * 64 * kAtomRow + 1024;  // the n = 64 ring + atom alignment: 25 KB
  // Within the 48 KB any launch may take, so no opt-in attribute call on every launch.
  static_assert(smem <= 48 * 1024, "swap-AB ring beyond the default dynamic shared memory");
  grouped_gemm_swapab_kernel<F><<<dim3(unsigned(blocks)), kSwThreads, smem, stream>>>(p);
}

template <ExpertFormat F>
__global__ void dequant_probe_kernel(const uint32_t* words, const uint8_t* scales, int64_t n, uint32_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t o[4] = {0, 0, 0, 0};
  decode_word<F>(words[i], bf16x2_scale<F == ExpertFormat::kFP4 ? 126 : 120>(scales[i]), o);
  for (int q = 0; q < 4; ++q) out[4 * i + q] = o[q];
}

}  // namespace

void expert_dequant_probe(ExpertFormat f, const uint32_t* words, const uint8_t* scales, int64_t n, uint32_t* out,
                          cudaStream_t stream) {
  if (f == ExpertFormat::kPlain || n <= 0 || n >= (int64_t(1) << 30))
    DI_THROW(InvalidArgument, "expert_dequant_probe: format ", expert_format_name(f), ", n ", n, " (FP4/FP8, 1..2^30)");
  const unsigned blocks = unsigned((n + 255) / 256);
  if (f == ExpertFormat::kFP4) dequant_probe_kernel<ExpertFormat::kFP4><<<blocks, 256, 0, stream>>>(words, scales, n, out);
  else dequant_probe_kernel<ExpertFormat::kFP8><<<blocks, 256, 0, stream>>>(words, scales, n, out);
  DI_CUDA_CHECK_LAUNCH();
}

// kAuto's choice of the swap-AB kernel: FP4/FP8 weights and at most ~40 rows per expert on
// average, estimated from the host bound max_tiles = ceil(rows / 64) + min(experts, rows) (no
// host sync). Measured on an H200 (docs/PERFORMANCE.md "#13 ... round three"): V4-Flash FP4 up /
// down 1.03-1.12x the 128 x 256 wgmma kernel at 1,536 tokens (36 rows per expert), 1.32-1.43x at
// 512 / 64 / 8 tokens, but 0.6x at 4,096 (96 rows per expert); the crossover between 36 and 96
// rows was not measured. Plain weights: not measured, not chosen. Same output bits as the other
// kernels at the measured shapes, so the switch does not change results.
static bool swapab_by_default(const GroupedGemmParams& p) {
  if (p.format == ExpertFormat::kPlain || p.experts <= 0) return false;
  return (p.max_tiles - p.experts) * kGroupedTileM <= 40 * p.experts;
}

void grouped_gemm_wgmma(const GroupedGemmParams& p, cudaStream_t stream) {
  const int64_t blocks = p.max_tiles * ((p.N + WN - 1) / WN);
  if (blocks >= (int64_t(1) << 31))
    DI_THROW(InvalidArgument, "grouped_gemm (wgmma): grid too large (tiles ", p.max_tiles, ", N ", p.N, ")");
  const dim3 grid(static_cast<unsigned>(blocks));
  // Default per format, as measured on an H200 (docs/PERFORMANCE.md "#13 ... round two"): FP4 the
  // table-free decode (248 / 234 TFLOP/s up / down vs 246 / 227 with the table), FP8 the table
  // (190 / 179 vs 151 / 132: its table-free decode, with a NaN test per word, is slower there).
  const bool table = p.kernel == GroupedGemmKernel::kWgmmaTable ||
                     (p.kernel != GroupedGemmKernel::kWgmmaBits && p.format == ExpertFormat::kFP8);
  if (p.kernel == GroupedGemmKernel::kWgmmaSwapAB || (p.kernel == GroupedGemmKernel::kAuto && swapab_by_default(p))) {
    switch (p.format) {
      case ExpertFormat::kPlain: launch_swapab<ExpertFormat::kPlain>(p, stream); break;
      case ExpertFormat::kFP4: launch_swapab<ExpertFormat::kFP4>(p, stream); break;
      case ExpertFormat::kFP8: launch_swapab<ExpertFormat::kFP8>(p, stream); break;
    }
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  const bool ws = p.kernel == GroupedGemmKernel::kWgmmaWs;
  if (ws && p.format != ExpertFormat::kPlain) {
    p.format == ExpertFormat::kFP4 ? launch_ws<ExpertFormat::kFP4>(p, grid, stream) : launch_ws<ExpertFormat::kFP8>(p, grid, stream);
    DI_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (p.format) {
    case ExpertFormat::kPlain: launch<ExpertFormat::kPlain>(p, grid, stream); break;
    case ExpertFormat::kFP4:
      table ? launch<ExpertFormat::kFP4, true>(p, grid, stream) : launch<ExpertFormat::kFP4>(p, grid, stream);
      break;
    case ExpertFormat::kFP8:
      table ? launch<ExpertFormat::kFP8, true>(p, grid, stream) : launch<ExpertFormat::kFP8>(p, grid, stream);
      break;
  }
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
