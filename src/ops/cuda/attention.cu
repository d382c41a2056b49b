#include "ops/cuda/attention.h"
#include "ops/cuda/common.cuh"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::from_f32;
using deepinfer::cuda::kWarpSize;
using deepinfer::cuda::to_f32;
using deepinfer::cuda::warp_sum;

constexpr int kHeadsPerBlock = 8;            // one warp per head
constexpr int kThreads = kHeadsPerBlock * kWarpSize;
constexpr int kKeyTile = 16;                 // keys staged per shared-memory tile
constexpr int kMaxDim = 512;
constexpr int kMaxPerLane = kMaxDim / kWarpSize;  // 16 dims per lane

// Lane l owns dims l, l+32, l+64, ... (conflict-free shared reads, coalesced global loads).
template <typename T>
__global__ void __launch_bounds__(kThreads) sparse_attn_kernel(const __grid_constant__ SparseAttnParams p) {
  extern __shared__ float smem[];  // [kKeyTile][head_dim] keys as f32, then kKeyTile validity flags
  float* keys = smem;
  int* valid = reinterpret_cast<int*>(smem + kKeyTile * p.head_dim);
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t h = int64_t(blockIdx.y) * kHeadsPerBlock + warp;
  const bool active = h < p.num_heads;
  const int per_lane = int(p.head_dim / kWarpSize);

  float qv[kMaxPerLane], acc[kMaxPerLane];
  const T* q = static_cast<const T*>(p.q) + t * p.q_stride + (active ? h : 0) * p.head_dim;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    qv[i] = (i < per_lane) ? to_f32(q[i * kWarpSize + lane]) : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;

  const int wb = p.win_begin[t], wc = p.win_count[t];
  const int cc = p.cmp_count ? p.cmp_count[t] : 0;
  const int64_t co = cc ? p.cmp_offset[t] : 0;
  const int total = wc + cc;
  for (int base = 0; base < total; base += kKeyTile) {
    __syncthreads();  // previous tile fully consumed
    // Stage up to kKeyTile keys: warp w loads keys w, w+8 (coalesced rows).
    for (int kk = warp; kk < kKeyTile; kk += kHeadsPerBlock) {
      const int j = base + kk;
      const T* row = nullptr;
      if (j < wc) {
        row = static_cast<const T*>(p.win_kv) + int64_t(wb + j) * p.kv_stride;
      } else if (j < total) {
        const int32_t r = p.cmp_rows[co + (j - wc)];
        if (r >= 0) row = static_cast<const T*>(p.cmp_kv) + int64_t(r) * p.kv_stride;
      }
      if (lane == 0) valid[kk] = row != nullptr;
      if (row)
        for (int c = lane; c < p.head_dim; c += kWarpSize) keys[kk * p.head_dim + c] = to_f32(row[c]);
    }
    __syncthreads();
    if (!active) continue;
    const int n = min(kKeyTile, total - base);
    for (int kk = 0; kk < n; ++kk) {
      if (!valid[kk]) continue;
      const float* k = keys + kk * p.head_dim;
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i)
        if (i < per_lane) dot += qv[i] * k[i * kWarpSize + lane];
      const float s = warp_sum(dot) * p.scale;
      const float m_new = fmaxf(m, s);
      const float corr = expf(m - m_new);  // m = -inf on the first key: corr = 0, acc/l are 0 anyway
      const float pj = expf(s - m_new);
      l = l * corr + pj;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i)
        if (i < per_lane) acc[i] = acc[i] * corr + pj * k[i * kWarpSize + lane];
      m = m_new;
    }
  }
  if (!active) return;
  T* o = static_cast<T*>(p.out) + t * p.out_stride + h * p.head_dim;
  // No keys: o = 0 (as the CPU twin). Otherwise the sink joins the denominator at scale e^{-m}.
  const float denom = (m == -INFINITY) ? 1.f : l + expf(p.sink[h] - m);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (i < per_lane) o[i * kWarpSize + lane] = from_f32<T>(m == -INFINITY ? 0.f : acc[i] / denom);
}
}  // namespace

void sparse_attention(const SparseAttnParams& p, cudaStream_t stream) {
  if (p.head_dim <= 0 || p.head_dim % kWarpSize || p.head_dim > kMaxDim)
    DI_THROW(InvalidArgument, "sparse_attention: head_dim ", p.head_dim, " must be a multiple of 32 in [32, 512]");
  if (p.num_tokens < 0 || p.num_heads <= 0) DI_THROW(InvalidArgument, "sparse_attention: bad T/H");
  if (!p.q || !p.win_kv || !p.win_begin || !p.win_count || !p.sink || !p.out)
    DI_THROW(InvalidArgument, "sparse_attention: null q, win_kv, win_begin, win_count, sink or out");
  if (p.cmp_count && (!p.cmp_kv || !p.cmp_rows || !p.cmp_offset))
    DI_THROW(InvalidArgument, "sparse_attention: cmp_count given without cmp_kv, cmp_rows or cmp_offset");
  if (p.kv_stride < p.head_dim || p.q_stride < p.num_heads * p.head_dim || p.out_stride < p.num_heads * p.head_dim)
    DI_THROW(InvalidArgument, "sparse_attention: strides smaller than the rows they hold");
  if (p.num_tokens == 0) return;
  const size_t smem = size_t(kKeyTile) * size_t(p.head_dim) * sizeof(float) + kKeyTile * sizeof(int);
  const dim3 grid(unsigned(p.num_tokens), unsigned(ceil_div(p.num_heads, kHeadsPerBlock)));
  DI_DISPATCH_FLOAT(p.dtype, T, "sparse_attention", [&] {
    sparse_attn_kernel<T><<<grid, kThreads, smem, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace deepinfer::ops::cuda
