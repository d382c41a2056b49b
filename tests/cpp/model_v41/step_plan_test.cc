// The shared cache specs and step planner on V4.1's layer plans (v41_a: ratio-2 pooling sources,
// a ratio-1 projection source, Reuse / Reindex consumers owning nothing): what each layer keeps,
// the compressor kinds, the pending ratio-2 pair carried across steps through the slot's partial
// ring, entry positions, and candidates = every finished entry in order with visibility
// s < floor((t+1)/ratio) (what the two-level top-k's "candidate j is entry j" relies on).
#include <gtest/gtest.h>

#include "model/deepseek_v41/plan.h"
#include "model/plan/cache_specs.h"
#include "model/plan/step_plan.h"
#include "test_util.h"

namespace deepinfer::model {
namespace {
using v41_test::golden;

TEST(V41StepPlan, SpecsKindsPairsAndCandidates) {
  const v41::DeepseekV41Config c = v41::DeepseekV41Config::from_file((golden("v41_a") / "config.json").string());
  for (int64_t rollback : {0, 5}) {
    SCOPED_TRACE(rollback);
    const ModelPlan plan = v41::v41_plan(c, {.max_rollback = rollback});
    const auto specs = cache_specs(plan, {.head_dim = c.head_dim, .index_head_dim = c.index_head_dim});
    ASSERT_EQ(int64_t(specs.size()), c.num_layers);
    for (const LayerPlan& p : plan.layers) {
      const kv::LayerCacheSpec& s = specs[size_t(p.index)];
      EXPECT_EQ(s.window, c.sliding_window);
      EXPECT_EQ(s.ring_rows, c.sliding_window + rollback);
      if (!p.owns_entries()) {  // Reuse / Reindex / sliding layers read the source's pools
        EXPECT_EQ(s.ratio, 0) << p.index;
        EXPECT_EQ(s.index_dim, 0) << p.index;
        continue;
      }
      EXPECT_EQ(s.ratio, p.ratio);
      EXPECT_FALSE(s.overlap);
      EXPECT_EQ(s.comp_width, c.head_dim);
      EXPECT_EQ(s.state_rows, p.ratio == 1 ? 0 : p.ratio + rollback) << p.index;  // the pending pair
      EXPECT_EQ(s.index_dim, c.index_head_dim);  // keys from the latent: no key compressor
      EXPECT_EQ(s.index_width, 0);
      EXPECT_EQ(s.index_state_rows, 0);
    }
    const auto kinds = compressor_kinds(specs);
    ASSERT_EQ(kinds.size(), 2u);
    EXPECT_EQ(kinds[0].ratio, 2);
    EXPECT_EQ(kinds[1].ratio, 1);

    const StepPlanDims dims{.n_streams = c.hc_mult, .index_topk = c.index_topk, .topk_experts = c.num_experts_per_tok};
    const kv::CacheGeometry g = kv::plan_cache_geometry(
        specs, kv::cache_slot_bytes(specs, 4) * 2 + kv::cache_block_bytes(specs, kv::default_block_tokens(specs), 4) * 8,
        2, 4, "test");
    ForwardBatch b;  // seq 0: 6 new after 7 cached (position 6 pending); seq 1: a prefill of 5 (4 pending)
    b.seqs.push_back({.cache_slot = 1, .block_table = {3}, .num_computed_tokens = 7, .num_new_tokens = 6});
    b.seqs.push_back({.cache_slot = 0, .block_table = {5}, .num_computed_tokens = 0, .num_new_tokens = 5});
    for (int i = 0; i < 11; ++i) b.token_ids.push_back(int32_t(10 + i));
    b.logits_indices = {5, 10};
    validate_forward_batch(b, g, true, c.vocab_size);
    const StepPlan m = build_step_plan(specs, dims, g, b);
    const std::vector<int64_t> pos = {7, 8, 9, 10, 11, 12, 0, 1, 2, 3, 4};
    ASSERT_EQ(m.pos, pos);
    for (const KindKey& kk : kinds) {
      const CompressPlan* k = m.kind(kk.ratio, false);
      ASSERT_NE(k, nullptr);
      const int64_t r = k->ratio, epb = g.block_tokens / r;
      // Entries the step completes: seq 0 entries floor(7/r) .. floor(13/r)-1, seq 1 0 .. floor(5/r)-1.
      std::vector<int64_t> want_pos, want_dst;
      for (int64_t j = 7 / r; j < 13 / r; ++j) want_pos.push_back(j * r), want_dst.push_back(3 * epb + j);
      for (int64_t j = 0; j < 5 / r; ++j) want_pos.push_back(j * r), want_dst.push_back(5 * epb + j);
      EXPECT_EQ(k->entry_pos, want_pos) << "ratio " << r;
      EXPECT_EQ(k->entry_dst, want_dst) << "ratio " << r;
      for (int64_t t = 0; t < m.T; ++t) {
        const int64_t n = (pos[size_t(t)] + 1) / r;  // visible iff s < floor((t+1)/r)
        ASSERT_EQ(k->cand_count[size_t(t)], n) << "ratio " << r << " token " << t;
        const int64_t block = t < 6 ? 3 : 5;
        for (int64_t j = 0; j < n; ++j)  // entry j is candidate j, in order
          EXPECT_EQ(k->cand_rows[size_t(k->cand_offset[size_t(t)] + j)], block * epb + j);
      }
      if (r == 2) {
        // Seq 0's first staged row is position 6 from slot 1's partial ring; its last new row (12)
        // and seq 1's (4) are stored as the pending halves of the next pairs.
        ASSERT_FALSE(k->launches.empty());
        EXPECT_EQ(k->launches[0].lo, 6);
        EXPECT_EQ(k->stage_src[0], 1 * k->state_rows + 6 % k->state_rows);
        bool kept12 = false, kept4 = false;
        for (size_t i = 0; i < k->state_src.size(); ++i) {
          kept12 |= k->state_src[i] == 5 && k->state_dst[i] == 1 * k->state_rows + 12 % k->state_rows;
          kept4 |= k->state_src[i] == 10 && k->state_dst[i] == 0 * k->state_rows + 4 % k->state_rows;
        }
        EXPECT_TRUE(kept12 && kept4);
      } else {
        EXPECT_TRUE(k->state_src.empty());  // ratio 1 keeps no partial rows
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::model

namespace deepinfer::model {
namespace {
// Bounded replay: the tail layers' window runs start at each sequence's decoder_from, inside the
// shared staging; where no window reaches before a tail the lists stay empty (win_* serve).
TEST(V41StepPlan, TailWindowsStartAtTheTail) {
  const v41::DeepseekV41Config c = v41::DeepseekV41Config::from_file((v41_test::golden("v41_a") / "config.json").string());
  const ModelPlan plan = v41::v41_plan(c, {.max_rollback = 4, .replay_keep = 12});
  for (const LayerPlan& p : plan.layers) EXPECT_EQ(p.replay_tail, p.index > c.candidate_source_layer_id) << p.index;
  EXPECT_EQ(plan.replay_keep, 12);
  const auto specs = cache_specs(plan, {.head_dim = c.head_dim, .index_head_dim = c.index_head_dim});
  const StepPlanDims dims{.n_streams = c.hc_mult, .index_topk = c.index_topk, .topk_experts = c.num_experts_per_tok};
  const kv::CacheGeometry g = kv::plan_cache_geometry(
      specs, kv::cache_slot_bytes(specs, 4) * 2 + kv::cache_block_bytes(specs, kv::default_block_tokens(specs), 4) * 8,
      2, 4, "test");
  const int64_t W = c.sliding_window;  // 8
  ForwardBatch b;  // seq 0: positions 9..14 of a tail starting at 9; seq 1: positions 3..4, no tail
  b.seqs.push_back({.cache_slot = 1, .block_table = {3}, .num_computed_tokens = 9, .num_new_tokens = 6,
                    .decoder_from = 9});
  b.seqs.push_back({.cache_slot = 0, .block_table = {5}, .num_computed_tokens = 3, .num_new_tokens = 2});
  for (int i = 0; i < 8; ++i) b.token_ids.push_back(int32_t(10 + i));
  validate_forward_batch(b, g, true, c.vocab_size);
  const StepPlan m = build_step_plan(specs, dims, g, b);
  ASSERT_EQ(m.tail_win_begin.size(), 8u);
  // Seq 0 stages positions 2..14 (W-1 ring rows, then its 6 new rows); position p's tail run is
  // [max(9, p-W+1), p].
  for (int64_t j = 0; j < 6; ++j) {
    const int64_t p = 9 + j, lo = std::max<int64_t>(9, p - W + 1);
    EXPECT_EQ(m.tail_win_begin[size_t(j)], lo - 2) << p;
    EXPECT_EQ(m.tail_win_count[size_t(j)], p - lo + 1) << p;
    EXPECT_EQ(m.win_count[size_t(j)], W) << p;  // the encoder side's full windows
  }
  for (size_t t = 6; t < 8; ++t) {  // no tail: the same runs
    EXPECT_EQ(m.tail_win_begin[t], m.win_begin[t]);
    EXPECT_EQ(m.tail_win_count[t], m.win_count[t]);
  }
  // A step whose windows all lie inside their tails (decode after the prompt) needs no lists.
  ForwardBatch d;
  d.seqs.push_back({.cache_slot = 1, .block_table = {3}, .num_computed_tokens = 17, .num_new_tokens = 1,
                    .decoder_from = 9});
  d.token_ids = {7};
  validate_forward_batch(d, g, true, c.vocab_size);
  EXPECT_TRUE(build_step_plan(specs, dims, g, d).tail_win_begin.empty());
}
}  // namespace
}  // namespace deepinfer::model
