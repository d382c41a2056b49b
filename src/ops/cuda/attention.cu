#include "ops/cuda/attention.h"
#include <algorithm>

#include "ops/cuda/attention_mma.h"

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
// kSplit: this block handles keys [z·split_keys, (z+1)·split_keys) of the token's list and writes
// (m, l, acc[d]) unnormalised to the workspace; otherwise all keys, normalised with the sink.
template <typename T, bool kSplit>
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
  const int all = wc + cc;
  const int first = kSplit ? int(blockIdx.z) * p.split_keys : 0;
  const int total = kSplit ? min(all, first + p.split_keys) : all;
  for (int base = first; base < total; base += kKeyTile) {
    __syncthreads();  // previous tile fully consumed
    // Stage up to kKeyTile keys: warp w loads keys w, w+8. All of a lane's 16-byte loads are
    // issued before any is used (the rows are gathered from anywhere in the cache, so latency,
    // not bandwidth, bounds this loop).
    constexpr int kKeysPerWarp = kKeyTile / kHeadsPerBlock;  // 2
    constexpr int kElemsPerVec = 16 / sizeof(T);
    constexpr int kMaxVecPerLane = kMaxDim / kElemsPerVec / kWarpSize;  // 2 (bf16) / 4 (f32)
    const int vec_per_row = int(p.head_dim) / kElemsPerVec;
    const T* rows[kKeysPerWarp];
#pragma unroll
    for (int r = 0; r < kKeysPerWarp; ++r) {
      const int kk = warp + r * kHeadsPerBlock, j = base + kk;
      const T* row = nullptr;
      if (j < min(wc, total)) {
        row = static_cast<const T*>(p.win_kv) + int64_t(wb + j) * p.kv_stride;
      } else if (j < total) {
        const int32_t id = p.cmp_rows[co + (j - wc)];
        if (id >= 0) row = static_cast<const T*>(p.cmp_kv) + int64_t(id) * p.kv_stride;
      }
      rows[r] = row;
      if (lane == 0) valid[kk] = row != nullptr;
    }
    uint4 buf[kKeysPerWarp][kMaxVecPerLane];
#pragma unroll
    for (int r = 0; r < kKeysPerWarp; ++r)
#pragma unroll
      for (int v = 0; v < kMaxVecPerLane; ++v) {
        const int vi = v * kWarpSize + lane;
        if (rows[r] && vi < vec_per_row) buf[r][v] = reinterpret_cast<const uint4*>(rows[r])[vi];
      }
#pragma unroll
    for (int r = 0; r < kKeysPerWarp; ++r)
#pragma unroll
      for (int v = 0; v < kMaxVecPerLane; ++v) {
        const int vi = v * kWarpSize + lane;
        if (!rows[r] || vi >= vec_per_row) continue;
        const T* e = reinterpret_cast<const T*>(&buf[r][v]);
        float* dst = keys + (warp + r * kHeadsPerBlock) * p.head_dim + vi * kElemsPerVec;
#pragma unroll
        for (int q = 0; q < kElemsPerVec; ++q) dst[q] = to_f32(e[q]);
      }
    __syncthreads();
    if (!active) continue;
    // Whole tile at once: 16 independent dot products (their shuffle chains overlap), one max,
    // one rescale of the accumulators. Missing keys (past the list, negative ids) score -inf.
    const int n = min(kKeyTile, total - base);
    float sc[kKeyTile];
#pragma unroll
    for (int kk = 0; kk < kKeyTile; ++kk) {
      float dot = 0.f;
      if (kk < n && valid[kk]) {
        const float* k = keys + kk * p.head_dim;
#pragma unroll
        for (int i = 0; i < kMaxPerLane; ++i)
          if (i < per_lane) dot += qv[i] * k[i * kWarpSize + lane];
      }
      sc[kk] = dot;
    }
    float m_new = m;
#pragma unroll
    for (int kk = 0; kk < kKeyTile; ++kk) {
      sc[kk] = (kk < n && valid[kk]) ? warp_sum(sc[kk]) * p.scale : -INFINITY;
      m_new = fmaxf(m_new, sc[kk]);
    }
    if (m_new == -INFINITY) continue;  // nothing valid yet
    const float corr = expf(m - m_new);  // m = -inf before the first key: corr = 0, acc and l are 0
    l *= corr;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) acc[i] *= corr;
#pragma unroll
    for (int kk = 0; kk < kKeyTile; ++kk) {
      const float pj = expf(sc[kk] - m_new);  // 0 for missing keys
      if (pj == 0.f) continue;
      l += pj;
      const float* k = keys + kk * p.head_dim;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i)
        if (i < per_lane) acc[i] += pj * k[i * kWarpSize + lane];
    }
    m = m_new;
  }
  if (!active) return;
  if constexpr (kSplit) {
    float* w = p.workspace + ((t * p.num_heads + h) * p.num_splits + blockIdx.z) * (p.head_dim + 2);
    if (lane == 0) {
      w[0] = m;
      w[1] = l;
    }
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i)
      if (i < per_lane) w[2 + i * kWarpSize + lane] = acc[i];
    return;
  }
  T* o = static_cast<T*>(p.out) + t * p.out_stride + h * p.head_dim;
  // No keys: o = 0 (as the CPU twin). Otherwise the sink joins the denominator at scale e^{-m}.
  const float denom = (m == -INFINITY) ? 1.f : l + expf(p.sink[h] - m);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i)
    if (i < per_lane) o[i * kWarpSize + lane] = from_f32<T>(m == -INFINITY ? 0.f : acc[i] / denom);
}
// Merge the splits of one (token, head): M = max m_s, o = Σ acc_s e^{m_s−M} / (Σ l_s e^{m_s−M} + e^{sink−M}).
template <typename T>
__global__ void sparse_attn_combine_kernel(const __grid_constant__ SparseAttnParams p) {
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const float* w = p.workspace + (t * p.num_heads + h) * p.num_splits * (p.head_dim + 2);
  const int64_t stride = p.head_dim + 2;
  float M = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) M = fmaxf(M, w[s * stride]);
  float L = 0.f;
  for (int s = 0; s < p.num_splits; ++s)
    if (w[s * stride] != -INFINITY) L += w[s * stride + 1] * expf(w[s * stride] - M);
  T* o = static_cast<T*>(p.out) + t * p.out_stride + h * p.head_dim;
  const float denom = (M == -INFINITY) ? 1.f : L + expf(p.sink[h] - M);
  for (int64_t c = threadIdx.x; c < p.head_dim; c += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < p.num_splits; ++s)
      if (w[s * stride] != -INFINITY) acc += w[s * stride + 2 + c] * expf(w[s * stride] - M);
    o[c] = from_f32<T>(M == -INFINITY ? 0.f : acc / denom);
  }
}
// The same merge, same arithmetic in the same order (bit-identical results), with the per-split
// factors e^{m_s - M} computed once into shared memory and each thread's column pair loaded
// for several splits at once: the loop above waits on one load per split and column.
constexpr int kCombineThreads = 256;
constexpr int kCombineMaxSplits = 2048;  // shared memory: 2 floats + 1 flag per split
template <typename T>
__global__ void __launch_bounds__(kCombineThreads) sparse_attn_combine2_kernel(const __grid_constant__ SparseAttnParams p) {
  extern __shared__ float cs[];  // [splits] e^{m_s - M}, then [splits] m_s
  float* e = cs;
  float* ms = cs + p.num_splits;
  __shared__ float denom_s, M_s;
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t stride = p.head_dim + 2;
  const float* w = p.workspace + (t * p.num_heads + h) * p.num_splits * stride;
  for (int s = threadIdx.x; s < p.num_splits; s += blockDim.x) ms[s] = w[s * stride];
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int s = 0; s < p.num_splits; ++s) M = fmaxf(M, ms[s]);
    float L = 0.f;
    for (int s = 0; s < p.num_splits; ++s) {
      const float es = expf(ms[s] - M);
      e[s] = es;
      if (ms[s] != -INFINITY) L += w[s * stride + 1] * es;
    }
    M_s = M;
    denom_s = (M == -INFINITY) ? 1.f : L + expf(p.sink[h] - M);
  }
  __syncthreads();
  const float M = M_s, denom = denom_s;
  T* o = static_cast<T*>(p.out) + t * p.out_stride + h * p.head_dim;
  for (int64_t c = 2 * int64_t(threadIdx.x); c < p.head_dim; c += 2 * blockDim.x) {
    float a0 = 0.f, a1 = 0.f;
#pragma unroll 4
    for (int s = 0; s < p.num_splits; ++s) {
      // Every split wrote its row (m = -inf, acc = 0 when it had no keys): the load is safe and
      // the select keeps the old loop's skip, so the sums are the same bits.
      const float2 v = *reinterpret_cast<const float2*>(w + s * stride + 2 + c);
      const bool live = ms[s] != -INFINITY;
      const float es = e[s];
      a0 = live ? a0 + v.x * es : a0;
      a1 = live ? a1 + v.y * es : a1;
    }
    o[c] = from_f32<T>(M == -INFINITY ? 0.f : a0 / denom);
    o[c + 1] = from_f32<T>(M == -INFINITY ? 0.f : a1 / denom);
  }
}

template <typename T>
void launch_combine(const SparseAttnParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned(p.num_tokens), unsigned(p.num_heads));
  if (p.num_splits <= kCombineMaxSplits) {
    const size_t smem = size_t(2 * p.num_splits) * sizeof(float);
    sparse_attn_combine2_kernel<T><<<grid, kCombineThreads, smem, stream>>>(p);
  } else {
    sparse_attn_combine_kernel<T><<<grid, 128, 0, stream>>>(p);
  }
  DI_CUDA_CHECK_LAUNCH();
}
}  // namespace

AttnSplit choose_attention_split(int64_t num_tokens, int64_t num_heads, int64_t max_keys_per_token, int num_sms) {
  const int64_t blocks = num_tokens * ceil_div(num_heads, kHeadsPerBlock);
  // Latency-bound: aim for ~4 waves of blocks, at least 2 key tiles per split.
  const int64_t target = 4 * int64_t(num_sms);
  if (num_tokens <= 0 || max_keys_per_token <= 2 * kKeyTile || blocks >= target) return {};
  const int64_t want = std::min<int64_t>(ceil_div(target, blocks), ceil_div(max_keys_per_token, 2 * kKeyTile));
  const int64_t keys = ceil_div(ceil_div(max_keys_per_token, want), kKeyTile) * kKeyTile;
  return {int(ceil_div(max_keys_per_token, keys)), int(keys)};
}

AttnSplit choose_attention_split(int64_t num_tokens, int64_t num_heads, int64_t head_dim, DType dtype,
                                 int64_t max_keys_per_token, int num_sms) {
  if (!detail::sparse_attention_mma_supports_shape(num_heads, head_dim, dtype))
    return choose_attention_split(num_tokens, num_heads, max_keys_per_token, num_sms);
  // Tensor-core kernel: one 168-204 KB block per multiprocessor, so split only while the batch leaves
  // multiprocessors idle, into as many splits as fit one wave (b=1: 20 x 32 keys of 640; b=8:
  // 10 x 64; b=32: 4 x 160; b >= 132: none). Splitting further only adds partials to merge.
  constexpr int kTile = 32;
  const int64_t blocks = num_tokens * (num_heads / 64);
  if (num_tokens <= 0 || max_keys_per_token <= kTile || blocks * 2 > num_sms) return {};
  const int64_t want = std::min<int64_t>(num_sms / blocks, ceil_div(max_keys_per_token, kTile));
  const int64_t keys = ceil_div(ceil_div(max_keys_per_token, want), kTile) * kTile;
  const int splits = int(ceil_div(max_keys_per_token, keys));
  return splits > 1 ? AttnSplit{splits, int(keys)} : AttnSplit{};
}

bool sparse_attention_uses_tensor_cores(int64_t num_heads, int64_t head_dim, DType dtype) {
  return detail::sparse_attention_mma_supports_shape(num_heads, head_dim, dtype);
}

size_t sparse_attention_workspace_bytes(int64_t num_tokens, int64_t num_heads, int64_t head_dim, int num_splits) {
  return num_splits <= 1 ? 0 : size_t(num_tokens * num_heads * num_splits * (head_dim + 2)) * sizeof(float);
}

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
  const size_t elem = p.dtype == DType::kF32 ? 4 : 2;
  auto aligned16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  if ((p.head_dim * elem) % 16 || (p.kv_stride * elem) % 16 || !aligned16(p.win_kv) || (p.cmp_kv && !aligned16(p.cmp_kv)))
    DI_THROW(InvalidArgument, "sparse_attention: kv rows must be 16-byte aligned (base pointers and kv_stride)");
  const bool split = p.num_splits > 1;
  if (split && (!p.workspace || p.split_keys <= 0 || p.num_splits > 65535))
    DI_THROW(InvalidArgument, "sparse_attention: num_splits ", p.num_splits, " needs split_keys > 0 and a workspace");
  if (p.num_tokens == 0) return;
  const bool mma = p.kernel != AttnKernel::kCudaCores && detail::sparse_attention_mma_supports(p);
  if (p.kernel != AttnKernel::kAuto && p.kernel != AttnKernel::kCudaCores && !mma)
    DI_THROW(InvalidArgument, "sparse_attention: the tensor-core kernel needs bf16, head_dim 512, heads a multiple of 64, ",
             "split_keys a multiple of its key tile (32 or 64) and 16-byte aligned q (got dtype ", dtype_name(p.dtype), ", head_dim ", p.head_dim,
             ", heads ", p.num_heads, ", split_keys ", p.split_keys, ")");
  if (mma) {
    detail::sparse_attention_mma(p, stream);
    if (split) launch_combine<__nv_bfloat16>(p, stream);
    return;
  }
  const size_t smem = size_t(kKeyTile) * size_t(p.head_dim) * sizeof(float) + kKeyTile * sizeof(int);
  const dim3 grid(unsigned(p.num_tokens), unsigned(ceil_div(p.num_heads, kHeadsPerBlock)), split ? p.num_splits : 1);
  DI_DISPATCH_FLOAT(p.dtype, T, "sparse_attention", [&] {
    if (split) {
      sparse_attn_kernel<T, true><<<grid, kThreads, smem, stream>>>(p);
      DI_CUDA_CHECK_LAUNCH();
      launch_combine<T>(p, stream);
    } else {
      sparse_attn_kernel<T, false><<<grid, kThreads, smem, stream>>>(p);
    }
    DI_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace deepinfer::ops::cuda
