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
  v9_up_kernel<F, kMT, S, kPairs, kProbe><<<dim3(tiles, unsigned(ceil_div(p.inter, 8 * kMT * kW))), kW * kWarpSize, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
  v9_down_kernel<F, kMT, S, kPairs, kProbe><<<dim3(tiles, unsigned(ceil_div(p.dim, 16 * kMT * kW))), kW * kWarpSize, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
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
    // load-only probes of v9's (v3's) and v13's addressing (moe_decode.h kMoeDecodeGroupedProbeFirst)
    case kMoeDecodeGroupedProbeFirst: return launch_format<ExpertFormat::kFP4, 4, 2, false, true>(p, stream);
    case kMoeDecodeGroupedProbeFirst + 1: return launch_format<ExpertFormat::kFP4, 2, 4, true, true>(p, stream);
    default: return launch_format<ExpertFormat::kFP4, 4, 2>(p, stream);
  }
}

}  // namespace deepinfer::model::ds::cuda::moe_grouped
