// Bounded replay (DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact, MODEL-DEEPSEEK-V41.md §2.2) on the
// V4.1 goldens: the encoder side (the layers up to the candidate source) computes exactly what a
// full prefill computes over every position; the tail layers run over the kept tail only, with
// windows that start at the tail. Checked here:
//  - encoder-side cache state (window rings, compressed entries, index keys, compressor partials)
//    byte-identical to a full prefill cut at the same position, and to a one-shot full prefill
//    with fixed-order products;
//  - the truncated-window oracle: a tail row whose decoder cone (tail layers x (window - 1)
//    positions back) lies inside the tail equals the full prefill's row bit for bit (fixed-order
//    products); the first tail row differs (its windows were cut); a tail split over chunks or
//    run token by token equals the tail in one chunk (the ring keeps the tail's rows);
//  - greedy generations against full prefill, the refusals (keep below window + rollback, logits
//    before the tail) and the knob reaching the model through the registry.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../model/golden.h"
#include "deepinfer/error.h"
#include "model/deepseek/forward.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/plan.h"
#include "model/registry.h"
#include "model/sequence_runner.h"
#include "test_util.h"

namespace {
using namespace deepinfer;
using deepinfer::model::v41::DeepseekV41Model;
using model::ForwardBatch;

constexpr int64_t kRollback = 4;

std::unique_ptr<DeepseekV41Model> load(const std::string& fixture, int64_t keep, bool invariant) {
  auto m = DeepseekV41Model::load(v41_test::golden(fixture).string(),
                                  {.max_rollback = kRollback, .batch_invariant = invariant, .replay_keep = keep});
  m->allocate_cache_for(1, 256);
  return m;
}

// Runs `ids` in slot 0 (reset first) in the given chunks with decoder_from = `from`, asking the
// logits of every position at or after `from`; returns them [T - from, V].
std::vector<float> run_tail(DeepseekV41Model& m, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks,
                            int64_t from) {
  m.reset_slot(0);
  const int64_t V = m.vocab_size();
  std::vector<float> out;
  int64_t done = 0;
  for (int64_t n : chunks) {
    ForwardBatch b;
    b.token_ids.assign(ids.begin() + done, ids.begin() + done + n);
    b.seqs.push_back({.cache_slot = 0, .block_table = model::slot_block_table(m.cache_geometry(), 0),
                      .num_computed_tokens = done, .num_new_tokens = int32_t(n), .decoder_from = from});
    for (int64_t p = std::max(done, from); p < done + n; ++p) b.logits_indices.push_back(int32_t(p - done));
    const model::ForwardOutput o = m.run(b, {});
    if (!b.logits_indices.empty()) {
      const float* l = o.logits.data<float>();
      out.insert(out.end(), l, l + int64_t(b.logits_indices.size()) * V);
    }
    done += n;
  }
  return out;
}

// Greedy continuation by `n` tokens (argmax, lowest id on ties) after a one-chunk prefill of `ids`
// with decoder_from = max(0, T - replay_keep()), as the engine's runner sets it.
std::vector<int32_t> greedy(DeepseekV41Model& m, const std::vector<int32_t>& ids, size_t n) {
  m.reset_slot(0);
  const int64_t V = m.vocab_size(), keep = m.replay_keep();
  const int64_t from = keep > 0 ? std::max<int64_t>(0, int64_t(ids.size()) - keep) : 0;
  std::vector<int32_t> out, step = ids;
  int64_t done = 0;
  while (out.size() < n) {
    ForwardBatch b;
    b.token_ids = step;
    b.seqs.push_back({.cache_slot = 0, .block_table = model::slot_block_table(m.cache_geometry(), 0),
                      .num_computed_tokens = done, .num_new_tokens = int32_t(step.size()), .decoder_from = from});
    b.logits_indices = {int32_t(step.size() - 1)};
    const model::ForwardOutput o = m.run(b, {});
    const float* l = o.logits.data<float>();
    int32_t best = 0;
    for (int32_t v = 1; v < V; ++v)
      if (l[v] > l[best]) best = v;
    out.push_back(best);
    done += int64_t(step.size());
    step = {best};
  }
  return out;
}

// The bytes of the first `layers` layers' caches of slot 0 (the CPU backend's host memory).
std::vector<uint8_t> encoder_state(DeepseekV41Model& m, int64_t layers) {
  std::vector<uint8_t> bytes;
  const auto& specs = m.cache_specs();
  const kv::CacheGeometry& g = m.cache_geometry();
  auto add = [&](const void* p, size_t n) {
    if (!p || n == 0) return;
    const uint8_t* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  };
  for (int64_t l = 0; l < layers; ++l) {
    const kv::LayerCacheSpec& s = specs[size_t(l)];
    const model::ds::LayerCacheRef c = m.backend().cache(l);
    add(c.window, size_t(s.ring_rows * s.head_dim) * 4);
    if (s.owns_entries()) {
      const int64_t rows = g.num_blocks * (g.block_tokens / s.ratio);
      add(c.entries, size_t(rows * s.head_dim) * 4);
      if (s.index_dim > 0) add(c.keys, size_t(rows * s.index_dim) * 4);
      add(c.state, size_t(s.state_rows * 2 * s.comp_width) * 4);
    }
  }
  return bytes;
}

int64_t tail_layers(const DeepseekV41Model& m) {
  return m.arch().plan.num_layers() - model::ds::replay_encoder_layers(m.arch().plan);
}

const std::vector<int32_t>& prompt(const std::string& fixture) {
  static std::map<std::string, std::vector<int32_t>> cache;
  auto it = cache.find(fixture);
  if (it == cache.end())
    it = cache.emplace(fixture, deepinfer::testing::read_inputs(v41_test::golden(fixture).string()).at("t161")).first;
  return it->second;
}

class V41Replay : public ::testing::TestWithParam<std::string> {};

TEST_P(V41Replay, EncoderSideStateEqualsFullPrefill) {
  const std::vector<int32_t>& ids = prompt(GetParam());
  const int64_t T = int64_t(ids.size()), keep = 40, from = T - keep;
  auto compact = load(GetParam(), keep, false);
  auto full = load(GetParam(), 0, false);
  ASSERT_EQ(compact->replay_keep(), keep);
  ASSERT_GT(tail_layers(*compact), 0);
  run_tail(*compact, ids, {T}, from);
  run_tail(*full, ids, {from, T - from}, 0);  // full prefill cut where compact cuts its encoder chunk
  const int64_t enc = model::ds::replay_encoder_layers(compact->arch().plan);  // the full model has no tail
  const std::vector<uint8_t> a = encoder_state(*compact, enc), b = encoder_state(*full, enc);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 0u);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << GetParam() << ": encoder state vs full prefill cut at " << from;
  // Fixed-order products: the same against the one-shot full prefill.
  auto compact_i = load(GetParam(), keep, true);
  auto full_i = load(GetParam(), 0, true);
  run_tail(*compact_i, ids, {T}, from);
  run_tail(*full_i, ids, {T}, 0);
  const std::vector<uint8_t> c = encoder_state(*compact_i, enc), d = encoder_state(*full_i, enc);
  ASSERT_EQ(c.size(), d.size());
  EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size()), 0) << GetParam() << ": encoder state vs one-shot full prefill";
}

TEST_P(V41Replay, TailRowsFollowTheTruncatedWindow) {
  const std::vector<int32_t>& ids = prompt(GetParam());
  const int64_t T = int64_t(ids.size()), keep = 40, from = T - keep;
  auto compact = load(GetParam(), keep, true);
  auto full = load(GetParam(), 0, true);
  const int64_t V = compact->vocab_size(), W = compact->arch().plan.layers[0].window, D = tail_layers(*compact);
  const std::vector<float> tail = run_tail(*compact, ids, {T}, from);
  const std::vector<float> whole = run_tail(*full, ids, {T}, 0);
  ASSERT_EQ(int64_t(tail.size()), keep * V);
  ASSERT_EQ(int64_t(whole.size()), T * V);
  // A row at p depends, through D tail layers of window W, on tail-layer rows back to p - D(W-1):
  // inside the tail it is the full prefill's row; the first tail row saw cut windows.
  const int64_t exact_from = from + D * (W - 1);
  ASSERT_LT(exact_from, T) << "the fixture's tail is too short for the check";
  int64_t exact = 0;
  for (int64_t p = exact_from; p < T; ++p) {
    EXPECT_EQ(std::memcmp(&tail[size_t((p - from) * V)], &whole[size_t(p * V)], size_t(V) * 4), 0) << "row " << p;
    ++exact;
  }
  EXPECT_NE(std::memcmp(&tail[0], &whole[size_t(from * V)], size_t(V) * 4), 0) << "the first tail row saw full windows";
  std::printf("[v41 replay] %s: keep %lld, %lld tail layers, window %lld: rows %lld..%lld equal full prefill\n",
              GetParam().c_str(), (long long)keep, (long long)D, (long long)W, (long long)exact_from, (long long)T - 1);
  EXPECT_GT(exact, 0);
  // The tail split across chunks (its ring rows carry over) and token by token: the same rows.
  const std::vector<float> split = run_tail(*compact, ids, {from + 5, 11, T - from - 16}, from);
  EXPECT_EQ(std::memcmp(split.data(), tail.data(), tail.size() * 4), 0) << "tail split over chunks";
  std::vector<int64_t> steps = {from};
  steps.resize(size_t(1 + keep), 1);
  const std::vector<float> tok = run_tail(*compact, ids, steps, from);
  EXPECT_EQ(std::memcmp(tok.data(), tail.data(), tail.size() * 4), 0) << "tail token by token";
}

// Greedy continuations after a compact prefill vs a full one. With the default keep (140) on these
// fixtures the cone of every decode row lies inside the tail (3 tail layers x window 8 or 12 <<
// 140), so the generations are those of full prefill; with the smallest keep allowed (window +
// rollback) the first tail rows are approximations and the generations may part.
TEST_P(V41Replay, GreedyGenerationsAgainstFullPrefill) {
  const std::vector<int32_t>& ids = prompt(GetParam());
  auto full = load(GetParam(), 0, true);
  const std::vector<int32_t> want = greedy(*full, ids, 24);
  auto dflt = load(GetParam(), model::v41::kDefaultReplayKeep, true);
  EXPECT_EQ(greedy(*dflt, ids, 24), want) << "keep 140";
  const int64_t W = full->arch().plan.layers[0].window;
  auto small = load(GetParam(), W + kRollback, true);
  const std::vector<int32_t> got = greedy(*small, ids, 24);
  size_t same = 0;
  while (same < got.size() && got[same] == want[same]) ++same;
  std::printf("[v41 replay] %s: keep %lld (window + rollback): greedy tokens equal to full prefill's: %zu of %zu\n",
              GetParam().c_str(), (long long)(W + kRollback), same, want.size());
  EXPECT_EQ(got.size(), want.size());
  // Deterministic: the same compact run twice gives the same tokens.
  EXPECT_EQ(greedy(*small, ids, 24), got);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V41Replay, ::testing::Values("v41_a", "v41_b"));

TEST(V41ReplayRefusals, KeepBelowWindowPlusRollbackNamesBoth) {
  const std::string dir = v41_test::golden("v41_a").string();  // window 8
  const std::string msg = v41_test::error_of<InvalidArgument>(
      [&] { DeepseekV41Model::load(dir, {.max_rollback = 6, .replay_keep = 13}); });
  V41_EXPECT_HAS(msg, "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS=13");
  V41_EXPECT_HAS(msg, "sliding window (8)");
  V41_EXPECT_HAS(msg, "maximum rollback (6)");
  EXPECT_NO_THROW(DeepseekV41Model::load(dir, {.max_rollback = 6, .replay_keep = 14}));
}

TEST(V41ReplayRefusals, RowsBeforeTheTailAreRefused) {
  auto m = load("v41_a", 20, false);
  ForwardBatch b;
  b.token_ids = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  b.seqs.push_back({.cache_slot = 0, .block_table = model::slot_block_table(m->cache_geometry(), 0),
                    .num_computed_tokens = 0, .num_new_tokens = 10, .decoder_from = 4});
  b.logits_indices = {2};
  const std::string msg = v41_test::error_of<InvalidArgument>([&] { m->run(b, {}); });
  V41_EXPECT_HAS(msg, "before its sequence's kept tail");
  // A model without bounded replay refuses the field rather than ignoring it.
  auto plain = load("v41_a", 0, false);
  b.logits_indices = {9};
  V41_EXPECT_HAS(v41_test::error_of<InvalidArgument>([&] { plain->run(b, {}); }), "no bounded replay");
  // An encoder-only step (no position reaches the tail) returns no rows and runs.
  b.seqs[0].decoder_from = 100;
  b.logits_indices.clear();
  EXPECT_EQ(m->run(b, {}).logits.numel(), 0);
}

TEST(V41ReplayRefusals, TheKnobsReachTheModelThroughTheRegistry) {
  model::ModelLoadOptions o;
  o.env.accelerator = Accelerator::kCPU;
  o.progress = false;
  o.limits.max_rollback = 6;
  o.env.yoco_truncation_mode = "compact";
  EXPECT_EQ(model::load_model(v41_test::golden("v41_a").string(), o)->replay_keep(), 140);
  o.env.yoco_keep_tokens = 30;
  EXPECT_EQ(model::load_model(v41_test::golden("v41_a").string(), o)->replay_keep(), 30);
  o.env.yoco_truncation_mode = "full";
  EXPECT_EQ(model::load_model(v41_test::golden("v41_a").string(), o)->replay_keep(), 0);
}

// Prefill time of a 2,048-token prompt, full vs compact (keep 140) on v41_a (10 layers, 3 of them
// after the candidate source). Opt-in (--gtest_also_run_disabled_tests): it takes a while.
TEST(V41ReplayTiming, DISABLED_Prefill2048) {
  std::vector<int32_t> ids(2048);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919 + 13) % 300);
  for (int64_t keep : {int64_t(0), model::v41::kDefaultReplayKeep}) {
    auto m = DeepseekV41Model::load(v41_test::golden("v41_a").string(), {.max_rollback = 6, .replay_keep = keep});
    m->allocate_cache_for(1, 2048);
    const int64_t from = keep > 0 ? int64_t(ids.size()) - keep : 0;
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      ForwardBatch b;
      b.token_ids = ids;
      b.seqs.push_back({.cache_slot = 0, .block_table = model::slot_block_table(m->cache_geometry(), 0),
                        .num_computed_tokens = 0, .num_new_tokens = int32_t(ids.size()), .decoder_from = from});
      b.logits_indices = {int32_t(ids.size() - 1)};
      m->reset_slot(0);
      const model::ForwardOutput o = m->run(b, {});
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      ASSERT_EQ(o.logits.numel(), m->vocab_size());
    }
    std::printf("[v41 replay timing] 2048-token prefill, keep %lld: %.1f ms (best of 3)\n", (long long)keep, best * 1e3);
  }
}

}  // namespace
