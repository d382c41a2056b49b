#include <algorithm>

#include "core/numeric.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/engram.h"
#include "ops/cuda/engram_widen_values.h"

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

// One thread per 4 consecutive values (dim % 4 == 0, checked by the launcher; FP8 has dim % 32),
// read with one vector load; the values are engram_widen_quad's (engram_widen_values.h, the same
// scalar functions as the host widen, checked against it on the CPU too), then f32_to_bf16.
template <DType In, typename Out>
__global__ void __launch_bounds__(kThreads) engram_widen_kernel(const __grid_constant__ EngramWidenParams p) {
  const int64_t quads = p.rows * p.dim / 4;
  Out* out = static_cast<Out*>(p.out);
  for (int64_t q = int64_t(blockIdx.x) * kThreads + threadIdx.x; q < quads; q += int64_t(gridDim.x) * kThreads) {
    alignas(16) unsigned char raw[16];  // the quad, by one aligned vector load
    constexpr int kBytes = In == DType::kF8E4M3 ? 4 : In == DType::kBF16 ? 8 : 16;
    if constexpr (kBytes == 4)
      *reinterpret_cast<uchar4*>(raw) = static_cast<const uchar4*>(p.values)[q];
    else if constexpr (kBytes == 8)
      *reinterpret_cast<ushort4*>(raw) = static_cast<const ushort4*>(p.values)[q];
    else
      *reinterpret_cast<float4*>(raw) = static_cast<const float4*>(p.values)[q];
    float v[4];
    engram_widen_quad<In>(raw, p.scales, p.dim, q * 4, v);
    if constexpr (sizeof(Out) == 4) {
      reinterpret_cast<float4*>(out)[q] = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      reinterpret_cast<ushort4*>(out)[q] = make_ushort4(f32_to_bf16(v[0]), f32_to_bf16(v[1]), f32_to_bf16(v[2]),
                                                        f32_to_bf16(v[3]));
    }
  }
}

template <DType In>
void launch_widen(const EngramWidenParams& p, cudaStream_t stream) {
  const int64_t quads = p.rows * p.dim / 4;
  const unsigned blocks = unsigned(std::min<int64_t>((quads + kThreads - 1) / kThreads, 132 * 16));
  if (p.out_dtype == DType::kF32)
    engram_widen_kernel<In, float><<<blocks, kThreads, 0, stream>>>(p);
  else
    engram_widen_kernel<In, uint16_t><<<blocks, kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
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

void engram_widen(const EngramWidenParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.dim <= 0 || p.dim % 4 != 0)
    DI_THROW(InvalidArgument, "engram_widen: bad shape rows=", p.rows, " dim=", p.dim, " (dim must be a multiple of 4)");
  if (p.in != DType::kF8E4M3 && p.in != DType::kBF16 && p.in != DType::kF32)
    DI_THROW(InvalidArgument, "engram_widen: stored dtype ", dtype_name(p.in));
  if (p.out_dtype != DType::kBF16 && p.out_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "engram_widen: output dtype ", dtype_name(p.out_dtype));
  if (p.in == DType::kF8E4M3 && p.dim % 32 != 0)
    DI_THROW(InvalidArgument, "engram_widen: FP8 rows of ", p.dim, " values (an E8M0 scale per 32 needs dim % 32 == 0)");
  if (p.rows == 0) return;
  if (!p.values || !p.out || (p.in == DType::kF8E4M3 && !p.scales))
    DI_THROW(InvalidArgument, "engram_widen: null values, scales or out");
  if (reinterpret_cast<uintptr_t>(p.values) % 16 || reinterpret_cast<uintptr_t>(p.out) % 16)
    DI_THROW(InvalidArgument, "engram_widen: values and out must be 16-byte aligned");
  switch (p.in) {
    case DType::kF8E4M3: launch_widen<DType::kF8E4M3>(p, stream); return;
    case DType::kBF16: launch_widen<DType::kBF16>(p, stream); return;
    default: launch_widen<DType::kF32>(p, stream); return;
  }
}

}  // namespace deepinfer::ops::cuda
