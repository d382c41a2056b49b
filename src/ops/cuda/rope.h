// Interleaved tail RoPE (spec §3.1) and its inverse, in place. Pair i of a head is channels
// (tail + 2i, tail + 2i + 1), tail = head_dim - rope_dim; angle = fp32(pos) * inv_freq[i] in
// fp32, rotated in fp32, stored back in the tensor's dtype. inv_freq (with YaRN when the layer
// uses it) comes from the host table ops::cpu::rope_inv_freq, uploaded once per layer kind.
// CPU twin: ops/cpu/rope.h rope_apply.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

struct RopeParams {
  void* x = nullptr;              // [rows, heads, head_dim] dtype; element (r,h,c) at r*row_stride + h*head_stride + c
  DType dtype = DType::kBF16;
  int64_t row_stride = 0;         // elements
  int64_t head_stride = 0;        // elements
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;           // even, <= head_dim; rotates the trailing rope_dim channels
  const int64_t* pos = nullptr;   // [rows] absolute positions (device)
  const float* inv_freq = nullptr;  // [rope_dim/2] (device)
  bool inverse = false;           // rotate by -angle (attention output de-rotation)
};

void rope(const RopeParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
