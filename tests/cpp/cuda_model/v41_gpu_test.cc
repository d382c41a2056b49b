// DeepSeek-V4.1 on the GPU (deepseek/cuda/v41_cuda_model.h) against the reference's goldens and the
// CPU model. SKIPs without a GPU (the refusal tests run everywhere).
//  * exact numerics (fp32 weights, activations, caches; cuBLASLt fp32 without TF32): v41_a, v41_b and
//    their release twins, every golden sequence whole, in odd chunks (3, 5, 7: ratio-2 pairs split
//    across steps) and token by token, vs logits_<seq>.npy and vs the CPU model on the same path.
//    Both fixtures have Engram layers (the rows gathered on the host, injected on the device), the
//    two-level top-k, Reuse / Reindex layers, ratio-1 and ratio-2 compressors, single-pass mHC and
//    the QAT formats. Every row within 1e-4 of the golden on every path, except the sequences on
//    which the QAT roundings cascade (cascades(): v41_b t37 / t161, as on the CPU), held to a loose
//    bound. Measured on the H200: docs/MODEL-V41.md "Phase 4: the GPU".
//  * bounded replay (compact prefill, keep 40 of t161): GPU tail logits vs the CPU's, greedy 24
//    tokens GPU == CPU (v41_a; v41_b's tail cascades).
//  * batch of sequences vs each alone; the conformance suite's V4.1 GPU instance is in
//    conformance_gpu_test.cc.
//  * bf16: reported only (the random fixtures amplify bf16 rounding, see golden_test.cc).
// Lines "[gpu-v41..." are the figures docs/MODEL-V41.md quotes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "../model_v41/parity.h"
#include "golden.h"
#include "model/deepseek/cuda/v41_cuda_model.h"
#include "model/deepseek_v41/model.h"
#include "model/registry.h"
#include "model/sequence_runner.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v41 {
namespace {
using deepinfer::testing::golden_dir;
using deepinfer::testing::Npy;
using deepinfer::testing::read_inputs;
using deepinfer::testing::read_npy;
using ds::cuda::CudaModelOptions;
using ds::cuda::Numerics;

using v41_parity::cascades;
using v41_parity::Diff;
using v41_parity::diff;
using v41_parity::expect_loose;
using v41_parity::expect_strict;
using v41_parity::odd_chunks;

CudaModelOptions gpu_options(Numerics n, int64_t rollback = 0) {
  CudaModelOptions o;
  o.numerics = n;
  o.progress = false;
  o.max_batch_tokens = 1024;
  o.max_seqs = 4;
  o.max_context = 4096;
  o.max_rollback = rollback;
  return o;
}

bool have_gpu() { return cuda::cuda_device_count() > 0; }

class V41GpuGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(V41GpuGolden, ExactFullChunkedTokenByTokenMatchReferenceAndCpu) {
  if (!have_gpu()) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = golden_dir(GetParam());
  auto g = load_v41_cuda(dir, gpu_options(Numerics::kExact));
  g->allocate_cache_for(1, 256);
  auto c = DeepseekV41Model::load(dir);
  c->allocate_cache_for(1, 256);
  EXPECT_NE(g->describe().find("cuda"), std::string::npos) << g->describe();
  const int64_t V = g->vocab_size();
  for (const auto& [name, ids] : read_inputs(dir)) {
    const Npy want = read_npy(dir + "/logits_" + name + ".npy");
    const int64_t T = int64_t(ids.size());
    ASSERT_EQ(int64_t(want.data.size()), T * V) << name;
    const std::vector<std::pair<std::string, std::vector<int64_t>>> paths = {
        {"full", {T}}, {"chunked", odd_chunks(T)}, {"decode", std::vector<int64_t>(size_t(T), 1)}};
    Tensor gfull;
    for (const auto& [path, chunks] : paths) {
      const Tensor gl = model::run_sequence(*g, g->cache_geometry(), ids, chunks);
      if (path == "full") gfull = gl;
      const Diff dp = diff(gl.data<float>(), gfull.data<float>(), T, V);
      const Tensor cl = model::run_sequence(*c, c->cache_geometry(), ids, chunks);
      const Diff dg = diff(gl.data<float>(), want.data.data(), T, V);
      const Diff dc = diff(gl.data<float>(), cl.data<float>(), T, V);
      const Diff cg = diff(cl.data<float>(), want.data.data(), T, V);
      std::printf("[gpu-v41] %s %s %s (T=%lld): GPU-golden %.3g (%lld rows > 1e-4, %lld argmax) | GPU-CPU %.3g "
                  "(%lld rows, %lld argmax) | CPU-golden %.3g (%lld rows) | GPU path-GPU full %.3g (%lld rows)\n",
                  GetParam().c_str(), name.c_str(), path.c_str(), (long long)T, dg.max, (long long)dg.rows_over,
                  (long long)dg.flips, dc.max, (long long)dc.rows_over, (long long)dc.flips, cg.max,
                  (long long)cg.rows_over, dp.max, (long long)dp.rows_over);
      const std::string what = GetParam() + " " + name + " " + path;
      if (cascades(GetParam(), name)) {
        expect_loose(dg, T, what + " GPU vs golden");
        expect_loose(dc, T, what + " GPU vs CPU");
      } else {
        expect_strict(dg, 1e-4, what + " GPU vs golden");
        // The CPU itself misses 1e-4 by a hair on one row of v41_b t9 (1.5e-4, OpenBLAS's order).
        // Where the CPU run crosses a QAT step the golden does not (its known flips,
        // model_v41/forward_test.cc: v41_a t37 chunked and token by token with the SkylakeX kernels,
        // 8 rows by 3.2e-3), the GPU, held to the golden above, cannot also be within 1e-3 of it:
        // then only the loose bound between the two.
        if (cg.max <= 1e-3 && cg.flips == 0)
          expect_strict(dc, 1e-3, what + " GPU vs CPU");
        else
          expect_loose(dc, T, what + " GPU vs CPU (the CPU run crosses a QAT step)");
      }
    }
  }
}

TEST_P(V41GpuGolden, Bf16Reported) {
  if (!have_gpu()) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = golden_dir(GetParam());
  auto g = load_v41_cuda(dir, gpu_options(Numerics::kBf16));
  g->allocate_cache_for(1, 256);
  const int64_t V = g->vocab_size();
  for (const auto& [name, ids] : read_inputs(dir)) {
    const Npy want = read_npy(dir + "/logits_" + name + ".npy");
    const int64_t T = int64_t(ids.size());
    const Tensor full = model::run_sequence(*g, g->cache_geometry(), ids, {T});
    const Tensor dec = model::run_sequence(*g, g->cache_geometry(), ids, std::vector<int64_t>(size_t(T), 1));
    const Diff d = diff(full.data<float>(), want.data.data(), T, V);
    const Diff dd = diff(dec.data<float>(), full.data<float>(), T, V);
    double ref_max = 0;
    for (float x : want.data) ref_max = std::max(ref_max, double(std::fabs(x)));
    std::printf("[gpu-v41-bf16] %s %s (T=%lld): full vs golden max %.3g (rel %.3g), argmax %lld/%lld; decode vs full "
                "max %.3g, argmax %lld\n",
                GetParam().c_str(), name.c_str(), (long long)T, d.max, d.max / std::max(ref_max, 1e-30),
                (long long)d.flips, (long long)T, dd.max, (long long)dd.flips);
    EXPECT_TRUE(d.finite && dd.finite) << name;
  }
}

// Several sequences advance together in random chunks (some steps skip a sequence) with scattered
// block tables: each equals itself run alone (exact numerics).
TEST_P(V41GpuGolden, ExactBatchOfSequencesMatchesEachAlone) {
  if (!have_gpu()) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = golden_dir(GetParam());
  auto g = load_v41_cuda(dir, gpu_options(Numerics::kExact));
  g->allocate_cache_for(4, 256);
  const int64_t V = g->vocab_size();
  std::vector<InterleavedSequence> st;
  for (const auto& [name, ids] : read_inputs(dir)) {
    st.emplace_back();
    st.back().ids = ids;
    st.back().seq.cache_slot = int32_t(st.size() - 1);
    st.back().seq.block_table = deepinfer::testing::scattered_block_table(g->cache_geometry(), st.back().seq.cache_slot);
  }
  ASSERT_LE(st.size(), 4u);
  run_interleaved(*g, st, /*seed=*/77, /*max_chunk=*/24);
  const auto inputs = read_inputs(dir);
  auto name_it = inputs.begin();
  for (const InterleavedSequence& s : st) {
    const std::string name = (name_it++)->first;
    const int64_t T = int64_t(s.ids.size());
    const Tensor alone = model::run_sequence(*g, g->cache_geometry(), s.ids, {T}, 3);
    const Diff d = diff(s.logits.data(), alone.data<float>(), T, V);
    std::printf("[gpu-v41-batch] %s T=%lld: batch vs alone max %.3g (%lld rows > 1e-4, %lld argmax)\n",
                GetParam().c_str(), (long long)T, d.max, (long long)d.rows_over, (long long)d.flips);
    if (cascades(GetParam(), name)) {
      expect_loose(d, T, GetParam() + " " + name + " batch vs alone");
    } else {
      expect_strict(d, 1e-4, GetParam() + " " + name + " batch vs alone");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V41GpuGolden, ::testing::Values("v41_a", "v41_b", "v41_a_release", "v41_b_release"));

// Bounded replay on the GPU: the tail of t161 (keep 40 -> decoder layers over [121, 161)) in one
// chunk and in odd chunks, against the CPU model in the same mode; greedy 24 tokens equal.
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
    const ForwardOutput o = m.run(b, {});
    if (!b.logits_indices.empty()) {
      const float* l = o.logits.data<float>();
      out.insert(out.end(), l, l + int64_t(b.logits_indices.size()) * V);
    }
    done += n;
  }
  return out;
}

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
    const ForwardOutput o = m.run(b, {});
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

TEST(V41GpuReplay, CompactTailMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  constexpr int64_t kKeep = 40, kRollback = 4;
  for (const char* f : {"v41_a", "v41_b"}) {
    const std::string dir = golden_dir(f);
    auto g = load_v41_cuda(dir, gpu_options(Numerics::kExact, kRollback), {.replay_keep = kKeep});
    g->allocate_cache_for(1, 256);
    auto c = DeepseekV41Model::load(dir, {.max_rollback = kRollback, .replay_keep = kKeep});
    c->allocate_cache_for(1, 256);
    ASSERT_EQ(g->replay_keep(), kKeep);
    const std::vector<int32_t> ids = read_inputs(dir).at("t161");
    const int64_t T = int64_t(ids.size()), from = T - kKeep, V = g->vocab_size();
    for (const auto& [path, chunks] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"one chunk", {T}}, {"odd chunks", odd_chunks(T)}}) {
      const std::vector<float> gt = run_tail(*g, ids, chunks, from), ct = run_tail(*c, ids, chunks, from);
      ASSERT_EQ(gt.size(), size_t(kKeep * V));
      ASSERT_EQ(ct.size(), gt.size());
      const Diff d = diff(gt.data(), ct.data(), kKeep, V);
      std::printf("[gpu-v41-replay] %s t161 keep %lld, %s: GPU vs CPU tail max %.3g (%lld of %lld rows > 1e-4, %lld "
                  "argmax)\n",
                  f, (long long)kKeep, path.c_str(), d.max, (long long)d.rows_over, (long long)kKeep,
                  (long long)d.flips);
      if (cascades(f, "t161")) {
        expect_loose(d, kKeep, std::string(f) + " replay " + path);
      } else {
        expect_strict(d, 1e-4, std::string(f) + " replay " + path);  // incl. no argmax change
      }
      // (No separate flips == 0 here: on the cascading v41_b tail the loose bound allows 1 in 25 rows;
      // the H200 gave 1 of 40 on the odd-chunk path, 2026-12-02.)
    }
    const std::vector<int32_t> gg = greedy(*g, ids, 24), cg = greedy(*c, ids, 24);
    size_t same = 0;
    while (same < gg.size() && gg[same] == cg[same]) ++same;
    std::printf("[gpu-v41-replay] %s greedy 24 after t161 (compact keep %lld): %zu of 24 equal to the CPU\n", f,
                (long long)kKeep, same);
    if (!cascades(f, "t161")) {  // v41_b: 16 of 24 on the H200 (the tail's cascade)
      EXPECT_EQ(gg, cg) << f;
    }
  }
}

// The registry's GPU path (what `deepinfer logits --accelerator nvidia` and the engine load).
TEST(V41GpuRegistry, NvidiaLoadsTheGpuModel) {
  if (!have_gpu()) GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();
  const std::string dir = golden_dir("v41_a");
  ModelLoadOptions o;
  o.env.accelerator = Accelerator::kNvidia;
  o.progress = false;
  auto lm = model::load_model(dir, o);
  EXPECT_NE(lm->describe().find("cuda"), std::string::npos) << lm->describe();
  auto* m = dynamic_cast<DeepseekV41Model*>(lm.get());
  ASSERT_NE(m, nullptr);
  m->allocate_cache_for(1, 64);
  const std::vector<int32_t> ids = read_inputs(dir).at("t37");
  const int64_t T = int64_t(ids.size());
  const Tensor l = model::run_sequence(*m, m->cache_geometry(), ids, {T});
  const Npy want = read_npy(dir + "/logits_t37.npy");
  const Diff d = diff(l.data<float>(), want.data.data(), T, m->vocab_size());
  std::printf("[gpu-v41-registry] v41_a t37 production numerics (bf16): max %.3g, argmax %lld/%lld\n", d.max,
              (long long)d.flips, (long long)T);
  EXPECT_TRUE(d.finite);
}

// Refusals that need no GPU: the config is checked before the device.
TEST(V41GpuRefusals, UnnormalisedRoutingAndExpertShards) {
  const std::string src = golden_dir("v41_a");
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "v41_gpu_refusal_cfg";
  std::filesystem::create_directories(dir);
  std::ifstream in(src + "/config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "\"num_experts_per_tok\": 3";
  const size_t at = cfg.find(key);
  ASSERT_NE(at, std::string::npos) << "fixture config layout changed";
  cfg.replace(at, key.size(), "\"num_experts_per_tok\": 1");
  std::ofstream(dir / "config.json") << cfg;
  try {
    load_v41_cuda(dir.string(), gpu_options(Numerics::kExact));
    ADD_FAILURE() << "top-1 routing accepted on the GPU";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("normalises"), std::string::npos) << e.what();
  }
  CudaModelOptions o = gpu_options(Numerics::kExact);
  o.expert_shard = parallel::ExpertShard{};
  EXPECT_THROW(load_v41_cuda(src, o), InvalidArgument);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer::model::v41
