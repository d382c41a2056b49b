// Grouped MoE decode, variant 5 (issue #13; moe_decode.h): the weight rows, their scales and the
// tile's token columns go global -> shared memory by cp.async (16-byte .cg, a ring of kStages
// chunks, one commit group per chunk), so the bytes in flight per SM are bounded by shared memory
// (~60-150 KB) instead of registers (v1..v3 held 1-3 chunks of loads in registers: 168-249 per
// thread, ~32 KB in flight per SM, 2.0-2.2 TB/s). x is copied once per block and chunk, not once
// per warp. Each warp then reads exactly the fragment v3's load_stage would have loaded (same
// zeros and unit scales past K or past the tile) and calls the same compute_stage: the MMAs see
// the same operands in the same order, so v5 == v3 bit for bit (MoeDecodeGrouped tests).
//
// Shared memory per stage (one 128-input chunk), laid out so a warp's 16-byte reads of one plane
// are 512 contiguous bytes (conflict-free):
//   w   [kVecs][kRows][4 lanes t][16 B]  row ri = (warp*MT + m)*16 + h*8 + g (A row h*8+g of m-tile m)
//   sc  [kRows][kScaleBytes]             FP4: 4 scales (one per lane t), FP8: 1
//   x   [4 vecs][8 columns][4 lanes t][16 B]  (8 bf16 = inputs 32t + 8v .. of the chunk)
#include <cuda_bf16.h>

#include <cstdint>

#include "deepinfer/error.h"
#include "model/deepseek/cuda/moe_decode_grouped.cuh"
#include "ops/cuda/common.cuh"

namespace deepinfer::model::ds::cuda::moe_grouped {
namespace {
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::kWarpSize;

template <ExpertFormat F, int MT, int W, int S, int CPS>
struct V5Traits {
  static constexpr int kThreads = W * kWarpSize;
  static constexpr int kRows = 16 * MT * W;       // A rows per block (up: 8 gate + 8 up per m-tile)
  static constexpr int kVecs = kRawVecs<F>;        // 16-byte vectors of a lane's 32 inputs of a row
  static constexpr int kSegs = 4 * kVecs;          // 16-byte pieces of a row's chunk
  static constexpr int kChunkBytes = 64 * kVecs;   // a row's bytes per chunk
  static constexpr int kScaleBytes = F == ExpertFormat::kFP4 ? 4 : F == ExpertFormat::kFP8 ? 1 : 0;
  static constexpr int kStages = F == ExpertFormat::kPlain ? 2 : S;  // bf16 rows are 4x the FP4 bytes
  static constexpr int kCps = F == ExpertFormat::kPlain ? 1 : CPS;  // chunks per stage (one barrier each)
  static constexpr int kWBytes = kVecs * kRows * 64;
  static constexpr int kSBytes = (kRows * kScaleBytes + 15) / 16 * 16;
  static constexpr int kXBytes = 4 * 8 * 4 * 16;
  static constexpr int kChunkSlot = kWBytes + kSBytes + kXBytes;  // one chunk's layout (file comment)
  static constexpr int kStageBytes = kCps * kChunkSlot;
  static constexpr int kSmem = kStages * kStageBytes;
  // this thread's weight pieces: rows ri0 + k * kRowStep, piece j = threadIdx.x % kSegs of each
  static constexpr int kWCopies = kRows * kSegs / kThreads, kRowStep = kThreads / kSegs;
  static constexpr int kSCopies = kRows / kThreads;  // FP4 scale words by cp.async
  static constexpr int kXCopies = kThreads >= 128 ? 1 : 128 / kThreads;  // x pieces (8 columns x 16) per thread
  static_assert(kThreads % 128 == 0 || 128 % kThreads == 0, "whole x pieces per thread");
  static_assert(kThreads % kSegs == 0 && kRows % kThreads == 0, "whole pieces per thread");
  static_assert(kStages >= 2 && kCps >= 1, "a ring needs two stages");
};

// A block of W warps: one ring for the block (x copied once per block), or one per warp
// (kPerWarp: W rings of one warp's rows, each with its own x copy, no block barriers).
template <ExpertFormat F, int MT, int W, int S, int CPS, bool kPerWarp>
struct V5Ring {
  using Tr = V5Traits<F, MT, kPerWarp ? 1 : W, S, CPS>;
  static constexpr int kSmem = (kPerWarp ? W : 1) * Tr::kSmem;
  static constexpr int kMinBlocks = (200 * 1024) / kSmem > 0 ? (200 * 1024) / kSmem : 1;  // for the register budget
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
// 16 bytes global -> shared; src_bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// What one block streams: its A rows (row_of(ri) -> matrix row), the matrix (K inputs a row)
// and its scales, and this thread's token column piece (xcol: column base or null past the tile).
// The thread's copy sources are precomputed as 32-bit offsets (a matrix is < 4 GiB, checked at
// launch), so a copy costs one add per chunk, not a row computation.
template <typename Tr>
struct V5Block {
  int tid = 0;  // thread index in the ring (the block, or the lane for a warp's own ring)
  const uint8_t* w = nullptr;
  const uint8_t* sc = nullptr;
  int64_t K = 0;
  bool sc_async = false;  // FP4 scale rows 4-byte aligned: scales by cp.async too (else plain loads)
  const __nv_bfloat16* xcol[Tr::kXCopies] = {};  // column of x piece tid + k * kThreads (null past the tile)
  uint32_t w_off[Tr::kWCopies];  // byte offset of weight piece k (chunk 0) from w
  uint32_t s_off[Tr::kSCopies];  // byte offset of scale row k from sc (FP4 by cp.async)
};

template <typename Tr, typename RowOf>
__device__ __forceinline__ void init_offsets(V5Block<Tr>& b, RowOf row_of) {
  const int64_t row_bytes = b.K * Tr::kChunkBytes / kChunk;
  const int j = b.tid % Tr::kSegs, ri0 = b.tid / Tr::kSegs;
#pragma unroll
  for (int k = 0; k < Tr::kWCopies; ++k) b.w_off[k] = uint32_t(row_of(ri0 + k * Tr::kRowStep) * row_bytes + 16 * j);
#pragma unroll
  for (int k = 0; k < Tr::kSCopies; ++k) b.s_off[k] = uint32_t(row_of(b.tid + k * Tr::kThreads) * (b.K / 32));
}

// Issues chunk c's copies into `slot` (the caller commits the group). Pieces past K are skipped
// (compute selects zeros there); x pieces past K or the tile are zero-filled.
template <ExpertFormat F, typename Tr, typename RowOf>
__device__ __forceinline__ void issue_chunk(uint8_t* slot, const V5Block<Tr>& b, int64_t c, RowOf row_of) {
  const int64_t p_chunk = c * kChunk;
  {
    const int j = b.tid % Tr::kSegs, t = j / Tr::kVecs, v = j % Tr::kVecs, ri0 = b.tid / Tr::kSegs;
    if (p_chunk + 32 * t < b.K) {
      const uint8_t* src = b.w + c * Tr::kChunkBytes;
      uint8_t* dst = slot + (v * Tr::kRows + ri0) * 64 + 16 * t;
#pragma unroll
      for (int k = 0; k < Tr::kWCopies; ++k) cp_async16(dst + k * Tr::kRowStep * 64, src + b.w_off[k], 16);
    }
  }
  uint8_t* ss = slot + Tr::kWBytes;
  if constexpr (F == ExpertFormat::kFP4) {
    if (b.sc_async) {  // K % 128 == 0 here: a chunk's 4 scale bytes are all in the row
#pragma unroll
      for (int k = 0; k < Tr::kSCopies; ++k)
        cp_async4(ss + 4 * (b.tid + k * Tr::kThreads), b.sc + b.s_off[k] + 4 * c);
    } else {
      for (int i = b.tid; i < Tr::kRows * 4; i += Tr::kThreads)
        if (p_chunk + 32 * (i % 4) < b.K) ss[i] = __ldg(b.sc + row_of(i / 4) * (b.K / 32) + 4 * c + i % 4);
    }
  } else if constexpr (F == ExpertFormat::kFP8) {
    for (int ri = b.tid; ri < Tr::kRows; ri += Tr::kThreads)
      ss[ri] = __ldg(b.sc + row_of(ri) * ((b.K + 127) / 128) + c);
  }
#pragma unroll
  for (int k = 0; k < Tr::kXCopies; ++k) {  // x piece i = (column g, lane t, vec v)
    const int i = b.tid + k * Tr::kThreads, g = i / 16, t = (i / 4) % 4, v = i % 4;
    if (i >= 128) break;
    const bool ok = b.xcol[k] && p_chunk + 32 * t < b.K;
    const __nv_bfloat16* src = ok ? b.xcol[k] + p_chunk + 32 * t + 8 * v : reinterpret_cast<const __nv_bfloat16*>(b.w);
    cp_async16(slot + Tr::kWBytes + Tr::kSBytes + ((v * 8 + g) * 4 + t) * 16, src, ok ? 16 : 0);
  }
}

// The warp's Stage of one chunk from its slot: the values v3's load_stage loads from global.
// kFull: every lane's inputs are inside K (no selects; the same values).
template <ExpertFormat F, int MT, typename Tr, bool kFull>
__device__ __forceinline__ void read_stage(Stage<F, MT>& st, const uint8_t* slot, int warp, int g, int t, bool ok_in,
                                           bool has_col) {
  const bool ok = kFull || ok_in;
  const uint4 z = make_uint4(0, 0, 0, 0);
  const uint8_t* ss = slot + Tr::kWBytes;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int ri = (warp * MT + m) * 16 + h * 8 + g;
#pragma unroll
      for (int v = 0; v < Tr::kVecs; ++v)
        st.w[m][h][v] = ok ? *reinterpret_cast<const uint4*>(slot + (v * Tr::kRows + ri) * 64 + 16 * t) : z;
      if constexpr (F == ExpertFormat::kFP4) st.s[m][h] = ok ? ss[4 * ri + t] : 127u;
      else if constexpr (F == ExpertFormat::kFP8) st.s[m][h] = ok ? ss[ri] : 127u;
    }
  const uint8_t* xs = slot + Tr::kWBytes + Tr::kSBytes;
#pragma unroll
  for (int v = 0; v < 4; ++v)
    st.x[v] = ok && has_col ? *reinterpret_cast<const uint4*>(xs + ((v * 8 + g) * 4 + t) * 16) : z;
}

// acc[m] += the warp's rows · its columns over all K, chunks in order (v3's order). A stage is
// kCps consecutive chunks (one commit group, one barrier); the copy of stage q + kStages - 1 goes
// into the slot every warp finished with at the barrier.
// kPerWarp: the ring is the warp's own (its rows, its copy of x): __syncwarp instead of a block barrier.
template <ExpertFormat F, int MT, typename Tr, bool kPerWarp, typename RowOf>
__device__ __forceinline__ void run_rows_v5(uint8_t* smem, const V5Block<Tr>& b, RowOf row_of, bool has_col,
                                            const uint32_t* lut, float (&acc)[MT][4]) {
  constexpr int kS = Tr::kStages, kC = Tr::kCps;
  const int warp = b.tid / kWarpSize, lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
  const int64_t nc = (b.K + kChunk - 1) / kChunk, nq = (nc + kC - 1) / kC;
  auto issue = [&](int64_t q, int slot) {
#pragma unroll
    for (int u = 0; u < kC; ++u)
      if (q * kC + u < nc) issue_chunk<F, Tr>(smem + slot * Tr::kStageBytes + u * Tr::kChunkSlot, b, q * kC + u, row_of);
  };
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) {
    if (s < nq) issue(s, s);
    cp_async_commit();
  }
  int slot = 0;
  for (int64_t q = 0; q < nq; ++q) {
    cp_async_wait<kS - 2>();  // this thread's copies of stage q landed
    if constexpr (kPerWarp) __syncwarp();  // the lanes' copies landed; every lane is done with stage q - 1's slot
    else __syncthreads();                  // (block ring: every thread's, every warp)
    if (q + kS - 1 < nq) issue(q + kS - 1, slot == 0 ? kS - 1 : slot - 1);
    cp_async_commit();
#pragma unroll
    for (int u = 0; u < kC; ++u) {
      const int64_t c = q * kC + u;
      if (c < nc) {
        Stage<F, MT> st;
        const uint8_t* cs = smem + slot * Tr::kStageBytes + u * Tr::kChunkSlot;
        if ((c + 1) * kChunk <= b.K) read_stage<F, MT, Tr, true>(st, cs, warp, g, t, true, has_col);  // warp-uniform
        else read_stage<F, MT, Tr, false>(st, cs, warp, g, t, c * kChunk + 32 * t < b.K, has_col);
        compute_stage<F, true, MT>(st, lut, acc);
      }
    }
    slot = slot == kS - 1 ? 0 : slot + 1;
  }
  cp_async_wait<0>();  // nothing in flight at exit (the last groups are empty)
}

__device__ __forceinline__ bool scale_rows_aligned(const uint8_t* sc, int64_t K) {
  return K % 128 == 0 && (reinterpret_cast<uintptr_t>(sc) & 3) == 0;
}

// grid (max_tiles, ceil(inter / (8*MT*W))), as v3's grouped_up_kernel.
template <ExpertFormat F, int MT, int W, int S, int CPS, bool kPerWarp>
__global__ void __launch_bounds__(W * kWarpSize, (V5Ring<F, MT, W, S, CPS, kPerWarp>::kMinBlocks))
    v5_up_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  using R = V5Ring<F, MT, W, S, CPS, kPerWarp>;
  using Tr = typename R::Tr;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t lut[F == ExpertFormat::kFP8 ? 256 : 1];
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  if constexpr (F == ExpertFormat::kFP8) {  // a warp's own ring has no block barrier: publish here
    fill_lut<F>(lut);
    __syncthreads();
  }
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, g = (threadIdx.x % kWarpSize) / 4, t = threadIdx.x % 4;
  const int64_t I = p.inter, D = p.dim, blk0 = int64_t(blockIdx.y) * W * 8 * MT;
  // A row ri = (warp*MT + m)*16 + h*8 + g: gate row blk0 + (warp*MT + m)*8 + g (clamped), + h*I
  const int ring = kPerWarp ? warp : 0, rb = ring * Tr::kRows;  // the ring's first A row in the block
  auto row_of = [&](int ri) {
    ri += rb;
    const int64_t i = blk0 + (ri / 16) * 8 + ri % 8;
    return (i < I ? i : I - 1) + ((ri / 8) % 2) * I;
  };
  V5Block<Tr> b;
  b.tid = kPerWarp ? int(threadIdx.x) % kWarpSize : int(threadIdx.x);
  b.w = static_cast<const uint8_t*>(p.w13[tr.e]);
  b.sc = F == ExpertFormat::kPlain ? nullptr : p.w13_scale[tr.e];
  b.K = D;
  b.sc_async = F == ExpertFormat::kFP4 && scale_rows_aligned(b.sc, D);
  init_offsets(b, row_of);
#pragma unroll
  for (int k = 0; k < Tr::kXCopies; ++k) {  // the columns of this thread's x pieces
    const int i = b.tid + k * Tr::kThreads;
    if (i < 128 && i / 16 < tr.n) b.xcol[k] = static_cast<const __nv_bfloat16*>(p.x) + p.perm_src[tr.r0 + i / 16] * D;
  }
  float acc[MT][4] = {};
  run_rows_v5<F, MT, Tr, kPerWarp>(smem + ring * Tr::kSmem, b, row_of, g < tr.n, lut, acc);
  const int64_t i0 = blk0 + int64_t(warp) * 8 * MT;
  if (i0 < I) store_up<MT>(p, tr, i0, g, t, acc);
}

// grid (max_tiles, ceil(dim / (16*MT*W))), as v3's grouped_down_kernel.
template <ExpertFormat F, int MT, int W, int S, int CPS, bool kPerWarp>
__global__ void __launch_bounds__(W * kWarpSize, (V5Ring<F, MT, W, S, CPS, kPerWarp>::kMinBlocks))
    v5_down_kernel(const __grid_constant__ MoeDecodeGroupedParams p) {
  using R = V5Ring<F, MT, W, S, CPS, kPerWarp>;
  using Tr = typename R::Tr;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ uint32_t lut[F == ExpertFormat::kFP8 ? 256 : 1];
  if (int64_t(blockIdx.x) >= *p.num_tiles) return;
  if constexpr (F == ExpertFormat::kFP8) {
    fill_lut<F>(lut);
    __syncthreads();
  }
  const TileRows tr = tile_rows(p);
  const int warp = threadIdx.x / kWarpSize, g = (threadIdx.x % kWarpSize) / 4, t = threadIdx.x % 4;
  const int64_t I = p.inter, D = p.dim, blk0 = int64_t(blockIdx.y) * W * 16 * MT;
  const int ring = kPerWarp ? warp : 0, rb = ring * Tr::kRows;
  auto row_of = [&](int ri) { return blk0 + rb + ri < D ? blk0 + rb + ri : D - 1; };  // output row, clamped
  V5Block<Tr> b;
  b.tid = kPerWarp ? int(threadIdx.x) % kWarpSize : int(threadIdx.x);
  b.w = static_cast<const uint8_t*>(p.w2[tr.e]);
  b.sc = F == ExpertFormat::kPlain ? nullptr : p.w2_scale[tr.e];
  b.K = I;
  b.sc_async = F == ExpertFormat::kFP4 && scale_rows_aligned(b.sc, I);
  init_offsets(b, row_of);
#pragma unroll
  for (int k = 0; k < Tr::kXCopies; ++k) {
    const int i = b.tid + k * Tr::kThreads;
    if (i < 128 && i / 16 < tr.n) b.xcol[k] = static_cast<const __nv_bfloat16*>(p.act) + (tr.r0 + i / 16) * I;
  }
  float acc[MT][4] = {};
  run_rows_v5<F, MT, Tr, kPerWarp>(smem + ring * Tr::kSmem, b, row_of, g < tr.n, lut, acc);
  const int64_t j0 = blk0 + int64_t(warp) * 16 * MT;
  if (j0 < D) store_down<MT>(p, tr, j0, g, t, acc);
}

// Opts the kernel into its ring's shared memory once; a ring the device cannot hold is a typed error.
template <typename K>
void set_smem(K kernel, int bytes) {
  int dev = 0, optin = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > optin)
    DI_THROW(InvalidArgument, "moe_decode_grouped v5: ring of ", bytes, " bytes exceeds the device's ", optin,
             " bytes of shared memory per block");
  DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <ExpertFormat F, int MT, int W, int S, int CPS, bool kPerWarp>
void launch_shape(const MoeDecodeGroupedParams& p, cudaStream_t stream) {
  using R = V5Ring<F, MT, W, S, CPS, kPerWarp>;
  const int64_t bytes2 = F == ExpertFormat::kFP4 ? 1 : F == ExpertFormat::kFP8 ? 2 : 4;  // per 2 inputs
  if (p.inter * p.dim * bytes2 >= (int64_t(1) << 32))  // w13 [2I, D]: the 32-bit copy offsets
    DI_THROW(InvalidArgument, "moe_decode_grouped v5: expert matrices of ", p.inter, " x ", p.dim, " exceed 4 GiB");
  static const bool ready = [] {  // cudaFuncSetAttribute once per instantiation (device 0's limits)
    set_smem(v5_up_kernel<F, MT, W, S, CPS, kPerWarp>, R::kSmem);
    set_smem(v5_down_kernel<F, MT, W, S, CPS, kPerWarp>, R::kSmem);
    return true;
  }();
  (void)ready;
  const unsigned tiles = unsigned(p.max_tiles);
  v5_up_kernel<F, MT, W, S, CPS, kPerWarp>
      <<<dim3(tiles, unsigned(ceil_div(p.inter, 8 * MT * W))), W * kWarpSize, R::kSmem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
  v5_down_kernel<F, MT, W, S, CPS, kPerWarp>
      <<<dim3(tiles, unsigned(ceil_div(p.dim, 16 * MT * W))), W * kWarpSize, R::kSmem, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

// FP4 sizes (a warp's 4 m-tiles = 64 A rows = 4 KB of a chunk, + 256 B of scales, + 2 KB of x):
template <ExpertFormat F>
void launch_format(const MoeDecodeGroupedParams& p, int shape, cudaStream_t stream) {
  switch (shape) {
    case 5: return launch_shape<F, 4, 4, 4, 1, false>(p, stream);  // block ring, 4 stages of 1 chunk: 76 KB, 2 blocks/SM
    case 6: return launch_shape<F, 4, 4, 2, 2, false>(p, stream);  // block ring, 2 stages of 2 chunks: 76 KB, half the barriers
    case 7: return launch_shape<F, 4, 4, 4, 1, true>(p, stream);   // a ring per warp, 4 stages: 100 KB, 2 blocks/SM
    default: return launch_shape<F, 4, 2, 3, 1, true>(p, stream);  // 8: a ring per warp, 2 warps, 3 stages: 38 KB, 5 blocks/SM
  }
}
}  // namespace

void launch_v5(const MoeDecodeGroupedParams& p, int shape, cudaStream_t stream) {
  switch (p.format) {
    case ExpertFormat::kPlain: return launch_format<ExpertFormat::kPlain>(p, shape, stream);
    case ExpertFormat::kFP4: return launch_format<ExpertFormat::kFP4>(p, shape, stream);
    case ExpertFormat::kFP8: return launch_format<ExpertFormat::kFP8>(p, shape, stream);
  }
}

}  // namespace deepinfer::model::ds::cuda::moe_grouped
