// The sm_90a (Hopper) path of grouped_gemm (grouped_gemm.h): warpgroup MMA, 128 x 256 block
// tiles. Internal: grouped_gemm() validates the parameters and dispatches here only on a device
// of compute capability 9.0.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/cuda/grouped_gemm.h"

namespace deepinfer::ops::cuda {

// Block tile of the wgmma kernel: two 64-row tiles of one expert (tiles 2j and 2j+1 of the tile
// list) x 256 outputs.
constexpr int kWgmmaTileM = 2 * kGroupedTileM;
constexpr int kWgmmaTileN = 256;

// p already validated; launches on `stream`. p.kernel picks the variant (grouped_gemm.h).
void grouped_gemm_wgmma(const GroupedGemmParams& p, cudaStream_t stream);

// Test hook for the kernel's table-free decoder (any device): word i (FP4 8 nibbles, FP8 4 bytes,
// lowest first) with e8m0 scale scales[i] -> out[4i..4i+3] bf16x2 words (FP8: out[4i+2..3] = 0).
// Device pointers.
void expert_dequant_probe(ExpertFormat f, const uint32_t* words, const uint8_t* scales, int64_t n, uint32_t* out,
                          cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
