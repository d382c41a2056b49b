// Host-side plan of the GPU model, no GPU needed: cache geometry in device bytes, weight and
// activation sizes, the device memory plan's OutOfMemory for V4-Flash on one card, the step's
// index lists (window runs, compressor staging, candidates) and typed batch errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "deepinfer/error.h"
#include "golden.h"
#include "model/deepseek_v4/cuda/cuda_model.h"
#include "model/deepseek_v4/weights.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4 {
namespace {
using deepinfer::testing::golden_dir;

DeepseekV4Config tiny() {
  const std::string dir = golden_dir("tiny");
  return DeepseekV4Config::from_file(dir);
}

const CudaModelOptions kBf16Opts{.numerics = gpu::Numerics::kBf16};

TEST(CudaModelPlan, TinyGeometryAndSizes) {
  if (!std::filesystem::exists(golden_dir("tiny") + "/config.json")) GTEST_SKIP() << "fixture absent";
  const DeepseekV4Config c = tiny();
  const CudaHostPlan p = CudaHostPlan::make(c, kBf16Opts);
  ASSERT_EQ(int64_t(p.cache_specs.size()), c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.compress_ratio[l] > 0) {
      EXPECT_EQ(p.block_tokens % c.compress_ratio[l], 0);
    }
  EXPECT_GT(p.bytes_per_slot, 0u);
  EXPECT_GT(p.bytes_per_block, 0u);
  // Weight bytes: every parameter once as bf16 (linears) or f32, never less than 2 bytes each.
  DeepseekV4Weights w = DeepseekV4Weights::load(golden_dir("tiny"), c, LoadOptions{.progress = false});
  const ParamCounts pc = w.param_counts(c);
  EXPECT_GE(p.weight_bytes, size_t(pc.total - pc.mtp) * 2);
  EXPECT_LE(p.weight_bytes, size_t(pc.total - pc.mtp) * 4 + size_t(c.vocab_size) * 64);
  EXPECT_GT(p.activation_bytes, 0u);
  // Cache planning: slots first, OutOfMemory when they do not fit.
  const kv::CacheGeometry g = gpu::plan_gpu_cache(p.cache_specs, p.bytes_per_slot * 4 + p.bytes_per_block * 10, 4);
  EXPECT_EQ(g.num_slots, 4);
  EXPECT_EQ(g.num_blocks, 10);
  EXPECT_THROW(gpu::plan_gpu_cache(p.cache_specs, p.bytes_per_slot * 3, 4), OutOfMemory);
  // Exact numerics: f32 linears, activations and kv entries (compressor partials are f32 in both).
  const CudaHostPlan x = CudaHostPlan::make(c, {.numerics = gpu::Numerics::kExact});
  EXPECT_EQ(x.bytes_per_block, 2 * p.bytes_per_block);
  EXPECT_GT(x.bytes_per_slot, p.bytes_per_slot);
  EXPECT_GT(x.activation_bytes, p.activation_bytes);
  EXPECT_GE(x.weight_bytes, size_t(pc.total - pc.mtp) * 4);
  const kv::CacheGeometry gx =
      gpu::plan_gpu_cache(x.cache_specs, x.bytes_per_slot * 4 + x.bytes_per_block * 10, 4, 4);
  EXPECT_EQ(gx.num_blocks, 10);
}

TEST(CudaModelPlan, FlashSizedModelDoesNotFitOneH200) {
  if (!std::filesystem::exists(golden_dir("tiny") + "/config.json")) GTEST_SKIP() << "fixture absent";
  DeepseekV4Config c = tiny();
  c.vocab_size = 129280, c.hidden_size = 4096, c.num_heads = 64, c.head_dim = 512, c.rope_head_dim = 64;
  c.q_lora_rank = 1024, c.o_groups = 8, c.o_lora_rank = 1024, c.n_routed_experts = 256, c.num_experts_per_tok = 6;
  c.moe_intermediate_size = 2048, c.index_n_heads = 64, c.index_head_dim = 128, c.index_topk = 512;
  c.sliding_window = 128, c.num_layers = 43;
  c.layer_types.assign(43, AttnKind::kCSA);
  c.compress_ratio.assign(43, 4);
  c.mlp_types.assign(43, MlpKind::kMoE);
  for (int64_t l = 0; l < 43; ++l) {
    if (l < 2) c.layer_types[l] = AttnKind::kSliding, c.compress_ratio[l] = 0;
    else if (l % 2 == 1) c.layer_types[l] = AttnKind::kHCA, c.compress_ratio[l] = 128;
  }
  const CudaHostPlan p = CudaHostPlan::make(c, kBf16Opts);
  EXPECT_GT(p.weight_bytes, size_t(500) << 30);  // bf16 experts: ~284B params
  const size_t h200 = size_t(143771) << 20;
  try {
    cuda::plan_device_memory({.weight_bytes = p.weight_bytes, .activation_bytes = p.activation_bytes,
                              .min_cache_bytes = p.bytes_per_slot},
                             h200, h200);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("weight"), std::string::npos) << e.what();
  }
}

TEST(CudaModelPlan, StepMetaWindowCompressorCandidates) {
  if (!std::filesystem::exists(golden_dir("tiny") + "/config.json")) GTEST_SKIP() << "fixture absent";
  const DeepseekV4Config c = tiny();
  const CudaHostPlan p = CudaHostPlan::make(c, kBf16Opts);
  kv::CacheGeometry g = gpu::plan_gpu_cache(p.cache_specs, p.bytes_per_slot * 2 + p.bytes_per_block * 8, 2);
  ForwardBatch b;
  // seq 0: 5 new tokens after 30 cached (crosses window and block boundaries); seq 1: prefill of 3.
  b.seqs.push_back({.cache_slot = 1, .block_table = {3, 2}, .num_computed_tokens = 30, .num_new_tokens = 5});
  b.seqs.push_back({.cache_slot = 0, .block_table = {5}, .num_computed_tokens = 0, .num_new_tokens = 3});
  b.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  b.logits_indices = {4, 7};
  gpu::validate_batch(c, g, true, b);
  const gpu::StepMeta m = gpu::build_step_meta(c, g, b);
  const int64_t W = c.sliding_window;
  ASSERT_EQ(m.T, 8);
  EXPECT_EQ(int64_t(m.win_src.size()), (W - 1 + 5) + 3);
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(m.win_count[j], std::min<int64_t>(W, 30 + j + 1));
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(m.win_count[5 + j], j + 1);
  // The last window row of token t is its own kv row.
  for (int64_t t = 0; t < 8; ++t) EXPECT_EQ(m.win_src[size_t(m.win_begin[t] + m.win_count[t] - 1)], -t - 1);
  for (const auto& k : m.kinds) {
    const int64_t mm = k.ratio;
    // Entries emitted by seq 0: blocks floor(30/m) .. floor(35/m)-1.
    const int64_t e0 = 35 / mm - 30 / mm, e1 = 3 / mm;
    EXPECT_EQ(int64_t(k.entry_pos.size()), e0 + e1) << "ratio " << mm;
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(k.cand_count[j], (30 + j + 1) / mm);
    for (const auto& l : k.launches) EXPECT_LE(l.lo, l.first_block * mm);
  }
  EXPECT_EQ(m.logits_rows, (std::vector<int64_t>{4, 7}));
  // Typed errors.
  ForwardBatch bad = b;
  bad.seqs[1].cache_slot = 1;
  EXPECT_THROW(gpu::validate_batch(c, g, true, bad), InvalidArgument);
  bad = b;
  bad.token_ids[0] = int32_t(c.vocab_size);
  EXPECT_THROW(gpu::validate_batch(c, g, true, bad), InvalidArgument);
  EXPECT_THROW(gpu::validate_batch(c, g, false, b), InvalidArgument);
}

TEST(CudaModelPlan, EngineSelection) {
  EnvConfig env;
  env.accelerator = Accelerator::kCPU;
  EXPECT_FALSE(use_cuda_model(env));
  env.accelerator = Accelerator::kNvidia;
  EXPECT_TRUE(use_cuda_model(env));
  env.accelerator = Accelerator::kAuto;
  EXPECT_EQ(use_cuda_model(env), cuda::cuda_device_count() > 0);
}

}  // namespace
}  // namespace deepinfer::model::v4
