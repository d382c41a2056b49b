// FP8 weight-only GEMM (gemm_fp8w.h). Layout of the work:
//  * a block of 4 warps covers 64 weight rows (16 per warp: the m16 side of mma.m16n8k16, so the
//    WEIGHT is the A operand and up to 8 tiles of 8 tokens are the B operand: M = 1 wastes 7/8 of
//    an n8 tile, not 15/16 of an m16 one);
//  * K advances in chunks of 64: lane (g = lane/4, t = lane%4) reads 16 consecutive weights of rows
//    g and g+8 (16 B each in FP8) and the same 16 k of its token's x row (32 B). The MMA's k order
//    is a permutation of the chunk, the same for A and B, so the dot products are unchanged: step j
//    (0..3) of the chunk gives lane t's fragment slots (2t, 2t+1, 2t+8, 2t+9) the actual k
//    chunk + 16t + 4j + (0, 1, 2, 3);
//  * blocks split K (grid.y) when the rows alone do not fill the GPU; partial sums go to an f32
//    workspace and a second kernel adds them in split order (deterministic).
// In-register dequantisation: the e4m3 byte b placed as bf16 bits sign | (b & 0x7f) << 4 is
// exactly b's value times 2^-120 (normal or subnormal alike: both formats' mantissas line up),
// and one bf16x2 multiply by 2^(e-7) makes it b · 2^(e-127) — exact, as the product is a bf16
// value of at most 4 significant bits and e <= kFp8wMaxScaleExp keeps it in range.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/check.h"
#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm_fp8w.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::ceil_div;

constexpr int kWarps = 4;             // per block
constexpr int kRowsPerBlock = 16 * kWarps;
constexpr int kChunk = 64;            // k per warp step

__device__ __forceinline__ uint4 ld_stream(const void* p) {  // weights: read once, skip L1
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(a), "r"(sel));
  return r;
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}
// Two e4m3 bytes of `v` (bytes 0,1 when hi is false, else 2,3) -> bf16x2 of their values · 2^(e-127),
// `f` = bf16x2 of 2^(e-7). prmt's sign mode puts [sign-fill | byte] in each half; << 4 and the
// mask leave sign | (b & 0x7f) << 4.
template <bool kHi>
__device__ __forceinline__ uint32_t fp8x2_bf16x2(uint32_t v, uint32_t f) {
  const uint32_t p = prmt(v, kHi ? 0xB3A2u : 0x9180u);
  return bf16x2_mul((p << 4) & 0x87f087f0u, f);
}
// bf16x2 of 2^(e-7) in both halves (e <= kFp8wMaxScaleExp).
__device__ __forceinline__ uint32_t scale_factor(uint32_t e) {
  const uint32_t h = (e + 120u) << 7;
  return h | (h << 16);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct Args {
  const __nv_bfloat16* x;
  int64_t ldx, bsx;
  const uint8_t* w;
  const uint8_t* scale;
  int64_t scale_rows;
  const __nv_bfloat16* wb;
  void* y;
  int64_t ldy, bsy;
  float* ws;             // [splits][batch][M][N] when splits > 1
  int64_t M, N, K, batch;
  int chunks_per_split;
};

// One chunk's weights of a lane: rows A = g and B = g+8 of the warp's 16, 16 k each (FP8: one
// uint4 per row; bf16: two). Rows past N, or k past K, read as zero.
struct WRegs {
  uint4 a0, a1, b0, b1;
  uint32_t fa, fb;  // FP8 scale factors of the two rows
};

template <bool kFp8>
__device__ __forceinline__ void load_w(const Args& p, int64_t rowA, bool okA, bool okB, const uint8_t* sA,
                                       const uint8_t* sB, int64_t k, WRegs& r) {
  const int64_t rowB = rowA + 8;  // global rows of the [batch*N, K] matrix
  const uint4 z = make_uint4(0, 0, 0, 0);
  const bool va = okA && k < p.K, vb = okB && k < p.K;
  if constexpr (kFp8) {
    r.a0 = va ? ld_stream(p.w + rowA * p.K + k) : z;
    r.b0 = vb ? ld_stream(p.w + rowB * p.K + k) : z;
    r.fa = scale_factor(va ? sA[k / 128] : 0u);
    r.fb = scale_factor(vb ? sB[k / 128] : 0u);
  } else {
    r.a0 = va ? ld_stream(p.wb + rowA * p.K + k) : z;
    r.a1 = va ? ld_stream(p.wb + rowA * p.K + k + 8) : z;
    r.b0 = vb ? ld_stream(p.wb + rowB * p.K + k) : z;
    r.b1 = vb ? ld_stream(p.wb + rowB * p.K + k + 8) : z;
  }
}

// The 8 bf16x2 pairs (k order within the lane's 16) of one row.
template <bool kFp8>
__device__ __forceinline__ void row_pairs(const uint4& v0, const uint4& v1, uint32_t f, uint32_t (&P)[8]) {
  if constexpr (kFp8) {
    const uint32_t w[4] = {v0.x, v0.y, v0.z, v0.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      P[2 * j] = fp8x2_bf16x2<false>(w[j], f);
      P[2 * j + 1] = fp8x2_bf16x2<true>(w[j], f);
    }
  } else {
    P[0] = v0.x, P[1] = v0.y, P[2] = v0.z, P[3] = v0.w;
    P[4] = v1.x, P[5] = v1.y, P[6] = v1.z, P[7] = v1.w;
  }
}

template <int kNT>
__device__ __forceinline__ void load_x(const Args& p, const __nv_bfloat16* xb, int g, int64_t k, uint4 (&X)[kNT][2]) {
#pragma unroll
  for (int q = 0; q < kNT; ++q) {
    const int64_t m = q * 8 + g;
    if (m < p.M && k < p.K) {
      const uint4* src = reinterpret_cast<const uint4*>(xb + m * p.ldx + k);
      X[q][0] = __ldg(src);
      X[q][1] = __ldg(src + 1);
    } else {
      X[q][0] = X[q][1] = make_uint4(0, 0, 0, 0);
    }
  }
}

// grid (row blocks, splits, batch), block 128. kNT token tiles of 8 (M <= 8*kNT). Out: the
// output type when not split, else partial sums to p.ws.
template <bool kFp8, int kNT, typename Out>
__global__ void __launch_bounds__(kWarps * 32) fp8w_kernel(const __grid_constant__ Args p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z;
  const int64_t n0 = int64_t(blockIdx.x) * kRowsPerBlock + warp * 16;  // row within the batch's N
  const int64_t chunks = (p.K + kChunk - 1) / kChunk;
  const int64_t c0 = int64_t(blockIdx.y) * p.chunks_per_split;
  const int64_t c1 = std::min<int64_t>(c0 + p.chunks_per_split, chunks);
  const __nv_bfloat16* xb = p.x + b * p.bsx;
  const bool okA = n0 + g < p.N, okB = n0 + g + 8 < p.N;
  const int64_t rowA = b * p.N + n0 + g;
  // scale rows of the lane's two weight rows (fixed for the whole kernel)
  const int64_t kb = (p.K + 127) / 128;
  const uint8_t* sA = kFp8 && okA ? p.scale + (rowA / p.scale_rows) * kb : nullptr;
  const uint8_t* sB = kFp8 && okB ? p.scale + ((rowA + 8) / p.scale_rows) * kb : nullptr;

  float acc[kNT][4];
#pragma unroll
  for (int q = 0; q < kNT; ++q) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;

  // Loads run kDepth chunks ahead through a ring of registers. The ring is indexed by constants
  // only (the inner loop is unrolled), so no register is copied: copying a buffer whose load is
  // still in flight would wait for it and serialise the loads.
  constexpr int kDepth = kNT <= 2 ? 4 : 2;
  WRegs W[kDepth];
  uint4 X[kDepth][kNT][2];
#pragma unroll
  for (int b = 0; b < kDepth; ++b)
    if (c0 + b < c1) {
      const int64_t k = (c0 + b) * kChunk + 16 * t;
      load_w<kFp8>(p, rowA, okA, okB, sA, sB, k, W[b]);
      load_x<kNT>(p, xb, g, k, X[b]);
    }
  for (int64_t c = c0; c < c1; c += kDepth) {
#pragma unroll
    for (int b = 0; b < kDepth; ++b) {
      if (c + b >= c1) break;
      uint32_t PA[8], PB[8];
      row_pairs<kFp8>(W[b].a0, W[b].a1, W[b].fa, PA);
      row_pairs<kFp8>(W[b].b0, W[b].b1, W[b].fb, PB);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a[4] = {PA[2 * j], PB[2 * j], PA[2 * j + 1], PB[2 * j + 1]};
#pragma unroll
        for (int q = 0; q < kNT; ++q) {
          const uint32_t xw[8] = {X[b][q][0].x, X[b][q][0].y, X[b][q][0].z, X[b][q][0].w,
                                  X[b][q][1].x, X[b][q][1].y, X[b][q][1].z, X[b][q][1].w};
          mma_bf16(acc[q], a, xw[2 * j], xw[2 * j + 1]);
        }
      }
      if (c + b + kDepth < c1) {  // refill this slot kDepth chunks ahead
        const int64_t k = (c + b + kDepth) * kChunk + 16 * t;
        load_w<kFp8>(p, rowA, okA, okB, sA, sB, k, W[b]);
        load_x<kNT>(p, xb, g, k, X[b]);
      }
    }
  }
  // acc[q][0..1]: row g, tokens 8q + 2t, 2t+1; acc[q][2..3]: row g+8.
#pragma unroll
  for (int q = 0; q < kNT; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + g + (i >= 2 ? 8 : 0), m = q * 8 + 2 * t + (i & 1);
      if (n >= p.N || m >= p.M) continue;
      if (gridDim.y > 1)
        p.ws[((int64_t(blockIdx.y) * p.batch + b) * p.M + m) * p.N + n] = acc[q][i];
      else
        static_cast<Out*>(p.y)[b * p.bsy + m * p.ldy + n] = deepinfer::cuda::from_f32<Out>(acc[q][i]);
    }
}

// y[b][m][n] = Σ_s ws[s][b][m][n], s ascending.
template <typename Out>
__global__ void fp8w_reduce(const float* __restrict__ ws, int splits, int64_t batch, int64_t M, int64_t N, Out* y,
                            int64_t ldy, int64_t bsy) {
  const int64_t total = batch * M * N, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  float s = 0.f;
  for (int k = 0; k < splits; ++k) s += ws[int64_t(k) * total + i];
  const int64_t n = i % N, m = (i / N) % M, b = i / (N * M);
  y[b * bsy + m * ldy + n] = deepinfer::cuda::from_f32<Out>(s);
}

__global__ void dequant_kernel(const __grid_constant__ Fp8wDequantParams p) {
  const int64_t per_row = p.K / 16, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.N * per_row) return;
  const int64_t n = i / per_row, k = (i % per_row) * 16;
  const uint4 v = ld_stream(p.w + n * p.K + k);
  const uint32_t f = scale_factor(p.scale[(n / p.scale_rows) * ((p.K + 127) / 128) + k / 128]);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t o[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    o[2 * j] = fp8x2_bf16x2<false>(w[j], f);
    o[2 * j + 1] = fp8x2_bf16x2<true>(w[j], f);
  }
  uint4* dst = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) + n * p.K + k);
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

int token_tiles(int64_t M) {
  const int64_t t = ceil_div(M, 8);
  return t <= 1 ? 1 : t <= 2 ? 2 : t <= 4 ? 4 : 8;
}

struct Split {
  int splits = 1, chunks_per_split = 1;
};
// The split depends on the weight's shape alone (not on M), so every row of x is reduced in the
// same order whatever the batch size: token-by-token decode and a prefill chunk give the same
// per-token result (the model's chunked-vs-full consistency tests rely on it).
Split choose_split(int64_t N, int64_t K, int64_t batch, int num_sms) {
  const int64_t chunks = ceil_div(K, kChunk), blocks = ceil_div(N, kRowsPerBlock) * batch;
  // As many splits as fit one wave of the decode kernel (kNT = 1: 112 registers, 4 blocks of 4
  // warps per SM, 4 chunks of loads in flight per warp), at least 2 chunks per split: a second,
  // partial wave would cost as much as the first.
  constexpr int64_t kBlocksPerSm = 4;
  const int64_t wave = int64_t(std::max(num_sms, 1)) * kBlocksPerSm;
  int64_t s = std::clamp<int64_t>(wave / blocks, 1, std::max<int64_t>(ceil_div(chunks, 2), 1));
  s = std::min<int64_t>(s, 65535);
  Split r;
  r.chunks_per_split = int(ceil_div(chunks, s));
  r.splits = int(ceil_div(chunks, r.chunks_per_split));
  return r;
}

template <bool kFp8, typename Out>
void launch(const Args& a, const Split& sp, int nt, cudaStream_t stream) {
  const dim3 grid(unsigned(ceil_div(a.N, kRowsPerBlock)), unsigned(sp.splits), unsigned(a.batch));
  switch (nt) {
    case 1: fp8w_kernel<kFp8, 1, Out><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 2: fp8w_kernel<kFp8, 2, Out><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 4: fp8w_kernel<kFp8, 4, Out><<<grid, kWarps * 32, 0, stream>>>(a); break;
    default: fp8w_kernel<kFp8, 8, Out><<<grid, kWarps * 32, 0, stream>>>(a); break;
  }
  DI_CUDA_CHECK_LAUNCH();
  if (sp.splits > 1) {
    const int64_t total = a.batch * a.M * a.N;
    fp8w_reduce<Out><<<unsigned(ceil_div(total, 256)), 256, 0, stream>>>(a.ws, sp.splits, a.batch, a.M, a.N,
                                                                         static_cast<Out*>(a.y), a.ldy, a.bsy);
    DI_CUDA_CHECK_LAUNCH();
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

void validate(const Fp8wGemmParams& p) {
  const bool fp8 = p.w != nullptr;
  if (!p.x || !p.y || (fp8 ? !p.scale : !p.w_bf16) || (fp8 && p.w_bf16))
    DI_THROW(InvalidArgument, "gemm_fp8w: null x/y, or not exactly one of w (+scale) and w_bf16");
  if (p.M <= 0 || p.N <= 0 || p.K <= 0 || p.batch <= 0)
    DI_THROW(InvalidArgument, "gemm_fp8w: empty shape M=", p.M, " N=", p.N, " K=", p.K, " batch=", p.batch);
  if (p.K % 16) DI_THROW(InvalidArgument, "gemm_fp8w: K=", p.K, " must be a multiple of 16");
  if (p.ldx < p.K || p.ldx % 8 || p.batch_stride_x % 8 || !aligned16(p.x))
    DI_THROW(InvalidArgument, "gemm_fp8w: x needs ldx >= K, ldx and batch_stride_x multiples of 8 and 16-byte "
             "alignment (ldx=", p.ldx, ", batch_stride_x=", p.batch_stride_x, ")");
  if (!aligned16(fp8 ? static_cast<const void*>(p.w) : p.w_bf16))
    DI_THROW(InvalidArgument, "gemm_fp8w: weight pointer must be 16-byte aligned");
  if (p.ldy < p.N) DI_THROW(InvalidArgument, "gemm_fp8w: ldy=", p.ldy, " < N=", p.N);
  if (p.out_dtype != DType::kBF16 && p.out_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "gemm_fp8w: out dtype ", dtype_name(p.out_dtype), " (bf16 or f32)");
  if (fp8 && (p.scale_rows <= 0 || 128 % p.scale_rows))
    DI_THROW(InvalidArgument, "gemm_fp8w: scale_rows=", p.scale_rows, " must divide 128");
  if (p.batch > 65535) DI_THROW(InvalidArgument, "gemm_fp8w: batch=", p.batch, " > 65535");
}
}  // namespace

int fp8w_splits(int64_t /*M*/, int64_t N, int64_t K, int64_t batch, int num_sms) {
  return choose_split(N, K, batch, num_sms).splits;
}

size_t fp8w_workspace_bytes(int64_t M, int64_t N, int64_t K, int64_t batch, int num_sms) {
  if (M <= 0 || N <= 0 || K <= 0 || batch <= 0) return 0;
  const Split s = choose_split(N, K, batch, num_sms);  // M runs in chunks of kFp8wMaxM rows
  return s.splits > 1 ? size_t(s.splits) * size_t(batch * std::min(M, kFp8wMaxM) * N) * 4 : 0;
}

void gemm_fp8w(const Fp8wGemmParams& p, cudaStream_t stream) {
  validate(p);
  const bool fp8 = p.w != nullptr;
  const size_t ob = p.out_dtype == DType::kF32 ? 4 : 2;
  for (int64_t m0 = 0; m0 < p.M; m0 += kFp8wMaxM) {
    const int64_t M = std::min(kFp8wMaxM, p.M - m0);
    const Split sp = choose_split(p.N, p.K, p.batch, p.num_sms);
    const size_t need = sp.splits > 1 ? size_t(sp.splits) * size_t(p.batch * M * p.N) * 4 : 0;
    if (need > p.workspace_bytes || (need && !p.workspace))
      DI_THROW(InvalidArgument, "gemm_fp8w: workspace of ", p.workspace_bytes, " bytes, this shape (M=", M, " N=",
               p.N, " K=", p.K, " batch=", p.batch, ") needs ", need, " (fp8w_workspace_bytes)");
    Args a{.x = static_cast<const __nv_bfloat16*>(p.x) + m0 * p.ldx, .ldx = p.ldx, .bsx = p.batch_stride_x,
           .w = p.w, .scale = p.scale, .scale_rows = p.scale_rows, .wb = static_cast<const __nv_bfloat16*>(p.w_bf16),
           .y = static_cast<char*>(p.y) + size_t(m0 * p.ldy) * ob, .ldy = p.ldy, .bsy = p.batch_stride_y,
           .ws = p.workspace, .M = M, .N = p.N, .K = p.K, .batch = p.batch, .chunks_per_split = sp.chunks_per_split};
    const int nt = token_tiles(M);
    if (fp8)
      p.out_dtype == DType::kF32 ? launch<true, float>(a, sp, nt, stream) : launch<true, __nv_bfloat16>(a, sp, nt, stream);
    else
      p.out_dtype == DType::kF32 ? launch<false, float>(a, sp, nt, stream)
                                 : launch<false, __nv_bfloat16>(a, sp, nt, stream);
  }
}

void dequant_fp8w_bf16(const Fp8wDequantParams& p, cudaStream_t stream) {
  if (!p.w || !p.scale || !p.out || p.N <= 0 || p.K <= 0)
    DI_THROW(InvalidArgument, "dequant_fp8w_bf16: null pointer or empty shape N=", p.N, " K=", p.K);
  if (p.scale_rows <= 0 || 128 % p.scale_rows)
    DI_THROW(InvalidArgument, "dequant_fp8w_bf16: scale_rows=", p.scale_rows, " must divide 128");
  if (p.K % 16 || !aligned16(p.w) || !aligned16(p.out))
    DI_THROW(InvalidArgument, "dequant_fp8w_bf16: K=", p.K, " must be a multiple of 16 and pointers 16-byte aligned");
  const int64_t n = p.N * (p.K / 16);
  dequant_kernel<<<unsigned(ceil_div(n, 256)), 256, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
