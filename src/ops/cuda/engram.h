// Engram injection on the GPU (V4.1; CPU twin and formula: ops/cpu/engram.h). One block per
// (token, stream): the three sums over D (h², key², h·w·key) are block reductions in a fixed
// order (deterministic, batch invariant), then X[t, k] += gate · value. All fp32, in place.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer::ops::cuda {

struct EngramParams {
  float* x = nullptr;             // [tokens, n, D], token stride x_stride (elements)
  int64_t x_stride = 0;
  const float* kv = nullptr;      // [tokens, (n+1)·D] key then value, row stride kv_stride
  int64_t kv_stride = 0;
  const float* w = nullptr;       // [n, D] q_weight ⊙ k_weight
  const uint8_t* dead = nullptr;  // optional [tokens]: 1 = DEAD, gate 0
  int64_t tokens = 0;
  int n = 4;
  int64_t dim = 0;
  float eps = 1e-20f;
};

void engram_inject(const EngramParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
