// Shared device helpers for the CUDA kernels: element conversion, warp/block reductions and
// the one dtype dispatch step (runtime DType -> template type). Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/check.h"
#include "core/dtype.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::cuda {

constexpr int kWarpSize = 32;

// ---- element conversion: fp32 is the compute type everywhere ----
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// ---- reductions ----
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds >= 32 floats. The order of
// additions is fixed by the block shape, so results are deterministic run to run.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < num_warps ? scratch[lane] : 0.f;
  return warp_sum(r);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace deepinfer::cuda

// Maps a runtime activation dtype (f32 | bf16) to a type alias `NAME` inside the body.
#define DI_DISPATCH_FLOAT(DT, NAME, WHAT, ...)                                                   \
  [&] {                                                                                          \
    switch (DT) {                                                                                \
      case ::deepinfer::DType::kF32: { using NAME = float; return __VA_ARGS__(); }               \
      case ::deepinfer::DType::kBF16: { using NAME = __nv_bfloat16; return __VA_ARGS__(); }      \
      default:                                                                                   \
        DI_THROW(::deepinfer::InvalidArgument, WHAT, ": dtype ", ::deepinfer::dtype_name(DT),    \
                 " not supported (f32 or bf16)");                                                \
    }                                                                                            \
  }()
