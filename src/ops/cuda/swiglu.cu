#include "ops/cuda/common.cuh"
#include "ops/cuda/swiglu.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::from_f32;
using deepinfer::cuda::to_f32;
constexpr int kThreads = 256;

template <typename TI, typename TO>
__global__ void __launch_bounds__(kThreads) swiglu_kernel(const __grid_constant__ SwigluParams p) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.rows * p.inter) return;
  const int64_t r = idx / p.inter, c = idx % p.inter;
  float g = to_f32(static_cast<const TI*>(p.gate)[r * p.gate_stride + c]);
  float u = to_f32(static_cast<const TI*>(p.up)[r * p.up_stride + c]);
  if (p.limit > 0.f) {
    u = fminf(fmaxf(u, -p.limit), p.limit);
    g = fminf(g, p.limit);
  }
  float v = g / (1.0f + expf(-g)) * u;  // silu(g) · u
  if (p.row_weight) v = p.row_weight[r] * v;
  static_cast<TO*>(p.out)[r * p.out_stride + c] = from_f32<TO>(v);
}
}  // namespace

void swiglu(const SwigluParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.inter <= 0) DI_THROW(InvalidArgument, "swiglu: bad shape rows=", p.rows, " inter=", p.inter);
  if (!p.gate || !p.up || !p.out) DI_THROW(InvalidArgument, "swiglu: null gate, up or out");
  if (p.gate_stride < p.inter || p.up_stride < p.inter || p.out_stride < p.inter)
    DI_THROW(InvalidArgument, "swiglu: row strides smaller than inter=", p.inter);
  const int64_t n = p.rows * p.inter;
  if (n == 0) return;
  DI_DISPATCH_FLOAT(p.in_dtype, TI, "swiglu in", [&] {
    DI_DISPATCH_FLOAT(p.out_dtype, TO, "swiglu out", [&] {
      swiglu_kernel<TI, TO><<<unsigned(deepinfer::cuda::ceil_div(n, kThreads)), kThreads, 0, stream>>>(p);
      DI_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace deepinfer::ops::cuda
