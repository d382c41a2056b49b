// FP8 weight-only GEMM (gemm_fp8w.h). Layout of the work:
//  * a block of kWarps warps covers 16·kWarps weight rows (16 per warp: the m16 side of
//    mma.m16n8k16, so the WEIGHT is the A operand and up to 8 tiles of 8 tokens are the B operand:
//    M = 1 wastes 7/8 of an n8 tile, not 15/16 of an m16 one);
//  * K advances in stages of 128 (one e8m0 scale column, or 2 / 4 of them for scale_k 64 / 32): the block's weight tile (rows x 128 k,
//    FP8 or bf16) and x tile (tokens x 128 k, bf16) go global -> shared memory by cp.async, 16 B per
//    thread, whole 128-byte lines of a row per 8 threads, kStages deep, so 24-48 KB of weights per
//    block are in flight (the previous version loaded 64-byte pieces of a row into registers, 4 KB
//    per warp, and read x from L1 per warp);
//  * in each 64-k half of a stage, lane (g = lane/4, t = lane%4) takes 16 consecutive weights of its
//    rows g and g+8 and the same 16 k of x (LDS.128, swizzled / padded so a quarter-warp hits 8
//    distinct 16-byte bank groups). The MMA's k order is a permutation of the half, the same for A
//    and B, so the dot products are unchanged: step j (0..3) gives lane t's fragment slots (2t, 2t+1,
//    2t+8, 2t+9) the actual k  half + 16t + 4j + (0, 1, 2, 3);
//  * K is split over the blocks of a thread-block cluster (grid.y = splits <= 8) when the rows alone
//    do not fill the GPU. Each block leaves its partial sums in its shared memory and, after a
//    cluster barrier, every block sums a slice of the outputs over the cluster's blocks in split
//    order through distributed shared memory: no workspace, no second kernel, deterministic. The
//    S remote loads of an output are issued together, then added in order. Unsplit launches carry
//    no cluster attribute;
//  * gemm_fp8w_multi puts up to kFp8wMaxParts weights that read the same x (and have the same
//    split) into one grid, their row blocks one after another along grid.x: one launch's fixed
//    cost (~4 us in a graph on the H200) instead of several.
// Batch invariance: the splits, their k ranges and the MMA sequence inside each depend on the
// weight's shape and the SM count only, and an MMA's output column depends only on its own token,
// so every token's result is bit-identical for any M (1..64 per launch, chunks of 64 above) and any
// batch neighbours (tested: CudaGemmFp8w.BatchInvariant).
// In-register dequantisation: the e4m3 byte b placed as bf16 bits sign | (b & 0x7f) << 4 is
// exactly b's value times 2^-120 (normal or subnormal alike: both formats' mantissas line up),
// and one bf16x2 multiply by 2^(e-7) makes it b · 2^(e-127) — exact, as the product is a bf16
// value of at most 4 significant bits and e <= kFp8wMaxScaleExp keeps it in range.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>

#include "core/check.h"
#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm_fp8w.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::ceil_div;
__host__ __device__ constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
namespace cg = cooperative_groups;

constexpr int kChunk = 128;            // k per pipeline stage (= the scale block along K)
constexpr int kMaxSplits = 8;          // portable cluster size
constexpr int kSplitRows = 64;         // notional rows per block for the split rule (all kernels)
constexpr int kXLd = 2 * kChunk + 16;  // bytes per x row in shared memory (padded: see the header)

__device__ __forceinline__ uint4 ld_stream(const void* p) {  // weights: read once, skip L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
// 16 bytes global -> shared, bypassing L1; src_bytes = 0 fills zeros (rows past N, k past K).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(a), "r"(sel));
  return r;
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}
// Two e4m3 bytes of `v` (bytes 0,1 when hi is false, else 2,3) -> bf16x2 of their values · 2^(e-127),
// `f` = bf16x2 of 2^(e-7). prmt's sign mode puts [sign-fill | byte] in each half; << 4 and the
// mask leave sign | (b & 0x7f) << 4.
template <bool kHi>
__device__ __forceinline__ uint32_t fp8x2_bf16x2(uint32_t v, uint32_t f) {
  const uint32_t p = prmt(v, kHi ? 0xB3A2u : 0x9180u);
  return bf16x2_mul((p << 4) & 0x87f087f0u, f);
}
// bf16x2 of 2^(e-7) in both halves (e <= kFp8wMaxScaleExp).
__device__ __forceinline__ uint32_t scale_factor(uint32_t e) {
  const uint32_t h = (e + 120u) << 7;
  return h | (h << 16);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One weight of a launch: gemm_fp8w has one; gemm_fp8w_multi up to kFp8wMaxParts that read the
// same x (their row blocks follow each other along grid.x).
struct Part {
  const uint8_t* w;      // FP8 bytes, or the bf16 weight as bytes
  const uint8_t* scale;  // FP8 only
  void* y;
  int64_t ldy, N;
  int64_t block0;        // first blockIdx.x of this part
};
struct Args {
  const __nv_bfloat16* x;
  int64_t ldx, bsx;
  Part part[kFp8wMaxParts];
  int parts;
  int64_t scale_rows;
  int scale_sub;         // scale columns per 128-k stage: 1 (scale_k 128), 2 (64) or 4 (32)
  int64_t bsy;
  int64_t M, K, batch;
  int chunks_per_split;
  int scale_slots;       // distinct scale rows one block touches at most (FP8)
};

// Field access to part `i` of the launch by unrolled selects over constant indices, so the fields
// stay in the parameter bank instead of a register copy of the part (the first session-15 version
// copied it and compiled to 90-132 registers where session 14's kernels used 62-112).
struct PartRef {
  const Args& p;
  int i;
  template <typename F>
  __device__ __forceinline__ auto get(F f) const {
    auto v = f(p.part[0]);
#pragma unroll
    for (int j = 1; j < kFp8wMaxParts; ++j)
      if (i == j) v = f(p.part[j]);
    return v;
  }
  __device__ __forceinline__ const uint8_t* w() const { return get([](const Part& q) { return q.w; }); }
  __device__ __forceinline__ const uint8_t* scale() const { return get([](const Part& q) { return q.scale; }); }
  __device__ __forceinline__ void* y() const { return get([](const Part& q) { return q.y; }); }
  __device__ __forceinline__ int64_t ldy() const { return get([](const Part& q) { return q.ldy; }); }
  __device__ __forceinline__ int64_t N() const { return get([](const Part& q) { return q.N; }); }
  __device__ __forceinline__ int64_t block0() const { return get([](const Part& q) { return q.block0; }); }
};

// Shapes of one kernel variant. kNT token tiles of 8 (M <= 8·kNT). Shared memory per block:
// kStages x (weight tile + x tile) + the scale bytes of the block's split.
template <bool kFp8, int kNT>
struct Cfg {
  // More rows per block amortise the x tile; two m16 row tiles per warp (256 rows per block, one
  // block per SM) measured 20-35% slower at M = 64.
  static constexpr int kWarps = kNT >= 4 ? 8 : 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kWarps;
  // Deeper measured slower at every decode shape (session 15's sweep of 4..16 stages, a runtime
  // depth: e.g. wq_b M = 1 11.9 / 12.7 / 16.7 us at 4 / 5 / 6 stages, wo_b 15.5 / 16.3 / 24.9 at
  // 4 / 6 / 8), so more bytes in flight per SM are not what these launches lack.
  static constexpr int kStages = kNT >= 8 ? 3 : 4;
  static constexpr int kWRow = kFp8 ? kChunk : 2 * kChunk;  // bytes of one weight row per stage
  static constexpr int kWSegs = kWRow / 16;
  static constexpr int kWTile = kRows * kWRow;
  static constexpr int kXRows = 8 * kNT;
  static constexpr int kStage = kWTile + kXRows * kXLd;
  static constexpr int kPipe = kStages * kStage;
  static_assert(kRows * kWSegs % kThreads == 0 && kXRows * 16 % kThreads == 0, "whole copies per thread");
  static_assert(kRows * kXRows * 4 <= kPipe, "partial sums reuse the pipeline buffers");
};
// Swizzle of the 16-byte segment s of weight row r: a quarter-warp reads rows 2p, 2p+1 at segments
// t + 4h (FP8) or 2t (+1) + 8h (bf16); flipping a bit by the row's parity sends them to 8 banks groups.
template <bool kFp8>
__device__ __forceinline__ int wswz(int r, int s) {
  return kFp8 ? s ^ ((r & 1) << 2) : s ^ (r & 1);
}

// Issues the cp.async copies of local chunk ci (global chunk c0 + ci) into pipeline slot `slot`.
template <bool kFp8, int kNT>
__device__ __forceinline__ void load_stage(const Args& p, const uint8_t* w, uint8_t* smem, int slot, int64_t k0,
                                           int64_t wrow0, int64_t rows_left, const __nv_bfloat16* xb) {
  using C = Cfg<kFp8, kNT>;
  uint8_t* Ws = smem + slot * C::kStage;
  uint8_t* Xs = Ws + C::kWTile;
  constexpr int kEb = kFp8 ? 1 : 2;             // bytes per weight
  constexpr int kSegK = 16 / kEb;               // k per weight segment
#pragma unroll
  for (int j = 0; j < C::kRows * C::kWSegs / C::kThreads; ++j) {
    const int i = int(threadIdx.x) + j * C::kThreads, r = i / C::kWSegs, s = i % C::kWSegs;
    const int64_t k = k0 + s * kSegK;
    const bool ok = r < rows_left && k < p.K;  // K % 16 == 0: a segment is all in or all out
    const uint8_t* src = ok ? w + ((wrow0 + r) * p.K + k) * kEb : w;
    cp_async16(Ws + r * C::kWRow + wswz<kFp8>(r, s) * 16, src, ok ? 16 : 0);
  }
#pragma unroll
  for (int j = 0; j < C::kXRows * 16 / C::kThreads; ++j) {
    const int i = int(threadIdx.x) + j * C::kThreads, m = i / 16, s = i % 16;
    const int64_t k = k0 + s * 8;
    const bool ok = m < p.M && k < p.K;
    const __nv_bfloat16* src = ok ? xb + m * p.ldx + k : xb;
    cp_async16(Xs + m * kXLd + s * 16, src, ok ? 16 : 0);
  }
}

// The 8 bf16x2 pairs (k order within the lane's 16) of one weight row from shared memory.
template <bool kFp8>
__device__ __forceinline__ void row_pairs(const uint8_t* row, int h, int t, int r, uint32_t f, uint32_t (&P)[8]) {
  if constexpr (kFp8) {
    const uint4 v = *reinterpret_cast<const uint4*>(row + wswz<true>(r, h * 4 + t) * 16);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      P[2 * j] = fp8x2_bf16x2<false>(w[j], f);
      P[2 * j + 1] = fp8x2_bf16x2<true>(w[j], f);
    }
  } else {
    const uint4 v0 = *reinterpret_cast<const uint4*>(row + wswz<false>(r, h * 8 + 2 * t) * 16);
    const uint4 v1 = *reinterpret_cast<const uint4*>(row + wswz<false>(r, h * 8 + 2 * t + 1) * 16);
    P[0] = v0.x, P[1] = v0.y, P[2] = v0.z, P[3] = v0.w;
    P[4] = v1.x, P[5] = v1.y, P[6] = v1.z, P[7] = v1.w;
  }
}

// One stage (128 k) of a warp: two halves of 64, 4 MMA k-steps each per token tile.
// fa[h] / fb[h]: the scale factor of the lane's 16 k in half h for rows g / g+8 (equal halves when
// one scale covers the stage).
template <bool kFp8, int kNT>
__device__ __forceinline__ void compute_stage(const uint8_t* Ws, const uint8_t* Xs, int warp, int g, int t,
                                              const uint32_t (&fa)[2], const uint32_t (&fb)[2], float (&acc)[kNT][4]) {
  using C = Cfg<kFp8, kNT>;
  const int rA = warp * 16 + g, rB = rA + 8;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t PA[8], PB[8];
    row_pairs<kFp8>(Ws + rA * C::kWRow, h, t, rA, fa[h], PA);
    row_pairs<kFp8>(Ws + rB * C::kWRow, h, t, rB, fb[h], PB);
#pragma unroll
    for (int q = 0; q < kNT; ++q) {
      const uint8_t* xr = Xs + (q * 8 + g) * kXLd + h * 128 + 32 * t;
      const uint4 x0 = *reinterpret_cast<const uint4*>(xr), x1 = *reinterpret_cast<const uint4*>(xr + 16);
      const uint32_t xw[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a[4] = {PA[2 * j], PB[2 * j], PA[2 * j + 1], PB[2 * j + 1]};
        mma_bf16(acc[q], a, xw[2 * j], xw[2 * j + 1]);
      }
    }
  }
}

// Sums the cluster's partial sums (shared memory of every block, [kXRows][kRows] f32) in split
// order; block `rank` writes its slice of the outputs.
template <int kRows, int kXRows, int kThreads, typename Out>
__device__ __forceinline__ void cluster_reduce(const Args& p, const PartRef& q, float* part, int64_t b, int64_t n0) {
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();  // every block's partials are in its shared memory
  const int S = int(cl.num_blocks()), rank = int(cl.block_rank());
  const int mv = int(std::min<int64_t>(p.M, kXRows)), E = mv * kRows, per = (E + S - 1) / S;
  const int e1 = std::min(E, (rank + 1) * per);
  const float* src[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) src[s] = cl.map_shared_rank(part, s < S ? s : 0);
  for (int e = rank * per + int(threadIdx.x); e < e1; e += kThreads) {
    // All S remote loads are issued before the first add (one DSMEM round trip, not S in a
    // chain); the sum is still 0 + p0 + p1 + ... in split order, the same bits as a serial loop.
    float t[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) t[s] = s < S ? src[s][e] : 0.f;
    float v = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      if (s < S) v += t[s];
    const int m = e / kRows;
    const int64_t n = n0 + e % kRows;
    if (n < q.N()) static_cast<Out*>(q.y())[b * p.bsy + m * q.ldy() + n] = deepinfer::cuda::from_f32<Out>(v);
  }
  cl.sync();  // no block leaves while another still reads its shared memory
}

// grid (row blocks of every part, splits, batch), cluster (1, splits, 1). Two blocks per SM at
// least: caps the 8-warp variants at 128 registers (the first session-15 version compiled the
// 8-tile FP8 kernel to 132, one block per SM, and ran wq_b at M = 64 25% slower). kMulti: the
// launch has several parts (gemm_fp8w_multi); its own instantiation, as choosing the part at run
// time in every launch cost single launches 0.1-0.5 us at M = 1 and up to 11% at M = 64 (session
// 15, variants A / C in docs/PERFORMANCE.md).
template <bool kFp8, int kNT, typename Out, bool kMulti>
__global__ void __launch_bounds__(Cfg<kFp8, kNT>::kThreads, 2) fp8w_kernel(const __grid_constant__ Args p) {
  using C = Cfg<kFp8, kNT>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int pi = 0;  // this block's part
  if constexpr (kMulti) {
#pragma unroll
    for (int i = 1; i < kFp8wMaxParts; ++i)
      if (i < p.parts && int64_t(blockIdx.x) >= p.part[i].block0) pi = i;
  }
  const PartRef q{p, pi};
  const int64_t b = blockIdx.z, n0 = (int64_t(blockIdx.x) - q.block0()) * C::kRows;  // first row within the batch's N
  const int64_t chunks = cdiv(p.K, kChunk), cps = p.chunks_per_split;
  const int64_t c0 = int64_t(blockIdx.y) * cps;
  const int nc = int(std::min<int64_t>(cps, chunks - c0));  // >= 1 (choose_split)
  const int64_t wrow0 = b * q.N() + n0, rows_left = q.N() - n0;   // rows of the [batch*N, K] matrix
  const __nv_bfloat16* xb = p.x + b * p.bsx;

#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < nc) load_stage<kFp8, kNT>(p, q.w(), smem, s, (c0 + s) * kChunk, wrow0, rows_left, xb);
    cp_async_commit();
  }
  // The split's scale bytes, [scale_slots][cps * sub], while the first stages are in flight.
  uint8_t* sc = smem + C::kPipe;
  const int64_t sr = kFp8 ? p.scale_rows : 1, s_first = wrow0 / sr;
  const int sub = kFp8 ? p.scale_sub : 1;
  const int64_t sps = cps * sub;  // scale bytes per slot
  if constexpr (kFp8) {
    const int64_t kb = cdiv(p.K, kChunk / sub), srows = cdiv(p.batch * q.N(), sr);
    for (int i = threadIdx.x; i < p.scale_slots * nc * sub; i += C::kThreads) {
      const int slot = i / (nc * sub), c = i % (nc * sub);
      const int64_t col = c0 * sub + c;
      sc[slot * sps + c] = s_first + slot < srows && col < kb ? q.scale()[(s_first + slot) * kb + col] : uint8_t(0);
    }
  }
  // Scale column of the lane's 16 k in half h of a stage: (64h + 16t) / scale_k.
  const int sub_h0 = (16 * t) * sub / kChunk, sub_h1 = (64 + 16 * t) * sub / kChunk;
  const int slotA = int((wrow0 + warp * 16 + g) / sr - s_first), slotB = int((wrow0 + warp * 16 + g + 8) / sr - s_first);

  float acc[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int ci = 0; ci < nc; ++ci) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // stage ci landed for every thread; slot (ci-1) % kStages is free again
    const int nx = ci + C::kStages - 1;
    if (nx < nc) load_stage<kFp8, kNT>(p, q.w(), smem, nx % C::kStages, (c0 + nx) * kChunk, wrow0, rows_left, xb);
    cp_async_commit();
    const uint8_t* Ws = smem + (ci % C::kStages) * C::kStage;
    uint32_t fa[2] = {0u, 0u}, fb[2] = {0u, 0u};
    if constexpr (kFp8) {
      const uint8_t* sa = sc + slotA * sps + ci * sub;
      const uint8_t* sb = sc + slotB * sps + ci * sub;
      fa[0] = scale_factor(sa[sub_h0]), fa[1] = scale_factor(sa[sub_h1]);
      fb[0] = scale_factor(sb[sub_h0]), fb[1] = scale_factor(sb[sub_h1]);
    }
    compute_stage<kFp8, kNT>(Ws, Ws + C::kWTile, warp, g, t, fa, fb, acc);
  }
  // acc[q][0..1]: row g, tokens 8q + 2t, 2t+1; acc[q][2..3]: row g+8.
  if (gridDim.y == 1) {
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t n = n0 + warp * 16 + g + (i >= 2 ? 8 : 0), m = j * 8 + 2 * t + (i & 1);
        if (n < q.N() && m < p.M)
          static_cast<Out*>(q.y())[b * p.bsy + m * q.ldy() + n] = deepinfer::cuda::from_f32<Out>(acc[j][i]);
      }
    return;
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the partial-sum buffer
  float* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      part[(j * 8 + 2 * t + (i & 1)) * C::kRows + warp * 16 + g + (i >= 2 ? 8 : 0)] = acc[j][i];
  cluster_reduce<C::kRows, C::kXRows, C::kThreads, Out>(p, q, part, b, n0);
}

__global__ void dequant_kernel(const __grid_constant__ Fp8wDequantParams p) {
  const int64_t per_row = p.K / 16, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.N * per_row) return;
  const int64_t n = i / per_row, k = (i % per_row) * 16;
  const uint4 v = ld_stream(p.w + n * p.K + k);
  const uint32_t f = scale_factor(p.scale[(n / p.scale_rows) * ((p.K + p.scale_k - 1) / p.scale_k) + k / p.scale_k]);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    o[2 * j] = fp8x2_bf16x2<false>(w[j], f);
    o[2 * j + 1] = fp8x2_bf16x2<true>(w[j], f);
  }
  uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) + n * p.K + k);
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

int token_tiles(int64_t M) {
  const int64_t t = ceil_div(M, 8);
  return t <= 1 ? 1 : t <= 2 ? 2 : t <= 4 ? 4 : 8;
}

struct Split {
  int splits = 1, chunks_per_split = 1;
};
// The split depends on the weight's shape and the SM count alone (not on M, nor on which kernel
// variant runs), so every row of x is reduced in the same order whatever the batch size:
// token-by-token decode and a prefill chunk give the same per-token result (the model's
// chunked-vs-full consistency tests rely on it).
Split choose_split(int64_t N, int64_t K, int64_t batch, int num_sms, int max_splits) {
  const int64_t chunks = ceil_div(K, kChunk), blocks = ceil_div(N, kSplitRows) * batch;
  // As many splits as make 2 blocks of 64 rows per SM, at most a portable cluster, at least 2
  // chunks per split. Measured on the H200 (bench/gpu_kernels_bench.sh, the DI_FP8W_SPLITS sweep):
  // 4 blocks per SM (the first rule) was 15-25% slower on 4096x4096 / 4096x2048 at M = 1 and at
  // M = 64 than 2 per SM; longer K ranges per block beat more blocks in flight.
  constexpr int64_t kBlocksPerSm = 2;
  const int64_t wave = int64_t(std::max(num_sms, 1)) * kBlocksPerSm;
  const int64_t cap = max_splits > 0 ? std::min<int64_t>(max_splits, kMaxSplits) : kMaxSplits;
  const int64_t s = std::clamp<int64_t>(wave / blocks, 1, std::clamp<int64_t>(chunks / 2, 1, cap));
  Split r;
  r.chunks_per_split = int(ceil_div(chunks, s));
  r.splits = int(ceil_div(chunks, r.chunks_per_split));
  return r;
}

// Sets each part's first row block for blocks of `rows` rows; returns the row blocks of all parts.
int64_t assign_row_blocks(Args& a, int rows) {
  int64_t blocks = 0;
  for (int i = 0; i < a.parts; ++i) {
    a.part[i].block0 = blocks;
    blocks += ceil_div(a.part[i].N, int64_t(rows));
  }
  return blocks;
}

template <bool kFp8, int kNT, typename Out, bool kMulti>
void launch_variant(Args a, const Split& sp, cudaStream_t stream) {
  using C = Cfg<kFp8, kNT>;
  a.scale_slots = kFp8 ? int(std::min<int64_t>(C::kRows, (C::kRows - 2) / a.scale_rows + 2)) : 0;
  const size_t smem =
      size_t(C::kPipe) + size_t(ceil_div(int64_t(a.scale_slots) * sp.chunks_per_split * a.scale_sub, 16) * 16);
  auto* fn = fp8w_kernel<kFp8, kNT, Out, kMulti>;
  DI_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(assign_row_blocks(a, C::kRows)), unsigned(sp.splits), unsigned(a.batch));
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = unsigned(sp.splits);
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = sp.splits > 1 ? 1 : 0;  // unsplit: a plain launch (the kernel touches the cluster only when split)
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, fn, a));
  DI_CUDA_CHECK_LAUNCH();
}

// Multi-part launches exist for FP8 weights only (no bf16 multi instantiations).
template <bool kFp8, int kNT, typename Out>
void launch_nt(const Args& a, const Split& sp, cudaStream_t stream) {
  DI_CHECK(kFp8 || a.parts == 1, "gemm_fp8w: multi-part launches take FP8 weights");
  if constexpr (kFp8) {
    if (a.parts > 1) return launch_variant<kFp8, kNT, Out, true>(a, sp, stream);
  }
  launch_variant<kFp8, kNT, Out, false>(a, sp, stream);
}

template <bool kFp8, typename Out>
void launch(const Args& a, const Split& sp, int nt, cudaStream_t stream) {
  switch (nt) {
    case 1: launch_nt<kFp8, 1, Out>(a, sp, stream); break;
    case 2: launch_nt<kFp8, 2, Out>(a, sp, stream); break;
    case 4: launch_nt<kFp8, 4, Out>(a, sp, stream); break;
    default: launch_nt<kFp8, 8, Out>(a, sp, stream); break;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

void validate(const Fp8wGemmParams& p) {
  const bool fp8 = p.w != nullptr;
  if (!p.x || !p.y || (fp8 ? !p.scale : !p.w_bf16) || (fp8 && p.w_bf16))
    DI_THROW(InvalidArgument, "gemm_fp8w: null x/y, or not exactly one of w (+scale) and w_bf16");
  if (p.M <= 0 || p.N <= 0 || p.K <= 0 || p.batch <= 0)
    DI_THROW(InvalidArgument, "gemm_fp8w: empty shape M=", p.M, " N=", p.N, " K=", p.K, " batch=", p.batch);
  if (p.K % 16) DI_THROW(InvalidArgument, "gemm_fp8w: K=", p.K, " must be a multiple of 16");
  if (p.ldx < p.K || p.ldx % 8 || p.batch_stride_x % 8 || !aligned16(p.x))
    DI_THROW(InvalidArgument, "gemm_fp8w: x needs ldx >= K, ldx and batch_stride_x multiples of 8 and 16-byte "
             "alignment (ldx=", p.ldx, ", batch_stride_x=", p.batch_stride_x, ")");
  if (!aligned16(fp8 ? static_cast<const void*>(p.w) : p.w_bf16))
    DI_THROW(InvalidArgument, "gemm_fp8w: weight pointer must be 16-byte aligned");
  if (p.ldy < p.N) DI_THROW(InvalidArgument, "gemm_fp8w: ldy=", p.ldy, " < N=", p.N);
  if (p.out_dtype != DType::kBF16 && p.out_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "gemm_fp8w: out dtype ", dtype_name(p.out_dtype), " (bf16 or f32)");
  if (fp8 && (p.scale_rows <= 0 || 128 % p.scale_rows))
    DI_THROW(InvalidArgument, "gemm_fp8w: scale_rows=", p.scale_rows, " must divide 128");
  if (fp8 && p.scale_k != 128 && p.scale_k != 64 && p.scale_k != 32)
    DI_THROW(InvalidArgument, "gemm_fp8w: scale_k=", p.scale_k, " must be 128, 64 or 32");
  if (p.batch > 65535) DI_THROW(InvalidArgument, "gemm_fp8w: batch=", p.batch, " > 65535");
}

// The kernel arguments of the rows [m0, m0 + M) of x / y.
Args make_args(const Fp8wGemmParams& p, const Split& sp, int64_t m0, int64_t M) {
  const bool fp8 = p.w != nullptr;
  const size_t ob = p.out_dtype == DType::kF32 ? 4 : 2;
  Args a{.x = static_cast<const __nv_bfloat16*>(p.x) + m0 * p.ldx, .ldx = p.ldx, .bsx = p.batch_stride_x,
         .part = {}, .parts = 1, .scale_rows = p.scale_rows, .scale_sub = fp8 ? int(kChunk / p.scale_k) : 1,
         .bsy = p.batch_stride_y, .M = M, .K = p.K, .batch = p.batch, .chunks_per_split = sp.chunks_per_split,
         .scale_slots = 0};
  a.part[0] = Part{.w = fp8 ? p.w : static_cast<const uint8_t*>(p.w_bf16), .scale = p.scale,
                   .y = static_cast<char*>(p.y) + size_t(m0 * p.ldy) * ob, .ldy = p.ldy, .N = p.N, .block0 = 0};
  return a;
}

// The launches of `p` over its rows, 64 at a time; `a.part[1..parts)` set by `more_parts`.
template <typename MoreParts>
void run_chunks(const Fp8wGemmParams& p, const Split& sp, int parts, const MoreParts& more_parts, cudaStream_t stream) {
  const bool fp8 = p.w != nullptr;
  for (int64_t m0 = 0; m0 < p.M; m0 += kFp8wMaxM) {
    const int64_t M = std::min(kFp8wMaxM, p.M - m0);
    Args a = make_args(p, sp, m0, M);
    a.parts = parts;
    more_parts(a, m0);
    const int nt = token_tiles(M);
    if (fp8)
      p.out_dtype == DType::kF32 ? launch<true, float>(a, sp, nt, stream)
                                 : launch<true, __nv_bfloat16>(a, sp, nt, stream);
    else
      p.out_dtype == DType::kF32 ? launch<false, float>(a, sp, nt, stream)
                                 : launch<false, __nv_bfloat16>(a, sp, nt, stream);
  }
}

// Part i of a multi launch as a gemm_fp8w of its own.
Fp8wGemmParams part_params(const Fp8wMultiParams& p, int i) {
  const Fp8wPart& w = p.parts[i];
  return {.x = p.x, .ldx = p.ldx, .w = w.w, .scale = w.scale, .scale_rows = p.scale_rows, .scale_k = p.scale_k,
          .y = w.y, .ldy = w.ldy, .out_dtype = p.out_dtype, .M = p.M, .N = w.N, .K = p.K, .num_sms = p.num_sms};
}
}  // namespace

int fp8w_splits(int64_t /*M*/, int64_t N, int64_t K, int64_t batch, int num_sms, int max_splits) {
  return choose_split(N, K, batch, num_sms, max_splits).splits;
}

size_t fp8w_workspace_bytes(int64_t /*M*/, int64_t /*N*/, int64_t /*K*/, int64_t /*batch*/, int /*num_sms*/) {
  return 0;  // the K split is summed inside the kernel's cluster (distributed shared memory)
}

void gemm_fp8w(const Fp8wGemmParams& p, cudaStream_t stream) {
  validate(p);
  const Split sp = choose_split(p.N, p.K, p.batch, p.num_sms, p.max_splits);
  run_chunks(p, sp, 1, [](Args&, int64_t) {}, stream);
}

bool gemm_fp8w_multi_fuses(const Fp8wMultiParams& p) {
  if (!p.parts || p.num_parts < 1 || p.num_parts > kFp8wMaxParts)
    DI_THROW(InvalidArgument, "gemm_fp8w_multi: num_parts=", p.num_parts, " (1..", kFp8wMaxParts, ", parts non-null)");
  for (int i = 0; i < p.num_parts; ++i) {
    if (!p.parts[i].w) DI_THROW(InvalidArgument, "gemm_fp8w_multi: part ", i, " has no FP8 weight");
    validate(part_params(p, i));
  }
  const Split s0 = choose_split(p.parts[0].N, p.K, 1, p.num_sms, 0);
  for (int i = 1; i < p.num_parts; ++i) {
    const Split si = choose_split(p.parts[i].N, p.K, 1, p.num_sms, 0);
    if (si.splits != s0.splits || si.chunks_per_split != s0.chunks_per_split) return false;
  }
  return true;
}

void gemm_fp8w_multi(const Fp8wMultiParams& p, cudaStream_t stream) {
  if (!gemm_fp8w_multi_fuses(p)) {  // splits differ: one launch each (the same bits either way)
    for (int i = 0; i < p.num_parts; ++i) gemm_fp8w(part_params(p, i), stream);
    return;
  }
  const Fp8wGemmParams p0 = part_params(p, 0);
  const Split sp = choose_split(p0.N, p0.K, 1, p0.num_sms, 0);
  const size_t ob = p.out_dtype == DType::kF32 ? 4 : 2;
  run_chunks(p0, sp, p.num_parts, [&](Args& a, int64_t m0) {
    for (int i = 1; i < p.num_parts; ++i) {
      const Fp8wPart& w = p.parts[i];
      a.part[i] = Part{.w = w.w, .scale = w.scale, .y = static_cast<char*>(w.y) + size_t(m0 * w.ldy) * ob,
                       .ldy = w.ldy, .N = w.N, .block0 = 0};
    }
  }, stream);
}

void dequant_fp8w_bf16(const Fp8wDequantParams& p, cudaStream_t stream) {
  if (!p.w || !p.scale || !p.out || p.N <= 0 || p.K <= 0)
    DI_THROW(InvalidArgument, "dequant_fp8w_bf16: null pointer or empty shape N=", p.N, " K=", p.K);
  if (p.scale_rows <= 0 || 128 % p.scale_rows)
    DI_THROW(InvalidArgument, "dequant_fp8w_bf16: scale_rows=", p.scale_rows, " must divide 128");
  if (p.scale_k != 128 && p.scale_k != 64 && p.scale_k != 32)
    DI_THROW(InvalidArgument, "dequant_fp8w_bf16: scale_k=", p.scale_k, " must be 128, 64 or 32");
  if (p.K % 16 || !aligned16(p.w) || !aligned16(p.out))
    DI_THROW(InvalidArgument, "dequant_fp8w_bf16: K=", p.K, " must be a multiple of 16 and pointers 16-byte aligned");
  const int64_t n = p.N * (p.K / 16);
  dequant_kernel<<<unsigned(ceil_div(n, 256)), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
