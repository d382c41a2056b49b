#include "ops/cuda/common.cuh"
#include "ops/cuda/norm.h"
#include "ops/cuda/norm_row.cuh"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::block_sum;
using deepinfer::cuda::from_f32;
using deepinfer::cuda::kNormThreads;
using deepinfer::cuda::kWarpSize;
using deepinfer::cuda::rms_inv;
using deepinfer::cuda::kNormMaxPerThread;
using deepinfer::cuda::rmsnorm_row_loop;
using deepinfer::cuda::rmsnorm_row_regs;
using deepinfer::cuda::to_f32;
using deepinfer::cuda::warp_sum;

constexpr int kThreads = kNormThreads;
constexpr int kNormWarps = kNormThreads / kWarpSize;  // 8: the warps whose sums block_sum folds
constexpr int64_t kWarpRowMaxDim = 4 * kNormThreads;  // rows up to 1,024 wide take one warp each
constexpr int kRowsPerBlock = kThreads / kWarpSize;   // warp kernel: 8 rows per 256-thread block
// The warp kernel only from this many rows (prefill: the per-head q norm's T*64 rows): its unrolled
// body is 2-3x the block kernel's code, which a decode launch fetches once per SM.
constexpr int64_t kWarpRowsFrom = 1024;

// The two-pass kernel of sessions <= 14 (RmsNormParams::legacy): one block per row, pass 1 sums
// squares, pass 2 re-reads x. The bit-identity and timing baseline of the kernels below.
template <typename TX, typename TW, typename TY>
__global__ void __launch_bounds__(kThreads) rmsnorm_legacy_kernel(const __grid_constant__ RmsNormParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const TX* x = static_cast<const TX*>(p.x) + row * p.x_stride;
  TY* y = static_cast<TY*>(p.y) + row * p.y_stride;
  const TW* w = static_cast<const TW*>(p.w);
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    float v = to_f32(x[i]);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float r = 1.0f / sqrtf(ss / float(p.dim) + p.eps);
  for (int64_t i = threadIdx.x; i < p.dim; i += blockDim.x) {
    float v = to_f32(x[i]) * r;
    if (w) v = to_f32(w[i]) * v;
    y[i] = from_f32<TY>(v);
  }
}

// One block per row, the row in registers (norm_row.cuh): one read of x, every load in flight.
// NPT elements per thread (dim <= 256*NPT), one instantiation each: a decode launch runs its code
// once per SM, so a kernel carrying every width would fetch more instructions than it runs.
// NPT = 0: the two-pass loop (rows wider than 4,096).
template <int NPT, typename TX, typename TW, typename TY>
__global__ void __launch_bounds__(kThreads) rmsnorm_block_kernel(const __grid_constant__ RmsNormParams p) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const TX* x = static_cast<const TX*>(p.x) + row * p.x_stride;
  auto load = [x](int64_t i) { return to_f32(x[i]); };
  const TW* w = static_cast<const TW*>(p.w);
  TY* y = static_cast<TY*>(p.y) + row * p.y_stride;
  if constexpr (NPT == 0) rmsnorm_row_loop(load, w, y, p.dim, p.eps, scratch);
  else rmsnorm_row_regs<NPT>(load, w, y, p.dim, p.eps, scratch);
}

// One warp per row (dim <= 256*K), 8 rows per block: the warp plays the 256-thread block. Lane l
// holds elements l + 32m (m < 8K), so the block's thread 32w + l, which sums elements
// 32w + l + 256k, is lane l's chain over v[w + 8k]; its warp's butterfly is the same butterfly
// here, and the final fold of the 8 warp sums is block_sum's second stage verbatim: the bits of
// the block kernel, without shared memory or barriers.
template <int K, typename TX, typename TW, typename TY>
__global__ void __launch_bounds__(kThreads) rmsnorm_warp_kernel(const __grid_constant__ RmsNormParams p) {
  constexpr int M = kNormWarps * K;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (row >= p.rows) return;  // whole warps: no barrier below
  const TX* x = static_cast<const TX*>(p.x) + row * p.x_stride;
  TY* y = static_cast<TY*>(p.y) + row * p.y_stride;
  const TW* w = static_cast<const TW*>(p.w);
  float v[M];
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int64_t i = lane + int64_t(m) * kWarpSize;
    v[m] = i < p.dim ? to_f32(x[i]) : 0.f;
  }
  float s[kNormWarps];
#pragma unroll
  for (int wv = 0; wv < kNormWarps; ++wv) {
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < K; ++k) ss += v[wv + kNormWarps * k] * v[wv + kNormWarps * k];
    s[wv] = ss;
  }
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1)  // warp_sum of the 8 virtual warps, interleaved
#pragma unroll
    for (int wv = 0; wv < kNormWarps; ++wv) s[wv] += __shfl_xor_sync(0xffffffffu, s[wv], o);
  float fold = 0.f;  // block_sum: lane < num_warps reads scratch[lane], the rest 0
#pragma unroll
  for (int wv = 0; wv < kNormWarps; ++wv)
    if (lane == wv) fold = s[wv];
  const float r = rms_inv(warp_sum(fold), p.dim, p.eps);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const int64_t i = lane + int64_t(m) * kWarpSize;
    if (i < p.dim) {
      float o = v[m] * r;
      if (w) o = to_f32(w[i]) * o;
      y[i] = from_f32<TY>(o);
    }
  }
}

template <typename TX, typename TW, typename TY>
void launch(const RmsNormParams& p, cudaStream_t stream) {
  const unsigned rows = unsigned(p.rows);
  const int64_t per = (p.dim + kNormThreads - 1) / kNormThreads;  // elements per thread of a block
  if (p.legacy) {
    rmsnorm_legacy_kernel<TX, TW, TY><<<rows, kThreads, 0, stream>>>(p);
  } else if (p.rows >= kWarpRowsFrom && p.dim <= kWarpRowMaxDim) {
    const unsigned blocks = unsigned((p.rows + kRowsPerBlock - 1) / kRowsPerBlock);
    if (per <= 1) rmsnorm_warp_kernel<1, TX, TW, TY><<<blocks, kThreads, 0, stream>>>(p);
    else if (per <= 2) rmsnorm_warp_kernel<2, TX, TW, TY><<<blocks, kThreads, 0, stream>>>(p);
    else rmsnorm_warp_kernel<4, TX, TW, TY><<<blocks, kThreads, 0, stream>>>(p);
  } else if (per <= 1) {
    rmsnorm_block_kernel<1, TX, TW, TY><<<rows, kThreads, 0, stream>>>(p);
  } else if (per <= 2) {
    rmsnorm_block_kernel<2, TX, TW, TY><<<rows, kThreads, 0, stream>>>(p);
  } else if (per <= 4) {
    rmsnorm_block_kernel<4, TX, TW, TY><<<rows, kThreads, 0, stream>>>(p);
  } else if (per <= 8) {
    rmsnorm_block_kernel<8, TX, TW, TY><<<rows, kThreads, 0, stream>>>(p);
  } else if (per <= kNormMaxPerThread) {
    rmsnorm_block_kernel<kNormMaxPerThread, TX, TW, TY><<<rows, kThreads, 0, stream>>>(p);
  } else {
    rmsnorm_block_kernel<0, TX, TW, TY><<<rows, kThreads, 0, stream>>>(p);
  }
  DI_CUDA_CHECK_LAUNCH();
}
}  // namespace

void rmsnorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim <= 0) DI_THROW(InvalidArgument, "rmsnorm: bad shape rows=", p.rows, " dim=", p.dim);
  if (!p.x || !p.y) DI_THROW(InvalidArgument, "rmsnorm: null x or y");
  if (p.x_stride < p.dim || p.y_stride < p.dim)
    DI_THROW(InvalidArgument, "rmsnorm: row strides (x ", p.x_stride, ", y ", p.y_stride, ") < dim ", p.dim);
  if (p.rows == 0) return;
  if (p.rows > int64_t(INT32_MAX)) DI_THROW(InvalidArgument, "rmsnorm: too many rows ", p.rows);
  DI_DISPATCH_FLOAT(p.x_dtype, TX, "rmsnorm x", [&] {
    DI_DISPATCH_FLOAT(p.w ? p.w_dtype : DType::kF32, TW, "rmsnorm w", [&] {
      DI_DISPATCH_FLOAT(p.y_dtype, TY, "rmsnorm y", [&] { launch<TX, TW, TY>(p, stream); });
    });
  });
}

}  // namespace deepinfer::ops::cuda
