// Grouped MoE decode, variants 14..16 (issue #13; moe_decode.h): FP4 weight rows streamed into a
// shared-memory ring by bulk copies (cp.async.bulk, the TMA's 1-D form: one instruction moves a
// whole contiguous row segment, completion counted in bytes on an mbarrier), one producer warp
// feeding W consumer warps.
//
// Why: every register-staged or cp.async variant (v1..v13) sat at 2.0-2.3 TB/s, and their loads
// ask the memory system for 16..128 contiguous bytes per row at a time from ~thousands of rows at
// once. Here a stage is KC contiguous inputs (KC/2 bytes) of each of the block's 16*W rows, plus
// the tile's token columns over the same inputs; the producer issues one copy per row and per
// token, so DRAM sees 256..1024-byte runs, and the consumer warps issue no global loads for
// weights at all (only their scale bytes, one stage ahead in registers).
//
// Each consumer warp owns one m-tile (16 A rows: up 8 gate + 8 up rows, down 16 output rows) and
// builds, chunk by chunk in order, exactly the Stage v9's load9 would have loaded (same weight
// vectors, scales and token column), then calls v9's compute_fp4: the same MMA operands in the
// same order, so v14..v16 == v3 bit for bit (MoeDecodeGrouped tests). Columns past the tile are
// not copied (their smem is stale): an MMA output element reads only its own B column, and those
// columns are never stored.
//
// Measured (H200, session 13, docs/PERFORMANCE.md "the memory side"): SLOWER than v9..v13 (0.8-1.5
// TB/s at B >= 8 vs v13's 2.2-2.6), and so are its load-only probes (0.9-2.3 TB/s vs 2.8-3.1 for
// v3's addressing): the per-row copies (256..1024 bytes each, 136 per stage) cap the ring, which
// grew with the copy size. Not picked by variant 0; kept as the tested base for a 2-D tensor-map
// (cp.async.bulk.tensor) ring, which would move a stage's rows in one copy.
//
// Needs K % 128 == 0 (whole chunks per stage; else v9 runs), 16-byte aligned expert bases and
// activations (what v3's 16-byte loads already need), FP4 weights (FP8 / bf16 take v3's kernel).
//
// Ring slot (one stage), row stride padded so a quarter warp's 16-byte reads hit distinct banks:
//   w  [16*W rows][KC/2 + 64 B]     row ri = warp*16 + h*8 + g (A row h*8+g of warp's m-tile)
//   x  [8 columns][2*KC + 32 B]     bf16 inputs k0 .. k0+KC of column c's token
// then S "full" mbarriers (producer arrive + bytes) and S "empty" ones (one arrive per consumer warp).
//
// kProbe (diagnostic variants 103..106): the same copies and shared-memory reads, no decode and
// no MMA (the words are folded by xor so the reads stay live): the ceiling of the access pattern.
#include <cuda_bf16.h>

#include <cstdint>

#include "deepinfer/error.h"
#include "model/deepseek/cuda/moe_decode_fp4.cuh"
#include "ops/cuda/common.cuh"

namespace deepinfer::model::ds::cuda::moe_grouped {
namespace {
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::kWarpSize;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the bulk copies' complete_tx).
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred P1;\n"
      "WAIT14:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      " @!P1 bra WAIT14;\n"
      "}\n" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
}
// bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared, counted on b.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(b))
               : "memory");
}

template <int W, int KC, int S>
struct V14Cfg {
  static constexpr int kCps = KC / kChunk;           // chunks per stage
  static constexpr int kRows = 16 * W;               // A rows per block
  static constexpr int kRowStride = KC / 2 + 64;     // bytes; == 64 mod 128: rows g, g+1 in other banks
  static constexpr int kXStride = 2 * KC + 32;       // bytes; == 32 mod 128
  static constexpr int kSlot = kRows * kRowStride + 8 * kXStride;
  static constexpr int kSmem = S * kSlot + 2 * S * 8;
  static constexpr int kThreads = (W + 1) * kWarpSize;
  static constexpr int kBlocks = (227 * 1024) / (kSmem + 1024);  // per SM (1 KB: the block's reserved smem)
  static_assert(KC % kChunk == 0 && kSlot % 16 == 0 && S >= 2, "whole chunks, aligned slots, a ring");
  static_assert(kSmem <= 227 * 1024, "ring past shared memory");
};

// Matrix row of ring row ri (clamped to the matrix: rows past it are copied but never stored).
template <bool kUp>
__device__ __forceinline__ int64_t ring_row(int ri, int64_t base, int64_t I, int64_t D) {
  const int wi = ri / 16, h = (ri / 8) % 2, g = ri % 8;
  if constexpr (kUp) {
    int64_t i = base + 8 * wi + g;
    i = i < I ? i : I - 1;
    return h ? I + i : i;
  } else {
    const int64_t j = base + 16 * wi + 8 * h + g;
    return j < D ? j : D - 1;
  }
}

// grid (max_tiles, up: ceil(inter / 8W), down: ceil(dim / 16W)), (W + 1) warps: W consumers, 1 producer.
template <bool kUp, int W, int KC, int S, bool kProbe>
__global__ void __launch_bounds__(V14Cfg<W, KC, S>::kThreads, V14Cfg<W, KC, S>::kBlocks)
    v14_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  using C = V14Cfg<W, KC, S>;
  extern __shared__ __align__(128) uint8_t smem[];
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t I = p.inter, D = p.dim, K = kUp ? D : I;
  const int64_t nc = K / kChunk, ns = (nc + C::kCps - 1) / C::kCps;
  const int64_t base = int64_t(blockIdx.y) * (kUp ? 8 : 16) * W;  // first output row of the block
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S * C::kSlot);
  uint64_t* empty = full + S;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) mbar_init(full + s, 1), mbar_init(empty + s, W);
    mbar_fence_init();
  }
  __syncthreads();
  if (warp == W) {  // producer: stage j into slot j % S once its consumers released it
    const uint8_t* w = static_cast<const uint8_t*>(kUp ? p.w13[tr.e] : p.w2[tr.e]);
    const __nv_bfloat16* xm = static_cast<const __nv_bfloat16*>(kUp ? p.x : p.act);
    for (int64_t j = 0; j < ns; ++j) {
      const int slot = int(j % S);
      if (j >= S) mbar_wait(empty + slot, uint32_t((j / S - 1) & 1));
      const int64_t k0 = j * KC;
      const int nch = int(nc - j * C::kCps < C::kCps ? nc - j * C::kCps : C::kCps);
      const uint32_t rb = uint32_t(nch) * 64, xb = uint32_t(nch) * 256;  // FP4 row / bf16 column bytes
      if (lane == 0) mbar_arrive_expect_tx(full + slot, C::kRows * rb + uint32_t(tr.n) * xb);
      __syncwarp();
      uint8_t* sl = smem + slot * C::kSlot;
      for (int ri = lane; ri < C::kRows + tr.n; ri += kWarpSize) {
        if (ri < C::kRows) {
          bulk_copy(sl + ri * C::kRowStride, w + ring_row<kUp>(ri, base, I, D) * (K / 2) + k0 / 2, rb, full + slot);
        } else {
          const int c = ri - C::kRows;
          const int64_t xr = kUp ? p.perm_src[tr.r0 + c] : tr.r0 + c;
          bulk_copy(sl + C::kRows * C::kRowStride + c * C::kXStride, xm + xr * K + k0, xb, full + slot);
        }
      }
    }
    return;
  }
  // consumer warp: its m-tile's A rows warp*16 + {g, 8 + g}, B column g, lane t's 32 inputs a chunk
  const int g = lane / 4, t = lane % 4;
  const uint8_t* sc = kUp ? p.w13_scale[tr.e] : p.w2_scale[tr.e];
  const uint8_t* srow[2] = {sc + ring_row<kUp>(warp * 16 + g, base, I, D) * (K / 32) + t,
                            sc + ring_row<kUp>(warp * 16 + 8 + g, base, I, D) * (K / 32) + t};
  uint32_t scur[2][C::kCps], snext[2][C::kCps];
  auto load_scales = [&](uint32_t(&s)[2][C::kCps], int64_t j) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int cl = 0; cl < C::kCps; ++cl) {
        const int64_t c = j * C::kCps + cl;
        s[h][cl] = c < nc ? __ldg(srow[h] + 4 * c) : 127u;
      }
  };
  load_scales(scur, 0);
  float acc[1][4] = {};
  const uint8_t* wr0 = smem + (warp * 16 + g) * C::kRowStride + 16 * t;
  const uint8_t* wr1 = wr0 + 8 * C::kRowStride;
  const uint8_t* xr = smem + C::kRows * C::kRowStride + g * C::kXStride + 64 * t;
  for (int64_t j = 0; j < ns; ++j) {
    const int slot = int(j % S);
    if (j + 1 < ns) load_scales(snext, j + 1);
    mbar_wait(full + slot, uint32_t((j / S) & 1));
    const int off = slot * C::kSlot;
    const int nch = int(nc - j * C::kCps < C::kCps ? nc - j * C::kCps : C::kCps);
#pragma unroll
    for (int cl = 0; cl < C::kCps; ++cl) {
      if (cl < nch) {
        Stage<ExpertFormat::kFP4, 1> st;
        st.w[0][0][0] = *reinterpret_cast<const uint4*>(wr0 + off + cl * 64);
        st.w[0][1][0] = *reinterpret_cast<const uint4*>(wr1 + off + cl * 64);
        st.s[0][0] = scur[0][cl];
        st.s[0][1] = scur[1][cl];
#pragma unroll
        for (int v = 0; v < 4; ++v) st.x[v] = *reinterpret_cast<const uint4*>(xr + off + cl * 256 + 16 * v);
        if constexpr (kProbe) probe_fold<ExpertFormat::kFP4, 1>(st, acc);
        else compute_fp4<1>(st, acc);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + slot);  // this warp's reads of the slot are done
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int cl = 0; cl < C::kCps; ++cl) scur[h][cl] = snext[h][cl];
  }
  if constexpr (kUp) store_up<1>(p, tr, base + 8 * warp, g, t, acc);
  else store_down<1>(p, tr, base + 16 * warp, g, t, acc);
}

template <int W, int KC, int S, bool kProbe>
void launch14(const MoeDecodeGroupedParams& p, cudaStream_t stream) {
  using C = V14Cfg<W, KC, S>;
  static const bool attrs = [] {  // past the 48 KB default: opt in once per kernel
    DI_CUDA_CHECK(cudaFuncSetAttribute(v14_kernel<true, W, KC, S, kProbe>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    DI_CUDA_CHECK(cudaFuncSetAttribute(v14_kernel<false, W, KC, S, kProbe>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    return true;
  }();
  (void)attrs;
  const unsigned tiles = unsigned(p.max_tiles);
  v14_kernel<true, W, KC, S, kProbe>
      <<<dim3(tiles, unsigned(ceil_div(p.inter, int64_t(8 * W)))), C::kThreads, C::kSmem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
  v14_kernel<false, W, KC, S, kProbe>
      <<<dim3(tiles, unsigned(ceil_div(p.dim, int64_t(16 * W)))), C::kThreads, C::kSmem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}
}  // namespace

bool v14_supported(const MoeDecodeGroupedParams& p) {
  return p.format == ExpertFormat::kFP4 && p.dim % kChunk == 0 && p.inter % kChunk == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.act) % 16 == 0;
}

void launch_v14(const MoeDecodeGroupedParams& p, int shape, cudaStream_t stream) {
  if (!v14_supported(p)) DI_THROW(InvalidArgument, "moe_decode_grouped variant ", shape, ": needs FP4, K % 128 == 0");
  switch (shape) {  // consumer warps, inputs per stage, stages
    case 15: return launch14<8, 1024, 2, false>(p, stream);
    case 16: return launch14<4, 512, 3, false>(p, stream);  // 2 blocks per SM
    case kMoeDecodeGroupedProbeFirst + 2: return launch14<8, 512, 4, true>(p, stream);
    case kMoeDecodeGroupedProbeFirst + 3: return launch14<8, 1024, 2, true>(p, stream);
    case kMoeDecodeGroupedProbeFirst + 4: return launch14<4, 512, 3, true>(p, stream);
    case kMoeDecodeGroupedProbeFirst + 5: return launch14<4, 2048, 2, true>(p, stream);  // whole rows at I = 2048
    default: return launch14<8, 512, 4, false>(p, stream);
  }
}

}  // namespace deepinfer::model::ds::cuda::moe_grouped
