#include <cub/block/block_scan.cuh>

#include "ops/cuda/common.cuh"
#include "ops/cuda/indexer.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::kWarpSize;
using deepinfer::cuda::to_f32;
using deepinfer::cuda::warp_sum;

constexpr int kWarps = 8, kThreads = kWarps * kWarpSize;
constexpr int kCandPerWarp = 8, kCandPerBlock = kWarps * kCandPerWarp;
constexpr int kMaxHeads = 128, kMaxHeadsPerLane = kMaxHeads / kWarpSize;
constexpr int kMaxDim = 256;

// Scores: block = (token, 64 candidates). q[t] sits in shared memory as [Hi][di+1] (padded so the
// lanes, one head each, read different banks); each warp stages one key row and lane l
// accumulates heads l, l+32, ...; the head sum is one warp reduction per candidate.
template <typename T>
__global__ void __launch_bounds__(kThreads) indexer_scores_kernel(const __grid_constant__ IndexerParams p) {
  extern __shared__ float sm[];
  const int64_t t = blockIdx.x;
  const int count = p.cand_count[t];
  const int j0 = int(blockIdx.y) * kCandPerBlock;
  if (j0 >= count) return;  // whole block
  const int di = int(p.head_dim), Hi = int(p.num_heads), ld = di + 1;
  float* qs = sm;                                   // [Hi][ld]
  float* ks = sm + Hi * ld;                         // [kWarps][di]
  const T* q = static_cast<const T*>(p.q) + t * Hi * di;
  for (int i = threadIdx.x; i < Hi * di; i += kThreads) qs[(i / di) * ld + i % di] = to_f32(q[i]);
  __syncthreads();
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  float* kw = ks + warp * di;
  float wh[kMaxHeadsPerLane];
#pragma unroll
  for (int u = 0; u < kMaxHeadsPerLane; ++u) {
    const int h = u * kWarpSize + lane;
    wh[u] = h < Hi ? p.w[t * Hi + h] * p.w_scale : 0.f;
  }
  const int32_t* cand = p.cand_rows + p.cand_offset[t];
  for (int c = 0; c < kCandPerWarp; ++c) {
    const int j = j0 + warp * kCandPerWarp + c;
    if (j >= count) break;  // warp-uniform
    const T* k = static_cast<const T*>(p.k_pool) + int64_t(cand[j]) * di;
    for (int i = lane; i < di; i += kWarpSize) kw[i] = to_f32(k[i]);
    __syncwarp();
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < kMaxHeadsPerLane; ++u) {
      const int h = u * kWarpSize + lane;
      if (h >= Hi) break;
      const float* qh = qs + h * ld;
      float dot = 0.f;
      for (int i = 0; i < di; ++i) dot += qh[i] * kw[i];
      acc += (fmaxf(dot, 0.f) * p.qk_scale) * wh[u];
    }
    acc = warp_sum(acc);
    if (lane == 0) p.scores[t * p.max_candidates + j] = acc;
    __syncwarp();  // kw is rewritten by the next candidate
  }
}

// Larger key = larger score, then earlier candidate.
__device__ __forceinline__ uint64_t select_key(float s, int j) {
  uint32_t u = __float_as_uint(s);
  u ^= (u >> 31) ? 0xffffffffu : 0x80000000u;
  return (uint64_t(u) << 32) | uint64_t(0xffffffffu - uint32_t(j));
}

// Top-k of one row as a set: radix select (8 bits a pass, high to low) finds the k-th largest key
// exactly; keys are unique, so the keys >= it are exactly k. Then an ordered compaction (block
// scan) writes ids[j] (j itself when ids is null) in index order: deterministic. Block-wide: every
// thread of a 1024-thread block calls it with the same arguments.
__device__ void select_row(const float* sc, int count, int k, const int32_t* ids, int32_t* out, int64_t out_len) {
  using Scan = cub::BlockScan<int, 1024>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ uint64_t s_prefix;
  __shared__ int s_remaining, s_base;
  uint64_t prefix = 0, mask = 0;  // k-th largest key, known on the bits in mask
  if (k > 0 && k < count) {
    if (threadIdx.x == 0) s_remaining = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      for (int j = threadIdx.x; j < count; j += blockDim.x) {
        const uint64_t key = select_key(sc[j], j);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xff], 1);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int rem = s_remaining, b = 255;
        for (; b > 0 && hist[b] < rem; --b) rem -= hist[b];
        s_remaining = rem;
        s_prefix = prefix | (uint64_t(b) << shift);
      }
      __syncthreads();
      prefix = s_prefix;
      mask |= uint64_t(0xff) << shift;
    }
  }
  if (threadIdx.x == 0) s_base = 0;
  __syncthreads();
  for (int base = 0; base < count; base += blockDim.x) {
    const int j = base + threadIdx.x;
    const int sel = j < count && k > 0 && (k >= count || select_key(sc[j], j) >= prefix) ? 1 : 0;
    int pos, total;
    Scan(scan_tmp).ExclusiveSum(sel, pos, total);
    if (sel) out[s_base + pos] = ids ? ids[j] : j;
    __syncthreads();
    if (threadIdx.x == 0) s_base += total;
    __syncthreads();
  }
  for (int64_t i = k + threadIdx.x; i < out_len; i += blockDim.x) out[i] = -1;
}

// One block per token. Consume mode: out_count[t] holds the live candidates (mask kernel).
__global__ void __launch_bounds__(1024) indexer_select_kernel(const __grid_constant__ IndexerParams p) {
  const int64_t t = blockIdx.x;
  const int count = p.cand_count[t];
  const int live = p.in_blocks ? p.out_count[t] : count;
  const int k = p.topk < live ? int(p.topk) : live;
  __syncthreads();  // every thread read out_count before thread 0 overwrites it
  select_row(p.scores + t * p.max_candidates, count, k, p.cand_rows + p.cand_offset[t], p.out_rows + t * p.topk,
             p.topk);
  if (threadIdx.x == 0) p.out_count[t] = k;
}

// Consume: scores outside the token's listed blocks -> -inf; out_count[t] = the entries inside.
__global__ void __launch_bounds__(1024) indexer_mask_kernel(const __grid_constant__ IndexerParams p) {
  __shared__ int s_live;
  const int64_t t = blockIdx.x;
  const int count = p.cand_count[t];
  const int32_t* blocks = p.in_blocks + t * p.topk_blocks;
  float* sc = p.scores + t * p.max_candidates;
  if (threadIdx.x == 0) s_live = 0;
  __syncthreads();
  int live = 0;
  for (int j = threadIdx.x; j < count; j += blockDim.x) {
    const int32_t blk = int32_t(j / p.block_size);
    bool inside = false;
    for (int64_t b = 0; b < p.topk_blocks && !inside; ++b) inside = blocks[b] == blk;
    if (inside) ++live;
    else sc[j] = -INFINITY;
  }
  atomicAdd(&s_live, live);
  __syncthreads();
  if (threadIdx.x == 0) p.out_count[t] = s_live;
}

// Publish: block maxima (the newest block pinned at +inf), then the best topk_blocks of them,
// written ascending (the compaction runs in block order).
__global__ void __launch_bounds__(1024) indexer_blocks_kernel(const __grid_constant__ IndexerParams p, int64_t max_blocks) {
  const int64_t t = blockIdx.x;
  const int count = p.cand_count[t];
  const int bs = int(p.block_size), nb = (count + bs - 1) / bs;
  const float* sc = p.scores + t * p.max_candidates;
  float* bsc = p.block_scores + t * max_blocks;
  for (int b = threadIdx.x; b < nb; b += blockDim.x) {
    float m = -INFINITY;
    for (int j = b * bs; j < count && j < (b + 1) * bs; ++j) m = fmaxf(m, sc[j]);
    bsc[b] = b == nb - 1 ? INFINITY : m;
  }
  __syncthreads();
  const int k = p.topk_blocks < nb ? int(p.topk_blocks) : nb;
  select_row(bsc, nb, k, nullptr, p.out_blocks + t * p.topk_blocks, p.topk_blocks);
}
}  // namespace

void indexer_topk(const IndexerParams& p, cudaStream_t stream) {
  if (p.num_heads <= 0 || p.num_heads > kMaxHeads)
    DI_THROW(InvalidArgument, "indexer_topk: num_heads ", p.num_heads, " not in [1, ", kMaxHeads, "]");
  if (p.head_dim <= 0 || p.head_dim % kWarpSize || p.head_dim > kMaxDim)
    DI_THROW(InvalidArgument, "indexer_topk: head_dim ", p.head_dim, " must be a multiple of 32 in [32, ", kMaxDim, "]");
  if (!p.q || !p.w || !p.k_pool || !p.cand_rows || !p.cand_offset || !p.cand_count || !p.scores || !p.out_rows ||
      !p.out_count)
    DI_THROW(InvalidArgument, "indexer_topk: null input, workspace or output");
  if (p.topk <= 0 || p.max_candidates <= 0 || p.num_tokens < 0)
    DI_THROW(InvalidArgument, "indexer_topk: topk ", p.topk, " / max_candidates ", p.max_candidates, " must be > 0");
  const bool publish = p.out_blocks != nullptr, consume = p.in_blocks != nullptr;
  if (publish && consume) DI_THROW(InvalidArgument, "indexer_topk: a layer both publishes and consumes candidate blocks");
  if ((publish || consume) && (p.block_size <= 0 || p.topk_blocks <= 0))
    DI_THROW(InvalidArgument, "indexer_topk: candidate blocks of size ", p.block_size, " x ", p.topk_blocks);
  if (publish && !p.block_scores) DI_THROW(InvalidArgument, "indexer_topk: publishing needs the block_scores workspace");
  if (p.num_tokens == 0) return;
  const size_t smem = (size_t(p.num_heads) * (p.head_dim + 1) + size_t(kWarps) * p.head_dim) * sizeof(float);
  const dim3 grid(unsigned(p.num_tokens), unsigned(ceil_div(p.max_candidates, kCandPerBlock)));
  DI_DISPATCH_FLOAT(p.dtype, T, "indexer_topk", [&] {
    if (smem > 48 * 1024)
      DI_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    indexer_scores_kernel<T><<<grid, kThreads, smem, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
  if (consume) {
    indexer_mask_kernel<<<unsigned(p.num_tokens), 1024, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  }
  if (publish) {
    indexer_blocks_kernel<<<unsigned(p.num_tokens), 1024, 0, stream>>>(p, indexer_max_blocks(p.max_candidates, p.block_size));
    DI_CUDA_CHECK_LAUNCH();
  }
  indexer_select_kernel<<<unsigned(p.num_tokens), 1024, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

int64_t indexer_max_blocks(int64_t max_candidates, int64_t block_size) {
  return block_size > 0 ? ceil_div(max_candidates, block_size) : 0;
}

}  // namespace deepinfer::ops::cuda
