// The fixed-shape step planner extended to verify steps (several tokens per sequence):
//  - decode batches (one token per sequence) still get exactly the lists the decode-only planner
//    built (its code is kept below as the reference), so the existing GPU graphs are unchanged;
//  - a verify batch's fixed lists stage, per token, the same window and compressor rows as the
//    general plan (ring rows before the step, this step's rows after), store the same ring rows
//    and see the same candidates;
//  - the CPU backend running fixed plans (CpuBackend::use_fixed_shapes) gives the general path's
//    logits for verify steps with rollbacks in between, on every golden fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>

#include "golden.h"
#include "mtp_rounds.h"
#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v4/plan.h"
#include "model/plan/cache_specs.h"
#include "model/plan/step_plan.h"
#include "model/sequence_runner.h"

namespace deepinfer::model {
namespace {
using deepinfer::testing::golden_dir;

// The decode-only fixed planner as it was before verify steps (one token per sequence): the
// reference the generalised planner must reproduce bit for bit on decode batches.
StepPlan decode_plan_before_verify_steps(const std::vector<kv::LayerCacheSpec>& specs, const StepPlanDims& dims,
                                         const kv::CacheGeometry& g, const ForwardBatch& b, int64_t P,
                                         const std::vector<int64_t>& caps) {
  const int64_t B = int64_t(b.seqs.size()), n = dims.n_streams;
  StepPlan m;
  m.fixed = true;
  m.T = P;
  m.n_streams = n;
  m.window = specs[0].window;
  m.ring_rows = specs[0].ring_rows;
  const int64_t W = m.window, S = m.ring_rows;
  m.token_ids.assign(size_t(P), 0);
  m.pos.assign(size_t(P), 0);
  m.embed_src.assign(size_t(P * n), 0);
  m.win_src.resize(size_t(P * W));
  m.win_dst.assign(size_t(P * W), -1);
  m.win_begin.resize(size_t(P));
  m.win_count.assign(size_t(P), 1);
  m.win_store_src.resize(size_t(P));
  m.win_store_dst.assign(size_t(P), -1);
  m.max_window = W;
  for (int64_t t = 0; t < P; ++t) {
    m.win_begin[size_t(t)] = int32_t(t * W);
    m.win_store_src[size_t(t)] = t;
    for (int64_t j = 0; j < W; ++j) m.win_src[size_t(t * W + j)] = -(t + 1);
    m.win_dst[size_t(t * W)] = t * W;
    if (t >= B) continue;
    const SeqInBatch& s = b.seqs[size_t(t)];
    const int64_t p = s.num_computed_tokens, slot = s.cache_slot, prev = std::min(W - 1, p), first = p - prev;
    m.token_ids[size_t(t)] = b.token_ids[size_t(t)];
    m.pos[size_t(t)] = p;
    for (int64_t k = 0; k < n; ++k) m.embed_src[size_t(t * n + k)] = b.token_ids[size_t(t)];
    for (int64_t j = 0; j <= prev; ++j) {
      m.win_src[size_t(t * W + j)] = j < prev ? slot * S + (first + j) % S : -(t + 1);
      m.win_dst[size_t(t * W + j)] = t * W + j;
    }
    m.win_count[size_t(t)] = int32_t(prev + 1);
    m.win_store_dst[size_t(t)] = slot * S + p % S;
  }
  const std::vector<KindKey> kinds = compressor_kinds(specs);
  for (size_t ki = 0; ki < kinds.size(); ++ki) {
    CompressPlan k;
    k.ratio = kinds[ki].ratio;
    k.overlap = kinds[ki].overlap;
    k.state_rows = kinds[ki].state_rows;
    k.rows_per_token = k.overlap ? 2 * k.ratio : k.ratio;
    const int64_t mm = k.ratio, KS = k.state_rows, R = k.rows_per_token, epb = g.block_tokens / mm;
    k.entries_per_block = epb;
    k.max_count = caps[ki];
    k.stage_src.assign(size_t(P * R), 0);
    k.stage_dst.assign(size_t(P * R), -1);
    k.block.assign(size_t(P), -1);
    k.entry_pos.assign(size_t(P), 0);
    k.entry_dst.assign(size_t(P), -1);
    k.state_src.resize(size_t(P));
    k.state_dst.assign(size_t(P), -1);
    k.cand_offset.assign(size_t(P), 0);
    k.cand_count.assign(size_t(P), 0);
    for (int64_t t = 0; t < P; ++t) {
      k.state_src[size_t(t)] = t;
      for (int64_t r = 0; r < R; ++r) k.stage_src[size_t(t * R + r)] = -(t + 1);
      if (t >= B) continue;
      const SeqInBatch& s = b.seqs[size_t(t)];
      const int64_t p = s.num_computed_tokens, slot = s.cache_slot;
      auto entry_row = [&](int64_t i) { return int64_t(s.block_table[size_t(i / epb)]) * epb + i % epb; };
      k.state_dst[size_t(t)] = slot * KS + p % KS;
      if ((p + 1) % mm == 0) {
        const int64_t blk = (p + 1) / mm - 1, base = k.overlap ? mm * (blk - 1) : mm * blk;
        k.block[size_t(t)] = blk;
        k.entry_pos[size_t(t)] = mm * blk;
        k.entry_dst[size_t(t)] = entry_row(blk);
        for (int64_t r = 0; r < R; ++r) {
          const int64_t q = base + r;
          if (q < 0) continue;
          k.stage_src[size_t(t * R + r)] = q < p ? slot * KS + q % KS : -(t + 1);
          k.stage_dst[size_t(t * R + r)] = t * R + r;
        }
      }
      const int64_t count = (p + 1) / mm;
      k.cand_offset[size_t(t)] = int64_t(m.cand_pool.size());
      k.cand_count[size_t(t)] = int32_t(count);
      for (int64_t i = 0; i < count; ++i) m.cand_pool.push_back(int32_t(entry_row(i)));
    }
    m.kinds.push_back(std::move(k));
  }
  const int64_t K = std::max<int64_t>(dims.index_topk, 1);
  m.sel_offset.resize(size_t(P));
  for (int64_t i = 0; i < P; ++i) m.sel_offset[size_t(i)] = i * K;
  if (!b.hidden_indices.empty()) {
    m.hidden_rows.assign(size_t(P), 0);
    for (size_t i = 0; i < b.hidden_indices.size(); ++i) m.hidden_rows[i] = b.hidden_indices[i];
  }
  m.logits_rows.assign(size_t(P), 0);
  for (size_t i = 0; i < b.logits_indices.size(); ++i) m.logits_rows[i] = b.logits_indices[i];
  m.comb_rows.resize(size_t(P * dims.topk_experts));
  for (size_t i = 0; i < m.comb_rows.size(); ++i) m.comb_rows[i] = int64_t(i);
  return m;
}

void expect_same_plan(const StepPlan& a, const StepPlan& b, const std::string& what) {
  EXPECT_EQ(a.T, b.T) << what;
  EXPECT_EQ(a.token_ids, b.token_ids) << what;
  EXPECT_EQ(a.pos, b.pos) << what;
  EXPECT_EQ(a.embed_src, b.embed_src) << what;
  EXPECT_EQ(a.win_src, b.win_src) << what;
  EXPECT_EQ(a.win_dst, b.win_dst) << what;
  EXPECT_EQ(a.win_begin, b.win_begin) << what;
  EXPECT_EQ(a.win_count, b.win_count) << what;
  EXPECT_EQ(a.win_store_src, b.win_store_src) << what;
  EXPECT_EQ(a.win_store_dst, b.win_store_dst) << what;
  EXPECT_EQ(a.max_window, b.max_window) << what;
  EXPECT_EQ(a.sel_offset, b.sel_offset) << what;
  EXPECT_EQ(a.logits_rows, b.logits_rows) << what;
  EXPECT_EQ(a.hidden_rows, b.hidden_rows) << what;
  EXPECT_EQ(a.cand_pool, b.cand_pool) << what;
  EXPECT_EQ(a.comb_rows, b.comb_rows) << what;
  ASSERT_EQ(a.kinds.size(), b.kinds.size()) << what;
  for (size_t k = 0; k < a.kinds.size(); ++k) {
    const CompressPlan &x = a.kinds[k], &y = b.kinds[k];
    EXPECT_EQ(x.stage_src, y.stage_src) << what << " kind " << k;
    EXPECT_EQ(x.stage_dst, y.stage_dst) << what << " kind " << k;
    EXPECT_EQ(x.block, y.block) << what << " kind " << k;
    EXPECT_EQ(x.entry_pos, y.entry_pos) << what << " kind " << k;
    EXPECT_EQ(x.entry_dst, y.entry_dst) << what << " kind " << k;
    EXPECT_EQ(x.state_src, y.state_src) << what << " kind " << k;
    EXPECT_EQ(x.state_dst, y.state_dst) << what << " kind " << k;
    EXPECT_EQ(x.cand_offset, y.cand_offset) << what << " kind " << k;
    EXPECT_EQ(x.cand_count, y.cand_count) << what << " kind " << k;
    EXPECT_EQ(x.max_count, y.max_count) << what << " kind " << k;
  }
}

struct Fixture {
  std::vector<kv::LayerCacheSpec> specs;
  StepPlanDims dims;
  kv::CacheGeometry g;
  int64_t W = 0;
};

Fixture fixture(const std::string& name, int64_t rollback) {
  const v4::DeepseekV4Config cfg = v4::DeepseekV4Config::from_file(golden_dir(name));
  const ModelPlan plan = v4::v4_plan(cfg, {.max_rollback = rollback});
  Fixture f;
  f.specs = cache_specs(plan, {.head_dim = cfg.head_dim, .index_head_dim = cfg.index_head_dim});
  f.dims = {.n_streams = cfg.hc_mult, .index_topk = cfg.index_topk, .topk_experts = cfg.num_experts_per_tok};
  f.g = kv::plan_cache_geometry(f.specs, kv::cache_slot_bytes(f.specs, 4) * 8 +
                                             kv::cache_block_bytes(f.specs, kv::default_block_tokens(f.specs), 4) * 64,
                                8, 4, "test");
  f.W = cfg.sliding_window;
  return f;
}

// A random batch of `B` sequences in distinct slots, each with `per(rng)` new tokens after a
// random context.
ForwardBatch random_batch(const Fixture& f, std::mt19937& rng, int64_t B, int64_t max_new, int64_t max_ctx) {
  ForwardBatch b;
  const int64_t bpt = f.g.block_tokens, blocks_per_seq = f.g.num_blocks / f.g.num_slots;
  for (int64_t s = 0; s < B; ++s) {
    const int64_t n = 1 + int64_t(rng() % uint64_t(max_new));
    const int64_t ctx = int64_t(rng() % uint64_t(std::min(max_ctx, blocks_per_seq * bpt - n)));
    SeqInBatch q{.cache_slot = int32_t(s), .num_computed_tokens = ctx, .num_new_tokens = int32_t(n)};
    for (int64_t k = 0; k < blocks_per_seq; ++k) q.block_table.push_back(int32_t((B - 1 - s) * blocks_per_seq + k));
    for (int64_t j = 0; j < n; ++j) b.token_ids.push_back(int32_t(rng() % 200));
    b.seqs.push_back(std::move(q));
  }
  for (int64_t t = 0; t < b.num_tokens(); t += 2) b.logits_indices.push_back(int32_t(t));
  for (int64_t t = 0; t < b.num_tokens(); ++t) b.hidden_indices.push_back(int32_t(t));
  return b;
}
}  // namespace

TEST(FixedVerifyPlan, DecodeListsUnchanged) {
  for (const char* name : {"tiny", "tiny_prod"}) {
    if (!std::filesystem::exists(golden_dir(name) + "/config.json")) GTEST_SKIP() << "fixture absent";
    for (int64_t rollback : {0, 6}) {
      const Fixture f = fixture(name, rollback);
      const std::vector<int64_t> caps = fixed_candidate_caps(f.specs, 4096);
      std::mt19937 rng(11 + uint32_t(rollback));
      for (int trial = 0; trial < 40; ++trial) {
        const int64_t B = 1 + int64_t(rng() % 8);
        ForwardBatch b = random_batch(f, rng, B, 1, 300);
        if (trial % 3 == 0) b.hidden_indices.clear();
        ASSERT_TRUE(fixed_eligible(f.specs, b, caps));
        const int64_t P = decode_bucket(B);
        ASSERT_EQ(fixed_token_bucket(B), P);
        expect_same_plan(build_fixed_step_plan(f.specs, f.dims, f.g, b, P, caps),
                         decode_plan_before_verify_steps(f.specs, f.dims, f.g, b, P, caps),
                         std::string(name) + " trial " + std::to_string(trial));
      }
    }
  }
}

// Per token, the fixed plan stages the general plan's window rows (same sources, same order) and
// candidates, stores the same ring rows, and pads write nothing.
TEST(FixedVerifyPlan, VerifyBatchesMatchTheGeneralPlan) {
  for (const char* name : {"tiny", "tiny_prod"}) {
    if (!std::filesystem::exists(golden_dir(name) + "/config.json")) GTEST_SKIP() << "fixture absent";
    const Fixture f = fixture(name, 6);
    const std::vector<int64_t> caps = fixed_candidate_caps(f.specs, 4096);
    const FixedLimits lim{.max_tokens = 384, .max_tokens_per_seq = 7};
    std::mt19937 rng(5);
    for (int trial = 0; trial < 40; ++trial) {
      const ForwardBatch b = random_batch(f, rng, 1 + int64_t(rng() % 8), 7, 400);
      ASSERT_TRUE(fixed_eligible(f.specs, b, caps, lim)) << "trial " << trial;
      EXPECT_FALSE(fixed_eligible(f.specs, b, caps) && b.num_tokens() > int64_t(b.seqs.size()));
      const StepPlan g = build_step_plan(f.specs, f.dims, f.g, b);
      const int64_t P = fixed_token_bucket(b.num_tokens());
      const StepPlan x = build_fixed_step_plan(f.specs, f.dims, f.g, b, P, caps);
      const int64_t T = b.num_tokens(), W = x.window;
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(x.win_count[size_t(t)], g.win_count[size_t(t)]) << "token " << t;
        for (int32_t j = 0; j < x.win_count[size_t(t)]; ++j)
          EXPECT_EQ(x.win_src[size_t(t * W + j)], g.win_src[size_t(g.win_begin[size_t(t)] + j)]) << "token " << t;
        EXPECT_EQ(x.pos[size_t(t)], g.pos[size_t(t)]);
      }
      std::vector<int64_t> xs(x.win_store_dst.begin(), x.win_store_dst.begin() + T), gs = g.win_store_dst;
      std::sort(xs.begin(), xs.end());
      std::sort(gs.begin(), gs.end());
      EXPECT_EQ(xs, gs);
      for (int64_t t = T; t < P; ++t) EXPECT_EQ(x.win_store_dst[size_t(t)], -1);
      for (size_t k = 0; k < g.kinds.size(); ++k) {
        const CompressPlan &xk = x.kinds[k], &gk = g.kinds[k];
        for (int64_t t = 0; t < T; ++t) {
          ASSERT_EQ(xk.cand_count[size_t(t)], gk.cand_count[size_t(t)]);
          for (int32_t c = 0; c < xk.cand_count[size_t(t)]; ++c)
            EXPECT_EQ(x.cand_pool[size_t(xk.cand_offset[size_t(t)] + c)], gk.cand_rows[size_t(gk.cand_offset[size_t(t)] + c)]);
        }
        std::vector<int64_t> xe, ge = gk.entry_dst, xst, gst = gk.state_dst;
        for (int64_t t = 0; t < P; ++t) {
          if (xk.entry_dst[size_t(t)] >= 0) xe.push_back(xk.entry_dst[size_t(t)]);
          if (xk.state_dst[size_t(t)] >= 0) xst.push_back(xk.state_dst[size_t(t)]);
        }
        std::sort(xe.begin(), xe.end()), std::sort(ge.begin(), ge.end());
        std::sort(xst.begin(), xst.end()), std::sort(gst.begin(), gst.end());
        EXPECT_EQ(xe, ge) << "kind " << k;
        EXPECT_EQ(xst, gst) << "kind " << k;
      }
    }
    // More tokens per sequence than the limit, or than the rings hold, leaves the fixed path.
    ForwardBatch big = random_batch(f, rng, 2, 1, 100);
    big.seqs[0].num_new_tokens = 8;
    big.token_ids.insert(big.token_ids.end(), 7, 3);
    EXPECT_FALSE(fixed_eligible(f.specs, big, caps, lim));
    EXPECT_EQ(fixed_token_bucket(65), 96);
    EXPECT_EQ(fixed_token_bucket(385), 0);
  }
}

// Verify-shaped steps through fixed plans on the CPU backend give the general path's logits and
// hidden rows, with random rejected drafts rolled back between steps.
TEST(FixedVerifyPlan, CpuForwardMatchesGeneralPath) {
  for (const char* name : {"tiny", "tiny_clamp", "tiny_official", "tiny_prod"}) {
    const std::string dir = golden_dir(name);
    if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture absent";
    auto general = v4::DeepseekV4Model::load(dir, {.max_rollback = 6});
    auto fixed = v4::DeepseekV4Model::load(dir, {.max_rollback = 6});
    auto* cpu = dynamic_cast<ds::CpuBackend*>(&fixed->backend());
    ASSERT_NE(cpu, nullptr);
    cpu->use_fixed_shapes(4096, {.max_tokens = 384, .max_tokens_per_seq = 7});
    for (auto* m : {general.get(), fixed.get()}) m->allocate_cache_for(3, 512);
    const int64_t V = general->vocab_size();
    std::mt19937 rng(3);
    std::vector<int64_t> len(3, 0);
    for (int step = 0; step < 30; ++step) {
      ForwardBatch b;
      for (int32_t s = 0; s < 3; ++s) {
        // Step 0: a prefill (general path in both); then 1 + L tokens per sequence.
        const int64_t n = step == 0 ? 20 + 9 * s : 1 + int64_t(rng() % 6);
        b.seqs.push_back({.cache_slot = s, .block_table = slot_block_table(general->cache_geometry(), s),
                          .num_computed_tokens = len[size_t(s)], .num_new_tokens = int32_t(n)});
        for (int64_t j = 0; j < n; ++j) b.token_ids.push_back(int32_t(rng() % uint64_t(V)));
      }
      for (int64_t t = 0; t < b.num_tokens(); ++t) b.logits_indices.push_back(int32_t(t));
      b.hidden_indices = b.logits_indices;
      const ForwardOutput a = general->run(b, {}), c = fixed->run(b, {});
      ASSERT_EQ(a.logits.numel(), c.logits.numel());
      float worst = 0;
      for (int64_t i = 0; i < a.logits.numel(); ++i)
        worst = std::max(worst, std::abs(a.logits.data<float>()[i] - c.logits.data<float>()[i]));
      EXPECT_LT(worst, 2e-4) << name << " step " << step;
      ASSERT_EQ(a.hidden.rows, c.hidden.rows);
      // Accept a random prefix of each sequence's tokens; roll the rest back in both.
      for (size_t s = 0; s < 3; ++s) {
        const int64_t n = b.seqs[s].num_new_tokens, keep = step == 0 ? n : 1 + int64_t(rng() % uint64_t(n));
        for (auto* m : {general.get(), fixed.get()}) m->rollback(int32_t(s), len[s] + n, len[s] + keep);
        len[s] += keep;
      }
    }
  }
}

}  // namespace deepinfer::model

namespace deepinfer::model {
namespace {
// The MTP drafter's rounds through fixed plans (decode/verify shaped: round 0 feeds each
// sequence's committed positions, later rounds one draft each) on the CPU backend give the
// general path's draft logits and drafts, with verify steps and rollbacks in between, on the
// fixtures that have an MTP block (and the bundled default model when present).
TEST(FixedVerifyPlan, MtpDrafterRoundsMatchGeneralPath) {
  for (const std::string& dir : deepinfer::testing::mtp_fixture_dirs()) {
    constexpr int64_t kL = 5;
    auto general = v4::DeepseekV4Model::load(dir, {.max_rollback = kL + 1});
    auto fixed = v4::DeepseekV4Model::load(dir, {.max_rollback = kL + 1});
    ASSERT_NE(general->drafter(), nullptr) << dir;
    auto* cpu = dynamic_cast<ds::CpuBackend*>(&fixed->backend());
    ASSERT_NE(cpu, nullptr);
    cpu->use_fixed_shapes(4096, {.max_tokens = 384, .max_tokens_per_seq = kL + 2});
    const deepinfer::testing::MtpRounds a = deepinfer::testing::run_mtp_rounds(*general, kL, 16, 3);
    const deepinfer::testing::MtpRounds c = deepinfer::testing::run_mtp_rounds(*fixed, kL, 16, 3);
    EXPECT_EQ(a.drafts, c.drafts) << dir;
    EXPECT_LT(deepinfer::testing::max_abs_diff(a.logits, c.logits), 2e-4) << dir;
    EXPECT_LT(deepinfer::testing::max_abs_diff(a.logprobs, c.logprobs), 1e-4) << dir;
    EXPECT_EQ(int64_t(a.drafts.size()), 16 * 3 * kL) << dir;
    EXPECT_EQ(a.drafts_no_logits, a.drafts) << dir;
    EXPECT_EQ(c.drafts_no_logits, c.drafts) << dir;
    // Every target step but the prefill and every draft round but the first one after the
    // prefill ran fixed.
    EXPECT_GE(cpu->fixed_steps(), 15 + 16 * kL - 1) << dir;
  }
}

// The CPU backend's greedy_rows (the device drafter's pick, on host logits) vs the step's logits.
TEST(FixedVerifyPlan, CpuGreedyRowsMatchLogits) {
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture absent";
  auto m = v4::DeepseekV4Model::load(dir, {});
  m->allocate_cache_for(1, 512);
  ForwardBatch b;
  b.seqs.push_back({.cache_slot = 0, .block_table = slot_block_table(m->cache_geometry(), 0), .num_computed_tokens = 0,
                    .num_new_tokens = 9});
  for (int32_t t = 0; t < 9; ++t) b.token_ids.push_back(3 + 7 * t), b.logits_indices.push_back(t);
  const ForwardOutput o = m->run(b, {});
  std::vector<int32_t> tok(9);
  std::vector<float> lp(9);
  m->backend().greedy_rows(9, tok.data(), lp.data());
  const int64_t V = m->vocab_size();
  for (int64_t r = 0; r < 9; ++r) {
    const float* row = o.logits.data<float>() + r * V;
    const int64_t want = std::max_element(row, row + V) - row;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - double(row[want]));
    EXPECT_EQ(tok[size_t(r)], want) << r;
    EXPECT_NEAR(lp[size_t(r)], -std::log(sum), 1e-6) << r;
  }
  EXPECT_THROW(m->backend().greedy_rows(10, tok.data(), lp.data()), std::exception);  // more rows than the step
}
}  // namespace
}  // namespace deepinfer::model
