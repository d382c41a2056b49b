// MoE routing of DeepSeek-V4 (MODEL-DEEPSEEK-V4.md §5). scores = sqrt(softplus(logits / gate_temp))
// (torch softplus: linear above 20; gate_temp is V4.1's, 1 in V4). Selection is either a fixed
// table (hash layers: tid2eid[token]) or
// the top-k of scores + bias (bias only for selection). Weights come from the UNbiased scores:
//   w_j = scale · s_{e_j} / (Σ_j' s_{e_j'} + 1e-20)   (norm_topk_prob; else scale · s).
#pragma once
#include <cstdint>

namespace deepinfer::ops::cpu {

struct RouterArgs {
  const float* logits = nullptr;     // [T, E]  fp32 gate logits x·Wg^T
  int64_t num_tokens = 0, num_experts = 0, topk = 0;
  const float* bias = nullptr;       // [E] selection bias (bias routing) or null
  const int32_t* tid2eid = nullptr;  // [V, topk] (hash routing) or null
  const int32_t* token_ids = nullptr;// [T] needed with tid2eid
  int64_t vocab_size = 0;            // rows of tid2eid
  bool normalize = true;             // norm_topk_prob
  float routed_scale = 1.0f;         // routed_scaling_factor
  float gate_temp = 1.0f;            // V4.1: scores = sqrtsoftplus(logits / gate_temp)
  int32_t* out_ids = nullptr;        // [T, topk]
  float* out_weights = nullptr;      // [T, topk]
};

// Throws InvalidArgument for a token id outside tid2eid or an expert id outside [0, E).
void route(const RouterArgs& args);

}  // namespace deepinfer::ops::cpu
