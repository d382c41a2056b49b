// The RMSNorm of one row by one 256-thread block, shared by the standalone rmsnorm (norm.cu) and
// the mHC site's fused norm (hc.cu), so both give the same bits. Included by .cu files only.
//
// The operation order is the spec of every rmsnorm on the GPU (the kernel of sessions <= 14):
// thread i sums v*v over elements i, i+256, i+512, ... in that order, then block_sum (a warp
// butterfly per warp, the 8 warp sums butterflied by one warp); r = 1/sqrt(ss/dim + eps);
// y = w * (x * r). Padding elements a thread does not own add 0*0 = +0 to a sum >= 0, which leaves
// it unchanged bit for bit, so a register tile wider than the row is exact.
#pragma once
#include "ops/cuda/common.cuh"

namespace deepinfer::cuda {

constexpr int kNormThreads = 256;   // the block shape that fixes the order of the sum of squares
constexpr int kNormMaxPerThread = 16;  // register rows up to 4,096 elements; wider rows take two passes

__device__ __forceinline__ float rms_inv(float ss, int64_t dim, float eps) {
  return 1.0f / sqrtf(ss / float(dim) + eps);
}

// Row in registers: NPT elements per thread (dim <= 256*NPT), all loads in flight at once.
// `load(i)` returns element i as f32; w [dim] or null; y may alias the loaded row.
template <int NPT, typename TW, typename TY, typename Load>
__device__ __forceinline__ void rmsnorm_row_regs(Load load, const TW* w, TY* y, int64_t dim, float eps,
                                                 float* scratch) {
  float v[NPT];
#pragma unroll
  for (int k = 0; k < NPT; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kNormThreads;
    v[k] = i < dim ? load(i) : 0.f;
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NPT; ++k) ss += v[k] * v[k];
  ss = block_sum(ss, scratch);
  const float r = rms_inv(ss, dim, eps);
#pragma unroll
  for (int k = 0; k < NPT; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kNormThreads;
    if (i < dim) {
      float o = v[k] * r;
      if (w) o = to_f32(w[i]) * o;
      y[i] = from_f32<TY>(o);
    }
  }
}

// Any width, compact code: the two-pass loop (x re-read; the same order as the register rows).
template <typename TW, typename TY, typename Load>
__device__ void rmsnorm_row_loop(Load load, const TW* w, TY* y, int64_t dim, float eps, float* scratch) {
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) {
    const float v = load(i);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float r = rms_inv(ss, dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) {
    float o = load(i) * r;
    if (w) o = to_f32(w[i]) * o;
    y[i] = from_f32<TY>(o);
  }
}

}  // namespace deepinfer::cuda
