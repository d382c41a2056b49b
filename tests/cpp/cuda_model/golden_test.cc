// The golden fixtures through the GPU model, in two numerics modes. SKIPs without a GPU.
//  * exact (fp32 weights/activations/caches, fp32 GEMMs without TF32): max |Δlogit| ≤ 1e-3 and
//    top-1 ≥ 99.9% vs transformers' fp32 logits for full, chunked and token-by-token runs; a batch
//    of sequences vs each alone to the same bound; a 64-token greedy chain equal to the CPU model.
//  * bf16 (bf16 weights/activations/caches, fp32 accumulation, no FP8/FP4 round trips): paths and
//    batch vs alone as tight as before (observed bit-identical); vs the fp32 fixture only to a
//    tolerance derived from bf16 rounding itself (see kBf16Rel below).
// Lines "[gpu-..." are collected by tools/gpu_model_check.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <tuple>

#include "golden.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek_v4/model.h"
#include "model/sequence_runner.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4 {
namespace {
using deepinfer::testing::compare_logits;
using deepinfer::testing::golden_dir;
using Diff = deepinfer::testing::LogitsDiff;
using deepinfer::testing::Npy;
using deepinfer::testing::read_inputs;
using deepinfer::testing::random_chunks;
using deepinfer::testing::read_npy;
using deepinfer::testing::scattered_block_table;
using gpu::Numerics;

constexpr double kTop1 = 0.999;
// Exact mode: the only differences left are fp32 summation orders (GEMM algorithms, attention
// and reduction trees); ~1e-5 expected, 1e-3 absolute is the bound (vs fixture, paths, batch).
constexpr double kExactAbs = 1e-3;
// bf16 mode vs the fp32 fixture. The random tiny models amplify rounding: transformers itself
// with only each Linear's input and output rounded to bf16 (weights are bf16-exact) deviates from
// its fp32 logits by rel 0.29 / top-1 0.947 on tiny "long", 0.11 on "medium", 0.10 on tiny_clamp
// "long". The GPU rounds at more places (q, kv, attention output, expert activations, cache
// entries), measured rel 0.53 / top-1 0.93 on tiny and tiny_official "long" — so this checks that
// bf16 stays in the bf16 regime (a wiring bug gives rel ~1 and top-1 near chance), not parity.
constexpr double kBf16Rel = 0.6;        // max|Δ| / max|ref|
constexpr double kBf16Top1 = 0.9;       // aggregated over the fixture's sequences
constexpr double kBf16PathRel = 3e-2;   // between GPU paths / batch vs alone (GEMM shapes differ)

const char* mode_name(Numerics n) {
  return n == Numerics::kExact ? "exact" : n == Numerics::kBf16 ? "bf16" : "production";
}

class GpuGolden : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {
 protected:
  void SetUp() override {
    if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
    fixture_ = std::get<0>(GetParam());
    numerics_ = std::get<1>(GetParam());
    tag_ = fixture_ + " " + mode_name(numerics_);
    dir_ = golden_dir(fixture_);
    if (!std::filesystem::exists(dir_ + "/config.json")) GTEST_SKIP() << "fixture " << dir_ << " absent";
    CudaModelOptions o;
    o.numerics = numerics_;
    o.progress = false;
    o.max_batch_tokens = 2048;
    o.max_seqs = 8;
    o.max_context = 4096;
    model_ = DeepseekV4CudaModel::load(dir_, o);
    model_->allocate_cache_for(4, 512);
  }
  bool exact() const { return numerics_ == Numerics::kExact; }
  // vs the fp32 fixture
  void expect_parity(const Diff& d, const std::string& what) const {
    if (exact())
      EXPECT_LE(d.max_abs, kExactAbs) << tag_ << " " << what;
    else
      EXPECT_LE(d.rel(), kBf16Rel) << tag_ << " " << what;
  }
  // between two GPU runs of the same mode
  void expect_same(const Diff& d, const std::string& what) const {
    if (exact())
      EXPECT_LE(d.max_abs, kExactAbs) << tag_ << " " << what;
    else
      EXPECT_LE(d.rel(), kBf16PathRel) << tag_ << " " << what;
    EXPECT_EQ(d.argmax_mismatch, 0) << tag_ << " " << what;
  }
  std::string fixture_, tag_, dir_;
  Numerics numerics_ = Numerics::kExact;
  std::unique_ptr<DeepseekV4CudaModel> model_;
};

TEST_P(GpuGolden, FullChunkedDecodeMatchTransformers) {
  const int64_t V = model_->vocab_size();
  int64_t mism = 0, rows = 0;
  for (const auto& [name, ids] : read_inputs(dir_)) {
    const Npy ref = read_npy(dir_ + "/logits_" + name + ".npy");
    const int64_t T = int64_t(ids.size());
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{T, V}));
    const std::vector<std::pair<std::string, std::vector<int64_t>>> paths = {
        {"full", {T}}, {"chunked", random_chunks(T, 1234 + uint32_t(T))}, {"decode", std::vector<int64_t>(T, 1)}};
    Tensor full;
    for (const auto& [path, chunks] : paths) {
      Tensor logits = model::run_sequence(*model_, model_->cache_geometry(), ids, chunks, 1);
      const Diff d = compare_logits(logits.data<float>(), ref.data.data(), T, V);
      std::printf("[gpu-parity] %s/%s %s: max|dlogit| = %.3g (rel %.3g), top-1 mismatches %lld/%lld\n",
                  tag_.c_str(), name.c_str(), path.c_str(), d.max_abs, d.rel(), (long long)d.argmax_mismatch, (long long)T);
      expect_parity(d, name + " " + path);
      mism += d.argmax_mismatch;
      rows += T;
      if (path == "full") {
        full = logits;
      } else {
        const Diff dp = compare_logits(logits.data<float>(), full.data<float>(), T, V);
        std::printf("[gpu-paths] %s/%s %s vs full: max|d| = %.3g (rel %.3g), top-1 mismatches %lld%s\n",
                    tag_.c_str(), name.c_str(), path.c_str(), dp.max_abs, dp.rel(), (long long)dp.argmax_mismatch,
                    dp.max_abs == 0 ? " (bit identical)" : "");
        expect_same(dp, name + " " + path + " vs full");
      }
    }
  }
  const double agree = rows ? 1.0 - double(mism) / double(rows) : 1.0;
  std::printf("[gpu-parity] %s: top-1 agreement %.5f over %lld positions\n", tag_.c_str(), agree, (long long)rows);
  EXPECT_GE(agree, exact() ? kTop1 : kBf16Top1) << tag_;
}

// Several sequences advance together with random chunk sizes (some steps skip a sequence),
// scattered block tables: each must match itself run alone.
TEST_P(GpuGolden, BatchOfSequencesMatchesEachAlone) {
  const int64_t V = model_->vocab_size();
  auto inputs = read_inputs(dir_);
  std::vector<std::string> names;
  for (auto& [k, v] : inputs) names.push_back(k);
  ASSERT_LE(names.size(), 3u);
  const kv::CacheGeometry& g = model_->cache_geometry();
  std::vector<InterleavedSequence> st(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    st[i].ids = inputs[names[i]];
    st[i].seq.cache_slot = int32_t(i);
    st[i].seq.block_table = scattered_block_table(g, int32_t(i));
  }
  run_interleaved(*model_, st, /*seed=*/77, /*max_chunk=*/24);
  for (size_t i = 0; i < st.size(); ++i) {
    const int64_t T = int64_t(st[i].ids.size());
    const Npy ref = read_npy(dir_ + "/logits_" + names[i] + ".npy");
    const Diff d = compare_logits(st[i].logits.data(), ref.data.data(), T, V);
    Tensor alone = model::run_sequence(*model_, model_->cache_geometry(), st[i].ids, {T}, 3);
    const Diff da = compare_logits(st[i].logits.data(), alone.data<float>(), T, V);
    std::printf("[gpu-batch] %s/%s: vs fixture max|d| %.3g rel %.3g (top-1 mismatches %lld), vs alone max|d| %.3g%s\n",
                tag_.c_str(), names[i].c_str(), d.max_abs, d.rel(), (long long)d.argmax_mismatch, da.max_abs,
                da.max_abs == 0 ? " (bit identical)" : "");
    expect_parity(d, names[i] + " batch");
    expect_same(da, names[i] + " batch vs alone");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGolden,
                         ::testing::Combine(::testing::Values("tiny", "tiny_clamp", "tiny_official"),
                                            ::testing::Values(Numerics::kExact, Numerics::kBf16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + mode_name(std::get<1>(info.param));
                         });

// Greedy decoding of 64 tokens from the "short" prompt: in exact mode the GPU chain equals the
// CPU model's (fp32); in bf16 mode the common prefix is printed only (bf16 rounding flips
// near-ties of these random models, see kBf16Rel).
class GpuGoldenChain : public ::testing::TestWithParam<Numerics> {};
TEST_P(GpuGoldenChain, Greedy64MatchesCpuModel) {
  if (cuda::cuda_device_count() == 0) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = golden_dir("tiny");
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture absent";
  CudaModelOptions o;
  o.numerics = GetParam();
  o.progress = false;
  o.max_batch_tokens = 1024;
  o.max_seqs = 4;
  o.max_context = 4096;
  auto gm = DeepseekV4CudaModel::load(dir, o);
  gm->allocate_cache_for(1, 1024);
  auto cm = DeepseekV4Model::load(dir);
  cm->allocate_cache_for(1, 1024);
  const std::vector<int32_t> prompt = read_inputs(dir).at("short");
  const std::vector<int32_t> g_chain = greedy_continuation(*gm, gm->cache_geometry(), prompt, 64);
  const std::vector<int32_t> c_chain = greedy_continuation(*cm, cm->cache().geometry(), prompt, 64);
  size_t same = 0;
  while (same < g_chain.size() && g_chain[same] == c_chain[same]) ++same;
  std::printf("[gpu-chain] tiny %s greedy 64: %zu leading tokens equal to the CPU chain\n", mode_name(GetParam()),
              same);
  if (GetParam() == Numerics::kExact) { EXPECT_EQ(g_chain, c_chain); }
}
INSTANTIATE_TEST_SUITE_P(Modes, GpuGoldenChain, ::testing::Values(Numerics::kExact, Numerics::kBf16),
                         [](const auto& info) { return std::string(mode_name(info.param)); });

}  // namespace
}  // namespace deepinfer::model::v4
