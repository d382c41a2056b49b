// Device-side routed MoE for decode-sized steps (T <= kMoeDecodeMaxTokens tokens): no host
// sync, so the whole forward can be captured in a CUDA graph.
//
// Why a hand-written kernel and not cuBLASLt: the grouped path (cuda_layers.cpp) reads the
// routing back to the host to size one GEMM per expert; cuBLASLt takes its shapes and operand
// pointers from the host, so it cannot consume device-side expert ids without that sync. At
// decode sizes the routed experts are memory-bound GEMVs anyway: each (token, slot) pair reads
// its expert's weight rows once with 16-byte loads and accumulates in fp32, which is what a
// GEMM would do at M = 1 per expert.
//
//   up:   act[a, i] = w_a · swiglu(round(x_t·W1[e]_i), round(x_t·W3[e]_i))   a = t*K + k, e = ids[a]
//         (round = the storage dtype, as the grouped path's GEMM output; clamp as ops/cuda/swiglu)
//   down: ye[a, j] = act[a] · W2[e]_j   (f32)
// Weights in the release formats (ops/cuda/grouped_gemm.h ExpertFormat): FP4 rows are read as
// 16-byte vectors of 32 e2m1 values (exactly one e8m0 scale each), FP8 rows as 16 e4m3 values
// (scale per 128 inputs); each vector's products are summed in fp32 and multiplied by its
// power-of-two scale (exact), so the result equals the dequantised weights up to summation order.
// The combine (glue_kernels moe_combine) then sums k in order and the shared expert: every
// token's result is independent of its batch neighbours. An expert id outside [0, E) (a bad
// hash table entry) contributes zeros here; the grouped path raises it on the host.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/grouped_gemm.h"

namespace deepinfer::model::ds::cuda {

constexpr int64_t kMoeDecodeMaxTokens = 64;

struct MoeDecodeParams {
  const void* x = nullptr;            // [tokens, dim] dtype (the normed hidden h), contiguous
  const int32_t* expert_ids = nullptr;  // [tokens, topk] device
  const float* weights = nullptr;     // [tokens, topk] routed weights (f32)
  const void* const* w13 = nullptr;   // [num_experts] device pointers to [2*inter, dim] (gate | up rows)
  const void* const* w2 = nullptr;    // [num_experts] device pointers to [dim, inter]
  ops::cuda::ExpertFormat format = ops::cuda::ExpertFormat::kPlain;  // plain: dtype elements
  const uint8_t* const* w13_scale = nullptr;  // [num_experts] e8m0 [2*inter, dim/blk] (FP4/FP8)
  const uint8_t* const* w2_scale = nullptr;   // [num_experts] e8m0 [dim, inter/blk]
  void* act = nullptr;                // [tokens*topk, inter] dtype workspace
  float* ye = nullptr;                // [tokens*topk, dim] f32 out (weighted)
  int64_t tokens = 0, topk = 0, num_experts = 0, dim = 0, inter = 0;  // multiples of 8 (32 for FP4/FP8)
  DType dtype = DType::kBF16;         // of x, act (and plain weights): f32 | bf16
  float limit = 0.f;                  // swiglu clamp (<= 0: none)
};
void moe_decode(const MoeDecodeParams& p, cudaStream_t stream);

// Host twin (host pointers; bf16 as raw uint16 bits; host pointer tables), fp32
// accumulation in a plain order (the kernel sums in a different fixed order).
void moe_decode_host(const MoeDecodeParams& p);

// ---- Grouped decode (issue #13): each touched expert's weights read ONCE per step ----
// moe_decode above reads one expert copy per (token, k) pair. Here the pairs come sorted by expert
// (ops/cuda/moe_route with tile_m = kMoeDecodeTileM: stable, tokens ascending inside an expert,
// tiles of up to 8 rows of one expert), and one warp streams a band of an expert's rows once for
// all (up to 8) rows of a tile: mma.sync m16n8k16 bf16 with fp32 accumulators, the weight rows as
// the 16-row A operand (dequantised in registers: lookup per byte, then a bf16x2 multiply by the
// power-of-two scale, exact; FP4 by bit arithmetic, FP8 by a byte table), the tile's tokens as the 8 columns of B (zero
// columns past the tile). Each lane owns 32 consecutive inputs of a row per 128-input chunk (the
// k order inside an MMA is a fixed permutation of the inputs; x is permuted the same way).
//   up:   act[r, i] = w_r · swiglu(round(x_t·W1[e]_i), round(x_t·W3[e]_i))   (t = perm_src[r], w_r = perm_w[r])
//   down: ye[r, j] = act[r] · W2[e]_j   (f32, sorted row r; the combine maps (t, k) -> r through comb)
// Batch-invariant by construction: an MMA's output element depends only on its own A row and B
// column, and the chunk order is fixed, so a token's rows are bit-identical whichever tokens share
// its tile (tested). It rounds differently from moe_decode (tensor-core sums) and from the grouped
// prefill GEMM (another k order). bf16 activations only; dim, inter multiples of 32.
constexpr int kMoeDecodeTileM = 8;
// Fixed-shape steps up to this many tokens take moe_decode_grouped (bf16), above it the grouped
// prefill GEMM (cuda_backend moe_path). H200, FP4, V4-Flash widths, random top-6 routing: the
// grouped decode takes 0.37x the prefill GEMM path's time at 256 tokens (1.63 vs 4.43 ms; 0.37x
// at V4.1 widths too), so it is the measured limit; fixed steps go up to 384 tokens (verify).
constexpr int64_t kMoeDecodeGroupedMaxTokens = 256;
// Variants 1..kMoeDecodeGroupedVariants of MoeDecodeGroupedParams::variant (0 picks one).
constexpr int kMoeDecodeGroupedVariants = 24;
// Diagnostic variants (timing only; their outputs are garbage): the access patterns alone, loads
// folded by xor, no decode and no MMA, FP4 only. First: v9's (= v3's) addressing, + 1: v13's
// (128 contiguous bytes per row and pair of chunks), + 2 .. + 4: v14 / v15 / v16's bulk-copy rings,
// + 5: a ring of 4 warps x 2048 inputs (whole 1 KB rows of an I = 2048 down matrix) x 2 stages,
// + 6: v19's (v13's loads plus the L2 prefetch 6 chunks ahead), + 7: v23's (v9's plus the same).
constexpr int kMoeDecodeGroupedProbeFirst = 101, kMoeDecodeGroupedProbeLast = 108;

struct MoeDecodeGroupedParams {
  const void* x = nullptr;              // [tokens, dim] bf16 (the normed hidden h)
  const int32_t* seg = nullptr;         // moe_route outputs (tile_m = kMoeDecodeTileM), device
  const int64_t* perm_src = nullptr;
  const float* perm_w = nullptr;
  const int32_t* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  int64_t max_tiles = 0;                // moe_route_max_tiles(tokens*topk, num_experts, kMoeDecodeTileM)
  const void* const* w13 = nullptr;     // as MoeDecodeParams
  const void* const* w2 = nullptr;
  ops::cuda::ExpertFormat format = ops::cuda::ExpertFormat::kPlain;
  const uint8_t* const* w13_scale = nullptr;
  const uint8_t* const* w2_scale = nullptr;
  void* act = nullptr;                  // [tokens*topk, inter] bf16 workspace, sorted rows
  float* ye = nullptr;                  // [tokens*topk, dim] f32 out, sorted rows (invalid ids: unwritten)
  int64_t tokens = 0, topk = 0, num_experts = 0, dim = 0, inter = 0;  // dim, inter multiples of 32
  float limit = 0.f;                    // swiglu clamp (<= 0: none)
  int variant = 0;                      // tuning (timing tests): 0 by size (FP4: 13); 1..3 warp shapes; 4 FP4 by table;
                                        // 5..8 weights staged in shared memory by cp.async (moe_decode_v5.cu:
                                        // 5, 6 one ring per block; 7, 8 one ring per warp); 9, 10, 11
                                        // v3, v2, v1 with fewer instructions per FP4 byte, 12 the same
                                        // with 2 m-tiles x 2 stages, 13 with 2 m-tiles and loads in
                                        // pairs of chunks (moe_decode_v9.cu); 14..16 FP4 rows streamed
                                        // by bulk copies (TMA 1-D) into a shared-memory ring of
                                        // 8 warps x 512 inputs x 4 stages / 8 x 1024 x 2 / 4 x 512
                                        // x 3 (2 blocks per SM) (moe_decode_v14.cu; K % 128 != 0:
                                        // v9); 17, 18 v13 with 2 / 3 row bands per block, the
                                        // loads running on across a band's end (moe_decode_v9.cu);
                                        // 19 / 20 / 21 / 22: v13 / v17 / v13 / v17 with an L2 prefetch
                                        // of each row 6 / 6 / 12 / 12 chunks ahead of its loads; 23 / 24:
                                        // v9 (4 m-tiles, one chunk ahead) with the prefetch 6 / 12
                                        // ahead; the probes above
  int kernels = 3;                      // timing only: bit 0 launches the up kernel, bit 1 the down
                                        // kernel (honoured by variants 1..4, 9..13 and 17..24)
};
// Whether moe_decode_grouped takes these shapes (bf16 activations, widths multiples of 32).
bool moe_decode_grouped_supported(DType act, int64_t dim, int64_t inter);
void moe_decode_grouped(const MoeDecodeGroupedParams& p, cudaStream_t stream);
// Host twin (host pointers and tables; bf16 as raw uint16 bits), fp32 sums in input order.
void moe_decode_grouped_host(const MoeDecodeGroupedParams& p);

}  // namespace deepinfer::model::ds::cuda
