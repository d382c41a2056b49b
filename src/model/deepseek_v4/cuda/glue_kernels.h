// Small kernels the GPU forward needs beyond src/ops/cuda: row gathers/scatters with dtype
// casts (embedding lookup, window staging, paged-cache writes, MoE permutation), the
// compressor's positional gate bias, and the fixed-order MoE combine. Each has a plain host
// twin below (the spec the kernel is tested against in tests/cpp/cuda_model).
// Launchers validate (InvalidArgument naming the field, before any CUDA call) and launch on the
// given stream; zero rows is a no-op.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::model::v4::gpu {

// dst[dst_index[i]] = cast(src row i'), i' = src_index[i]; row width `width` elements.
//  src_index[i] >= 0 : row src_index[i] of src_a;  < 0 : row (-src_index[i] - 1) of src_b
//  (src_b lets one launch mix a cache ring with the chunk's new rows). Null index = identity.
struct GatherRowsParams {
  const void* src_a = nullptr;       // [*, width] src_dtype, row stride a_stride (elements)
  int64_t a_stride = 0;
  const void* src_b = nullptr;       // [*, width] src_dtype, row stride b_stride; may be null if no index < 0
  int64_t b_stride = 0;
  DType src_dtype = DType::kBF16;    // f32 | bf16
  const int64_t* src_index = nullptr;  // [rows] device, or null (row i of src_a)
  void* dst = nullptr;               // [*, width] dst_dtype, row stride dst_stride
  int64_t dst_stride = 0;
  DType dst_dtype = DType::kBF16;    // f32 | bf16
  const int64_t* dst_index = nullptr;  // [rows] device, or null (row i); targets must be distinct;
                                       // dst_index[i] < 0 skips row i (fixed-shape decode: pad
                                       // tokens and unused staging rows write nothing)
  int64_t rows = 0, width = 0;
};
void gather_rows(const GatherRowsParams& p, cudaStream_t stream);

// z[t, e] += bias[pos[t] mod m, e]  (compressor ape on the gate half, f32).
struct PositionBiasParams {
  float* z = nullptr;            // [rows, width] row stride z_stride
  int64_t z_stride = 0;
  const float* bias = nullptr;   // [m, width] contiguous
  const int64_t* pos = nullptr;  // [rows] absolute positions (>= 0)
  int64_t m = 0, rows = 0, width = 0;
};
void add_position_bias(const PositionBiasParams& p, cudaStream_t stream);

// out[t] = Σ_{k=0..K-1, rows[t,k] >= 0} ye[rows[t,k]] + shared[t]   (f32, k in order, then shared)
// Fixed order per token: the result of a token does not depend on its batch neighbours.
struct MoeCombineParams {
  const float* ye = nullptr;         // [assignments, dim] routed expert outputs (already weighted)
  const int64_t* rows = nullptr;     // [tokens, topk] row of ye for (t, k), -1 = none
  const float* shared = nullptr;     // [tokens, dim] or null
  float* out = nullptr;              // [tokens, dim]
  int64_t tokens = 0, topk = 0, dim = 0;
};
void moe_combine(const MoeCombineParams& p, cudaStream_t stream);

// Gated pooling of one complete compressor block per token (fixed-shape decode, graph-safe):
// same arithmetic as ops::cuda::compressor_pool, but the block index comes from device memory.
// Token t with block[t] = b >= 0 reads its staged rows stage[t*rows_per_token + r] = position
// base + r, base = m*(b-1) (CSA) or m*b (HCA); positions < 0 are absent (CSA block 0).
// block[t] < 0: nothing is written for t.
struct DecodePoolParams {
  const float* stage = nullptr;   // [tokens*rows_per_token, 2*width] (a | z) rows, row stride ld
  int64_t ld = 0;
  const int64_t* block = nullptr; // [tokens] block completed by token t, or -1
  int64_t tokens = 0, rows_per_token = 0;  // rows_per_token = 2m (CSA) or m (HCA)
  int64_t width = 0;              // c: d (HCA) or 2d (CSA) (a and z halves each c wide)
  int64_t ratio = 0;              // m
  bool overlap = false;
  float* out = nullptr;           // [tokens, d] f32, d = overlap ? width/2 : width
};
void decode_pool(const DecodePoolParams& p, cudaStream_t stream);

// ---- host twins (same argument meaning, host pointers; bf16 as raw uint16 bits) ----
void gather_rows_host(const GatherRowsParams& p);
void add_position_bias_host(const PositionBiasParams& p);
void moe_combine_host(const MoeCombineParams& p);
void decode_pool_host(const DecodePoolParams& p);

}  // namespace deepinfer::model::v4::gpu
