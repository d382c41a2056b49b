// The DSpark stages' weights as f32 host tensors (dspark.h), read from V41Weights' `mtp.k.*`
// entries (release layout), plus the trunk's embedding and lm head (shared with the drafter).
#pragma once
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v41/config.h"

namespace deepinfer::model::v41 {

struct V41Weights;

struct DSparkStageWeights {
  Tensor attn_norm, ffn_norm;
  Tensor hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  Tensor wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, sink;  // wo_a [G*R, H*d/G] (group g: rows g*R..)
  Tensor gate, gate_bias;                                      // [E, D], [E]
  std::vector<Tensor> w13, w2;                                 // per expert: [2I, D] (W1|W3), [D, I]
  Tensor shared13, shared2;
};

struct DSparkWeights {
  std::vector<DSparkStageWeights> stages;
  Tensor main_proj, main_norm;           // first stage: [D, taps*D], [D]
  Tensor norm, mk_embed, mk_head, conf;  // last stage: [D], [V, Rk], [V, Rk], [1, D + Rk]
  Tensor embed, head;                    // trunk: [V, D] each
  std::vector<float> inv_freq;           // the stages' rope (cfg.rope: theta, no YaRN)
  // The checkpoint the tensors came from (alive while a DSparkStagesMaker runs, not after): a
  // device maker reads the stored FP8 / FP4 bytes + e8m0 scales of the mtp.* linears from it
  // instead of uploading the f32 copies above. Null for weights built by hand.
  const V41Weights* stored = nullptr;

  // Throws CheckpointError naming the first missing tensor.
  static DSparkWeights load(const DeepseekV41Config& cfg, const V41Weights& w);
};

}  // namespace deepinfer::model::v41
