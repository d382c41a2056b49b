// DeepSeek-V4.1's layer plans and forward dimensions from its config (MODEL-DEEPSEEK-V41.md §2-§4,
// V41-REFERENCE-NOTES.md §3-§7): the CSA2 roles the config derived (LayerRoles) expressed in the
// shared core's vocabulary, so the forward branches on plan fields only:
//  - sliding (ratio 0): window only, main rope;
//  - full (a KV source): owns a compressor (kPool without ape for ratio >= 2, kProject for ratio 1),
//    index keys from its pre-rope latent (kFromLatent), scores them (kScore);
//  - reuse: reads its KV source's entries and the closest index source's top-k (kReuse);
//  - reindex: its own index query over its KV source's keys (kScore, key_source = kv_source);
//  - candidate source / uses_candidates as derived (every index source after the candidate source,
//    KV sources included); compress rope for every rotation of a ratio > 0 layer;
//  - no per-head q norm; single-pass mHC (HcWiring::kSinglePass); Engram before the block.
// The QAT formats apply in every numerics mode, including the fp32 reference (notes §4): window kv
// kFp8Block32, compressed entries kFp4E4m3Block16, index keys and index queries kFp4Ue8m0Block32.
// DSpark stages are not planned here yet (their MoE has its own width: a drafter phase of its own).
#pragma once
#include <cstdint>

#include "model/deepseek/forward.h"
#include "model/deepseek_v41/config.h"

namespace deepinfer::model::v41 {

struct V41PlanOptions {
  int64_t max_rollback = 0;  // ring slack for rollback (ModelLimits::max_rollback)
  // false: every row format plain. NOT the model (its QAT roundings are part of its numerics); for
  // path-consistency tests, where the roundings turn last-bit differences into whole FP4 steps.
  bool qat = true;
  // Bounded replay's keep length (DEEPINFER_YOCO_PREFILL_KEEP_TOKENS under compact mode), 0 = full
  // prefill: the layers after the candidate source become replay_tail layers. Refused (naming
  // both numbers) below window + max_rollback, and without a candidate source.
  int64_t replay_keep = 0;
  // The DSpark drafter runs (its stages are in the checkpoint): the tap layers record their input's
  // stream mean and the hidden rows a step returns are those taps (Dims::taps).
  bool dspark = false;
};

// The keep length the knobs ask of this config: 0 unless DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE
// is "compact", then DEEPINFER_YOCO_PREFILL_KEEP_TOKENS (default 140).
constexpr int64_t kDefaultReplayKeep = 140;

ModelPlan v41_plan(const DeepseekV41Config& cfg, const V41PlanOptions& options);
// eps = rms_norm_eps (also the mHC streams' RMS: notes §6), norm_topk = routing_normalized(),
// gate_temp and the candidate-block shape.
ds::Dims v41_dims(const DeepseekV41Config& cfg);
ds::Arch v41_arch(const DeepseekV41Config& cfg, const V41PlanOptions& options);

}  // namespace deepinfer::model::v41
