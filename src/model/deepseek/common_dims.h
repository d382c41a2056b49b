// The forward's dimensions (forward.h Dims) from the config fields V4 and V4.1 spell the same
// way; each family's *_dims (deepseek_v4/plan.cpp, deepseek_v41/plan.cpp) adds its own.
#pragma once
#include "model/deepseek/forward.h"

namespace deepinfer::model::ds {

template <class Config>
Dims common_dims(const Config& c) {
  Dims d;
  d.vocab = c.vocab_size;
  d.hidden = c.hidden_size;
  d.streams = c.hc_mult;
  d.heads = c.num_heads;
  d.head_dim = c.head_dim;
  d.rope_dim = c.rope_head_dim;
  d.q_lora = c.q_lora_rank;
  d.o_groups = c.o_groups;
  d.o_lora = c.o_lora_rank;
  d.experts = c.n_routed_experts;
  d.topk = c.num_experts_per_tok;
  d.moe_inter = c.moe_intermediate_size;
  d.index_heads = c.index_n_heads;
  d.index_dim = c.index_head_dim;
  d.index_topk = c.index_topk;
  d.sinkhorn_iters = c.hc_sinkhorn_iters;
  d.eps = float(c.rms_norm_eps);
  d.hc_eps = float(c.hc_eps);
  d.swiglu_limit = float(c.swiglu_limit);
  d.routed_scale = float(c.routed_scaling_factor);
  return d;
}

}  // namespace deepinfer::model::ds
