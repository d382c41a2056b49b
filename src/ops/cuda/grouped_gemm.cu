// Grouped expert GEMM (grouped_gemm.h), the mma.sync kernel (every arch; on compute capability
// 9.0 grouped_gemm() dispatches to grouped_gemm_sm90.cu unless asked for this one): one 64x128 output tile per block, 4 warps of 32x64,
// mma.sync m16n8k16 bf16 with fp32 accumulators, K in steps of 64. The global data of a K step
// (activation rows gathered through x_rows, raw weight bytes) goes global -> shared memory by
// cp.async, kStages - 1 steps ahead of the step being computed (the first version loaded one step
// ahead into registers, so every step waited for most of a memory latency); the e8m0 scales are
// loaded into registers one step ahead. Each step the raw weight tile is dequantised to bf16 in shared memory
// (lookup table per byte, then a bf16x2 multiply by the power-of-two scale; exact) and both operands
// are read by ldmatrix. Plain bf16 weights are read by ldmatrix straight from their stage. The MMA
// sequence is the same for every format, so FP4/FP8 give bit-for-bit the result of their bf16
// dequantisation through the plain path.
#include "ops/cuda/grouped_gemm.h"

#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"
#include "deepinfer/error.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/grouped_gemm_sm90.h"
#include "ops/cuda/moe_dequant.h"

namespace deepinfer::ops::cuda {

const char* expert_format_name(ExpertFormat f) {
  switch (f) {
    case ExpertFormat::kPlain: return "plain";
    case ExpertFormat::kFP4: return "fp4-e2m1/e8m0x32";
    case ExpertFormat::kFP8: return "fp8-e4m3/e8m0x128";
  }
  return "?";
}

const char* grouped_gemm_kernel_name(GroupedGemmKernel k) {
  switch (k) {
    case GroupedGemmKernel::kAuto: return "auto";
    case GroupedGemmKernel::kMmaSync: return "mma.sync";
    case GroupedGemmKernel::kWgmma: return "wgmma";
    case GroupedGemmKernel::kWgmmaTable: return "wgmma-table";
    case GroupedGemmKernel::kWgmmaBits: return "wgmma-bits";
    case GroupedGemmKernel::kWgmmaWs: return "wgmma-ws";
    case GroupedGemmKernel::kWgmmaSwapAB: return "wgmma-swapab";
  }
  return "?";
}

// Compute capability of the current device, looked up once per device (at most 64 devices).
// Atomic entries: several engine threads (data-parallel ranks) may ask at once; a lookup done
// twice stores the same value.
bool grouped_gemm_wgmma_available() {
  static std::atomic<int> cc[64] = {};  // 0 = not looked up yet; major * 10 + minor
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int v = cc[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
      return false;
    v = major * 10 + minor;
    cc[dev].store(v, std::memory_order_relaxed);
  }
  return v == 90;
}

int64_t expert_matrix_bytes(ExpertFormat f, int64_t n, int64_t k, int64_t plain_bytes) {
  switch (f) {
    case ExpertFormat::kFP4: return n * (k / 2) + n * ((k + 31) / 32);
    case ExpertFormat::kFP8: return n * k + n * ((k + 127) / 128);
    default: return n * k * plain_bytes;
  }
}

namespace {
using deepinfer::cuda::kWarpSize;

constexpr int BM = kGroupedTileM, BN = kGroupedTileN, BK = 64, kThreads = 128;
// Pipeline depth: as deep as keeps 3 blocks per SM (FP4 4 stages, 71 KB; FP8 3, 70 KB). FP8 at 4
// stages (89 KB, 2 blocks per SM) measured 8% slower than the one-stage first version.
template <ExpertFormat F>
constexpr int kStages = F == ExpertFormat::kFP4 ? 4 : 3;
constexpr int kLd = BK + 8;  // bf16 elements per smem row of A and of the bf16 B tile: 144 bytes,
                             // ldmatrix's 8 rows hit distinct banks

// Raw weight bytes of one row per K step and the 16-byte chunks a thread copies.
template <ExpertFormat F>
struct BTraits {
  static constexpr int kElemsPerChunk = F == ExpertFormat::kFP4 ? 32 : F == ExpertFormat::kFP8 ? 16 : 8;
  static constexpr int kChunksPerRow = BK / kElemsPerChunk;
  static constexpr int kChunks = BN * kChunksPerRow / kThreads;
  // raw stage row stride: plain rows are read by ldmatrix, so padded like A
  static constexpr int kRowBytes = F == ExpertFormat::kPlain ? kLd * 2 : kChunksPerRow * 16;
  static constexpr int kStageBytes = BN * kRowBytes;
};
constexpr int kAStageBytes = BM * kLd * 2;

// Shared memory of a block: kStages x (A stage, raw B stage), the bf16 B tile (FP4/FP8) and the
// byte -> bf16 table: 71 KB for FP4, 3 blocks per SM.
template <ExpertFormat F>
struct Smem {
  static constexpr int kStage = kAStageBytes + BTraits<F>::kStageBytes;
  static constexpr int kBs = F == ExpertFormat::kPlain ? 0 : BN * kLd * 2;
  static constexpr int kLut = F == ExpertFormat::kPlain ? 0 : 256 * 4;
  static constexpr int kBytes = kStages<F> * kStage + kBs + kLut;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// cp.async of K step k0 into stage buffers As (A rows through xrow) and Braw (raw weight rows).
// Rows past the segment / N and k past K are zero-filled.
template <ExpertFormat F>
__device__ __forceinline__ void issue_stage(const GroupedGemmParams& p, const int64_t* xrow, int64_t k0,
                                            const uint8_t* w, int64_t n0, uint8_t* As, uint8_t* Braw) {
  const int tid = threadIdx.x;
  const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(p.x);
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // A: 64 rows x 8 chunks of 8 bf16
    const int i = tid + j * kThreads, r = i / 8, ch = i % 8;
    const int64_t k = k0 + ch * 8;
    const bool ok = xrow[r] >= 0 && k < p.K;
    cp_async16(As + (r * kLd + ch * 8) * 2, ok ? x + xrow[r] * p.ldx + k : x, ok ? 16 : 0);
  }
  using Tr = BTraits<F>;
#pragma unroll
  for (int j = 0; j < Tr::kChunks; ++j) {
    const int i = tid + j * kThreads, r = i / Tr::kChunksPerRow, ch = i % Tr::kChunksPerRow;
    const int64_t n = n0 + r, k = k0 + ch * Tr::kElemsPerChunk;
    const bool ok = n < p.N && k < p.K;  // K % 32 == 0: a chunk is all in or all out
    const uint8_t* src = w;
    if (ok) {
      if constexpr (F == ExpertFormat::kFP4) src = w + n * (p.K / 2) + k / 2;
      else if constexpr (F == ExpertFormat::kFP8) src = w + n * p.K + k;
      else src = w + (n * p.K + k) * 2;
    }
    cp_async16(Braw + r * Tr::kRowBytes + ch * 16, src, ok ? 16 : 0);
  }
}


// Dequantisation table: FP4 byte -> bf16x2 of its two nibbles (low nibble in the low half);
// FP8 byte -> bf16. Looked up per byte, then one bf16x2 multiply by the power-of-two scale: both
// steps exact (the product of an e2m1/e4m3 value and 2^k is a bf16).
template <ExpertFormat F>
__device__ void fill_lut(uint32_t* lut) {
  if constexpr (F == ExpertFormat::kFP4)
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = fp4_bf16_bits(i & 15) | (fp4_bf16_bits(i >> 4) << 16);
  else if constexpr (F == ExpertFormat::kFP8)
    for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = fp8_bf16_bits(i);
}

// The e8m0 scales of a thread's raw chunks in K step k0 (127 past N or K): plain loads, one K step
// ahead of their use, so their latency hides behind a step's MMAs.
template <ExpertFormat F>
__device__ __forceinline__ void load_scales(const GroupedGemmParams& p, const uint8_t* sc, int64_t n0, int64_t k0,
                                            uint8_t (&s)[BTraits<F>::kChunks]) {
  using Tr = BTraits<F>;
  constexpr int blk = F == ExpertFormat::kFP4 ? 32 : 128;
  const int64_t ns = (p.K + blk - 1) / blk;
#pragma unroll
  for (int j = 0; j < Tr::kChunks; ++j) {
    const int i = threadIdx.x + j * kThreads, r = i / Tr::kChunksPerRow, ch = i % Tr::kChunksPerRow;
    const int64_t n = n0 + r, k = k0 + ch * Tr::kElemsPerChunk;
    s[j] = n < p.N && k < p.K ? __ldg(sc + n * ns + k / blk) : uint8_t(127);
  }
}

// Raw stage -> bf16 B tile; s: the chunks' scales (load_scales).
template <ExpertFormat F>
__device__ __forceinline__ void dequant_stage(const uint8_t* Braw, __nv_bfloat16* Bs, const uint32_t* lut,
                                              const uint8_t (&s)[BTraits<F>::kChunks]) {
  using Tr = BTraits<F>;
#pragma unroll
  for (int j = 0; j < Tr::kChunks; ++j) {
    const int i = threadIdx.x + j * kThreads, r = i / Tr::kChunksPerRow, ch = i % Tr::kChunksPerRow;
    const uint32_t s2 = e8m0_bf16x2(s[j]);
    const uint4 rv = *reinterpret_cast<const uint4*>(Braw + r * Tr::kRowBytes + ch * 16);
    const uint32_t raw[4] = {rv.x, rv.y, rv.z, rv.w};
    uint4* dst = reinterpret_cast<uint4*>(Bs + r * kLd + ch * Tr::kElemsPerChunk);
    if constexpr (F == ExpertFormat::kFP4) {  // 16 bytes -> 32 bf16 (4 uint4)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint4 o;
        uint32_t* po = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
        for (int b = 0; b < 4; ++b) po[b] = mul_bf16x2(lut[(raw[q] >> (8 * b)) & 0xff], s2);
        dst[q] = o;
      }
    } else {  // 16 bytes of e4m3 -> 16 bf16 (2 uint4)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        uint4 o;
        uint32_t* po = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const uint32_t word = raw[2 * q + b / 2], sh = 16 * (b % 2);
          po[b] = mul_bf16x2(lut[(word >> sh) & 0xff] | (lut[(word >> (sh + 8)) & 0xff] << 16), s2);
        }
        dst[q] = o;
      }
    }
  }
}

// One K step of a warp's 32x64 sub-tile from As [BM][kLd] and Bs [BN][kLd] (bf16).
__device__ __forceinline__ void mma_step(const __nv_bfloat16* As, const __nv_bfloat16* Bs, int wm, int wn, int lane,
                                         float (&acc)[2][8][4]) {
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    uint32_t af[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const int r = wm * 32 + mi * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = kk + (lane / 16) * 8;
      ldmatrix_x4(af[mi], As + r * kLd + c);
    }
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {  // two n8 tiles per ldmatrix.x4
      uint32_t bf[4];
      const int r = wn * 64 + nj * 16 + (lane % 8) + (lane / 16) * 8, c = kk + ((lane / 8) % 2) * 8;
      ldmatrix_x4(bf, Bs + r * kLd + c);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        mma_bf16(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
        mma_bf16(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
      }
    }
  }
}

template <ExpertFormat F>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(const __grid_constant__ GroupedGemmParams p) {
  using S = Smem<F>;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int64_t xrow[BM];
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  const int32_t code = p.tiles[blockIdx.x];
  const int e = code >> 16;
  const int64_t row0 = p.seg[e] + int64_t(code & 0xffff) * BM, row_end = p.seg[e + 1];
  const int64_t n0 = int64_t(blockIdx.y) * BN;
  if (threadIdx.x < BM) {
    const int64_t a = row0 + threadIdx.x;
    xrow[threadIdx.x] = a < row_end ? (p.x_rows ? p.x_rows[a] : a) : -1;
  }
  __syncthreads();
  const uint8_t* w = static_cast<const uint8_t*>(p.w[e]);
  auto stage = [&](int s) { return smem + s * S::kStage; };
  const int nk = int((p.K + BK - 1) / BK);
#pragma unroll
  for (int s = 0; s < kStages<F> - 1; ++s) {
    if (s < nk) issue_stage<F>(p, xrow, int64_t(s) * BK, w, n0, stage(s), stage(s) + kAStageBytes);
    cp_async_commit();
  }
  __nv_bfloat16* Bs = reinterpret_cast<__nv_bfloat16*>(smem + kStages<F> * S::kStage);
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + kStages<F> * S::kStage + S::kBs);
  const uint8_t* sc = F == ExpertFormat::kPlain ? nullptr : p.scale[e];
  uint8_t s_cur[BTraits<F>::kChunks], s_nxt[BTraits<F>::kChunks];
  if constexpr (F != ExpertFormat::kPlain) {
    fill_lut<F>(lut);
    load_scales<F>(p, sc, n0, 0, s_cur);
  }
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int wm = warp / 2, wn = warp % 2;
  float acc[2][8][4] = {};
  for (int i = 0; i < nk; ++i) {
    cp_async_wait<kStages<F> - 2>();
    __syncthreads();  // stage i landed for all threads; stage i-1's buffers and Bs are free again
    const int nx = i + kStages<F> - 1;
    if (nx < nk) issue_stage<F>(p, xrow, int64_t(nx) * BK, w, n0, stage(nx % kStages<F>), stage(nx % kStages<F>) + kAStageBytes);
    cp_async_commit();
    const uint8_t* st = stage(i % kStages<F>);
    const __nv_bfloat16* As = reinterpret_cast<const __nv_bfloat16*>(st);
    if constexpr (F == ExpertFormat::kPlain) {
      mma_step(As, reinterpret_cast<const __nv_bfloat16*>(st + kAStageBytes), wm, wn, lane, acc);
    } else {
      if (i + 1 < nk) load_scales<F>(p, sc, n0, int64_t(i + 1) * BK, s_nxt);
      dequant_stage<F>(st + kAStageBytes, Bs, lut, s_cur);
      __syncthreads();
      mma_step(As, Bs, wm, wn, lane, acc);
#pragma unroll
      for (int j = 0; j < BTraits<F>::kChunks; ++j) s_cur[j] = s_nxt[j];
    }
  }
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t a = row0 + wm * 32 + mi * 16 + g + h * 8;
      if (a >= row_end) continue;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int64_t n = n0 + wn * 64 + ni * 8 + 2 * t + q;
          if (n >= p.N) continue;
          const float v = acc[mi][ni][2 * h + q];
          if (p.y_dtype == DType::kF32)
            static_cast<float*>(p.y)[a * p.ldy + n] = v;
          else
            static_cast<__nv_bfloat16*>(p.y)[a * p.ldy + n] = __float2bfloat16_rn(v);
        }
      }
    }
}

template <ExpertFormat F>
void launch_grouped(const GroupedGemmParams& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = Smem<F>::kBytes;
  DI_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  grouped_gemm_kernel<F><<<grid, kThreads, smem, stream>>>(p);
}

void validate(const GroupedGemmParams& p) {
  if (p.experts <= 0 || p.N <= 0 || p.K <= 0 || p.max_tiles < 0)
    DI_THROW(InvalidArgument, "grouped_gemm: bad shape experts=", p.experts, " N=", p.N, " K=", p.K, " max_tiles=",
             p.max_tiles);
  if (p.K % 32 != 0) DI_THROW(InvalidArgument, "grouped_gemm: K=", p.K, " must be a multiple of 32");
  if (p.ldx < p.K || p.ldx % 8 != 0) DI_THROW(InvalidArgument, "grouped_gemm: ldx=", p.ldx, " (>= K, multiple of 8)");
  if (p.ldy < p.N) DI_THROW(InvalidArgument, "grouped_gemm: ldy=", p.ldy, " < N=", p.N);
  if (p.y_dtype != DType::kBF16 && p.y_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "grouped_gemm: output dtype ", dtype_name(p.y_dtype), " (bf16 or f32)");
  if (!p.x || !p.w || !p.seg || !p.y || (p.format != ExpertFormat::kPlain && !p.scale))
    DI_THROW(InvalidArgument, "grouped_gemm: null activation, weight/scale table, segments or output");
}
}  // namespace

// kAuto picks wgmma on sm_90: measured on an H200 (session 13, docs/PERFORMANCE.md "#13 grouped
// expert GEMM on wgmma") 1.6-1.75x the mma.sync kernel at V4-Flash prefill sizes, bit-identical
// output, tests and compute-sanitizer clean.
constexpr bool kWgmmaByDefault = true;

void grouped_gemm(const GroupedGemmParams& p, cudaStream_t stream) {
  validate(p);
  if (!p.tiles || !p.num_tiles) DI_THROW(InvalidArgument, "grouped_gemm: null tile list");
  const bool sm90 = grouped_gemm_wgmma_available();
  const bool wgmma = p.kernel == GroupedGemmKernel::kWgmma || p.kernel == GroupedGemmKernel::kWgmmaTable ||
                     p.kernel == GroupedGemmKernel::kWgmmaBits || p.kernel == GroupedGemmKernel::kWgmmaWs ||
                     p.kernel == GroupedGemmKernel::kWgmmaSwapAB;
  if (wgmma && !sm90)
    DI_THROW(InvalidArgument, "grouped_gemm: kernel wgmma needs a compute capability 9.0 device");
  if (p.max_tiles == 0) return;
  if (p.max_tiles >= (int64_t(1) << 31) || (p.N + BN - 1) / BN > 65535)
    DI_THROW(InvalidArgument, "grouped_gemm: grid too large (tiles ", p.max_tiles, ", N ", p.N, ")");
  if (wgmma || (p.kernel == GroupedGemmKernel::kAuto && sm90 && kWgmmaByDefault)) {
    grouped_gemm_wgmma(p, stream);
    return;
  }
  const dim3 grid(unsigned(p.max_tiles), unsigned((p.N + BN - 1) / BN));
  switch (p.format) {
    case ExpertFormat::kPlain: launch_grouped<ExpertFormat::kPlain>(p, grid, stream); break;
    case ExpertFormat::kFP4: launch_grouped<ExpertFormat::kFP4>(p, grid, stream); break;
    case ExpertFormat::kFP8: launch_grouped<ExpertFormat::kFP8>(p, grid, stream); break;
  }
  DI_CUDA_CHECK_LAUNCH();
}

// ---- host twin ----
namespace {
float e8m0_host(uint8_t e) { return deepinfer::e8m0_to_f32(e); }
}  // namespace

void grouped_gemm_host(const GroupedGemmParams& p) {
  validate(p);
  const int64_t N = p.N, K = p.K;
  std::vector<float> wrow(static_cast<size_t>(K));
  for (int64_t e = 0; e < p.experts; ++e) {
    const uint8_t* w = static_cast<const uint8_t*>(p.w[e]);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {  // the exact dequantised weight, rounded to bf16 (exact for FP4/FP8)
        float v;
        if (p.format == ExpertFormat::kFP4) {
          const uint8_t b = w[n * (K / 2) + k / 2];
          v = fp4e2m1_to_f32(uint8_t(k % 2 ? b >> 4 : b & 15)) * e8m0_host(p.scale[e][n * (K / 32) + k / 32]);
        } else if (p.format == ExpertFormat::kFP8) {
          v = fp8e4m3_to_f32(w[n * K + k]) * e8m0_host(p.scale[e][n * ((K + 127) / 128) + k / 128]);
        } else {
          uint16_t b;
          std::memcpy(&b, w + (n * K + k) * 2, 2);
          v = bf16_to_f32(b);
        }
        wrow[size_t(k)] = bf16_to_f32(f32_to_bf16(v));
      }
      for (int64_t a = p.seg[e]; a < p.seg[e + 1]; ++a) {
        const int64_t xr = p.x_rows ? p.x_rows[a] : a;
        const uint16_t* x = static_cast<const uint16_t*>(p.x) + xr * p.ldx;
        float s = 0.f;
        for (int64_t k = 0; k < K; ++k) s += bf16_to_f32(x[k]) * wrow[size_t(k)];
        if (p.y_dtype == DType::kF32)
          static_cast<float*>(p.y)[a * p.ldy + n] = s;
        else
          static_cast<uint16_t*>(p.y)[a * p.ldy + n] = f32_to_bf16(s);
      }
    }
  }
}

}  // namespace deepinfer::ops::cuda
