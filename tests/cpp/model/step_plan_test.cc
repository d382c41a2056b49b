// The shared step planner (model/plan/step_plan.h) on the tiny fixture's V4 layer plans: window
// runs through the slot rings (with and without rollback slack), compressor staging, candidates,
// the fixed-shape variant, and typed batch errors. Host code: runs in CI.
#include <gtest/gtest.h>

#include <filesystem>

#include "deepinfer/error.h"
#include "golden.h"
#include "model/deepseek_v4/plan.h"
#include "model/plan/cache_specs.h"
#include "model/plan/step_plan.h"

namespace deepinfer::model {
namespace {
using deepinfer::testing::golden_dir;

struct Fixture {
  v4::DeepseekV4Config cfg;
  std::vector<kv::LayerCacheSpec> specs;
  StepPlanDims dims;
  kv::CacheGeometry g;
};

Fixture tiny(int64_t rollback) {
  Fixture f;
  f.cfg = v4::DeepseekV4Config::from_file(golden_dir("tiny"));
  const ModelPlan plan = v4::v4_plan(f.cfg, {.max_rollback = rollback});
  f.specs = cache_specs(plan, {.head_dim = f.cfg.head_dim, .index_head_dim = f.cfg.index_head_dim});
  f.dims = {.n_streams = f.cfg.hc_mult, .index_topk = f.cfg.index_topk, .topk_experts = f.cfg.num_experts_per_tok};
  f.g = kv::plan_cache_geometry(f.specs, kv::cache_slot_bytes(f.specs, 4) * 2 +
                                             kv::cache_block_bytes(f.specs, kv::default_block_tokens(f.specs), 4) * 8,
                                2, 4, "test");
  return f;
}

ForwardBatch two_seqs() {
  ForwardBatch b;
  // seq 0: 5 new tokens after 30 cached (crosses window and block boundaries); seq 1: prefill of 3.
  b.seqs.push_back({.cache_slot = 1, .block_table = {3, 2}, .num_computed_tokens = 30, .num_new_tokens = 5});
  b.seqs.push_back({.cache_slot = 0, .block_table = {5}, .num_computed_tokens = 0, .num_new_tokens = 3});
  b.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  b.logits_indices = {4, 7};
  return b;
}

TEST(StepPlan, WindowCompressorCandidates) {
  if (!std::filesystem::exists(golden_dir("tiny") + "/config.json")) GTEST_SKIP() << "fixture absent";
  for (int64_t rollback : {0, 6}) {
    const Fixture f = tiny(rollback);
    const ForwardBatch b = two_seqs();
    validate_forward_batch(b, f.g, true, f.cfg.vocab_size);
    const StepPlan m = build_step_plan(f.specs, f.dims, f.g, b);
    const int64_t W = f.cfg.sliding_window, S = W + rollback;
    ASSERT_EQ(m.T, 8);
    EXPECT_EQ(m.ring_rows, S);
    EXPECT_EQ(int64_t(m.win_src.size()), (W - 1 + 5) + 3);
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(m.win_count[j], std::min<int64_t>(W, 30 + j + 1));
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(m.win_count[5 + j], j + 1);
    // The last window row of token t is its own kv row; earlier rows come from the slot's ring.
    for (int64_t t = 0; t < 8; ++t) EXPECT_EQ(m.win_src[size_t(m.win_begin[t] + m.win_count[t] - 1)], -t - 1);
    EXPECT_EQ(m.win_src[0], 1 * S + (30 - (W - 1)) % S);
    // Window stores: seq 0's 5 rows go to ring rows p mod S of slot 1.
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(m.win_store_dst[size_t(j)], 1 * S + (30 + j) % S);
    for (const auto& k : m.kinds) {
      const int64_t mm = k.ratio;
      EXPECT_EQ(k.state_rows, (k.overlap ? 2 * mm : mm) + rollback);
      // Entries emitted by seq 0: blocks floor(30/m) .. floor(35/m)-1.
      const int64_t e0 = 35 / mm - 30 / mm, e1 = 3 / mm;
      EXPECT_EQ(int64_t(k.entry_pos.size()), e0 + e1) << "ratio " << mm;
      for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(k.cand_count[j], (30 + j + 1) / mm);
      for (const auto& l : k.launches) EXPECT_LE(l.lo, l.first_block * mm);
    }
    EXPECT_EQ(m.logits_rows, (std::vector<int64_t>{4, 7}));
  }
}

TEST(StepPlan, FixedShapeMatchesGeneralForDecode) {
  if (!std::filesystem::exists(golden_dir("tiny") + "/config.json")) GTEST_SKIP() << "fixture absent";
  const Fixture f = tiny(3);
  ForwardBatch b;
  b.seqs.push_back({.cache_slot = 1, .block_table = {3, 2}, .num_computed_tokens = 39, .num_new_tokens = 1});
  b.seqs.push_back({.cache_slot = 0, .block_table = {5}, .num_computed_tokens = 3, .num_new_tokens = 1});
  b.token_ids = {9, 10};
  b.logits_indices = {0, 1};
  const std::vector<int64_t> caps = fixed_candidate_caps(f.specs, 4096);
  ASSERT_TRUE(fixed_eligible(f.specs, b, caps));
  const StepPlan g = build_step_plan(f.specs, f.dims, f.g, b);
  const StepPlan x = build_fixed_step_plan(f.specs, f.dims, f.g, b, decode_bucket(2), caps);
  ASSERT_EQ(x.T, 2);
  EXPECT_TRUE(x.fixed);
  EXPECT_EQ(x.win_store_dst, g.win_store_dst);
  for (size_t k = 0; k < g.kinds.size(); ++k) {
    EXPECT_EQ(x.kinds[k].state_dst, g.kinds[k].state_dst);
    EXPECT_EQ(x.kinds[k].cand_count, g.kinds[k].cand_count);
  }
  ForwardBatch prefill = b;
  prefill.seqs[0].num_new_tokens = 2;
  prefill.token_ids.push_back(11);
  EXPECT_FALSE(fixed_eligible(f.specs, prefill, caps));
  EXPECT_EQ(decode_bucket(3), 4);
  EXPECT_EQ(decode_bucket(65), 96);
  EXPECT_EQ(decode_bucket(257), 0);
}

// Decode batches above 64 sequences: eligible where the backend's limits allow that many tokens
// (the CUDA backend with grouped MoE: 384), not under the default limits (64 tokens), never above
// the last decode bucket (256 sequences).
TEST(StepPlan, WideDecodeBatchesFollowTheLimits) {
  if (!std::filesystem::exists(golden_dir("tiny") + "/config.json")) GTEST_SKIP() << "fixture absent";
  const Fixture f = tiny(0);
  const std::vector<int64_t> caps = fixed_candidate_caps(f.specs, 4096);
  auto decode = [](int64_t B) {
    ForwardBatch b;
    for (int64_t i = 0; i < B; ++i) {
      b.seqs.push_back({.cache_slot = int32_t(i % 2), .block_table = {int32_t(i % 8)}, .num_computed_tokens = 5 + i % 7,
                        .num_new_tokens = 1});
      b.token_ids.push_back(int32_t(3 + i));
      b.logits_indices.push_back(int32_t(i));
    }
    return b;
  };
  const FixedLimits wide{.max_tokens = 384, .max_tokens_per_seq = 1};
  for (int64_t B : {64, 65, 97, 129, 256}) {
    EXPECT_EQ(fixed_eligible(f.specs, decode(B), caps), B <= 64) << B << " sequences, default limits";
    EXPECT_TRUE(fixed_eligible(f.specs, decode(B), caps, wide)) << B << " sequences, 384-token limits";
  }
  EXPECT_FALSE(fixed_eligible(f.specs, decode(257), caps, wide)) << "above the last decode bucket";
  // The padded plan of a wide batch: the bucket's size, pad tokens after the real ones.
  const ForwardBatch b = decode(100);
  const StepPlan x = build_fixed_step_plan(f.specs, f.dims, f.g, b, decode_bucket(100), caps);
  EXPECT_EQ(x.T, 128);
  EXPECT_TRUE(x.fixed);
  ASSERT_EQ(x.logits_rows.size(), 128u);  // padded: a fixed plan's lists have the bucket's length
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(x.logits_rows[size_t(i)], i);
}

TEST(StepPlan, TypedBatchErrors) {
  if (!std::filesystem::exists(golden_dir("tiny") + "/config.json")) GTEST_SKIP() << "fixture absent";
  const Fixture f = tiny(0);
  const ForwardBatch b = two_seqs();
  ForwardBatch bad = b;
  bad.seqs[1].cache_slot = 1;
  EXPECT_THROW(validate_forward_batch(bad, f.g, true, f.cfg.vocab_size), InvalidArgument);
  bad = b;
  bad.token_ids[0] = int32_t(f.cfg.vocab_size);
  EXPECT_THROW(validate_forward_batch(bad, f.g, true, f.cfg.vocab_size), InvalidArgument);
  EXPECT_THROW(validate_forward_batch(b, f.g, false, f.cfg.vocab_size), InvalidArgument);
}

TEST(LayerPlan, RefusesLayoutsTheMathForbids) {
  ModelPlan p;
  LayerPlan a{.index = 0, .window = 8, .ratio = 2, .compressor = CompressorKind::kPool, .kv_source = 0,
              .select = SelectKind::kAll};
  LayerPlan r = a;
  r.index = 1;
  r.compressor = CompressorKind::kNone;
  r.ratio = 1;  // a consumer whose ratio differs from its source's
  p.layers = {a, r};
  EXPECT_THROW(p.validate("test"), ConfigError);
  p.layers[1].ratio = 2;
  p.validate("test");
  p.layers[1].kv_source = 5;  // a source after the consumer
  EXPECT_THROW(p.validate("test"), ConfigError);
}

}  // namespace
}  // namespace deepinfer::model
