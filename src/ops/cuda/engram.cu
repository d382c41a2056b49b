#include "ops/cuda/common.cuh"
#include "ops/cuda/engram.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::kWarpSize;
using deepinfer::cuda::warp_sum;

constexpr int kThreads = 256, kWarps = kThreads / kWarpSize;

__global__ void __launch_bounds__(kThreads) engram_kernel(const __grid_constant__ EngramParams p) {
  __shared__ float red[3][kWarps];
  __shared__ float s_gate;
  const int64_t t = blockIdx.x;
  const int k = int(blockIdx.y), n = p.n;
  const int64_t D = p.dim;
  float* h = p.x + t * p.x_stride + k * D;
  const float* key = p.kv + t * p.kv_stride + k * D;
  const float* value = p.kv + t * p.kv_stride + n * D;
  const float* w = p.w + k * D;
  float hh = 0.f, kk = 0.f, dot = 0.f;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) {
    const float hv = h[c], kv = key[c];
    hh += hv * hv;
    kk += kv * kv;
    dot += hv * w[c] * kv;
  }
  hh = warp_sum(hh);
  kk = warp_sum(kk);
  dot = warp_sum(dot);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) {
    red[0][warp] = hh;
    red[1][warp] = kk;
    red[2][warp] = dot;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = 0.f, b = 0.f, d = 0.f;
    for (int i = 0; i < kWarps; ++i) a += red[0][i], b += red[1][i], d += red[2][i];
    const float rstd = (1.0f / sqrtf(a / float(D) + p.eps)) * (1.0f / sqrtf(b / float(D) + p.eps));
    d = d * rstd * (1.0f / sqrtf(float(D)));
    float g = 1.0f / (1.0f + expf(-copysignf(sqrtf(fmaxf(fabsf(d), 1e-6f)), d)));
    if (p.dead && p.dead[t]) g = 0.f;
    s_gate = g;
  }
  __syncthreads();
  const float g = s_gate;
  for (int64_t c = threadIdx.x; c < D; c += kThreads) h[c] += g * value[c];
}
}  // namespace

void engram_inject(const EngramParams& p, cudaStream_t stream) {
  if (p.n < 1 || p.n > 16 || p.dim <= 0 || p.tokens < 0)
    DI_THROW(InvalidArgument, "engram_inject: bad shape tokens=", p.tokens, " n=", p.n, " dim=", p.dim);
  if (!p.x || !p.kv || !p.w) DI_THROW(InvalidArgument, "engram_inject: null x, kv or w");
  if (p.x_stride < p.n * p.dim || p.kv_stride < (p.n + 1) * p.dim)
    DI_THROW(InvalidArgument, "engram_inject: strides x ", p.x_stride, " / kv ", p.kv_stride, " too small");
  if (p.tokens == 0) return;
  if (p.tokens > INT32_MAX) DI_THROW(InvalidArgument, "engram_inject: ", p.tokens, " tokens");
  engram_kernel<<<dim3(unsigned(p.tokens), unsigned(p.n)), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
