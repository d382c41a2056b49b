// DeepSeek-V4.1 through fixed-shape step plans (what the GPU's decode graphs replay) on the CPU
// backend (CpuBackend::use_fixed_shapes): decode and verify-shaped steps of several sequences,
// with random rejected drafts rolled back in between, give the general path's logits. Covers what
// V4.1 adds to a fixed step: the Engram rows of padded tokens (zero rows past the step's tokens),
// the ratio-1 projection and ratio-2 pooling staged per token, the two-level top-k over the fixed
// candidate pools, keys from the latent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>

#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek_v41/model.h"
#include "model/sequence_runner.h"
#include "test_util.h"

namespace {
using namespace deepinfer;
using deepinfer::model::ForwardBatch;
using deepinfer::model::ForwardOutput;
using deepinfer::model::v41::DeepseekV41Model;

TEST(V41FixedPlan, CpuDecodeAndVerifyStepsMatchGeneralPath) {
  for (const char* name : {"v41_a_release", "v41_b_release"}) {
    const std::string dir = v41_test::golden(name).string();
    if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "fixture absent";
    constexpr int64_t kRollback = 5;
    // Fixed-order products: the fixed path multiplies padded batches, and BLAS kernels whose sums
    // depend on M (OpenBLAS's Haswell kernels on an AVX2 machine) turn a last-bit difference into
    // whole FP4/FP8 steps through V4.1's QAT roundings (up to 0.8 in the logits); with them both
    // paths are bit-identical in their products and this compares the fixed plan's logic alone.
    const model::v41::ModelOptions mo{.max_rollback = kRollback, .batch_invariant = true, .dspark = false};
    auto general = DeepseekV41Model::load(dir, mo);
    auto fixed = DeepseekV41Model::load(dir, mo);
    auto* cpu = dynamic_cast<model::ds::CpuBackend*>(&fixed->backend());
    ASSERT_NE(cpu, nullptr);
    cpu->use_fixed_shapes(4096, {.max_tokens = 384, .max_tokens_per_seq = 1 + kRollback});
    for (auto* m : {general.get(), fixed.get()}) m->allocate_cache_for(3, 512);
    const int64_t V = general->vocab_size();
    std::mt19937 rng(5);
    std::vector<int64_t> len(3, 0);
    float worst_all = 0;
    for (int step = 0; step < 40; ++step) {
      ForwardBatch b;
      for (int32_t s = 0; s < 3; ++s) {
        // Step 0: a prefill (general path in both); then 1 token (decode) or 1 + L (verify).
        const int64_t n = step == 0 ? 21 + 8 * s : (step % 3 == 0 ? 1 : 1 + int64_t(rng() % (kRollback + 1)));
        b.seqs.push_back({.cache_slot = s, .block_table = model::slot_block_table(general->cache_geometry(), s),
                          .num_computed_tokens = len[size_t(s)], .num_new_tokens = int32_t(n)});
        for (int64_t j = 0; j < n; ++j) b.token_ids.push_back(int32_t(rng() % uint64_t(V)));
      }
      for (int64_t t = 0; t < b.num_tokens(); ++t) b.logits_indices.push_back(int32_t(t));
      const ForwardOutput a = general->run(b, {}), c = fixed->run(b, {});
      ASSERT_EQ(a.logits.numel(), c.logits.numel());
      float worst = 0;
      for (int64_t i = 0; i < a.logits.numel(); ++i)
        worst = std::max(worst, std::abs(a.logits.data<float>()[i] - c.logits.data<float>()[i]));
      worst_all = std::max(worst_all, worst);
      EXPECT_LT(worst, 2e-4) << name << " step " << step;
      for (size_t s = 0; s < 3; ++s) {
        const int64_t n = b.seqs[s].num_new_tokens, keep = step == 0 ? n : 1 + int64_t(rng() % uint64_t(n));
        for (auto* m : {general.get(), fixed.get()}) m->rollback(int32_t(s), len[s] + n, len[s] + keep);
        len[s] += keep;
      }
    }
    EXPECT_GE(cpu->fixed_steps(), 39) << name << ": the fixed path was not taken";
    std::printf("[v41-fixed] %s: 40 steps (3 sequences, decode + verify with rollbacks), fixed vs general max %.3g, "
                "%lld fixed steps\n",
                name, double(worst_all), (long long)cpu->fixed_steps());
  }
}

}  // namespace
