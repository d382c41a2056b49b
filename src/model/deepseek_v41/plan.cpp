#include "model/deepseek_v41/plan.h"

#include "deepinfer/error.h"
#include "model/deepseek/common_dims.h"

namespace deepinfer::model::v41 {
namespace {
LayerPlan base_plan(int32_t index, const DeepseekV41Config& c) {
  LayerPlan p;
  p.index = index;
  p.role = "sliding";
  p.window = c.sliding_window;
  p.rope = RopeKind::kMain;
  p.q_head_norm = false;                    // V4.1 dropped V4's per-head q RMS
  p.window_format = RowFormat::kFp8Block32;  // QAT: every layer, every mode
  p.moe = MoeKind::kBiased;                 // V4.1 has no hash-routed layers
  return p;
}

// The compressed-attention part of a ratio > 0 layer from its derived roles.
void compressed(LayerPlan& p, const LayerRoles& r) {
  p.rope = RopeKind::kCompress;
  p.ratio = r.ratio;
  p.kv_source = r.kv_source;
  p.candidate_source = r.candidate_source;
  p.uses_candidates = r.uses_candidates;
  switch (r.role) {
    case LayerRole::kFull:
      p.role = "full";
      p.compressor = r.ratio == 1 ? CompressorKind::kProject : CompressorKind::kPool;
      p.compressor_ape = false;
      p.entry_format = RowFormat::kFp4E4m3Block16;
      p.index_keys = IndexKeyKind::kFromLatent;
      p.select = SelectKind::kScore;
      p.topk_source = p.index;
      p.key_source = p.index;
      p.key_format = RowFormat::kFp4Ue8m0Block32;
      break;
    case LayerRole::kReindex:
      p.role = "reindex";
      p.select = SelectKind::kScore;
      p.topk_source = p.index;
      p.key_source = r.kv_source;               // the source's keys, scored with this layer's query
      p.key_format = RowFormat::kFp4Ue8m0Block32;  // its index queries round like the keys
      break;
    case LayerRole::kReuse:
      p.role = "reuse";
      p.select = SelectKind::kReuse;
      p.topk_source = r.topk_source;
      break;
    case LayerRole::kSliding:
      DI_THROW(InternalError, "v41_plan: layer ", p.index, " has ratio ", r.ratio, " and the sliding role");
  }
}
}  // namespace

ModelPlan v41_plan(const DeepseekV41Config& c, const V41PlanOptions& o) {
  if (int64_t(c.roles.size()) != c.num_layers)
    DI_THROW(InternalError, c.origin, ": ", c.roles.size(), " derived layer roles for ", c.num_layers, " layers");
  ModelPlan plan;
  plan.hc = HcWiring::kSinglePass;
  plan.max_rollback = o.max_rollback;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerRoles& r = c.roles[size_t(l)];
    LayerPlan p = base_plan(int32_t(l), c);
    p.engram = r.engram;
    if (r.dspark_target && o.dspark)  // tap slot = the layer's place in dspark_target_layer_ids (main_proj's input order)
      for (size_t k = 0; k < c.dspark.target_layer_ids.size(); ++k)
        if (c.dspark.target_layer_ids[k] == l) p.tap = int32_t(k);
    if (r.ratio > 0) compressed(p, r);
    if (!o.qat) p.window_format = p.entry_format = p.key_format = RowFormat::kPlain;
    p.replay_tail = o.replay_keep > 0 && l > c.candidate_source_layer_id;
    plan.layers.push_back(p);
  }
  if (o.replay_keep > 0) {
    if (!c.candidates_enabled())
      DI_THROW(InvalidArgument, c.origin, ": DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact needs a candidate source ",
               "(candidate_source_layer_id): the layers after it are the ones bounded replay runs over the tail");
    if (o.replay_keep < c.sliding_window + o.max_rollback)
      DI_THROW(InvalidArgument, c.origin, ": DEEPINFER_YOCO_PREFILL_KEEP_TOKENS=", o.replay_keep, " is below the ",
               "sliding window (", c.sliding_window, ") + the maximum rollback (", o.max_rollback, ") = ",
               c.sliding_window + o.max_rollback, "; decode would read window rows the replay never computed");
    plan.replay_keep = o.replay_keep;
  }
  plan.validate(c.origin);
  return plan;
}

ds::Dims v41_dims(const DeepseekV41Config& c) {
  ds::Dims d = ds::common_dims(c);
  d.norm_topk = c.routing_normalized();
  d.gate_temp = float(c.gate_temp);
  d.route_before_w2 = true;  // the reference weights the SwiGLU output before w2 (notes §7)
  d.engram = !c.engram.layer_ids.empty();
  if (c.dspark.num_stages > 0) d.taps = int64_t(c.dspark.target_layer_ids.size());
  if (c.candidates_enabled()) {
    d.candidate_block_size = c.candidate_block_size;
    d.candidate_topk_blocks = c.candidate_topk_blocks;
  }
  return d;
}

ds::Arch v41_arch(const DeepseekV41Config& c, const V41PlanOptions& o) {
  ds::Arch a{v41_dims(c), v41_plan(c, o)};
  if (!o.dspark) a.dims.taps = 0;
  return a;
}

}  // namespace deepinfer::model::v41
