// Row movement and small elementwise steps of the DeepSeek forward, on the host: indexed row
// gathers/scatters with f32/bf16 casts (embedding lookup, window staging through the slot rings,
// paged-cache writes), the compressor's positional gate bias, the fixed-order MoE combine and
// the fixed-shape block pooling. These are the CPU backend's ops and the specs the CUDA glue
// kernels (model/deepseek/cuda/glue_kernels.h) are tested against; the argument structs are
// shared with them. bf16 values are raw uint16 bits.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cpu {

// dst[dst_index[i]] = cast(src row i'), i' = src_index[i]; row width `width` elements.
//  src_index[i] >= 0 : row src_index[i] of src_a;  < 0 : row (-src_index[i] - 1) of src_b
//  (src_b lets one call mix a cache ring with the chunk's new rows). Null index = identity.
struct GatherRowsArgs {
  const void* src_a = nullptr;       // [*, width] src_dtype, row stride a_stride (elements)
  int64_t a_stride = 0;
  const void* src_b = nullptr;       // [*, width] src_dtype, row stride b_stride; may be null if no index < 0
  int64_t b_stride = 0;
  DType src_dtype = DType::kBF16;    // f32 | bf16
  const int64_t* src_index = nullptr;  // [rows], or null (row i of src_a)
  void* dst = nullptr;               // [*, width] dst_dtype, row stride dst_stride
  int64_t dst_stride = 0;
  DType dst_dtype = DType::kBF16;    // f32 | bf16
  const int64_t* dst_index = nullptr;  // [rows], or null (row i); targets must be distinct;
                                       // dst_index[i] < 0 skips row i (fixed-shape pads)
  int64_t rows = 0, width = 0;
};
// Throws InvalidArgument naming the field for bad shapes, dtypes or missing pointers.
void validate_gather_rows(const GatherRowsArgs& a);
void gather_rows(const GatherRowsArgs& a);

// z[t, e] += bias[pos[t] mod m, e]  (compressor ape on the gate half, f32).
struct PositionBiasArgs {
  float* z = nullptr;            // [rows, width] row stride z_stride
  int64_t z_stride = 0;
  const float* bias = nullptr;   // [m, width] contiguous
  const int64_t* pos = nullptr;  // [rows] absolute positions (>= 0)
  int64_t m = 0, rows = 0, width = 0;
};
void add_position_bias(const PositionBiasArgs& a);

// out[t] = Σ_{k=0..K-1, rows[t,k] >= 0} ye[rows[t,k]] + shared[t]   (f32, k in order, then shared)
// Fixed order per token: the result of a token does not depend on its batch neighbours.
struct MoeCombineArgs {
  const float* ye = nullptr;         // [assignments, dim] routed expert outputs (already weighted)
  const int64_t* rows = nullptr;     // [tokens, topk] row of ye for (t, k), -1 = none
  const float* shared = nullptr;     // [tokens, dim] or null
  float* out = nullptr;              // [tokens, dim]
  int64_t tokens = 0, topk = 0, dim = 0;
};
void moe_combine(const MoeCombineArgs& a);

// Gated pooling of one complete compressor block per token (fixed-shape decode): the arithmetic
// of compressor_pool, but the block index comes from `block`. Token t with block[t] = b >= 0 reads
// its staged rows stage[t*rows_per_token + r] = position base + r, base = m*(b-1) (overlapping) or
// m*b (disjoint); positions < 0 are absent. block[t] < 0: nothing is written for t.
struct DecodePoolArgs {
  const float* stage = nullptr;   // [tokens*rows_per_token, 2*width] (a | z) rows, row stride ld
  int64_t ld = 0;
  const int64_t* block = nullptr; // [tokens] block completed by token t, or -1
  int64_t tokens = 0, rows_per_token = 0;  // rows_per_token = 2m (overlapping) or m
  int64_t width = 0;              // c (a and z halves each c wide)
  int64_t ratio = 0;              // m
  bool overlap = false;
  float* out = nullptr;           // [tokens, d] f32, d = overlap ? width/2 : width
};
void validate_decode_pool(const DecodePoolArgs& a);
void decode_pool(const DecodePoolArgs& a);

// x[t, j, :] += v[t, :] for every stream j (f32).
void add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim);

// Asynchronous scheduling: ids a previous step sampled, written into a step's token list and
// embedding rows before its forward: for i < count, with t = patch[2i], id = sampled[patch[2i+1]]:
// token_ids[t] = id and embed_src[t * n_streams + j] = id for every stream j.
struct InputPatchArgs {
  const int32_t* patch = nullptr;    // [count, 2] (token index, sampled row)
  int64_t count = 0;
  const int32_t* sampled = nullptr;  // sampled ids, indexed by row
  int32_t* token_ids = nullptr;      // [T]
  int64_t* embed_src = nullptr;      // [T * n_streams]
  int64_t n_streams = 1;
};
void validate_input_patch(const InputPatchArgs& a);
void patch_input_tokens(const InputPatchArgs& a);

}  // namespace deepinfer::ops::cpu
