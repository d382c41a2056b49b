// The V4.1 forward on the CPU backend against the reference's golden logits (tests/data/golden/
// v41_{a,b} in transformers naming and v41_{a,b}_release in release naming, same weights): every
// golden sequence run whole, in odd chunks (which split ratio-2 pairs across steps) and token by
// token, each within 1e-4 of the golden and of each other. Exercises single-pass mHC, ratio-2
// pooling with pending pairs, ratio-1 projection, keys from the latent, Reuse / Reindex, the
// two-level top-k, gate_temp, Engram and the QAT round trips, all on the shared forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../model/golden.h"
#include "deepinfer/error.h"
#include "model/deepseek_v41/model.h"
#include "model/registry.h"
#include "model/sequence_runner.h"
#include "parity.h"
#include "test_util.h"

namespace {
using namespace deepinfer;
using deepinfer::model::v41::DeepseekV41Model;
using model::ForwardBatch;
using model::ForwardOutput;
using model::ModelLoadOptions;
using model::SlotSnapshot;

using v41_parity::cascades;
using v41_parity::Diff;
using v41_parity::diff;
using v41_parity::expect_loose;
using v41_parity::odd_chunks;

// What a path must meet: 1e-4 on almost every row, no greedy token changed. The QAT roundings turn
// last-bit differences (OpenBLAS rounds other chunk sizes differently; glibc's cosf/sinf and
// torch's vectorised ones disagree by one ulp on ~5% of the rope angles) into a whole FP4/FP8 step
// now and then (V41-REFERENCE-NOTES.md §1): measured, one entry of a KV source's cache differing by
// one FP4 step while its latent, its index keys and every selection agree. Such a flip moves the
// rows after it by up to ~0.3 on these fixtures; the rows before it stay within 1e-5.
// The one-shot forward must keep 90% of the rows within 1e-4 of the golden; chunked and token by
// token, whose GEMMs have other M and round differently, only the greedy tokens and the bound
// (with the routed weight before w2, v41_a t37 chunked flips one entry: 8 of 37 rows move by
// 3.2e-3; with it after w2 the same flip was in its token-by-token run).
void expect_close(const Diff& d, int64_t T, const std::string& what, bool bulk = true) {
  EXPECT_EQ(d.flips, 0) << what;
  if (bulk) {
    EXPECT_LE(d.rows_over * 10, std::max<int64_t>(T, 10)) << what << ": " << d.rows_over << " of " << T
                                                           << " rows beyond 1e-4 (max " << d.max << ")";
  }
  EXPECT_LE(d.max, 0.5) << what;
}

class V41Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(V41Golden, FullChunkedTokenByTokenMatchTheReference) {
  const std::string dir = v41_test::golden(GetParam()).string();
  auto m = DeepseekV41Model::load(dir);
  m->allocate_cache_for(1, 256);
  const int64_t V = m->vocab_size();
  for (const auto& [name, ids] : deepinfer::testing::read_inputs(dir)) {
    const deepinfer::testing::Npy want = deepinfer::testing::read_npy(dir + "/logits_" + name + ".npy");
    const int64_t T = int64_t(ids.size());
    ASSERT_EQ(int64_t(want.data.size()), T * V) << name;
    const Tensor full = model::run_sequence(*m, m->cache_geometry(), ids, {T});
    const Tensor chunked = model::run_sequence(*m, m->cache_geometry(), ids, odd_chunks(T));
    const Tensor decode = model::run_sequence(*m, m->cache_geometry(), ids, std::vector<int64_t>(size_t(T), 1));
    const Diff g = diff(full.data<float>(), want.data.data(), T, V);
    const Diff c = diff(chunked.data<float>(), full.data<float>(), T, V);
    const Diff d = diff(decode.data<float>(), full.data<float>(), T, V);
    const Diff cg = diff(chunked.data<float>(), want.data.data(), T, V);
    const Diff dg = diff(decode.data<float>(), want.data.data(), T, V);
    std::printf("[v41 golden] %s %s (T=%lld): max|d| full-golden %.3g (%lld rows > 1e-4), chunked-full %.3g (%lld), "
                "decode-full %.3g (%lld), chunked-golden %.3g (%lld), decode-golden %.3g (%lld)\n",
                GetParam().c_str(), name.c_str(), (long long)T, g.max, (long long)g.rows_over, c.max,
                (long long)c.rows_over, d.max, (long long)d.rows_over, cg.max, (long long)cg.rows_over, dg.max,
                (long long)dg.rows_over);
    if (v41_parity::cpu_cascades(GetParam(), name)) {
      for (const auto& [x, what] : {std::pair{g, " full vs golden"}, {c, " chunked vs full"}, {d, " token by token vs full"},
                                    {cg, " chunked vs golden"}, {dg, " token by token vs golden"}})
        expect_loose(x, T, name + what);
      continue;
    }
    expect_close(g, T, name + " full vs golden");
    expect_close(c, T, name + " chunked vs full", false);
    expect_close(d, T, name + " token by token vs full", false);
    expect_close(cg, T, name + " chunked vs golden", false);
    expect_close(dg, T, name + " token by token vs golden", false);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V41Golden,
                         ::testing::Values("v41_a", "v41_b", "v41_a_release", "v41_b_release"));

// With fixed-order products (DEEPINFER_BATCH_INVARIANT) the three paths are one computation: chunked
// and token by token equal the full forward bit for bit, QAT roundings included.
TEST(V41Golden, BatchInvariantPathsAreBitIdentical) {
  for (const char* f : {"v41_a", "v41_b"}) {
    const std::string dir = v41_test::golden(f).string();
    auto m = DeepseekV41Model::load(dir, {.batch_invariant = true});
    m->allocate_cache_for(1, 256);
    const int64_t V = m->vocab_size();
    for (const auto& [name, ids] : deepinfer::testing::read_inputs(dir)) {
      const int64_t T = int64_t(ids.size());
      const deepinfer::testing::Npy want = deepinfer::testing::read_npy(dir + "/logits_" + name + ".npy");
      const Tensor full = model::run_sequence(*m, m->cache_geometry(), ids, {T});
      const Tensor chunked = model::run_sequence(*m, m->cache_geometry(), ids, odd_chunks(T));
      const Tensor decode = model::run_sequence(*m, m->cache_geometry(), ids, std::vector<int64_t>(size_t(T), 1));
      const size_t bytes = size_t(T * V) * sizeof(float);
      EXPECT_EQ(std::memcmp(full.raw_data(), chunked.raw_data(), bytes), 0) << f << " " << name << " chunked";
      EXPECT_EQ(std::memcmp(full.raw_data(), decode.raw_data(), bytes), 0) << f << " " << name << " token by token";
      const Diff g = diff(full.data<float>(), want.data.data(), T, V);
      // Reported, not asserted: the fixed-order sums round differently from OpenBLAS and the reference,
      // so other QAT steps flip (v41_b t161: 0.54, 111 of 161 rows, one argmax); the default
      // numerics are held to the goldens above.
      std::printf("[v41 golden, batch-invariant] %s %s (T=%lld): max|d| vs golden %.3g (%lld rows > 1e-4, %lld argmax)\n",
                  f, name.c_str(), (long long)T, g.max, (long long)g.rows_over, (long long)g.flips);
    }
  }
}

TEST(V41Model, BothNamingsGiveTheSameLogits) {
  auto hf = DeepseekV41Model::load(v41_test::golden("v41_b").string());
  auto rel = DeepseekV41Model::load(v41_test::golden("v41_b_release").string());
  hf->allocate_cache_for(1, 64);
  rel->allocate_cache_for(1, 64);
  const auto ids = deepinfer::testing::read_inputs(v41_test::golden("v41_b").string()).at("t37");
  const Tensor a = model::run_sequence(*hf, hf->cache_geometry(), ids, {int64_t(ids.size())});
  const Tensor b = model::run_sequence(*rel, rel->cache_geometry(), ids, {int64_t(ids.size())});
  // The release file's FP8/FP4 values decode exactly to the float file's: the same forward bit for bit.
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), size_t(a.numel()) * 4), 0);
}

TEST(V41Model, TheRegistryLoadsIt) {
  ModelLoadOptions o;
  o.env.accelerator = Accelerator::kCPU;
  o.progress = false;
  auto m = model::load_model(v41_test::golden("v41_a").string(), o);
  EXPECT_NE(m->describe().find("DeepseekV41ForCausalLM"), std::string::npos) << m->describe();
  // nvidia: the GPU model (deepseek/cuda/v41_cuda_model.h) where there is one; refused with an error
  // otherwise (InvalidArgument without the CUDA backend, CudaError without a device).
  o.env.accelerator = Accelerator::kNvidia;
  if (model::accelerator_count() == 0) {
    EXPECT_ANY_THROW(model::load_model(v41_test::golden("v41_a").string(), o));
  }
}

TEST(V41Model, EngramHistoryTravelsInSnapshotsAndRollback) {
  auto m = DeepseekV41Model::load(v41_test::golden("v41_a").string(), {.max_rollback = 4});
  m->allocate_cache_for(3, 256);
  const auto ids = deepinfer::testing::read_inputs(v41_test::golden("v41_a").string()).at("t161");
  const int64_t T = int64_t(ids.size()), V = m->vocab_size(), cut = 64;
  const Tensor want = model::run_sequence(*m, m->cache_geometry(), ids, {T}, 0);
  // Slot 1: prefix, snapshot; slot 2 gets the prefix's blocks' contents by recomputing them, then the snapshot.
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + cut);
  model::run_sequence(*m, m->cache_geometry(), prefix, {cut}, 1);
  const SlotSnapshot snap = m->save_slot(1, cut);
  const Tensor again = model::run_sequence(*m, m->cache_geometry(), prefix, {cut}, 2);
  m->reset_slot(2);
  m->restore_slot(2, snap);
  ForwardBatch b;
  b.token_ids.assign(ids.begin() + cut, ids.end());
  b.seqs.push_back({.cache_slot = 2, .block_table = model::slot_block_table(m->cache_geometry(), 2),
                    .num_computed_tokens = cut, .num_new_tokens = int32_t(T - cut)});
  for (int32_t i = 0; i < int32_t(T - cut); ++i) b.logits_indices.push_back(i);
  const ForwardOutput out = m->run(b, {});
  const Diff d = diff(out.logits.data<float>(), want.data<float>() + cut * V, T - cut, V);
  std::printf("[v41 snapshot] restored slot vs whole sequence: max|d| %.3g\n", d.max);
  expect_close(d, T - cut, "restored slot");
  // A snapshot without its Engram trailer is refused, not run with a wrong history.
  SlotSnapshot bad = snap;
  bad.bytes.resize(8);
  EXPECT_THROW(m->restore_slot(2, bad), InvalidArgument);
  (void)again;
}

}  // namespace
