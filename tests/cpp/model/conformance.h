// The CausalLM conformance suite: one TEST_P over every model x backend x numerics case, checking
// the properties the engine relies on (issue #10):
//  - full == chunked (random cuts) == token-by-token, bit for bit where the backend promises it;
//  - a sequence in a batch of others == the sequence alone;
//  - rollback: dropping the last n <= max_rollback positions (after random chunks and random
//    "draft" tokens) and continuing with other tokens == recomputing the final sequence fresh;
//  - rollback at every accept length: verify steps of 1 + L tokens keeping 1 + a of them, for each
//    a in 0..L, == recomputing the kept sequence (every cache kind of every fixture: windows,
//    overlapping and disjoint compressor partials, index keys, paged entries);
//  - the drafter (when the model has one): its greedy draft after a prompt == the argmax of the
//    reference draft logits (fixture goldens), and proposing twice after a rollback gives the same;
//    its own ring after verify steps with rejected drafts (and the drafts it wrote past them) ==
//    a fresh drafter fed the kept sequence at once (draft logits compared).
// Instantiated by tests/cpp/model/conformance_cpu_test.cc (CPU, in CI) and
// tests/cpp/cuda_model/conformance_gpu_test.cc (CUDA backend, exact/bf16/production).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "golden.h"
#include "model/deepseek/model.h"
#include "model/drafter.h"
#include "model/sequence_runner.h"

namespace deepinfer::testing {

struct ConformanceCase {
  std::string name;     // "<fixture>/<backend>/<numerics>"
  std::string fixture;  // tests/data/golden/<fixture>
  // Loads the fixture with `max_rollback` ring slack; null when the backend is unavailable (skip).
  std::function<std::unique_ptr<model::ds::DeepseekModel>(const std::string& dir, int64_t max_rollback)> load;
  bool bit_exact_paths = false;  // full / chunked / token-by-token agree bit for bit
  bool bit_exact_rollback = true;  // rollback == the same cuts without the rejected tokens, bit for bit
  double tol = 1e-5;             // otherwise: max |Δlogit| relative to the largest |logit| of the row set
  bool argmax_exact = true;      // greedy tokens must agree
  std::string sequence;          // inputs.json key of the sequence ("": "long", else the first)
};
inline std::ostream& operator<<(std::ostream& os, const ConformanceCase& c) { return os << c.name; }

class CausalLMConformance : public ::testing::TestWithParam<ConformanceCase> {
 protected:
  void SetUp() override {
    dir_ = golden_dir(GetParam().fixture);
    if (!std::filesystem::exists(dir_ + "/config.json")) GTEST_SKIP() << "fixture " << dir_ << " absent";
    model_ = GetParam().load(dir_, kRollback);
    if (!model_) GTEST_SKIP() << GetParam().name << ": backend unavailable";
    model_->allocate_cache_for(4, 1024);
    const auto in = read_inputs(dir_);
    const std::string key = !GetParam().sequence.empty() ? GetParam().sequence : in.count("long") ? "long" : "";
    ids_ = key.empty() ? in.begin()->second : in.at(key);
  }
  static constexpr int64_t kRollback = 5;

  // Logits of every position of `ids` in one slot, cut into `chunks`.
  std::vector<float> run(const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks, int32_t slot = 0) {
    const Tensor t = model::run_sequence(*model_, model_->cache_geometry(), ids, chunks, slot);
    return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  }
  // Checks two logits sets of `rows` rows: bit for bit when `bit_exact`, else the case's tolerance.
  void expect_same(const std::vector<float>& a, const std::vector<float>& b, int64_t rows, const std::string& what,
                   bool bit_exact) {
    const int64_t V = model_->vocab_size();
    ASSERT_EQ(a.size(), b.size()) << what;
    if (bit_exact) {
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << ": not bit-identical";
      return;
    }
    float scale = 0.f, diff = 0.f;
    int64_t flips = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = a.data() + r * V;
      const float* y = b.data() + r * V;
      for (int64_t v = 0; v < V; ++v) {
        scale = std::max(scale, std::fabs(x[v]));
        diff = std::max(diff, std::fabs(x[v] - y[v]));
      }
      flips += (std::max_element(x, x + V) - x) != (std::max_element(y, y + V) - y);
    }
    std::printf("[conformance] %s %s: max|d| %.3g (rel %.3g), argmax flips %lld/%lld\n", GetParam().name.c_str(),
                what.c_str(), diff, diff / std::max(scale, 1e-30f), (long long)flips, (long long)rows);
    EXPECT_LE(diff, GetParam().tol * std::max(scale, 1.f)) << what;
    if (GetParam().argmax_exact) { EXPECT_EQ(flips, 0) << what; }
  }

  std::string dir_;
  std::unique_ptr<model::ds::DeepseekModel> model_;
  std::vector<int32_t> ids_;
};

TEST_P(CausalLMConformance, FullChunkedTokenByToken) {
  const int64_t T = int64_t(ids_.size());
  const std::vector<float> full = run(ids_, {T});
  const bool exact = GetParam().bit_exact_paths;
  expect_same(full, run(ids_, random_chunks(T, 11)), T, "chunked", exact);
  expect_same(full, run(ids_, std::vector<int64_t>(size_t(T), 1)), T, "token-by-token", exact);
}

TEST_P(CausalLMConformance, BatchEqualsAlone) {
  const int64_t V = model_->vocab_size();
  std::vector<model::InterleavedSequence> seqs(3);
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].ids.assign(ids_.begin() + int64_t(i) * 7, ids_.end() - int64_t(i) * 13);
    seqs[i].seq.cache_slot = int32_t(i + 1);
    seqs[i].seq.block_table = model::slot_block_table(model_->cache_geometry(), int32_t(i + 1));
  }
  model::run_interleaved(*model_, seqs, 7, 17);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t T = int64_t(seqs[i].ids.size());
    const std::vector<float> alone = run(seqs[i].ids, {T}, 0);
    ASSERT_EQ(seqs[i].logits.size(), size_t(T * V));
    // Batched rows may round differently from the same rows alone (GEMM blocking by M): tolerance.
    expect_same(alone, seqs[i].logits, T, "batched seq " + std::to_string(i), false);
  }
}

TEST_P(CausalLMConformance, RollbackEqualsRecompute) {
  ASSERT_EQ(model_->max_rollback(), kRollback);
  const int64_t V = model_->vocab_size(), T = int64_t(ids_.size());
  std::mt19937 gen(123);
  for (int trial = 0; trial < 4; ++trial) {
    // The sequence that is finally kept, and a run that reaches it through rejected drafts.
    std::vector<int32_t> kept(ids_.begin(), ids_.begin() + std::min<int64_t>(T, 40 + 37 * trial));
    const int32_t slot = 2;
    model_->reset_slot(slot);
    model::SeqInBatch s;
    s.cache_slot = slot;
    s.block_table = model::slot_block_table(model_->cache_geometry(), slot);
    std::vector<float> got(kept.size() * size_t(V), 0.f);
    int64_t done = 0;  // positions in the cache that belong to `kept`
    std::vector<int64_t> cuts;
    std::uniform_int_distribution<int64_t> chunk(1, 23), drafts(1, kRollback), tok(0, V - 1);
    while (done < int64_t(kept.size())) {
      const int64_t n = std::min<int64_t>(chunk(gen), int64_t(kept.size()) - done);
      cuts.push_back(n);
      // The next n kept tokens, then d speculative tokens that are rejected.
      const int64_t d = drafts(gen);
      model::ForwardBatch b;
      b.token_ids.assign(kept.begin() + done, kept.begin() + done + n);
      for (int64_t j = 0; j < d; ++j) b.token_ids.push_back(int32_t(tok(gen)));
      s.num_computed_tokens = done;
      s.num_new_tokens = int32_t(n + d);
      b.seqs = {s};
      for (int64_t i = 0; i < n; ++i) b.logits_indices.push_back(int32_t(i));
      const Tensor l = model_->forward(b);
      std::copy_n(l.data<float>(), n * V, got.data() + done * V);
      model_->rollback(slot, done + n + d, done + n);
      done += n;
    }
    // The same chunks without the rejected tokens: bit for bit where chunking is; one full pass: tolerance.
    const std::vector<float> same_cuts = run(kept, cuts, 3);
    expect_same(same_cuts, got, int64_t(kept.size()), "rollback trial " + std::to_string(trial),
                GetParam().bit_exact_rollback);
    expect_same(run(kept, {int64_t(kept.size())}, 3), got, int64_t(kept.size()),
                "rollback vs full, trial " + std::to_string(trial), GetParam().bit_exact_paths);
  }
  EXPECT_THROW(model_->rollback(2, 100, 100 - kRollback - 1), InvalidArgument);
}

TEST_P(CausalLMConformance, RollbackEveryAcceptLength) {
  const int64_t V = model_->vocab_size(), T = int64_t(ids_.size()), L = kRollback - 1;
  std::mt19937 gen(77);
  for (int64_t a = 0; a <= L; ++a) {
    // A prefill, then verify steps of the next kept token + L drafts of which the first a are
    // kept (the accepted run) and the rest random (rejected, rolled back).
    const std::vector<int32_t> kept(ids_.begin(), ids_.begin() + std::min<int64_t>(T, 60 + 23 * a));
    const int32_t slot = 1;
    model_->reset_slot(slot);
    model::SeqInBatch s{.cache_slot = slot, .block_table = model::slot_block_table(model_->cache_geometry(), slot)};
    std::vector<float> got(kept.size() * size_t(V), 0.f);
    std::vector<int64_t> cuts;
    int64_t done = 0;
    while (done < int64_t(kept.size())) {
      const int64_t n = done == 0 ? 17 : std::min<int64_t>(1 + a, int64_t(kept.size()) - done);
      const int64_t d = done == 0 ? 0 : L - (n - 1);  // rejected drafts after the accepted run
      model::ForwardBatch b;
      b.token_ids.assign(kept.begin() + done, kept.begin() + done + n);
      for (int64_t j = 0; j < d; ++j) b.token_ids.push_back(int32_t(gen() % uint64_t(V)));
      s.num_computed_tokens = done;
      s.num_new_tokens = int32_t(n + d);
      b.seqs = {s};
      for (int64_t i = 0; i < n; ++i) b.logits_indices.push_back(int32_t(i));
      const Tensor l = model_->forward(b);
      std::copy_n(l.data<float>(), n * V, got.data() + done * V);
      model_->rollback(slot, done + n + d, done + n);
      cuts.push_back(n);
      done += n;
    }
    expect_same(run(kept, cuts, 3), got, int64_t(kept.size()), "accept " + std::to_string(a),
                GetParam().bit_exact_rollback);
  }
}

TEST_P(CausalLMConformance, DrafterRollbackEqualsRecompute) {
  model::Drafter* drafter = model_->drafter();
  if (!drafter) GTEST_SKIP() << GetParam().name << " has no drafter";
  const int64_t V = model_->vocab_size(), L = kRollback - 1;
  const int64_t T = std::min<int64_t>(int64_t(ids_.size()), 90);
  std::mt19937 gen(5);
  const kv::CacheGeometry& g = model_->cache_geometry();
  const int32_t slot = 1, fresh = 2;
  model_->reset_slot(slot);
  auto draft_rows = [&](int32_t sl, int64_t first, const std::vector<int32_t>& next, const Tensor& hidden,
                        int64_t first_row) {
    model::DraftBatch db;
    db.seqs.push_back({.cache_slot = sl, .block_table = model::slot_block_table(g, sl), .first_position = first,
                       .num_positions = int32_t(next.size()), .next_tokens = next, .num_drafts = int32_t(L),
                       .first_hidden_row = first_row});
    db.target_hidden.host = hidden;
    db.target_hidden.rows = hidden.size(0);
    db.target_hidden.row_elems = hidden.numel() / std::max<int64_t>(hidden.size(0), 1);
    Tensor logits;
    drafter->propose(db, &logits);
    return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
  };
  model::SeqInBatch s{.cache_slot = slot, .block_table = model::slot_block_table(g, slot)};
  int64_t done = 0;
  for (int step = 0; done + 8 < T; ++step) {
    // Target step over the kept tokens [done, done + n) plus rejected drafts; hidden rows of all.
    const int64_t n = step == 0 ? 20 : 1 + int64_t(gen() % uint64_t(L + 1)), d = step == 0 ? 0 : L + 1 - n;
    model::ForwardBatch b;
    b.token_ids.assign(ids_.begin() + done, ids_.begin() + done + n);
    for (int64_t j = 0; j < d; ++j) b.token_ids.push_back(int32_t(gen() % uint64_t(V)));
    s.num_computed_tokens = done;
    s.num_new_tokens = int32_t(n + d);
    b.seqs = {s};
    for (int64_t i = 0; i < n + d; ++i) b.hidden_indices.push_back(int32_t(i));
    const model::ForwardOutput o = model_->run(b, {});
    model_->rollback(slot, done + n + d, done + n);
    // The drafter is fed the committed positions (with the token after each) and drafts L
    // (writing its ring past them, like the engine does every step).
    const std::vector<int32_t> next(ids_.begin() + done + 1, ids_.begin() + done + n + 1);
    const std::vector<float> got = draft_rows(slot, done, next, o.hidden.host, 0);
    model_->rollback(slot, done + n + L, done + n);
    done += n;
    // Fresh: the whole kept prefix at once in another slot.
    model_->reset_slot(fresh);
    Tensor hidden;
    const std::vector<int32_t> prefix(ids_.begin(), ids_.begin() + done);
    model::run_sequence(*model_, g, prefix, {done}, fresh, &hidden);
    const std::vector<int32_t> all_next(ids_.begin() + 1, ids_.begin() + done + 1);
    const std::vector<float> want = draft_rows(fresh, 0, all_next, hidden, 0);
    expect_same(want, got, L, "drafter after step " + std::to_string(step), false);
  }
}

TEST_P(CausalLMConformance, SlotSnapshotRestores) {
  // A slot's fixed state saved after a prefix, restored into another slot (with the prefix's paged
  // blocks copied by the caller, as prefix reuse will), continues exactly like the original.
  const int64_t V = model_->vocab_size(), T = int64_t(ids_.size()), cut = std::min<int64_t>(T - 1, 101);
  const std::vector<int32_t> prefix(ids_.begin(), ids_.begin() + cut), rest(ids_.begin() + cut, ids_.end());
  model::SeqInBatch a;
  a.cache_slot = 1;
  a.block_table = model::slot_block_table(model_->cache_geometry(), 1);
  model_->reset_slot(1);
  model::ForwardBatch b;
  b.token_ids = prefix;
  a.num_computed_tokens = 0;
  a.num_new_tokens = int32_t(cut);
  b.seqs = {a};
  model_->forward(b);
  const model::SlotSnapshot snap = model_->save_slot(1, cut);
  EXPECT_EQ(snap.num_tokens, cut);
  EXPECT_GT(snap.bytes.size(), 0u);
  // Continue in the original slot.
  auto tail = [&](int32_t slot, const std::vector<int32_t>& table) {
    model::ForwardBatch c;
    c.token_ids = rest;
    model::SeqInBatch s{.cache_slot = slot, .block_table = table, .num_computed_tokens = cut,
                        .num_new_tokens = int32_t(rest.size())};
    c.seqs = {s};
    for (size_t i = 0; i < rest.size(); ++i) c.logits_indices.push_back(int32_t(i));
    const Tensor l = model_->forward(c);
    return std::vector<float>(l.data<float>(), l.data<float>() + l.numel());
  };
  // Restore into slot 2 reading slot 1's paged blocks (shared, as a prefix hit shares them).
  model_->reset_slot(2);
  model_->restore_slot(2, snap);
  const std::vector<float> restored = tail(2, a.block_table);
  const std::vector<float> original = tail(1, a.block_table);
  expect_same(original, restored, int64_t(rest.size()), "restored slot", true);
  (void)V;
}

// The host tier's block copies and prefix reuse's checkpoint rule: slot 1's prefix blocks
// copied out to host memory and into slot 2's own blocks, with slot 1's checkpoint restored into
// slot 2, continue exactly like slot 1; a slot saves only within max_rollback of what it wrote.
TEST_P(CausalLMConformance, BlockCopiesAndCheckpointRule) {
  const int64_t T = int64_t(ids_.size()), cut = std::min<int64_t>(T - 1, 77);
  const kv::CacheGeometry& g = model_->cache_geometry();
  const std::vector<int32_t> t1 = model::slot_block_table(g, 1), t2 = model::slot_block_table(g, 2);
  model_->reset_slot(1);
  model::ForwardBatch b;
  b.token_ids.assign(ids_.begin(), ids_.begin() + cut);
  b.seqs = {{.cache_slot = 1, .block_table = t1, .num_computed_tokens = 0, .num_new_tokens = int32_t(cut)}};
  model_->forward(b);
  const int64_t R = model_->max_rollback();
  EXPECT_TRUE(model_->can_save_slot(1, cut));
  EXPECT_TRUE(model_->can_save_slot(1, cut - R));
  EXPECT_FALSE(model_->can_save_slot(1, cut - R - 1));
  EXPECT_FALSE(model_->can_save_slot(1, cut + 1));
  EXPECT_THROW(model_->save_slot(1, cut - R - 1), InvalidArgument);
  const model::SlotSnapshot snap = model_->save_slot(1, cut);
  const size_t bb = model_->paged_block_bytes();
  ASSERT_GT(bb, 0u);
  const int64_t nb = (cut + g.block_tokens - 1) / g.block_tokens;
  std::shared_ptr<uint8_t> host = model_->allocate_host_memory(bb * size_t(nb));
  std::vector<model::HostBlockCopy> out, in;
  for (int64_t i = 0; i < nb; ++i) {
    out.push_back({t1[size_t(i)], host.get() + size_t(i) * bb});
    in.push_back({t2[size_t(i)], host.get() + size_t(i) * bb});
  }
  model_->copy_blocks_to_host(out);
  model_->copy_blocks_from_host(in);
  EXPECT_THROW(model_->copy_blocks_to_host(std::vector<model::HostBlockCopy>{{int32_t(g.num_blocks), host.get()}}),
               InvalidArgument);
  model_->reset_slot(2);
  model_->restore_slot(2, snap);
  const std::vector<int32_t> rest(ids_.begin() + cut, ids_.end());
  auto tail = [&](int32_t slot, const std::vector<int32_t>& table) {
    model::ForwardBatch c;
    c.token_ids = rest;
    c.seqs = {{.cache_slot = slot, .block_table = table, .num_computed_tokens = cut,
               .num_new_tokens = int32_t(rest.size())}};
    for (size_t i = 0; i < rest.size(); ++i) c.logits_indices.push_back(int32_t(i));
    const Tensor l = model_->forward(c);
    return std::vector<float>(l.data<float>(), l.data<float>() + l.numel());
  };
  const std::vector<float> copied = tail(2, t2), original = tail(1, t1);
  expect_same(original, copied, int64_t(rest.size()), "copied blocks + restored slot", true);
}

TEST_P(CausalLMConformance, QueuedSlotSavesEqualSaveSlot) {
  // queue_save_slots gives the snapshots save_slot takes, of two slots at different lengths, even
  // with a forward that writes both slots queued before wait() (a device backend copies them
  // stream-ordered, ahead of that forward); a second round reuses the staging.
  const int64_t T = int64_t(ids_.size()), cut = std::min<int64_t>(T - 1, 53), cut2 = std::max<int64_t>(cut - 9, 1);
  const kv::CacheGeometry& g = model_->cache_geometry();
  const std::vector<int32_t> t1 = model::slot_block_table(g, 1), t2 = model::slot_block_table(g, 2);
  auto run = [&](int64_t from1, int64_t to1, int64_t from2, int64_t to2) {
    model::ForwardBatch b;
    b.token_ids.assign(ids_.begin() + from1, ids_.begin() + to1);
    b.token_ids.insert(b.token_ids.end(), ids_.begin() + from2, ids_.begin() + to2);
    b.seqs = {{.cache_slot = 1, .block_table = t1, .num_computed_tokens = from1, .num_new_tokens = int32_t(to1 - from1)},
              {.cache_slot = 2, .block_table = t2, .num_computed_tokens = from2, .num_new_tokens = int32_t(to2 - from2)}};
    model_->forward(b);
  };
  model_->reset_slot(1);
  model_->reset_slot(2);
  run(0, cut, 0, cut2);
  const model::SlotSnapshot want1 = model_->save_slot(1, cut), want2 = model_->save_slot(2, cut2);
  const std::vector<model::SlotSave> saves = {{1, cut}, {2, cut2}};
  std::unique_ptr<model::PendingSlotSaves> pending = model_->queue_save_slots(saves);
  run(cut, T, cut2, T);  // writes both slots' rings before the copies are waited for
  const std::vector<model::SlotSnapshot> got = pending->wait();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].num_tokens, cut);
  EXPECT_EQ(got[1].num_tokens, cut2);
  EXPECT_TRUE(got[0].bytes == want1.bytes) << "slot 1's queued snapshot differs from save_slot's";
  EXPECT_TRUE(got[1].bytes == want2.bytes) << "slot 2's queued snapshot differs from save_slot's";
  EXPECT_FALSE(model_->save_slot(1, T).bytes == want1.bytes) << "the second forward did not change slot 1";
  // Again (staging reused), and a dropped handle does not block the next round.
  model_->queue_save_slots(std::vector<model::SlotSave>{{1, T}});
  const std::vector<model::SlotSnapshot> again = model_->queue_save_slots(std::vector<model::SlotSave>{{1, T}})->wait();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_TRUE(again[0].bytes == model_->save_slot(1, T).bytes);
  EXPECT_THROW(model_->queue_save_slots(std::vector<model::SlotSave>{{1, T + 1}}), InvalidArgument);
}

TEST_P(CausalLMConformance, DrafterMatchesReference) {
  model::Drafter* drafter = model_->drafter();
  if (!drafter) GTEST_SKIP() << GetParam().name << " has no drafter";
  const int64_t V = model_->vocab_size();
  for (const auto& [name, ids] : read_inputs(dir_)) {
    const std::string path = dir_ + "/mtp_logits_" + name + ".npy";
    if (!std::filesystem::exists(path)) continue;
    const Npy ref = read_npy(path);  // [T-1, V]: draft logits after position t given token t+1
    const int64_t T = int64_t(ids.size());
    // Target pass over all but the last token, with every position's hidden rows.
    Tensor hidden;
    model::run_sequence(*model_, model_->cache_geometry(), std::vector<int32_t>(ids.begin(), ids.end() - 1),
                        {T - 1}, 0, &hidden);
    model::DraftBatch db;
    model::DraftSeq s;
    s.cache_slot = 0;
    s.block_table = model::slot_block_table(model_->cache_geometry(), 0);
    s.first_position = 0;
    s.num_positions = int32_t(T - 1);
    s.next_tokens.assign(ids.begin() + 1, ids.end());
    s.num_drafts = 3;
    db.seqs = {s};
    db.target_hidden.host = hidden;
    db.target_hidden.rows = T - 1;
    db.target_hidden.row_elems = hidden.numel() / (T - 1);
    Tensor logits;
    const auto out = drafter->propose(db, &logits);
    ASSERT_EQ(out.size(), 1u);
    ASSERT_EQ(out[0].tokens.size(), 3u) << name;
    const float* last = ref.data.data() + (T - 2) * V;
    EXPECT_EQ(out[0].tokens[0], int32_t(std::max_element(last, last + V) - last)) << name;
    ASSERT_EQ(logits.size(0), 3);
    // Rolled back and proposed again from the same state: the same drafts.
    model_->rollback(0, T - 1 + 2, T - 1);
    const auto again = drafter->propose(db, nullptr);
    EXPECT_EQ(again[0].tokens, out[0].tokens) << name;
  }
}

}  // namespace deepinfer::testing
