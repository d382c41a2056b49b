// DeepSeek-V4's layer plans and forward dimensions from its config: sliding-only, CSA (own
// overlapping compressor, own indexer with its own key compressor) and HCA (own disjoint
// compressor, every entry attended) layers, hash- or bias-routed MoE, per-site mHC, and one
// sliding-only MTP block per num_nextn_predict_layers (MODEL-DEEPSEEK-V4.md §1-§7).
#pragma once
#include <cstdint>

#include "model/deepseek/forward.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer::model::v4 {

// The cache formats of a numerics mode: V4's production serving rounds window kv and compressed
// entries through FP8 (non-rope dims, block 64) and index keys/queries through Hadamard + FP4;
// the reference (exact) and plain bf16 modes keep values as computed.
enum class V4Formats : uint8_t { kPlain, kProduction };

struct V4PlanOptions {
  V4Formats formats = V4Formats::kPlain;
  int64_t num_mtp = 0;       // MTP blocks to plan (0..num_mtp_layers)
  int64_t max_rollback = 0;  // ring slack for rollback (ModelLimits::max_rollback)
};

ModelPlan v4_plan(const DeepseekV4Config& cfg, const V4PlanOptions& options);
ds::Dims v4_dims(const DeepseekV4Config& cfg);
ds::Arch v4_arch(const DeepseekV4Config& cfg, const V4PlanOptions& options);

}  // namespace deepinfer::model::v4
