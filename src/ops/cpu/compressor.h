// Gated pooling of the KV compressor (MODEL-DEEPSEEK-V4.md §3.3), over complete blocks only.
// The caller projects a = Wkv h and z = Wgate h + ape[t mod m] for each source token and keeps
// pending rows between chunks; this op turns rows into compressed entries (before the entry
// RMSNorm and rope, which the caller applies with rmsnorm()/rope_apply()).
#pragma once
#include <cstdint>

namespace deepinfer::ops::cpu {

struct CompressorPoolArgs {
  const float* a = nullptr;   // [n_rows, c] (row stride row_stride) rows of consecutive source tokens row0, row0+1, ...
  const float* z = nullptr;   // [n_rows, c] (row stride row_stride) gate logits (ape already added)
  int64_t row0 = 0;           // absolute position of row 0
  int64_t n_rows = 0;
  int64_t width = 0;          // c: d (disjoint) or 2d (overlapping)
  int64_t row_stride = 0;     // elements between rows of a and z (0 = width)
  int64_t ratio = 0;          // m
  bool overlap = false;       // CSA: block i = A-halves (dims [0,d)) of tokens m(i-1)..mi-1
                              //      ++ B-halves (dims [d,2d)) of tokens mi..mi+m-1
                              // HCA: block i = all dims of tokens mi..mi+m-1
  int64_t first_block = 0;    // blocks first_block .. first_block+n_blocks-1
  int64_t n_blocks = 0;
  float* out = nullptr;       // [n_blocks, d]: out[i][e] = Σ_slots softmax(z[.,e])·a[.,e]
};
// Every token a block needs must lie in [row0, row0+n_rows) unless it is < 0 (absent, weight 0).
void compressor_pool(const CompressorPoolArgs& args);

}  // namespace deepinfer::ops::cpu
