// DeepSeek-V4.1 weights prepared for the CPU backend (fp32 reference): every tensor-table entry
// dequantised exactly to f32 into ds::ModelRef as the shared forward reads it (parts stacked:
// compressor Wkv|Wgate for ratio >= 2 sources, Wkv alone for ratio 1; experts W1|W3), the lm head
// in 16-column panels, Engram q_weight ⊙ k_weight precomputed (the reference only uses the
// product), the Engram tables left in their stored form (FP8 rows + scales in the mapped file, read
// by row id), rope tables per layer (compress rope for ratio > 0, main otherwise). No hc_head:
// V4.1's final collapse uses the last FFN site's weights.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer::model::v41 {

std::vector<float> v41_inv_freq(const RopeParams& p, int64_t rope_dim);

// `shard` (ModelLoadOptions::expert_shard): only that rank's routed experts of the main layers are
// prepared; the others stay undefined refs (the expert-parallel seam never runs them here).
// `pack_head` false leaves the lm head a plain f32 [V, D] ref (the GPU loader uploads it as is).
std::unique_ptr<ds::CpuWeightStore> v41_prepare_cpu(const DeepseekV41Config& cfg, const ModelPlan& plan,
                                                    const V41Weights& weights,
                                                    const std::optional<parallel::ExpertShard>& shard = std::nullopt,
                                                    bool pack_head = true);

}  // namespace deepinfer::model::v41
