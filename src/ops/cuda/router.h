// MoE router on the GPU (spec §5), fp32 throughout. Input: router logits [tokens, E] f32
// (x·Wgᵀ from gemm with an f32 output). s = sqrt(softplus(logit / gate_temp)) (torch softplus:
// linear above 20; gate_temp is V4.1's, 1 in V4, where the division is skipped). Biased mode: experts = top-k of s + bias (ties -> lower expert id), selection
// only. Hash mode: experts = tid2eid[token_id]. Weights from the UNbiased scores:
// w = route_scale · s_e / Σ_{selected} s (sum in selection order).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

constexpr int kRouterMaxTopk = 16;

struct RouterParams {
  const float* logits = nullptr;   // [tokens, num_experts] f32, row stride logits_stride
  int64_t logits_stride = 0;
  const float* bias = nullptr;     // [num_experts] f32 (biased mode) or null (hash mode)
  const void* tid2eid = nullptr;   // [vocab, topk] i32 or i64 (hash mode) or null
  DType tid2eid_dtype = DType::kI32;
  const int32_t* token_ids = nullptr;  // [tokens] (hash mode)
  int64_t vocab = 0;               // rows of tid2eid (ids are checked against it)
  int32_t* expert_ids = nullptr;   // [tokens, topk] out
  float* weights = nullptr;        // [tokens, topk] out
  int64_t tokens = 0;
  int num_experts = 0;             // <= 1024
  int topk = 0;                    // <= kRouterMaxTopk
  float route_scale = 1.0f;
  float gate_temp = 1.0f;          // V4.1: logits are divided by it before the score function (> 0)
  int* error_flag = nullptr;       // optional: set to 1 when a token id or table entry is out of range
};

void router(const RouterParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
