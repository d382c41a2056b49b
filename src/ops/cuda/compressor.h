// Gated pooling of the KV compressor on the GPU (spec §3.3), complete blocks only, fp32 as the
// reference. For block b and output dim e, over the block's slots (token, column):
//   HCA (overlap=false): tokens m·b .. m·b+m-1, column e
//   CSA (overlap=true):  A-slots tokens m(b-1) .. m·b-1 at column e (absent when < 0),
//                        B-slots tokens m·b .. m·b+m-1 at column d+e
//   out[b][e] = Σ_slots e^{z - max} a / Σ_slots e^{z - max}
// The caller then applies the entry RMSNorm (norm.h), rope (rope.h) and, in production numerics,
// the FP8 round trip (quant.h). CPU twin: ops/cpu/compressor.h compressor_pool (same arguments).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer::ops::cuda {

struct CompressorPoolParams {
  const float* a = nullptr;  // [n_rows, width] row stride row_stride: rows of tokens row0, row0+1, ...
  const float* z = nullptr;  // [n_rows, width] gate logits (ape already added), same layout
  int64_t row0 = 0;          // absolute position of row 0
  int64_t n_rows = 0;
  int64_t width = 0;         // d (HCA) or 2d (CSA)
  int64_t row_stride = 0;    // elements (0 = width)
  int64_t ratio = 0;         // m
  bool overlap = false;
  int64_t first_block = 0;   // blocks first_block .. first_block + n_blocks - 1
  int64_t n_blocks = 0;
  float* out = nullptr;      // [n_blocks, d] f32
};

// Throws InvalidArgument when a block needs a token outside [row0, row0 + n_rows).
void compressor_pool(const CompressorPoolParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
