// Engram injection on the GPU (V4.1; CPU twin and formula: ops/cpu/engram.h). One block per
// (token, stream): the three sums over D (h², key², h·w·key) are block reductions in a fixed
// order (deterministic, batch invariant), then X[t, k] += gate · value. All fp32, in place.
// engram_widen: a step's table rows uploaded in stored form (FP8 e4m3 codes + an E8M0 scale per
// 32, or bf16/f32 values) widened on the device to the dtype the wkv linear reads; the values are
// exactly those of the host widen (ops/cpu engram_widen_row), then rounded once to bf16 (the
// host's f32_to_bf16) when the output is bf16.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

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

struct EngramWidenParams {
  const void* values = nullptr;     // [rows, dim] in `in` (kF8E4M3, kBF16 or kF32)
  const uint8_t* scales = nullptr;  // [rows, dim / 32] E8M0, kF8E4M3 only (dim % 32 == 0)
  DType in = DType::kF8E4M3;
  void* out = nullptr;              // [rows, dim] in `out_dtype` (kBF16 or kF32), dense
  DType out_dtype = DType::kBF16;
  int64_t rows = 0, dim = 0;
};

void engram_widen(const EngramWidenParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
