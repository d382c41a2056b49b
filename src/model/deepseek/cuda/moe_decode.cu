#include "model/deepseek/cuda/moe_decode.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/moe_dequant.h"

namespace deepinfer::model::ds::cuda {
namespace {
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::from_f32;
using deepinfer::cuda::kWarpSize;
using deepinfer::cuda::to_f32;
using deepinfer::cuda::warp_sum;
using ops::cuda::ExpertFormat;

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

// Eight staged elements x[8*g .. 8*g+7] as fp32.
__device__ __forceinline__ void load8(const uint4* xs, int64_t g, float (&f)[8], __nv_bfloat16) {
  const uint4 u = xs[g];
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
__device__ __forceinline__ void load8(const uint4* xs, int64_t g, float (&f)[8], float) {
  const uint4 a = xs[2 * g], b = xs[2 * g + 1];
  f[0] = __uint_as_float(a.x), f[1] = __uint_as_float(a.y), f[2] = __uint_as_float(a.z), f[3] = __uint_as_float(a.w);
  f[4] = __uint_as_float(b.x), f[5] = __uint_as_float(b.y), f[6] = __uint_as_float(b.z), f[7] = __uint_as_float(b.w);
}

// Warp dot of weight row `row` (release format F, n inputs) with the staged row. Each lane takes
// 16-byte vectors: FP4 32 inputs (one scale), FP8 16 inputs (scale per 128); the vector's fp32
// partial sum is multiplied by its power-of-two scale (exact).
// Per-byte dequantisation table in shared memory: FP4 -> bf16x2 bits of its two nibbles (low
// nibble in the low half), FP8 -> f32 bits of the e4m3 value. Exact.
template <ExpertFormat F>
__device__ __forceinline__ void fill_lut(uint32_t* lut) {
  if constexpr (F == ExpertFormat::kFP4)
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
      lut[i] = ops::cuda::fp4_bf16_bits(i & 15) | (ops::cuda::fp4_bf16_bits(i >> 4) << 16);
  else if constexpr (F == ExpertFormat::kFP8)
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = ops::cuda::fp8_bf16_bits(i) << 16;
}

// Warp dots of R weight rows (release format F, n inputs each) with the staged row. Each lane
// takes 16-byte vectors — FP4 32 inputs (one scale), FP8 16 inputs (scale per 128) — and loads
// the vectors of all R rows before using any, so R loads are in flight (one row at a time left
// the GEMV latency-bound near 1 TB/s); the staged inputs are read once for all rows. Per row a
// vector's fp32 partial sum is multiplied by its power-of-two scale (exact), then accumulated.
template <typename T, ExpertFormat F, int R>
__device__ __forceinline__ void rows_dot(const void* w, const uint8_t* sc, const int64_t (&rows)[R], const uint4* xs,
                                         int64_t n, int lane, const uint32_t* lut, float (&out)[R]) {
  constexpr int kPer = F == ExpertFormat::kFP4 ? 32 : 16;        // inputs per 16-byte vector
  constexpr int kScaleIn = F == ExpertFormat::kFP4 ? 32 : 128;   // inputs per scale
  const int64_t row_bytes = F == ExpertFormat::kFP4 ? n / 2 : n, row_scales = (n + kScaleIn - 1) / kScaleIn;
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int64_t v = lane; v < n / kPer; v += kWarpSize) {
    uint4 q[R];
    uint8_t se[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      q[r] = __ldg(reinterpret_cast<const uint4*>(wb + rows[r] * row_bytes) + v);
      se[r] = __ldg(sc + rows[r] * row_scales + v * kPer / kScaleIn);
    }
    float part[R];
#pragma unroll
    for (int r = 0; r < R; ++r) part[r] = 0.f;
    if constexpr (F == ExpertFormat::kFP4) {
#pragma unroll
      for (int g = 0; g < 4; ++g) {  // 8 inputs per 32-bit word
        float x[8];
        load8(xs, v * 4 + g, x, T{});
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t word = reinterpret_cast<const uint32_t*>(&q[r])[g];
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t d = lut[(word >> (8 * b)) & 0xff];
            part[r] += __uint_as_float(d << 16) * x[2 * b];
            part[r] += __uint_as_float(d & 0xffff0000u) * x[2 * b + 1];
          }
        }
      }
    } else {
#pragma unroll
      for (int g = 0; g < 2; ++g) {  // 8 inputs per two 32-bit words
        float x[8];
        load8(xs, v * 2 + g, x, T{});
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t* raw = reinterpret_cast<const uint32_t*>(&q[r]);
#pragma unroll
          for (int j = 0; j < 8; ++j) part[r] += __uint_as_float(lut[(raw[2 * g + j / 4] >> (8 * (j % 4))) & 0xff]) * x[j];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += part[r] * deepinfer::e8m0_to_f32(se[r]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = warp_sum(acc[r]);
}

// Rounded to the storage dtype like the grouped path's GEMM output, then clamped SwiGLU.
template <typename T>
__device__ __forceinline__ float swiglu_act(float g, float u, float wt, float limit) {
  g = to_f32(from_f32<T>(g));
  u = to_f32(from_f32<T>(u));
  if (limit > 0.f) {
    u = fminf(fmaxf(u, -limit), limit);
    g = fminf(g, limit);
  }
  return wt * (g / (1.0f + expf(-g)) * u);
}

// Stage row `src` (n elements of T, 16-byte aligned) into shared memory.
template <typename T>
__device__ __forceinline__ void stage_row(uint4* xs, const T* src, int64_t n) {
  const uint4* sv = reinterpret_cast<const uint4*>(src);
  for (int64_t v = threadIdx.x; v < n / Vec<T>::kVec; v += blockDim.x) xs[v] = sv[v];
  __syncthreads();
}

// grid (tokens*topk, ceil(inter / kRowsPerBlock)).
template <typename T, ExpertFormat F>
__global__ void __launch_bounds__(kThreads) moe_up_kernel(const __grid_constant__ MoeDecodeParams p) {
  extern __shared__ uint4 xs[];  // [dim / kVec]
  __shared__ uint32_t lut[F == ExpertFormat::kPlain ? 1 : 256];
  fill_lut<F>(lut);
  const int64_t a = blockIdx.x, t = a / p.topk, I = p.inter;
  const int e = p.expert_ids[a];
  const bool valid = e >= 0 && e < p.num_experts;
  stage_row(xs, static_cast<const T*>(p.x) + t * p.dim, p.dim);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const void* w = valid ? p.w13[e] : nullptr;
  const uint8_t* sc = valid && F != ExpertFormat::kPlain ? p.w13_scale[e] : nullptr;
  const float wt = p.weights[a];
  T* out = static_cast<T*>(p.act) + a * I;
  const int64_t i0 = int64_t(blockIdx.y) * kRowsPerBlock + warp;  // rows i0 + r*kWarps
  if constexpr (F != ExpertFormat::kPlain) {
    // gate and up rows of the warp's kRowsPerWarp outputs in one pass (rows past I repeat row 0)
    int64_t rows[2 * kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = i0 + r * kWarps < I ? i0 + r * kWarps : 0;
      rows[2 * r] = i;
      rows[2 * r + 1] = I + i;
    }
    float d[2 * kRowsPerWarp];
    if (valid) rows_dot<T, F, 2 * kRowsPerWarp>(w, sc, rows, xs, p.dim, lane, lut, d);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = i0 + r * kWarps;
      if (i < I && lane == 0) out[i] = from_f32<T>(valid ? swiglu_act<T>(d[2 * r], d[2 * r + 1], wt, p.limit) : 0.f);
    }
  } else {
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = i0 + r * kWarps;
      if (i >= I) break;  // warp-uniform
      float v = 0.f;
      if (valid)
        v = swiglu_act<T>(warp_dot(static_cast<const T*>(w) + i * p.dim, xs, p.dim, lane),
                          warp_dot(static_cast<const T*>(w) + (I + i) * p.dim, xs, p.dim, lane), wt, p.limit);
      if (lane == 0) out[i] = from_f32<T>(v);
    }
  }
}

// grid (tokens*topk, ceil(dim / kRowsPerBlock)).
template <typename T, ExpertFormat F>
__global__ void __launch_bounds__(kThreads) moe_down_kernel(const __grid_constant__ MoeDecodeParams p) {
  extern __shared__ uint4 xs[];  // [inter / kVec]
  __shared__ uint32_t lut[F == ExpertFormat::kPlain ? 1 : 256];
  fill_lut<F>(lut);
  const int64_t a = blockIdx.x;
  const int e = p.expert_ids[a];
  const bool valid = e >= 0 && e < p.num_experts;
  stage_row(xs, static_cast<const T*>(p.act) + a * p.inter, p.inter);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const void* w = valid ? p.w2[e] : nullptr;
  const uint8_t* sc = valid && F != ExpertFormat::kPlain ? p.w2_scale[e] : nullptr;
  const int64_t j0 = int64_t(blockIdx.y) * kRowsPerBlock + warp;  // rows j0 + r*kWarps
  if constexpr (F != ExpertFormat::kPlain) {
    int64_t rows[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) rows[r] = j0 + r * kWarps < p.dim ? j0 + r * kWarps : 0;
    float d[kRowsPerWarp];
    if (valid) rows_dot<T, F, kRowsPerWarp>(w, sc, rows, xs, p.inter, lane, lut, d);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t j = j0 + r * kWarps;
      if (j < p.dim && lane == 0) p.ye[a * p.dim + j] = valid ? d[r] : 0.f;
    }
  } else {
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t j = j0 + r * kWarps;
      if (j >= p.dim) break;  // warp-uniform
      const float v = valid ? warp_dot(static_cast<const T*>(w) + j * p.inter, xs, p.inter, lane) : 0.f;
      if (lane == 0) p.ye[a * p.dim + j] = v;
    }
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
  if (p.format != ExpertFormat::kPlain) {
    if (p.dim % 32 || p.inter % 32)
      DI_THROW(InvalidArgument, "moe_decode: ", ops::cuda::expert_format_name(p.format), " weights need dim ", p.dim,
               " and inter ", p.inter, " to be multiples of 32");
    if (p.tokens > 0 && (!p.w13_scale || !p.w2_scale)) DI_THROW(InvalidArgument, "moe_decode: null scale table");
  }
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
    auto launch = [&](auto fmt) {
      constexpr ExpertFormat F = decltype(fmt)::value;
      moe_up_kernel<T, F><<<dim3(pairs, unsigned(ceil_div(p.inter, kRowsPerBlock))), kThreads, size_t(p.dim) * eb, stream>>>(p);
      DI_CUDA_CHECK_LAUNCH();
      moe_down_kernel<T, F><<<dim3(pairs, unsigned(ceil_div(p.dim, kRowsPerBlock))), kThreads, size_t(p.inter) * eb, stream>>>(p);
      DI_CUDA_CHECK_LAUNCH();
    };
    switch (p.format) {
      case ExpertFormat::kPlain: launch(std::integral_constant<ExpertFormat, ExpertFormat::kPlain>{}); break;
      case ExpertFormat::kFP4: launch(std::integral_constant<ExpertFormat, ExpertFormat::kFP4>{}); break;
      case ExpertFormat::kFP8: launch(std::integral_constant<ExpertFormat, ExpertFormat::kFP8>{}); break;
    }
  });
}

namespace {
float ld(const void* b, DType dt, int64_t i) {
  return dt == DType::kF32 ? static_cast<const float*>(b)[i] : bf16_to_f32(static_cast<const uint16_t*>(b)[i]);
}
float rnd(float v, DType dt) { return dt == DType::kF32 ? v : bf16_to_f32(f32_to_bf16(v)); }
// Weight [row, c] of an expert matrix with `n` inputs per row, dequantised exactly (f32).
float wld(const MoeDecodeParams& p, const void* w, const uint8_t* sc, int64_t row, int64_t c, int64_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(w);
  switch (p.format) {
    case ExpertFormat::kFP4: {
      const uint8_t byte = b[row * (n / 2) + c / 2];
      return fp4e2m1_to_f32(uint8_t(c % 2 ? byte >> 4 : byte & 15)) * e8m0_to_f32(sc[row * (n / 32) + c / 32]);
    }
    case ExpertFormat::kFP8:
      return fp8e4m3_to_f32(b[row * n + c]) * e8m0_to_f32(sc[row * ((n + 127) / 128) + c / 128]);
    default: return ld(w, p.dtype, row * n + c);
  }
}
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
          g += x * wld(p, p.w13[e], p.w13_scale ? p.w13_scale[e] : nullptr, i, c, D);
          u += x * wld(p, p.w13[e], p.w13_scale ? p.w13_scale[e] : nullptr, I + i, c, D);
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
        for (int64_t c = 0; c < I; ++c)
          v += ld(p.act, p.dtype, a * I + c) * wld(p, p.w2[e], p.w2_scale ? p.w2_scale[e] : nullptr, j, c, I);
      p.ye[a * D + j] = v;
    }
  }
}

}  // namespace deepinfer::model::ds::cuda
