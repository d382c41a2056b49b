#include "model/deepseek/cuda/moe_decode.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "model/deepseek/cuda/moe_decode_grouped.cuh"
#include "ops/cuda/common.cuh"
#include "ops/cuda/moe_dequant.h"
#include "ops/cuda/moe_route.h"

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

using moe_grouped::swiglu_act;

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

// ---- grouped decode (moe_decode.h): each touched expert read once per step ----
namespace {
namespace grouped {
using namespace moe_grouped;

// grid (max_tiles, ceil(inter / (8*MT*W))): a warp's m-tile m = gate rows i0+8m .. +7 (A rows
// 0-7) and their up rows (A rows 8-15), so a lane holds gate and up of its (row, column) pairs.
template <ExpertFormat F, bool kAlu, int MT, int W, int S>
__global__ void __launch_bounds__(W * kWarpSize) grouped_up_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  constexpr bool kLut = F == ExpertFormat::kFP8 || (F == ExpertFormat::kFP4 && !kAlu);
  __shared__ uint32_t lut[kLut ? 256 : 1];
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  if constexpr (kLut) {
    moe_grouped::fill_lut<F>(lut);  // qualified: the pair kernels' fill_lut (f32 bits) is in scope too
    __syncthreads();
  }
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int64_t I = p.inter, D = p.dim, i0 = (int64_t(blockIdx.y) * W + warp) * 8 * MT;
  if (i0 >= I) return;
  int64_t rows[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    rows[m][0] = i0 + 8 * m + g < I ? i0 + 8 * m + g : I - 1;
    rows[m][1] = I + rows[m][0];
  }
  const __nv_bfloat16* col = g < tr.n ? static_cast<const __nv_bfloat16*>(p.x) + p.perm_src[tr.r0 + g] * D : nullptr;
  const uint8_t* sc = F == ExpertFormat::kPlain ? nullptr : p.w13_scale[tr.e];
  float acc[MT][4] = {};
  run_rows<F, kAlu, MT, S>(static_cast<const uint8_t*>(p.w13[tr.e]), sc, rows, D, col, t, lut, acc);
  store_up<MT>(p, tr, i0, g, t, acc);
}

// grid (max_tiles, ceil(dim / (16*MT*W))): m-tile m = output rows j0+16m .. +15.
template <ExpertFormat F, bool kAlu, int MT, int W, int S>
__global__ void __launch_bounds__(W * kWarpSize) grouped_down_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  constexpr bool kLut = F == ExpertFormat::kFP8 || (F == ExpertFormat::kFP4 && !kAlu);
  __shared__ uint32_t lut[kLut ? 256 : 1];
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  if constexpr (kLut) {
    moe_grouped::fill_lut<F>(lut);
    __syncthreads();
  }
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int64_t I = p.inter, D = p.dim, j0 = (int64_t(blockIdx.y) * W + warp) * 16 * MT;
  if (j0 >= D) return;
  int64_t rows[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[m][h] = j0 + 16 * m + 8 * h + g < D ? j0 + 16 * m + 8 * h + g : D - 1;
  const __nv_bfloat16* col = g < tr.n ? static_cast<const __nv_bfloat16*>(p.act) + (tr.r0 + g) * I : nullptr;
  const uint8_t* sc = F == ExpertFormat::kPlain ? nullptr : p.w2_scale[tr.e];
  float acc[MT][4] = {};
  run_rows<F, kAlu, MT, S>(static_cast<const uint8_t*>(p.w2[tr.e]), sc, rows, I, col, t, lut, acc);
  store_down<MT>(p, tr, j0, g, t, acc);
}

template <ExpertFormat F, bool kAlu, int MT, int W, int S>
void launch(const MoeDecodeGroupedParams& p, cudaStream_t stream) {
  const unsigned tiles = unsigned(p.max_tiles);
  if (p.kernels & 1) {
    grouped_up_kernel<F, kAlu, MT, W, S>
        <<<dim3(tiles, unsigned(ceil_div(p.inter, 8 * MT * W))), W * kWarpSize, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  }
  if (p.kernels & 2) {
    grouped_down_kernel<F, kAlu, MT, W, S>
        <<<dim3(tiles, unsigned(ceil_div(p.dim, 16 * MT * W))), W * kWarpSize, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  }
}

// Variant 0's pick (H200, MoeDecodeGrouped.Timing). FP4 (session 13): v13 at every size (the
// diet with 2 m-tiles and its loads issued two chunks at a time, bit-identical to v3): 6-13%
// faster than v9 at B = 8..128 at both widths (V4 B = 32: 737 vs 821 us, V4.1 B = 32: 1112 vs
// 1274), 1-6% at B = 256, and at one token 56.8 us vs v1's 57.2 (V4) / 66.1 vs v10's 70.0 (V4.1);
// v6 was within 1.1% of it only at V4.1 B = 128 / 256. (Before: v9 above 16 pairs, at one token
// v1 when its blocks fit one wave, else v10; session 12.) For FP8 and bf16 weights 9 and 10 run
// the v3 and v2 kernels (the diet is FP4's), so their pick is unchanged.
// Session 16: variants 17..24 (row bands, L2 prefetch; bit-identical to v13 by construction) are
// opt-in until measured on a device: the pick stays v13. (The prediction, docs/PERFORMANCE.md
// "#13 item 5: the grouped MoE decode at V4.1's widths": v19 below 96 pairs, v20 from 96 up.)
// DEEPINFER_MOE_DECODE_VARIANT=<n> overrides the pick (tuning in a model stack; read once).
int env_variant() {
  static const int v = [] {
    const char* s = std::getenv("DEEPINFER_MOE_DECODE_VARIANT");
    if (!s || !*s) return 0;
    char* end = nullptr;
    const long n = std::strtol(s, &end, 10);
    if (*end != '\0' || n < 1 || n > kMoeDecodeGroupedVariants)  // "20abc" too: never half-read
      DI_THROW(InvalidArgument, "DEEPINFER_MOE_DECODE_VARIANT=", s, ": want 1..", kMoeDecodeGroupedVariants);
    return int(n);
  }();
  return v;
}

template <ExpertFormat F>
int auto_variant(const MoeDecodeGroupedParams& p) {
  if (const int v = env_variant()) return v;
  if constexpr (F == ExpertFormat::kFP4) return 13;
  const int64_t P = p.tokens * p.topk;
  if (P > 16) return 9;
  static const int per_sm = [] {
    int n = 0;
    DI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, grouped_up_kernel<F, true, 1, 4, 4>, 4 * kWarpSize, 0));
    return n;
  }();
  int dev = 0, sms = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t blocks = P * std::max(ceil_div(p.inter, 32), ceil_div(p.dim, 64));  // v1, every pair its own expert
  return blocks <= int64_t(per_sm) * sms ? 1 : 10;
}

// Variants 9..13 for FP8 / bf16 weights: the v3 / v2 / v1 / v2 / v2 kernels (the diet is FP4's).
template <ExpertFormat F>
void launch_variant_v3shape(const MoeDecodeGroupedParams& p, int v, cudaStream_t stream) {
  if (v == 10 || v >= 12) return launch<F, true, 2, 4, 3>(p, stream);
  if (v == 11) return launch<F, true, 1, 4, 4>(p, stream);
  return launch<F, true, 4, 4, 2>(p, stream);
}

// Variants (moe_decode.h): the same sums, other warp shapes. 0 picks by the step's size: small
// steps (a few experts) need many warps and deep pipelines to keep enough bytes in flight.
template <ExpertFormat F>
void launch_variant(const MoeDecodeGroupedParams& p, cudaStream_t stream) {
  int v = p.variant;
  if (v == 0) v = auto_variant<F>(p);
  switch (v) {
    case 1: return launch<F, true, 1, 4, 4>(p, stream);
    case 2: return launch<F, true, 2, 4, 3>(p, stream);
    case 3: return launch<F, true, 4, 4, 2>(p, stream);
    case 5:
    case 6:
    case 7:
    case 8: return launch_v5(p, v, stream);  // shared-memory ring (moe_decode_v5.cu)
    case 9:  // v3, v2, v1 (and 2 m-tiles x 2 stages) with fewer instructions per FP4 byte
    case 10:  // (moe_decode_v9.cu); FP8 and bf16 rows: the register-staged kernels above
    case 11:
    case 12:
    case 13:
      if constexpr (F != ExpertFormat::kFP4) return launch_variant_v3shape<F>(p, v, stream);
      else return launch_v9(p, v, stream);
    case 17:  // v13 with 2 / 3 row bands per block, 19..21 with L2 prefetches (moe_decode_v9.cu);
    case 18:  // FP8 / bf16: as 13
    case 19:
    case 20:
    case 21:
    case 22:
    case 23:
    case 24:
      if constexpr (F != ExpertFormat::kFP4) return launch_variant_v3shape<F>(p, 13, stream);
      else return launch_v9(p, v, stream);
    case 14:  // FP4 rows by bulk copies (moe_decode_v14.cu) where it takes the shape, else v9 / v3
    case 15:
    case 16:
      if constexpr (F != ExpertFormat::kFP4) return launch_variant_v3shape<F>(p, 9, stream);
      else return v14_supported(p) ? launch_v14(p, v, stream) : launch_v9(p, 9, stream);
    case kMoeDecodeGroupedProbeFirst:  // load-only diagnostics (FP4; validate checked)
    case kMoeDecodeGroupedProbeFirst + 1:
      if constexpr (F == ExpertFormat::kFP4) return launch_v9(p, v, stream);
      break;
    case kMoeDecodeGroupedProbeFirst + 2:
    case kMoeDecodeGroupedProbeFirst + 3:
    case kMoeDecodeGroupedProbeFirst + 4:
    case kMoeDecodeGroupedProbeFirst + 5:
      if constexpr (F == ExpertFormat::kFP4) return launch_v14(p, v, stream);
      break;
    case kMoeDecodeGroupedProbeFirst + 6:  // v19's / v23's loads and prefetches
    case kMoeDecodeGroupedProbeFirst + 7:
      if constexpr (F == ExpertFormat::kFP4) return launch_v9(p, v, stream);
      break;
    default:  // 4: FP4 through the byte table (the first version)
      if constexpr (F == ExpertFormat::kFP4) return launch<F, false, 2, 4, 2>(p, stream);
      else return launch<F, true, 2, 4, 2>(p, stream);
  }
}

void validate(const MoeDecodeGroupedParams& p) {
  if (p.tokens < 0 || p.topk <= 0 || p.num_experts <= 0 || p.dim <= 0 || p.inter <= 0 || p.max_tiles < 0)
    DI_THROW(InvalidArgument, "moe_decode_grouped: bad shape tokens=", p.tokens, " topk=", p.topk, " experts=",
             p.num_experts, " dim=", p.dim, " inter=", p.inter, " max_tiles=", p.max_tiles);
  if (!moe_decode_grouped_supported(DType::kBF16, p.dim, p.inter))
    DI_THROW(InvalidArgument, "moe_decode_grouped: dim ", p.dim, " and inter ", p.inter, " must be multiples of 32");
  if (p.tokens > 0 && p.max_tiles < ops::cuda::moe_route_max_tiles(p.tokens * p.topk, p.num_experts, kTileM))
    DI_THROW(InvalidArgument, "moe_decode_grouped: max_tiles ", p.max_tiles, " below moe_route's bound for tile_m ",
             kTileM);
  if (p.max_tiles >= (int64_t(1) << 31)) DI_THROW(InvalidArgument, "moe_decode_grouped: too many tiles");
  if (p.tokens > 0 && (!p.x || !p.seg || !p.perm_src || !p.perm_w || !p.tiles || !p.num_tiles || !p.w13 || !p.w2 ||
                       !p.act || !p.ye || (p.format != ExpertFormat::kPlain && (!p.w13_scale || !p.w2_scale))))
    DI_THROW(InvalidArgument, "moe_decode_grouped: null input, table or output");
  const bool probe = p.variant >= kMoeDecodeGroupedProbeFirst && p.variant <= kMoeDecodeGroupedProbeLast;
  if ((p.variant < 0 || p.variant > kMoeDecodeGroupedVariants) && !probe)
    DI_THROW(InvalidArgument, "moe_decode_grouped: variant ", p.variant);
  if (probe && (p.format != ExpertFormat::kFP4 || p.dim % 128 || p.inter % 128))
    DI_THROW(InvalidArgument, "moe_decode_grouped: probe variant ", p.variant, " needs FP4, widths multiples of 128");
}
}  // namespace grouped
}  // namespace

bool moe_decode_grouped_supported(DType act, int64_t dim, int64_t inter) {
  return act == DType::kBF16 && dim > 0 && inter > 0 && dim % 32 == 0 && inter % 32 == 0;
}

void moe_decode_grouped(const MoeDecodeGroupedParams& p, cudaStream_t stream) {
  grouped::validate(p);
  if (p.tokens == 0 || p.max_tiles == 0) return;
  switch (p.format) {
    case ExpertFormat::kPlain: grouped::launch_variant<ExpertFormat::kPlain>(p, stream); break;
    case ExpertFormat::kFP4: grouped::launch_variant<ExpertFormat::kFP4>(p, stream); break;
    case ExpertFormat::kFP8: grouped::launch_variant<ExpertFormat::kFP8>(p, stream); break;
  }
}

void moe_decode_grouped_host(const MoeDecodeGroupedParams& p) {
  grouped::validate(p);
  const int64_t D = p.dim, I = p.inter;
  MoeDecodeParams q;  // for wld: format and dtype
  q.format = p.format;
  q.dtype = DType::kBF16;
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  uint16_t* act = static_cast<uint16_t*>(p.act);
  std::vector<float> xr(size_t(std::max(D, I)));
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const uint8_t* s13 = p.format == ExpertFormat::kPlain ? nullptr : p.w13_scale[e];
    const uint8_t* s2 = p.format == ExpertFormat::kPlain ? nullptr : p.w2_scale[e];
    for (int64_t r = p.seg[e]; r < p.seg[e + 1]; ++r) {
      const int64_t t = p.perm_src[r];
      for (int64_t c = 0; c < D; ++c) xr[size_t(c)] = bf16_to_f32(x[t * D + c]);
      for (int64_t i = 0; i < I; ++i) {
        float g = 0.f, u = 0.f;
        for (int64_t c = 0; c < D; ++c) {
          g += xr[size_t(c)] * wld(q, p.w13[e], s13, i, c, D);
          u += xr[size_t(c)] * wld(q, p.w13[e], s13, I + i, c, D);
        }
        g = rnd(g, DType::kBF16);
        u = rnd(u, DType::kBF16);
        if (p.limit > 0.f) {
          u = std::fmin(std::fmax(u, -p.limit), p.limit);
          g = std::fmin(g, p.limit);
        }
        act[r * I + i] = f32_to_bf16(p.perm_w[r] * (g / (1.0f + std::exp(-g)) * u));
      }
      for (int64_t c = 0; c < I; ++c) xr[size_t(c)] = bf16_to_f32(act[r * I + c]);
      for (int64_t j = 0; j < D; ++j) {
        float v = 0.f;
        for (int64_t c = 0; c < I; ++c) v += xr[size_t(c)] * wld(q, p.w2[e], s2, j, c, I);
        p.ye[r * D + j] = v;
      }
    }
  }
}

}  // namespace deepinfer::model::ds::cuda
