#include "ops/cuda/common.cuh"
#include "ops/cuda/rope.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::from_f32;
using deepinfer::cuda::to_f32;

constexpr int kThreads = 256;

// One thread per (row, head, pair). sincosf (not __sincosf): positions reach 1M, so angles reach
// ~1e6 rad and need the full-range reduction to agree with the fp32 CPU reference.
template <typename T>
__global__ void __launch_bounds__(kThreads) rope_kernel(const __grid_constant__ RopeParams p) {
  const int64_t half = p.rope_dim / 2;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.rows * p.heads * half) return;
  const int64_t i = idx % half;
  const int64_t h = (idx / half) % p.heads;
  const int64_t r = idx / (half * p.heads);
  T* px = static_cast<T*>(p.x) + r * p.row_stride + h * p.head_stride + (p.head_dim - p.rope_dim) + 2 * i;
  const float ang = float(p.pos[r]) * p.inv_freq[i];
  float s, c;
  sincosf(ang, &s, &c);
  if (p.inverse) s = -s;
  const float a = to_f32(px[0]), b = to_f32(px[1]);
  px[0] = from_f32<T>(a * c - b * s);
  px[1] = from_f32<T>(a * s + b * c);
}
}  // namespace

void rope(const RopeParams& p, cudaStream_t stream) {
  if (p.rope_dim <= 0 || p.rope_dim % 2 || p.rope_dim > p.head_dim)
    DI_THROW(InvalidArgument, "rope: rope_dim ", p.rope_dim, " must be even and in (0, head_dim=", p.head_dim, "]");
  if (p.rows < 0 || p.heads <= 0) DI_THROW(InvalidArgument, "rope: bad shape rows=", p.rows, " heads=", p.heads);
  if (!p.x || !p.pos || !p.inv_freq) DI_THROW(InvalidArgument, "rope: null x, pos or inv_freq");
  if (p.head_stride < p.head_dim || p.row_stride < (p.heads - 1) * p.head_stride + p.head_dim)
    DI_THROW(InvalidArgument, "rope: strides (row ", p.row_stride, ", head ", p.head_stride, ") overlap heads");
  const int64_t n = p.rows * p.heads * (p.rope_dim / 2);
  if (n == 0) return;
  const int64_t blocks = deepinfer::cuda::ceil_div(n, kThreads);
  DI_DISPATCH_FLOAT(p.dtype, T, "rope x", [&] {
    rope_kernel<T><<<unsigned(blocks), kThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace deepinfer::ops::cuda
