// Grouped expert GEMM over device-side segments (MoE prefill, no host sync), reading expert
// weights in their release format: bf16, FP4 e2m1 (packed 2 per byte, one e8m0 scale per 32
// inputs) or FP8 e4m3 (one e8m0 scale per 128 inputs of a row).
//
//   for every expert e and row a in [seg[e], seg[e+1]):  y[a, n] = Σ_k x[xrow(a), k] · W_e[n, k]
//   W_e[n, k] = decode(w) · 2^(scale[n, k / blk] − 127)   (exact in bf16), fp32 accumulation,
//   y rounded once to its dtype (bf16 or f32).
//
// Why hand-written and not CUTLASS (nvidia-cutlass 4.2 headers checked): on sm_90a its grouped
// mixed-input GEMM (sm90_mma_array_tma_gmma_rs_warpspecialized_mixed_input) converts int4/uint4/
// fp8 operands only — no e2m1 — and needs the scale group to be a multiple of the K tile, whose
// minimum is 64 (K_BLOCK_MAX >= 4 wgmma k16 steps), so one scale per 32 inputs is not
// expressible; block-scaled FP4 MMA is sm_100+ only, and a wgmma kernel would not compile for the
// sm_100a half of CI. So two hand-written kernels, the weight tile dequantised to bf16 while
// staging it in shared memory, fp32 accumulators: mma.sync m16n8k16 bf16 with 64 x 128 tiles
// (sm_80+; sm_100a and every non-Hopper device), and on compute capability 9.0 warpgroup MMA
// (wgmma m64n256k16, 128 x 256 tiles: grouped_gemm_sm90.cu; its code exists only in the sm_90a
// object). Tiles are scheduled from a device tile list (moe_route.h) so the launch shape depends
// only on host-known bounds.
//
// Per row, the sum over k runs in the same order whatever the other rows of the tile are, so a
// token's result does not depend on its batch neighbours (batch invariant).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

enum class ExpertFormat : uint8_t {
  kPlain,  // the activation dtype itself (bf16 [N, K]; f32 in the decode GEMV)
  kFP4,    // uint8 [N, K/2], element 2k in the low nibble; scale e8m0 [N, K/32]
  kFP8,    // uint8 e4m3 [N, K]; scale e8m0 [N, ceil(K/128)] (the 128x128 block scale of the row)
};
const char* expert_format_name(ExpertFormat f);
// Inputs per scale (32 for FP4, 128 for FP8, 0 for plain).
inline int64_t expert_scale_block(ExpertFormat f) { return f == ExpertFormat::kFP4 ? 32 : f == ExpertFormat::kFP8 ? 128 : 0; }
// Bytes of one expert matrix [n, k] in the format, weights + scales (plain: `plain_bytes` per element).
int64_t expert_matrix_bytes(ExpertFormat f, int64_t n, int64_t k, int64_t plain_bytes = 2);

constexpr int kGroupedTileM = 64;   // rows of one tile (one expert segment each)
constexpr int kGroupedTileN = 128;  // outputs of one tile (mma.sync kernel)

// Which kernel runs: kAuto = the default (grouped_gemm.cu: kWgmmaByDefault; mma.sync off sm_90). The
// others force one (side-by-side timing, tests); kWgmma on another device throws InvalidArgument.
// kWgmma takes, per format, the dequantisation that measured faster (grouped_gemm_sm90.cu); for
// timing, kWgmmaTable / kWgmmaBits force the lookup-table / the table-free one for both formats,
// and kWgmmaWs runs the experimental warp-specialised kernel (plain weights: the default one).
// kWgmmaSwapAB: y^T = W x^T, the weights as wgmma's register A operand and the token rows as B
// (n = 8..64), for few rows per expert (grouped_gemm_sm90.cu, "swap-AB variant").
enum class GroupedGemmKernel : uint8_t { kAuto, kMmaSync, kWgmma, kWgmmaTable, kWgmmaBits, kWgmmaWs, kWgmmaSwapAB };
const char* grouped_gemm_kernel_name(GroupedGemmKernel k);
// True when the current device can run the wgmma kernel (compute capability 9.0).
bool grouped_gemm_wgmma_available();

struct GroupedGemmParams {
  const void* x = nullptr;            // bf16 activations, row stride ldx
  int64_t ldx = 0;
  const int64_t* x_rows = nullptr;    // [rows] x row of segment row a (null: row a itself)
  const void* const* w = nullptr;     // [experts] device pointers to W_e in `format`
  const uint8_t* const* scale = nullptr;  // [experts] e8m0 scale pointers (FP4/FP8)
  ExpertFormat format = ExpertFormat::kPlain;
  const int32_t* seg = nullptr;       // [experts+1] segment offsets (rows grouped by expert)
  const int32_t* tiles = nullptr;     // [max_tiles] (expert << 16 | tile index within the expert)
  const int32_t* num_tiles = nullptr; // [1] tiles in use (blocks past it exit)
  int64_t max_tiles = 0;              // grid bound (moe_route_max_tiles)
  int64_t experts = 0, N = 0, K = 0;  // K a multiple of 32; N any
  void* y = nullptr;                  // [rows, ldy] out
  int64_t ldy = 0;
  DType y_dtype = DType::kBF16;       // bf16 | f32
  GroupedGemmKernel kernel = GroupedGemmKernel::kAuto;  // device path only; the host twin ignores it
};
void grouped_gemm(const GroupedGemmParams& p, cudaStream_t stream);

// Host twin: host pointers (bf16 as uint16 bits); seg read on the host; the tile list is not used.
void grouped_gemm_host(const GroupedGemmParams& p);

}  // namespace deepinfer::ops::cuda
