#include "model/deepseek_v4/plan.h"

#include "deepinfer/error.h"
#include "model/deepseek/common_dims.h"

namespace deepinfer::model::v4 {
namespace {
LayerPlan sliding(int32_t index, const DeepseekV4Config& c, const V4PlanOptions& o) {
  LayerPlan p;
  p.index = index;
  p.role = "sliding";
  p.window = c.sliding_window;
  p.rope = RopeKind::kMain;
  p.q_head_norm = true;
  p.window_format = o.formats == V4Formats::kProduction ? RowFormat::kFp8Nope64 : RowFormat::kPlain;
  return p;
}
}  // namespace

ModelPlan v4_plan(const DeepseekV4Config& c, const V4PlanOptions& o) {
  if (c.n_shared_experts != 1)
    DI_THROW(ConfigError, c.origin, ": n_shared_experts must be 1 (DeepSeek-V4 has one shared expert), got ",
             c.n_shared_experts);
  ModelPlan plan;
  plan.hc = HcWiring::kPerSite;
  plan.max_rollback = o.max_rollback;
  const bool prod = o.formats == V4Formats::kProduction;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerPlan p = sliding(int32_t(l), c, o);
    p.moe = c.mlp_types[size_t(l)] == MlpKind::kHashMoE ? MoeKind::kHash : MoeKind::kBiased;
    const AttnKind kind = c.layer_types[size_t(l)];
    if (kind != AttnKind::kSliding) {
      p.rope = RopeKind::kCompress;
      p.ratio = c.compress_ratio[size_t(l)];
      p.kv_source = int32_t(l);
      p.compressor_ape = true;
      p.entry_format = prod ? RowFormat::kFp8Nope64 : RowFormat::kPlain;
      if (kind == AttnKind::kCSA) {
        p.role = "csa";
        p.compressor = CompressorKind::kOverlap;
        p.select = SelectKind::kScore;
        p.topk_source = int32_t(l);
        p.index_keys = IndexKeyKind::kOwnCompressor;
        p.key_source = int32_t(l);
        p.key_format = prod ? RowFormat::kFp4Hadamard32 : RowFormat::kPlain;
      } else {
        p.role = "hca";
        p.compressor = CompressorKind::kPool;
        p.select = SelectKind::kAll;
      }
    }
    plan.layers.push_back(p);
  }
  if (o.num_mtp < 0 || o.num_mtp > c.num_mtp_layers)
    DI_THROW(InvalidArgument, c.origin, ": ", o.num_mtp, " MTP blocks planned, the config has ", c.num_mtp_layers);
  for (int64_t k = 0; k < o.num_mtp; ++k) {
    const int64_t ratio = k < int64_t(c.mtp_compress_ratio.size()) ? c.mtp_compress_ratio[size_t(k)] : 0;
    if (ratio != 0) DI_THROW(ConfigError, c.origin, ": MTP block ", k, " with compress ratio ", ratio, " unsupported");
    LayerPlan p = sliding(int32_t(c.num_layers + k), c, o);
    p.role = "mtp";
    p.moe = MoeKind::kBiased;
    plan.drafter.push_back(p);
  }
  plan.validate(c.origin);
  return plan;
}

ds::Dims v4_dims(const DeepseekV4Config& c) {
  ds::Dims d = ds::common_dims(c);
  d.norm_topk = c.norm_topk_prob;
  return d;
}

ds::Arch v4_arch(const DeepseekV4Config& c, const V4PlanOptions& o) { return {v4_dims(c), v4_plan(c, o)}; }

}  // namespace deepinfer::model::v4
