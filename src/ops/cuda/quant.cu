#include "core/numeric.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/quant.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::from_f32;
using deepinfer::cuda::kWarpSize;
using deepinfer::cuda::to_f32;
using deepinfer::cuda::warp_max;

constexpr float kFp8Max = 448.f, kFp4Max = 6.f;
constexpr int kThreads = 256;

// Smallest power of two >= s, exactly (s > 0, finite, normal).
__device__ __forceinline__ float pow2_ceil(float s) {
  int e;
  const float m = frexpf(s, &e);  // s = m · 2^e, m in [0.5, 1)
  return m == 0.5f ? s : ldexpf(1.f, e);
}

__device__ __forceinline__ float fp4_rt(float v, float scale) {
  const float q = fminf(fmaxf(v / scale, -kFp4Max), kFp4Max);
  return fp4e2m1_to_f32(f32_to_fp4e2m1(q)) * scale;
}

// One warp per (row, block); lanes stride the block so loads coalesce.
template <typename T>
__global__ void __launch_bounds__(kThreads) fp8_rt_kernel(const __grid_constant__ Fp8RoundTripParams p) {
  const int64_t blocks_per_row = p.quant_dims / p.block;
  const int64_t gw = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (gw >= p.rows * blocks_per_row) return;  // whole warp exits together
  T* x = static_cast<T*>(p.x) + (gw / blocks_per_row) * p.row_stride + (gw % blocks_per_row) * p.block;
  float amax = 0.f;
  for (int i = lane; i < p.block; i += kWarpSize) amax = fmaxf(amax, fabsf(to_f32(x[i])));
  amax = fmaxf(warp_max(amax), 1e-4f);
  float scale = amax * (1.0f / kFp8Max);
  if (p.pow2_scale) scale = pow2_ceil(scale);
  // pow2: 1/scale is exact; otherwise divide like the reference does.
  for (int i = lane; i < p.block; i += kWarpSize) {
    const float v = to_f32(x[i]);
    const float q = p.pow2_scale ? fminf(fmaxf(v * (1.0f / scale), -kFp8Max), kFp8Max)
                                 : fminf(fmaxf(v / scale, -kFp8Max), kFp8Max);
    x[i] = from_f32<T>(fp8e4m3_to_f32(f32_to_fp8e4m3(q)) * scale);
  }
}

// Plain FP4 round trip: one warp per block of 32 (one element per lane).
template <typename T>
__global__ void __launch_bounds__(kThreads) fp4_rt_kernel(const __grid_constant__ Fp4RoundTripParams p) {
  const int64_t blocks_per_row = p.dim / 32;
  const int64_t gw = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (gw >= p.rows * blocks_per_row) return;
  T* x = static_cast<T*>(p.x) + (gw / blocks_per_row) * p.row_stride + (gw % blocks_per_row) * 32;
  const float v = to_f32(x[lane]);
  const float amax = fmaxf(warp_max(fabsf(v)), kFp4Max * 1.17549435e-38f);  // 6 · 2^-126
  x[lane] = from_f32<T>(fp4_rt(v, pow2_ceil(amax * (1.0f / kFp4Max))));
}

// Hadamard-128 then FP4: one warp per row, lane l holds elements 4l..4l+3. Butterfly stages
// h = 1, 2 inside a lane, h = 4..64 across lanes (partner lane l ^ h/4); pair (i, i+h) becomes
// (x_i + x_{i+h}, x_i − x_{i+h}), i.e. x·H for the Sylvester H. Block of 32 = 8 lanes.
template <typename T>
__global__ void __launch_bounds__(kThreads) hadamard_fp4_kernel(const __grid_constant__ Fp4RoundTripParams p) {
  const int64_t row = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= p.rows) return;
  T* x = static_cast<T*>(p.x) + row * p.row_stride + lane * 4;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = to_f32(x[i]);
  float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
  v[0] = a0 + a2; v[2] = a0 - a2; v[1] = a1 + a3; v[3] = a1 - a3;
#pragma unroll
  for (int m = 1; m < kWarpSize; m <<= 1) {
    const bool upper = lane & m;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float o = __shfl_xor_sync(0xffffffffu, v[i], m);
      v[i] = upper ? o - v[i] : v[i] + o;
    }
  }
  const float norm = 0.08838834764831845f;  // 1/sqrt(128)
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = to_f32(from_f32<T>(v[i] * norm));  // the rotated activation is stored before quantising
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = pow2_ceil(fmaxf(amax, kFp4Max * 1.17549435e-38f) * (1.0f / kFp4Max));
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = from_f32<T>(fp4_rt(v[i], scale));
}

// One warp per (row, 128-block); lane l holds elements 4l..4l+3.
template <typename T>
__global__ void __launch_bounds__(kThreads) fp8_act_quant_kernel(const __grid_constant__ Fp8ActQuantParams p) {
  const int64_t blocks_per_row = p.K / 128;
  const int64_t gw = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (gw >= p.M * blocks_per_row) return;
  const int64_t row = gw / blocks_per_row, blk = gw % blocks_per_row;
  const T* x = static_cast<const T*>(p.x) + row * p.ldx + blk * 128 + lane * 4;
  float v[4], amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = to_f32(x[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = fmaxf(warp_max(amax), 1e-4f);
  float scale = amax * (1.0f / kFp8Max);
  if (p.pow2_scale) scale = pow2_ceil(scale);
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float q = p.pow2_scale ? v[i] * (1.0f / scale) : v[i] / scale;
    packed |= uint32_t(f32_to_fp8e4m3(fminf(fmaxf(q, -kFp8Max), kFp8Max))) << (8 * i);
  }
  reinterpret_cast<uint32_t*>(p.q + row * p.K + blk * 128)[lane] = packed;
  if (lane == 0) p.scale[blk * (p.scale_stride ? p.scale_stride : p.M) + row] = scale;
}

__global__ void e8m0_to_f32_kernel(const uint8_t* in, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = e8m0_to_f32(in[i]);
}

template <bool kE8M0>
__global__ void __launch_bounds__(kThreads) dequant_fp8_kernel(const __grid_constant__ Fp8DequantParams p) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.N * p.K) return;
  const int64_t n = idx / p.K, k = idx % p.K;
  const int64_t si = (n / 128) * ((p.K + 127) / 128) + k / 128;
  const float s = kE8M0 ? e8m0_to_f32(static_cast<const uint8_t*>(p.scale)[si]) : static_cast<const float*>(p.scale)[si];
  static_cast<__nv_bfloat16*>(p.out)[idx] = __float2bfloat16_rn(fp8e4m3_to_f32(p.w[idx]) * s);
}
}  // namespace

void quantize_fp8_act(const Fp8ActQuantParams& p, cudaStream_t stream) {
  if (p.K <= 0 || p.K % 128) DI_THROW(InvalidArgument, "quantize_fp8_act: K ", p.K, " must be a positive multiple of 128");
  if (!p.x || !p.q || !p.scale || p.M < 0 || p.ldx < p.K || (p.scale_stride && p.scale_stride < p.M))
    DI_THROW(InvalidArgument, "quantize_fp8_act: null pointer, negative M, ldx < K or scale_stride < M");
  if (reinterpret_cast<uintptr_t>(p.q) % 4) DI_THROW(InvalidArgument, "quantize_fp8_act: q must be 4-byte aligned");
  const int64_t warps = p.M * (p.K / 128);
  if (warps == 0) return;
  DI_DISPATCH_FLOAT(p.dtype, T, "quantize_fp8_act x", [&] {
    fp8_act_quant_kernel<T><<<unsigned(ceil_div(warps * kWarpSize, kThreads)), kThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

void e8m0_scales_to_f32(const uint8_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (!in || !out || n < 0) DI_THROW(InvalidArgument, "e8m0_scales_to_f32: null pointer or negative size");
  if (n == 0) return;
  e8m0_to_f32_kernel<<<unsigned(ceil_div(n, kThreads)), kThreads, 0, stream>>>(in, out, n);
  DI_CUDA_CHECK_LAUNCH();
}

void fp8_round_trip(const Fp8RoundTripParams& p, cudaStream_t stream) {
  if (p.block <= 0 || p.block % kWarpSize || p.block > 1024)
    DI_THROW(InvalidArgument, "fp8_round_trip: block ", p.block, " must be a multiple of 32 in [32, 1024]");
  if (p.quant_dims <= 0 || p.quant_dims % p.block)
    DI_THROW(InvalidArgument, "fp8_round_trip: quant_dims ", p.quant_dims, " not a multiple of block ", p.block);
  if (!p.x || p.rows < 0 || p.row_stride < p.quant_dims)
    DI_THROW(InvalidArgument, "fp8_round_trip: null x, negative rows or row_stride < quant_dims");
  const int64_t warps = p.rows * (p.quant_dims / p.block);
  if (warps == 0) return;
  DI_DISPATCH_FLOAT(p.dtype, T, "fp8_round_trip x", [&] {
    fp8_rt_kernel<T><<<unsigned(ceil_div(warps * kWarpSize, kThreads)), kThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

void fp4_round_trip(const Fp4RoundTripParams& p, cudaStream_t stream) {
  if (p.dim <= 0 || p.dim % 32) DI_THROW(InvalidArgument, "fp4_round_trip: dim ", p.dim, " not a multiple of 32");
  if (p.hadamard && p.dim != 128)
    DI_THROW(InvalidArgument, "fp4_round_trip: the Hadamard rotation is implemented for dim 128, got ", p.dim);
  if (!p.x || p.rows < 0 || p.row_stride < p.dim)
    DI_THROW(InvalidArgument, "fp4_round_trip: null x, negative rows or row_stride < dim");
  if (p.rows == 0) return;
  DI_DISPATCH_FLOAT(p.dtype, T, "fp4_round_trip x", [&] {
    if (p.hadamard) {
      hadamard_fp4_kernel<T><<<unsigned(ceil_div(p.rows * kWarpSize, kThreads)), kThreads, 0, stream>>>(p);
    } else {
      const int64_t warps = p.rows * (p.dim / 32);
      fp4_rt_kernel<T><<<unsigned(ceil_div(warps * kWarpSize, kThreads)), kThreads, 0, stream>>>(p);
    }
    DI_CUDA_CHECK_LAUNCH();
  });
}

void dequant_fp8_blockwise(const Fp8DequantParams& p, cudaStream_t stream) {
  if (!p.w || !p.scale || !p.out || p.N <= 0 || p.K <= 0)
    DI_THROW(InvalidArgument, "dequant_fp8_blockwise: null pointer or empty shape N=", p.N, " K=", p.K);
  if (p.scale_dtype != DType::kE8M0 && p.scale_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "dequant_fp8_blockwise: scale dtype ", dtype_name(p.scale_dtype), " (e8m0 or f32)");
  const unsigned blocks = unsigned(ceil_div(p.N * p.K, kThreads));
  if (p.scale_dtype == DType::kE8M0)
    dequant_fp8_kernel<true><<<blocks, kThreads, 0, stream>>>(p);
  else
    dequant_fp8_kernel<false><<<blocks, kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
