// Grouped MoE decode, variants 9..13 (issue #13; moe_decode.h): v3's, v2's and v1's warp shapes
// (4 warps x 4 / 2 / 1 m-tiles, 2 / 3 / 4 register stages), 2 m-tiles x 2 stages (v12, 156
// registers: 3 blocks per SM) and 2 m-tiles with loads in pairs of chunks (v13, run_rows9's
// kPairs) with fewer instructions per FP4 weight byte, and the same MMA operands in the same
// order, so v9..v13 == v3 bit for bit
// (MoeDecodeGrouped tests):
//  * FP4 nibbles -> bf16x2 words by fp4_pair_words (moe_fp4_pairs.h): 13 integer instructions per
//    32-bit weight word instead of 15 (same bits: MoeFp4Pairs.MatchesReference);
//  * the rare scale > 2^1 path (two multiplies) is one branch per m-tile instead of one per row;
//  * full 128-input chunks are loaded without the per-load "past K" selects (only the tail chunk
//    of a K that is not a multiple of 128 takes v3's checked load_stage);
//  * a B column past the tile reads the tile's first token instead of zeros: an MMA output element
//    reads only its own A row and B column, and those columns are never stored, so the stored
//    results do not change and the per-load "no column" selects go.
#include <cuda_bf16.h>

#include <cstdint>

#include "deepinfer/error.h"
#include "model/deepseek/cuda/moe_decode_grouped.cuh"
#include "model/deepseek/cuda/moe_decode_fp4.cuh"
#include "ops/cuda/common.cuh"

namespace deepinfer::model::ds::cuda::moe_grouped {
namespace {
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::kWarpSize;

constexpr int kW = 4;  // warps per block (v1..v3's); the sums depend on neither W nor MT nor S

// A lane's load addresses at chunk c (per row: its 16-byte vectors, its scale byte; its 32 inputs
// of x), advanced by whole chunks: loads then use immediate offsets, no per-chunk index math.
template <ExpertFormat F, int MT>
struct Ptrs {
  static constexpr int kW = 4 * kRawVecs<F>;            // uint4 per row and chunk
  static constexpr int kS = F == ExpertFormat::kFP4 ? 4 : 1;  // scale bytes per row and chunk
  static constexpr int kX = kChunk * 2 / 16;            // uint4 of x per chunk
  const uint4* w[MT][2];
  const uint8_t* s[MT][2];
  const uint4* x;
  __device__ __forceinline__ void advance(int n) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) w[m][h] += n * kW, s[m][h] += n * kS;
    x += n * kX;
  }
};
template <ExpertFormat F, int MT>
__device__ __forceinline__ Ptrs<F, MT> make_ptrs(const uint8_t* w, const uint8_t* sc, const int64_t (&rows)[MT][2],
                                                 int64_t K, const __nv_bfloat16* col, int t) {
  Ptrs<F, MT> P;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = rows[m][h];
      if constexpr (F == ExpertFormat::kFP4) P.w[m][h] = reinterpret_cast<const uint4*>(w + r * (K / 2) + 16 * t);
      else if constexpr (F == ExpertFormat::kFP8) P.w[m][h] = reinterpret_cast<const uint4*>(w + r * K + 32 * t);
      else P.w[m][h] = reinterpret_cast<const uint4*>(w + (r * K + 32 * t) * 2);
      if constexpr (F == ExpertFormat::kFP4) P.s[m][h] = sc + r * (K / 32) + t;
      else if constexpr (F == ExpertFormat::kFP8) P.s[m][h] = sc + r * ((K + 127) / 128);
      else P.s[m][h] = nullptr;
    }
  P.x = reinterpret_cast<const uint4*>(col + 32 * t);
  return P;
}
// load_stage of chunk (P's chunk + j) when it lies wholly inside K (kTail: v3's zeros and unit
// scales for a lane past K; the column always exists here).
template <ExpertFormat F, int MT, bool kTail = false>
__device__ __forceinline__ void load9(Stage<F, MT>& st, const Ptrs<F, MT>& P, int j, bool ok = true) {
  const uint4 z = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int v = 0; v < kRawVecs<F>; ++v) {
        const uint4* src = P.w[m][h] + j * Ptrs<F, MT>::kW + v;
        st.w[m][h][v] = kTail && !ok ? z : __ldg(src);
      }
      if constexpr (F != ExpertFormat::kPlain) {
        const uint8_t* ss = P.s[m][h] + j * Ptrs<F, MT>::kS;
        st.s[m][h] = kTail && !ok ? 127u : __ldg(ss);
      }
    }
#pragma unroll
  for (int v = 0; v < 4; ++v) st.x[v] = kTail && !ok ? z : __ldg(P.x + j * Ptrs<F, MT>::kX + v);
}

template <ExpertFormat F, int MT, bool kProbe = false>
__device__ __forceinline__ void compute9(const Stage<F, MT>& st, const uint32_t* lut, float (&acc)[MT][4]) {
  if constexpr (kProbe) probe_fold<F, MT>(st, acc);  // load-only diagnostic
  else if constexpr (F == ExpertFormat::kFP4) compute_fp4<MT>(st, acc);
  else compute_stage<F, true, MT>(st, lut, acc);
}

// run_rows<F, kAlu, MT, S> (the same chunk order, so the same sums) with load9 / compute9: the
// full chunks S per trip (one pointer bump per trip, S - 1 chunks of loads in flight), then a
// tail chunk when K % 128 != 0.
// kPairs (S = 4): the loads go out two chunks at a time (chunks c + 2, c + 3 while c is computed),
// so the 16-byte pieces of a quad's two consecutive chunks (128 contiguous bytes of each FP4 row)
// reach the memory system back to back, as v6's two-chunk ring stages do; the MMAs still take the
// chunks in order (the same sums).
template <ExpertFormat F, int MT, int S, bool kPairs = false, bool kProbe = false>
__device__ __forceinline__ void run_rows9(const uint8_t* w, const uint8_t* sc, const int64_t (&rows)[MT][2], int64_t K,
                                          const __nv_bfloat16* col, int t, const uint32_t* lut, float (&acc)[MT][4]) {
  static_assert(!kPairs || S == 4, "paired loads: two stages of two chunks");
  const int nf = int(K / kChunk);
  Ptrs<F, MT> P = make_ptrs<F, MT>(w, sc, rows, K, col, t);
  Stage<F, MT> st[S];
  constexpr int kAhead = kPairs ? 2 : S - 1;  // chunks loaded before the loop
#pragma unroll
  for (int u = 0; u < kAhead; ++u)
    if (u < nf) load9<F, MT>(st[u], P, u);
  int c = 0;
  for (; c < nf; c += S) {  // P at chunk c
#pragma unroll
    for (int u = 0; u < S; ++u) {
      if constexpr (kPairs) {
        if (u % 2 == 0) {  // slots u + 2, u + 3 (mod 4) were computed before this point
          if (c + u + 2 < nf) load9<F, MT>(st[(u + 2) % S], P, u + 2);
          if (c + u + 3 < nf) load9<F, MT>(st[(u + 3) % S], P, u + 3);
        }
        if (c + u < nf) compute9<F, MT, kProbe>(st[u], lut, acc);
      } else if (c + u < nf) {
        if (c + u + S - 1 < nf) load9<F, MT>(st[(u + S - 1) % S], P, u + S - 1);
        compute9<F, MT, kProbe>(st[u], lut, acc);
      }
    }
    P.advance(S);
  }
  if (K % kChunk) {  // chunk nf; P at chunk c (nf .. nf + S - 1)
    load9<F, MT, true>(st[0], P, nf - c, int64_t(nf) * kChunk + 32 * t < K);
    compute9<F, MT, kProbe>(st[0], lut, acc);
  }
}

template <ExpertFormat F>
constexpr bool kLut9 = F == ExpertFormat::kFP8;

// grid (max_tiles, ceil(inter / (8*MT*W))): as grouped_up_kernel (moe_decode.cu).
template <ExpertFormat F, int kMT, int S, bool kPairs, bool kProbe>
__global__ void __launch_bounds__(kW * kWarpSize) v9_up_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  __shared__ uint32_t lut[kLut9<F> ? 256 : 1];
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  if constexpr (kLut9<F>) {
    fill_lut<F>(lut);
    __syncthreads();
  }
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int64_t I = p.inter, D = p.dim, i0 = (int64_t(blockIdx.y) * kW + warp) * 8 * kMT;
  if (i0 >= I) return;
  int64_t rows[kMT][2];
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    rows[m][0] = i0 + 8 * m + g < I ? i0 + 8 * m + g : I - 1;
    rows[m][1] = I + rows[m][0];
  }
  // a column past the tile reads the tile's first token (never stored; see the file comment)
  const __nv_bfloat16* col = static_cast<const __nv_bfloat16*>(p.x) + p.perm_src[tr.r0 + (g < tr.n ? g : 0)] * D;
  const uint8_t* sc = F == ExpertFormat::kPlain ? nullptr : p.w13_scale[tr.e];
  float acc[kMT][4] = {};
  run_rows9<F, kMT, S, kPairs, kProbe>(static_cast<const uint8_t*>(p.w13[tr.e]), sc, rows, D, col, t, lut, acc);
  store_up<kMT>(p, tr, i0, g, t, acc);
}

// grid (max_tiles, ceil(dim / (16*MT*W))): as grouped_down_kernel.
template <ExpertFormat F, int kMT, int S, bool kPairs, bool kProbe>
__global__ void __launch_bounds__(kW * kWarpSize) v9_down_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  __shared__ uint32_t lut[kLut9<F> ? 256 : 1];
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  if constexpr (kLut9<F>) {
    fill_lut<F>(lut);
    __syncthreads();
  }
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int64_t I = p.inter, D = p.dim, j0 = (int64_t(blockIdx.y) * kW + warp) * 16 * kMT;
  if (j0 >= D) return;
  int64_t rows[kMT][2];
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[m][h] = j0 + 16 * m + 8 * h + g < D ? j0 + 16 * m + 8 * h + g : D - 1;
  const __nv_bfloat16* col = static_cast<const __nv_bfloat16*>(p.act) + (tr.r0 + (g < tr.n ? g : 0)) * I;
  const uint8_t* sc = F == ExpertFormat::kPlain ? nullptr : p.w2_scale[tr.e];
  float acc[kMT][4] = {};
  run_rows9<F, kMT, S, kPairs, kProbe>(static_cast<const uint8_t*>(p.w2[tr.e]), sc, rows, I, col, t, lut, acc);
  store_down<kMT>(p, tr, j0, g, t, acc);
}

template <ExpertFormat F, int kMT, int S, bool kPairs = false, bool kProbe = false>
void launch_format(const MoeDecodeGroupedParams& p, cudaStream_t stream) {
  const unsigned tiles = unsigned(p.max_tiles);
  if (p.kernels & 1) {
    v9_up_kernel<F, kMT, S, kPairs, kProbe><<<dim3(tiles, unsigned(ceil_div(p.inter, 8 * kMT * kW))), kW * kWarpSize, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  }
  if (p.kernels & 2) {
    v9_down_kernel<F, kMT, S, kPairs, kProbe><<<dim3(tiles, unsigned(ceil_div(p.dim, 16 * kMT * kW))), kW * kWarpSize, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  }
}

// ---- v17 / v18: v13 with NB row bands per block (session 16, V4.1's widths) ----
// v13's blocks are short at V4.1's widths (an up block streams 64 gate + 64 up rows of 2.5 KB, a
// down block 128 rows of 1.1 KB = 18 chunks), and each block pays the pipeline's ramp (the tile's
// routing loads, then two chunks of loads before the first MMA) and its drain. Here a warp runs NB
// bands of the same tile one after the other (band b = rows + b * the block's rows) and its
// chunk-pair loads run on across the band boundary: the next band's first chunks are in flight
// while the last ones of this band are computed. Each band is v13's sum (the same chunks, in the
// same order, into fresh accumulators), so v17 / v18 == v13 == v3 bit for bit. Taken only where
// every band is whole and a band has an even number of chunks (K % 256 == 0, rows % band == 0);
// else that kernel is v13's.
// kPf > 0 (v19..v21): each lane also prefetches into L2 the 128-byte line of ONE of the warp's 32
// rows (row g of m-tile t / 2, half t % 2: the warp's 32 lanes cover its 32 rows) that holds the
// chunk pair kPf chunks past the pair being loaded, and that row's scale word of the same pair:
// one `prefetch.global.L2` per lane and pair, no registers held, so the DRAM reads of ~kPf more
// chunks per warp are in flight and the loads that need registers find them in L2. The loads
// themselves (and so the sums) are v13's.
__device__ __forceinline__ void prefetch_l2(const void* a) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(a)));
}
template <int MT, int kPf, bool kProbe, bool kPairs, typename Store>
__device__ __forceinline__ void run_bands(const uint8_t* w, const uint8_t* sc, const int64_t (&rows)[MT][2], int64_t K,
                                          const __nv_bfloat16* col, int t, int nb, int64_t band_rows,
                                          const int64_t (&prow)[MT / 2], Store&& store) {
  // prow: this lane's prefetch rows, rows[t / 2 + 2k][t % 2] (passed in: indexing rows by t puts it on the stack)
  constexpr ExpertFormat F = ExpertFormat::kFP4;
  constexpr int kS = kPairs ? 4 : 2, kPr = MT / 2;  // register stages; rows a lane prefetches
  using PT = Ptrs<F, MT>;
  static_assert(kPf % 2 == 0 && MT % 2 == 0, "prefetch distance: whole chunk pairs; a lane's rows: MT / 2");
  const int nf = int(K / kChunk), n_all = nb * nf;  // nf even: a chunk pair never straddles two bands
  PT P = make_ptrs<F, MT>(w, sc, rows, K, col, t);
  Stage<F, MT> st[kS];
  float acc[MT][4] = {};
  // the prefetch cursor: this lane's rows at chunk pc of band pb (kPf chunks ahead of the loads),
  // as running pointers (the band's jump only when pc wraps)
  const int64_t band_w = band_rows * (K / 2), band_s = band_rows * (K / 32);  // bytes per band
  int pc = kPf % nf, pb = kPf / nf;
  const uint8_t* pw[kPr];
  const uint8_t* ps[kPr];
#pragma unroll
  for (int k = 0; k < kPr; ++k)
    pw[k] = w + prow[k] * (K / 2) + pb * band_w + 64 * pc, ps[k] = sc + prow[k] * (K / 32) + pb * band_s + 4 * pc;
  auto prefetch_pair = [&]() {
#pragma unroll
    for (int k = 0; k < kPr; ++k) {
      if (pb < nb) prefetch_l2(pw[k]), prefetch_l2(ps[k]);
      pw[k] += 128, ps[k] += 8;
    }
    pc += 2;
    if (pc == nf) {
      pc = 0, ++pb;
#pragma unroll
      for (int k = 0; k < kPr; ++k) pw[k] += band_w - 64 * nf, ps[k] += band_s - 4 * nf;
    }
  };
  if constexpr (kPf > 0) {  // the lines of the first kPf chunks (the first loads' and those up to kPf ahead)
#pragma unroll
    for (int k = 0; k < kPr; ++k) {
      const uint8_t* qw = w + prow[k] * (K / 2);
      const uint8_t* qs = sc + prow[k] * (K / 32);
      for (int c = 0, cb = 0; c < kPf && c < n_all; c += 2) {
        prefetch_l2(qw + 64 * cb), prefetch_l2(qs + 4 * cb);
        if ((cb += 2) == nf) cb = 0, qw += band_w, qs += band_s;
      }
    }
  }
  int lc = 0;  // chunks of the load cursor's band issued
  // after the load of chunk nf - 1 - d (d = the chunk's offset in the last load group, P not yet
  // advanced): on to the next band's first chunk, rows + band_rows, x from its start
  auto band_jump = [&](int d) {
    const int64_t jw = band_rows * (K / 32) - int64_t(nf - 1 - d) * PT::kW;  // uint4 of FP4 (K/2 bytes a row)
    const int64_t js = band_rows * (K / 32) - int64_t(nf - 1 - d) * PT::kS;  // scale bytes (K/32 a row)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) P.w[m][h] += jw, P.s[m][h] += js;
    P.x -= int64_t(nf - 1 - d) * PT::kX;
  };
  auto load_pair = [&](Stage<F, MT>& s0, Stage<F, MT>& s1) {  // v13's: two chunks at a time
    if constexpr (kPf > 0) prefetch_pair();
    load9<F, MT>(s0, P, 0);
    load9<F, MT>(s1, P, 1);
    lc += 2;
    if (lc == nf) lc = 0, band_jump(1);
    else P.advance(2);
  };
  auto load_one = [&](Stage<F, MT>& s0) {  // v9's: one chunk ahead
    if constexpr (kPf > 0)
      if (lc % 2 == 0) prefetch_pair();
    load9<F, MT>(s0, P, 0);
    if (++lc == nf) lc = 0, band_jump(0);
    else P.advance(1);
  };
  auto finish = [&](int& cc, int& b) {  // after an odd chunk (a band ends after one: nf even)
    if ((cc += 2) == nf) {
      store(b, acc);
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[m][q] = 0.f;
      cc = 0, ++b;
    }
  };
  int cc = 0, b = 0;  // the compute side: chunks of band b computed (counted by pairs)
  if constexpr (kPairs) {
    load_pair(st[0], st[1]);  // n_all >= 2
    for (int n = 0; n < n_all; n += 4) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (u % 2 == 0 && n + u + 2 < n_all) load_pair(st[(u + 2) % 4], st[(u + 3) % 4]);  // slots computed before
        if (n + u < n_all) {
          compute9<F, MT, kProbe>(st[u], nullptr, acc);  // compute_fp4 (or the load-only probe's fold)
          if (u % 2 == 1) finish(cc, b);  // two copies of the store in the unrolled body, not four
        }
      }
    }
  } else {
    load_one(st[0]);
    for (int n = 0; n < n_all; n += 2) {  // n_all even
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (n + u + 1 < n_all) load_one(st[(u + 1) % 2]);
        compute9<F, MT, kProbe>(st[u], nullptr, acc);
        if (u == 1) finish(cc, b);
      }
    }
  }
}

// Shapes: MT 2 with chunk-pair loads (v13's: 17..22), MT 4 with one chunk ahead (v9's: 23, 24).
bool v17_up_takes(const MoeDecodeGroupedParams& p, int mt) { return p.dim % 256 == 0 && p.inter % (8 * mt * kW) == 0; }
bool v17_down_takes(const MoeDecodeGroupedParams& p, int mt) { return p.inter % 256 == 0 && p.dim % (16 * mt * kW) == 0; }

// grid (max_tiles, ceil(inter / band / NB)), band = 8 * MT * kW gate rows: block y runs bands NB*y .. NB*y + NB - 1.
template <int MT, bool kPairs, int NB, int kPf, bool kProbe>
__global__ void __launch_bounds__(kW * kWarpSize) v17_up_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  constexpr int kBand = 8 * MT * kW;
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int64_t I = p.inter, D = p.dim, b0 = int64_t(blockIdx.y) * NB;
  const int nb = int(I / kBand - b0 < NB ? I / kBand - b0 : NB);
  const int64_t i0 = b0 * kBand + warp * 8 * MT;
  int64_t rows[MT][2], prow[MT / 2];
#pragma unroll
  for (int m = 0; m < MT; ++m) rows[m][0] = i0 + 8 * m + g, rows[m][1] = I + rows[m][0];
#pragma unroll
  for (int k = 0; k < MT / 2; ++k) prow[k] = (t % 2 ? I : 0) + i0 + 8 * (t / 2 + 2 * k) + g;
  const __nv_bfloat16* col = static_cast<const __nv_bfloat16*>(p.x) + p.perm_src[tr.r0 + (g < tr.n ? g : 0)] * D;
  run_bands<MT, kPf, kProbe, kPairs>(static_cast<const uint8_t*>(p.w13[tr.e]), p.w13_scale[tr.e], rows, D, col, t, nb,
                                     kBand, prow,
                                     [&](int b, const float (&acc)[MT][4]) { store_up<MT>(p, tr, i0 + b * kBand, g, t, acc); });
}

// grid (max_tiles, ceil(dim / band / NB)), band = 16 * MT * kW output rows.
template <int MT, bool kPairs, int NB, int kPf, bool kProbe>
__global__ void __launch_bounds__(kW * kWarpSize) v17_down_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  constexpr int kBand = 16 * MT * kW;
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int64_t I = p.inter, D = p.dim, b0 = int64_t(blockIdx.y) * NB;
  const int nb = int(D / kBand - b0 < NB ? D / kBand - b0 : NB);
  const int64_t j0 = b0 * kBand + warp * 16 * MT;
  int64_t rows[MT][2], prow[MT / 2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[m][h] = j0 + 16 * m + 8 * h + g;
#pragma unroll
  for (int k = 0; k < MT / 2; ++k) prow[k] = j0 + 16 * (t / 2 + 2 * k) + 8 * (t % 2) + g;
  const __nv_bfloat16* col = static_cast<const __nv_bfloat16*>(p.act) + (tr.r0 + (g < tr.n ? g : 0)) * I;
  run_bands<MT, kPf, kProbe, kPairs>(static_cast<const uint8_t*>(p.w2[tr.e]), p.w2_scale[tr.e], rows, I, col, t, nb,
                                     kBand, prow,
                                     [&](int b, const float (&acc)[MT][4]) { store_down<MT>(p, tr, j0 + b * kBand, g, t, acc); });
}

// Where a kernel's shape is not whole bands of an even chunk count, that kernel is v13's (MT 2) or v9's (MT 4).
template <int NB, int kPf = 0, bool kProbe = false, int MT = 2>
void launch_v17(const MoeDecodeGroupedParams& p, cudaStream_t stream) {
  constexpr ExpertFormat F = ExpertFormat::kFP4;
  constexpr bool kPairs = MT == 2;  // v13's loads (2 m-tiles); MT 4: v9's (one chunk ahead)
  constexpr int kS = kPairs ? 4 : 2;
  const unsigned tiles = unsigned(p.max_tiles);
  if (p.kernels & 1) {
    if (v17_up_takes(p, MT))
      v17_up_kernel<MT, kPairs, NB, kPf, kProbe>
          <<<dim3(tiles, unsigned(ceil_div(p.inter / (8 * MT * kW), NB))), kW * kWarpSize, 0, stream>>>(p);
    else
      v9_up_kernel<F, MT, kS, kPairs, kProbe><<<dim3(tiles, unsigned(ceil_div(p.inter, 8 * MT * kW))), kW * kWarpSize, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  }
  if (p.kernels & 2) {
    if (v17_down_takes(p, MT))
      v17_down_kernel<MT, kPairs, NB, kPf, kProbe>
          <<<dim3(tiles, unsigned(ceil_div(p.dim / (16 * MT * kW), NB))), kW * kWarpSize, 0, stream>>>(p);
    else
      v9_down_kernel<F, MT, kS, kPairs, kProbe><<<dim3(tiles, unsigned(ceil_div(p.dim, 16 * MT * kW))), kW * kWarpSize, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  }
}
}  // namespace

void launch_v9(const MoeDecodeGroupedParams& p, int shape, cudaStream_t stream) {
  // bf16 rows have no decode to diet on, and FP8's doubled raw vectors spill here (255
  // registers): moe_decode.cu runs v3 for both.
  if (p.format != ExpertFormat::kFP4)
    DI_THROW(InvalidArgument, "moe_decode_grouped variant 9: ", ops::cuda::expert_format_name(p.format),
             " weights take v3 (moe_decode.cu)");
  switch (shape) {  // v3's, v2's and v1's warp shapes (m-tiles per warp, register stages), then 2 x 2
    case 10: return launch_format<ExpertFormat::kFP4, 2, 3>(p, stream);
    case 11: return launch_format<ExpertFormat::kFP4, 1, 4>(p, stream);
    case 12: return launch_format<ExpertFormat::kFP4, 2, 2>(p, stream);  // fewer registers: more warps
    case 13: return launch_format<ExpertFormat::kFP4, 2, 4, true>(p, stream);  // chunk pairs
    case 17: return launch_v17<2>(p, stream);  // v13 with 2 / 3 row bands per block
    case 18: return launch_v17<3>(p, stream);
    case 19: return launch_v17<1, 6>(p, stream);  // v13 + L2 prefetch 6 chunks ahead of the loads
    case 20: return launch_v17<2, 6>(p, stream);  // v17 + the same
    case 21: return launch_v17<1, 12>(p, stream);  // v13 + L2 prefetch 12 chunks ahead
    case 22: return launch_v17<2, 12>(p, stream);  // v17 + the same
    case 23: return launch_v17<1, 6, false, 4>(p, stream);  // v9's shape (4 m-tiles, one chunk ahead) + prefetch 6
    case 24: return launch_v17<1, 12, false, 4>(p, stream);  // the same, 12 ahead
    case kMoeDecodeGroupedProbeFirst + 6: return launch_v17<1, 6, true>(p, stream);  // load-only v19
    case kMoeDecodeGroupedProbeFirst + 7: return launch_v17<1, 6, true, 4>(p, stream);  // load-only v23
    // load-only probes of v9's (v3's) and v13's addressing (moe_decode.h kMoeDecodeGroupedProbeFirst)
    case kMoeDecodeGroupedProbeFirst: return launch_format<ExpertFormat::kFP4, 4, 2, false, true>(p, stream);
    case kMoeDecodeGroupedProbeFirst + 1: return launch_format<ExpertFormat::kFP4, 2, 4, true, true>(p, stream);
    default: return launch_format<ExpertFormat::kFP4, 4, 2>(p, stream);
  }
}

}  // namespace deepinfer::model::ds::cuda::moe_grouped
