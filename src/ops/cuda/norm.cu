#include "ops/cuda/common.cuh"
#include "ops/cuda/norm.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::block_sum;
using deepinfer::cuda::from_f32;
using deepinfer::cuda::to_f32;

constexpr int kThreads = 256;

// One block per row. Pass 1 sums squares; pass 2 re-reads x (cached in L1/L2: a row is at most
// a few KiB) and writes. x and y may alias: each element is read before its own write.
template <typename TX, typename TW, typename TY>
__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(const __grid_constant__ RmsNormParams p) {
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
      DI_DISPATCH_FLOAT(p.y_dtype, TY, "rmsnorm y", [&] {
        rmsnorm_kernel<TX, TW, TY><<<unsigned(p.rows), kThreads, 0, stream>>>(p);
        DI_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace deepinfer::ops::cuda
