#include "ops/cuda/moe_route.h"

#include <algorithm>
#include <vector>

#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::kWarpSize;

constexpr int kSmemInts = 12288;  // 48 KiB of per-warp counters

// Warps of the block: one per 64 assignments (at least 4), as many as the per-warp counters fit.
int route_warps(int64_t experts, int64_t rows) {
  const int64_t fit = std::clamp<int64_t>(kSmemInts / (experts + 1), 1, 32);
  return int(std::min(fit, std::max<int64_t>(4, (rows + 63) / 64)));
}

// Shared memory: cnt [warps][E+1] (column E counts invalid ids), then seg [E+2], tile0 [E+1].
__global__ void moe_route_kernel(const __grid_constant__ MoeRouteParams p) {
  extern __shared__ int32_t sm[];
  const int nw = blockDim.x / kWarpSize, warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int E = int(p.experts), E1 = E + 1;
  int32_t* cnt = sm;
  int32_t* seg = sm + nw * E1;
  int32_t* tile0 = seg + E1 + 1;
  const int64_t rows = p.tokens * p.topk, chunk = (rows + nw - 1) / nw;
  const int64_t lo = warp * chunk, hi = std::min<int64_t>(rows, lo + chunk);
  auto expert_of = [&](int64_t a) {
    const int e = p.ids[a];
    return e >= 0 && e < E ? e : E;
  };
  for (int i = threadIdx.x; i < nw * E1; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  for (int64_t a = lo + lane; a < hi; a += kWarpSize) atomicAdd(&cnt[warp * E1 + expert_of(a)], 1);
  __syncthreads();
  // Column scan: cnt[w][e] becomes the rows of expert e in warps before w; seg[e] the total.
  for (int e = threadIdx.x; e < E1; e += blockDim.x) {
    int run = 0;
    for (int w = 0; w < nw; ++w) {
      const int c = cnt[w * E1 + e];
      cnt[w * E1 + e] = run;
      run += c;
    }
    seg[e] = run;
  }
  __syncthreads();
  {  // exclusive scans over experts of the rows and tiles: a chunk of experts per thread, warp
     // shuffles, then the warps' totals (one thread walking all E + 1 was ~20 us of the launch)
    __shared__ int warp_rows[32], warp_tiles[32];
    const int per = (E1 + int(blockDim.x) - 1) / int(blockDim.x), e0 = int(threadIdx.x) * per;
    const int e1 = e0 + per < E1 ? e0 + per : E1;
    int rows_sum = 0, tiles_sum = 0;
    for (int e = e0; e < e1; ++e) {
      rows_sum += seg[e];
      if (e < E) tiles_sum += (seg[e] + p.tile_m - 1) / p.tile_m;
    }
    int rows_inc = rows_sum, tiles_inc = tiles_sum;
    for (int off = 1; off < kWarpSize; off <<= 1) {
      const int r = __shfl_up_sync(0xffffffffu, rows_inc, off), t = __shfl_up_sync(0xffffffffu, tiles_inc, off);
      if (lane >= off) rows_inc += r, tiles_inc += t;
    }
    if (lane == kWarpSize - 1) warp_rows[warp] = rows_inc, warp_tiles[warp] = tiles_inc;
    __syncthreads();
    int run = rows_inc - rows_sum, tiles = tiles_inc - tiles_sum;
    for (int w = 0; w < warp; ++w) run += warp_rows[w], tiles += warp_tiles[w];
    for (int e = e0; e < e1; ++e) {
      const int c = seg[e];
      seg[e] = run;
      tile0[e] = tiles;
      run += c;
      if (e < E) tiles += (c + p.tile_m - 1) / p.tile_m;
    }
    if (e0 < E1 && e1 == E1) {
      seg[E1] = run;
      *p.num_tiles = tiles;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nw * E1; i += blockDim.x) cnt[i] += seg[i % E1];
  for (int e = threadIdx.x; e <= E; e += blockDim.x) p.seg[e] = seg[e];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int n = (seg[e + 1] - seg[e] + p.tile_m - 1) / p.tile_m;
    for (int i = 0; i < n; ++i) p.tiles[tile0[e] + i] = (e << 16) | i;
  }
  __syncthreads();
  // Stable scatter: each warp walks its range 32 at a time; lanes with the same expert take
  // consecutive rows in lane order (rank among equal keys), then the last of them bumps the counter.
  for (int64_t base = lo; base < hi; base += kWarpSize) {
    const int64_t a = base + lane;
    const bool in = a < hi;
    const int e = in ? expert_of(a) : -1 - lane;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1));
    int pos = 0;
    if (in) pos = cnt[warp * E1 + e] + rank;
    __syncwarp();
    if (in && rank == __popc(same) - 1) cnt[warp * E1 + e] = pos + 1;
    __syncwarp();
    if (in) {
      p.perm_src[pos] = a / p.topk;
      p.perm_w[pos] = p.weights[a];
      p.comb[a] = e < E ? pos : -1;
    }
  }
}

void validate(const MoeRouteParams& p) {
  if (p.tokens < 0 || p.topk <= 0 || p.experts <= 0 || p.tile_m <= 0)
    DI_THROW(InvalidArgument, "moe_route: bad shape tokens=", p.tokens, " topk=", p.topk, " experts=", p.experts,
             " tile_m=", p.tile_m);
  if (p.experts + 1 > kSmemInts || p.experts >= (1 << 15))
    DI_THROW(InvalidArgument, "moe_route: ", p.experts, " experts exceed the kernel's limit (", kSmemInts - 1, ")");
  const int64_t rows = p.tokens * p.topk;
  if (rows >= (int64_t(1) << 31) || (rows + p.tile_m - 1) / p.tile_m >= (1 << 16))
    DI_THROW(InvalidArgument, "moe_route: ", rows, " assignments exceed the tile list's range");
  if (p.max_tiles < moe_route_max_tiles(rows, p.experts, p.tile_m))
    DI_THROW(InvalidArgument, "moe_route: max_tiles ", p.max_tiles, " below the bound ",
             moe_route_max_tiles(rows, p.experts, p.tile_m));
  if (rows > 0 && (!p.ids || !p.weights || !p.seg || !p.perm_src || !p.perm_w || !p.comb || !p.tiles || !p.num_tiles))
    DI_THROW(InvalidArgument, "moe_route: null input or output");
}
}  // namespace

int64_t moe_route_max_tiles(int64_t rows, int64_t experts, int tile_m) {
  return (rows + tile_m - 1) / tile_m + std::min(experts, rows);
}

void moe_route(const MoeRouteParams& p, cudaStream_t stream) {
  validate(p);
  const int nw = route_warps(p.experts, p.tokens * p.topk);
  const size_t smem = size_t(nw * (p.experts + 1) + 2 * (p.experts + 1) + 1) * sizeof(int32_t);
  if (smem > 48 * 1024) {
    DI_CUDA_CHECK(cudaFuncSetAttribute(moe_route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  moe_route_kernel<<<1, nw * kWarpSize, smem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

void moe_route_host(const MoeRouteParams& p) {
  validate(p);
  const int64_t rows = p.tokens * p.topk, E = p.experts;
  std::vector<int32_t> count(size_t(E + 1), 0);
  auto expert_of = [&](int64_t a) {
    const int e = p.ids[a];
    return e >= 0 && e < E ? int64_t(e) : E;
  };
  for (int64_t a = 0; a < rows; ++a) count[size_t(expert_of(a))]++;
  std::vector<int32_t> next(size_t(E + 1));
  int32_t run = 0, tiles = 0;
  for (int64_t e = 0; e <= E; ++e) {
    next[size_t(e)] = run;
    if (e < E) p.seg[e] = run;
    run += count[size_t(e)];
    if (e < E)
      for (int32_t i = 0; i < (count[size_t(e)] + p.tile_m - 1) / p.tile_m; ++i) p.tiles[tiles++] = int32_t(e << 16) | i;
  }
  p.seg[E] = next[size_t(E)];
  *p.num_tiles = tiles;
  for (int64_t a = 0; a < rows; ++a) {
    const int64_t e = expert_of(a);
    const int32_t pos = next[size_t(e)]++;
    p.perm_src[pos] = a / p.topk;
    p.perm_w[pos] = p.weights[a];
    p.comb[a] = e < E ? pos : -1;
  }
}

}  // namespace deepinfer::ops::cuda
