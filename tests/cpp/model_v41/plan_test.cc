// V4.1 layer plans from the derived roles: both golden layouts, both config namings, the released
// schedule, and the forward dimensions (MODEL-DEEPSEEK-V41.md §2-§4; notes §3-§7).
#include "model/deepseek_v41/plan.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace deepinfer::model::v41 {
namespace {
using v41_test::golden;

DeepseekV41Config load(const std::string& name) {
  return DeepseekV41Config::from_file((golden(name) / "config.json").string());
}

// Every layer of every mode carries the QAT window format, no q head norm, biased MoE.
void expect_common(const ModelPlan& plan, const DeepseekV41Config& c) {
  EXPECT_EQ(plan.hc, HcWiring::kSinglePass);
  ASSERT_EQ(plan.num_layers(), c.num_layers);
  EXPECT_TRUE(plan.drafter.empty());
  for (const LayerPlan& p : plan.layers) {
    const LayerRoles& r = c.roles[size_t(p.index)];
    EXPECT_EQ(p.window, c.sliding_window);
    EXPECT_FALSE(p.q_head_norm);
    EXPECT_EQ(p.window_format, RowFormat::kFp8Block32);
    EXPECT_EQ(p.moe, MoeKind::kBiased);
    EXPECT_EQ(p.engram, r.engram) << p.index;
    EXPECT_EQ(p.ratio, r.ratio);
    EXPECT_EQ(p.rope, r.ratio > 0 ? RopeKind::kCompress : RopeKind::kMain) << p.index;
    EXPECT_EQ(p.candidate_source, r.candidate_source) << p.index;
    EXPECT_EQ(p.uses_candidates, r.uses_candidates) << p.index;
    EXPECT_FALSE(p.compressor_ape);
    if (r.ratio == 0) {
      EXPECT_FALSE(p.attends_compressed());
      continue;
    }
    EXPECT_EQ(p.kv_source, r.kv_source);
    switch (r.role) {
      case LayerRole::kFull:
        EXPECT_EQ(p.compressor, r.ratio == 1 ? CompressorKind::kProject : CompressorKind::kPool) << p.index;
        EXPECT_EQ(p.index_keys, IndexKeyKind::kFromLatent);
        EXPECT_EQ(p.select, SelectKind::kScore);
        EXPECT_EQ(p.key_source, p.index);
        EXPECT_EQ(p.entry_format, RowFormat::kFp4E4m3Block16);
        EXPECT_EQ(p.key_format, RowFormat::kFp4Ue8m0Block32);
        break;
      case LayerRole::kReindex:
        EXPECT_FALSE(p.owns_entries() || p.owns_keys());
        EXPECT_EQ(p.select, SelectKind::kScore);
        EXPECT_EQ(p.key_source, r.kv_source);
        EXPECT_EQ(p.key_format, RowFormat::kFp4Ue8m0Block32);  // the index queries round like the keys
        break;
      case LayerRole::kReuse:
        EXPECT_FALSE(p.owns_entries() || p.owns_keys());
        EXPECT_EQ(p.select, SelectKind::kReuse);
        EXPECT_EQ(p.topk_source, r.topk_source);
        break;
      case LayerRole::kSliding: ADD_FAILURE() << "ratio " << r.ratio << " sliding at " << p.index;
    }
  }
}

TEST(V41Plan, GoldenLayoutsBothNamings) {
  struct Case {
    const char* dir;
    const char* schedule;
  };
  for (const Case& k : {Case{"v41_a", "S S F X F R F R X R"}, Case{"v41_a_release", "S S F X F R F R X R"},
                        Case{"v41_b", "S F R F R F X R X S"}, Case{"v41_b_release", "S F R F R F X R X S"}}) {
    SCOPED_TRACE(k.dir);
    const DeepseekV41Config c = load(k.dir);
    const ds::Arch a = v41_arch(c, {.max_rollback = 3});
    expect_common(a.plan, c);
    EXPECT_EQ(a.plan.schedule_str(), k.schedule);
    EXPECT_EQ(a.plan.max_rollback, 3);
    EXPECT_EQ(a.dims.eps, float(c.rms_norm_eps));
    EXPECT_EQ(a.dims.gate_temp, float(c.gate_temp));
    EXPECT_EQ(a.dims.norm_topk, c.routing_normalized());
    EXPECT_EQ(a.dims.candidate_block_size, c.candidate_block_size);
    EXPECT_EQ(a.dims.candidate_topk_blocks, c.candidate_topk_blocks);
    EXPECT_EQ(a.dims.mix_dim(), c.hc_mix_dim());
  }
  // v41_b: the candidate source is a Reindex layer (ratio 1, keys of KV source 5); layer 8 masks.
  const ModelPlan b = v41_plan(load("v41_b"), {});
  EXPECT_TRUE(b.layers[6].candidate_source);
  EXPECT_EQ(b.layers[6].key_source, 5);
  EXPECT_EQ(b.layers[5].compressor, CompressorKind::kProject);
  EXPECT_EQ(b.layers[1].compressor, CompressorKind::kPool);
  EXPECT_TRUE(b.layers[8].uses_candidates);
  EXPECT_EQ(b.layers[9].rope, RopeKind::kMain);
}

TEST(V41Plan, ReleasedSchedule) {
  const DeepseekV41Config c = DeepseekV41Config::from_json_string(v41_test::release_json().dump(), "config.json");
  const ModelPlan plan = v41_plan(c, {});
  expect_common(plan, c);
  for (int32_t l : {2, 8, 14}) EXPECT_EQ(plan.layers[size_t(l)].compressor, CompressorKind::kPool) << l;
  EXPECT_EQ(plan.layers[20].compressor, CompressorKind::kProject);
  EXPECT_TRUE(plan.layers[20].candidate_source);
  for (int32_t l : {24, 28, 32, 36}) {
    EXPECT_EQ(plan.layers[size_t(l)].select, SelectKind::kScore) << l;
    EXPECT_EQ(plan.layers[size_t(l)].key_source, 20) << l;
    EXPECT_TRUE(plan.layers[size_t(l)].uses_candidates) << l;
  }
  EXPECT_EQ(plan.layers[27].topk_source, 24);
  EXPECT_EQ(plan.layers[21].topk_source, 20);
  EXPECT_EQ(plan.layers[19].kv_source, 14);
  const ds::Dims d = v41_dims(c);
  EXPECT_EQ(d.candidate_block_size, 8);
  EXPECT_EQ(d.candidate_topk_blocks, 2048);
  EXPECT_EQ(d.eps, 1e-20f);
  EXPECT_EQ(d.experts, 384);
}

}  // namespace
}  // namespace deepinfer::model::v41
