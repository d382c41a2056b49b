#include "model/deepseek_v4/cuda/moe_decode.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"

namespace deepinfer::model::v4::gpu {
namespace {
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::from_f32;
using deepinfer::cuda::kWarpSize;
using deepinfer::cuda::to_f32;
using deepinfer::cuda::warp_sum;

// Traits: 8 warps a block, each warp owns kRowsPerWarp output rows; a 16-byte vector holds
// kVec elements of T. The block's input row (x_t or act_a) sits in shared memory.
constexpr int kWarps = 8, kThreads = kWarps * kWarpSize, kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

template <typename T>
struct Vec {
  static constexpr int kVec = 16 / int(sizeof(T));
};

// Σ a_i·b_i over one 16-byte vector of T each (fp32).
__device__ __forceinline__ float dot16(const uint4& a, const uint4& b, float) {
  return __uint_as_float(a.x) * __uint_as_float(b.x) + __uint_as_float(a.y) * __uint_as_float(b.y) +
         __uint_as_float(a.z) * __uint_as_float(b.z) + __uint_as_float(a.w) * __uint_as_float(b.w);
}
__device__ __forceinline__ float dot16(const uint4& a, const uint4& b, __nv_bfloat16) {
  const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
    s += fa.x * fb.x + fa.y * fb.y;
  }
  return s;
}

// Warp dot of a weight row (global) with the staged row (shared), n elements (multiple of kVec).
template <typename T>
__device__ __forceinline__ float warp_dot(const T* w, const uint4* xs, int64_t n, int lane) {
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const int64_t nv = n / Vec<T>::kVec;
  float acc = 0.f;
  for (int64_t v = lane; v < nv; v += kWarpSize) acc += dot16(__ldg(wv + v), xs[v], T{});
  return warp_sum(acc);
}

// Stage row `src` (n elements of T, 16-byte aligned) into shared memory.
template <typename T>
__device__ __forceinline__ void stage_row(uint4* xs, const T* src, int64_t n) {
  const uint4* sv = reinterpret_cast<const uint4*>(src);
  for (int64_t v = threadIdx.x; v < n / Vec<T>::kVec; v += blockDim.x) xs[v] = sv[v];
  __syncthreads();
}

// grid (tokens*topk, ceil(inter / kRowsPerBlock)).
template <typename T>
__global__ void __launch_bounds__(kThreads) moe_up_kernel(const __grid_constant__ MoeDecodeParams p) {
  extern __shared__ uint4 xs[];  // [dim / kVec]
  const int64_t a = blockIdx.x, t = a / p.topk, I = p.inter;
  const int e = p.expert_ids[a];
  const bool valid = e >= 0 && e < p.num_experts;
  stage_row(xs, static_cast<const T*>(p.x) + t * p.dim, p.dim);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const T* w = valid ? static_cast<const T*>(p.w13[e]) : nullptr;
  const float wt = p.weights[a];
  T* out = static_cast<T*>(p.act) + a * I;
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = int64_t(blockIdx.y) * kRowsPerBlock + r * kWarps + warp;
    if (i >= I) break;  // warp-uniform
    float v = 0.f;
    if (valid) {
      // Rounded to the storage dtype like the grouped path's GEMM output, then clamped SwiGLU.
      float g = to_f32(from_f32<T>(warp_dot(w + i * p.dim, xs, p.dim, lane)));
      float u = to_f32(from_f32<T>(warp_dot(w + (I + i) * p.dim, xs, p.dim, lane)));
      if (p.limit > 0.f) {
        u = fminf(fmaxf(u, -p.limit), p.limit);
        g = fminf(g, p.limit);
      }
      v = wt * (g / (1.0f + expf(-g)) * u);
    }
    if (lane == 0) out[i] = from_f32<T>(v);
  }
}

// grid (tokens*topk, ceil(dim / kRowsPerBlock)).
template <typename T>
__global__ void __launch_bounds__(kThreads) moe_down_kernel(const __grid_constant__ MoeDecodeParams p) {
  extern __shared__ uint4 xs[];  // [inter / kVec]
  const int64_t a = blockIdx.x;
  const int e = p.expert_ids[a];
  const bool valid = e >= 0 && e < p.num_experts;
  stage_row(xs, static_cast<const T*>(p.act) + a * p.inter, p.inter);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const T* w = valid ? static_cast<const T*>(p.w2[e]) : nullptr;
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = int64_t(blockIdx.y) * kRowsPerBlock + r * kWarps + warp;
    if (j >= p.dim) break;  // warp-uniform
    const float v = valid ? warp_dot(w + j * p.inter, xs, p.inter, lane) : 0.f;
    if (lane == 0) p.ye[a * p.dim + j] = v;
  }
}

void validate(const MoeDecodeParams& p) {
  if (p.tokens < 0 || p.topk <= 0 || p.num_experts <= 0 || p.dim <= 0 || p.inter <= 0)
    DI_THROW(InvalidArgument, "moe_decode: bad shape tokens=", p.tokens, " topk=", p.topk, " experts=", p.num_experts,
             " dim=", p.dim, " inter=", p.inter);
  if (p.dim % 8 || p.inter % 8)
    DI_THROW(InvalidArgument, "moe_decode: dim ", p.dim, " and inter ", p.inter, " must be multiples of 8 (16-byte rows)");
  if (p.dtype != DType::kF32 && p.dtype != DType::kBF16)
    DI_THROW(InvalidArgument, "moe_decode: dtype ", dtype_name(p.dtype), " (f32 or bf16 only)");
  if (p.tokens > 0 && (!p.x || !p.expert_ids || !p.weights || !p.w13 || !p.w2 || !p.act || !p.ye))
    DI_THROW(InvalidArgument, "moe_decode: null input, table or output");
}
}  // namespace

void moe_decode(const MoeDecodeParams& p, cudaStream_t stream) {
  validate(p);
  if (p.tokens == 0) return;
  const unsigned pairs = unsigned(p.tokens * p.topk);
  const size_t eb = dtype_nbytes(p.dtype, 1);
  if (size_t(std::max(p.dim, p.inter)) * eb > 48 * 1024)
    DI_THROW(InvalidArgument, "moe_decode: staged row of ", std::max(p.dim, p.inter), " elements exceeds 48 KiB of shared memory");
  DI_DISPATCH_FLOAT(p.dtype, T, "moe_decode", [&] {
    moe_up_kernel<T><<<dim3(pairs, unsigned(ceil_div(p.inter, kRowsPerBlock))), kThreads, size_t(p.dim) * eb, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
    moe_down_kernel<T><<<dim3(pairs, unsigned(ceil_div(p.dim, kRowsPerBlock))), kThreads, size_t(p.inter) * eb, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

namespace {
float ld(const void* b, DType dt, int64_t i) {
  return dt == DType::kF32 ? static_cast<const float*>(b)[i] : bf16_to_f32(static_cast<const uint16_t*>(b)[i]);
}
float rnd(float v, DType dt) { return dt == DType::kF32 ? v : bf16_to_f32(f32_to_bf16(v)); }
}  // namespace

void moe_decode_host(const MoeDecodeParams& p) {
  validate(p);
  const int64_t D = p.dim, I = p.inter;
  for (int64_t a = 0; a < p.tokens * p.topk; ++a) {
    const int64_t t = a / p.topk;
    const int e = p.expert_ids[a];
    const bool valid = e >= 0 && e < p.num_experts;
    for (int64_t i = 0; i < I; ++i) {
      float v = 0.f;
      if (valid) {
        float g = 0.f, u = 0.f;
        for (int64_t c = 0; c < D; ++c) {
          const float x = ld(p.x, p.dtype, t * D + c);
          g += x * ld(p.w13[e], p.dtype, i * D + c);
          u += x * ld(p.w13[e], p.dtype, (I + i) * D + c);
        }
        g = rnd(g, p.dtype);
        u = rnd(u, p.dtype);
        if (p.limit > 0.f) {
          u = std::fmin(std::fmax(u, -p.limit), p.limit);
          g = std::fmin(g, p.limit);
        }
        v = p.weights[a] * (g / (1.0f + std::exp(-g)) * u);
      }
      if (p.dtype == DType::kF32)
        static_cast<float*>(p.act)[a * I + i] = v;
      else
        static_cast<uint16_t*>(p.act)[a * I + i] = f32_to_bf16(v);
    }
    for (int64_t j = 0; j < D; ++j) {
      float v = 0.f;
      if (valid)
        for (int64_t c = 0; c < I; ++c) v += ld(p.act, p.dtype, a * I + c) * ld(p.w2[e], p.dtype, j * I + c);
      p.ye[a * D + j] = v;
    }
  }
}

}  // namespace deepinfer::model::v4::gpu
