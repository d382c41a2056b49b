// Host-side plan of the GPU model, no GPU needed: cache geometry in device bytes, weight and
// activation sizes, the device memory plan's OutOfMemory for V4-Flash on one card, the step's
// index lists (window runs, compressor staging, candidates) and typed batch errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "deepinfer/error.h"
#include "golden.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "model/registry.h"
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
  // The plan counts what the upload takes (same tensor table): no MTP here.
  EXPECT_GE(p.weight_bytes, size_t(pc.total - pc.mtp) * 2);
  EXPECT_LE(p.weight_bytes, size_t(pc.total - pc.mtp) * 4 + size_t(c.vocab_size) * 64);
  EXPECT_GT(p.activation_bytes, 0u);
  // Cache planning: slots first, OutOfMemory when they do not fit.
  const kv::CacheGeometry g = kv::plan_cache_geometry(p.cache_specs, p.bytes_per_slot * 4 + p.bytes_per_block * 10, 4, 2, "test");
  EXPECT_EQ(g.num_slots, 4);
  EXPECT_EQ(g.num_blocks, 10);
  EXPECT_THROW(kv::plan_cache_geometry(p.cache_specs, p.bytes_per_slot * 3, 4, 2, "test"), OutOfMemory);
  // Exact numerics: f32 linears, activations and kv entries (compressor partials are f32 in both).
  const CudaHostPlan x = CudaHostPlan::make(c, {.numerics = gpu::Numerics::kExact});
  EXPECT_EQ(x.bytes_per_block, 2 * p.bytes_per_block);
  EXPECT_GT(x.bytes_per_slot, p.bytes_per_slot);
  EXPECT_GT(x.activation_bytes, p.activation_bytes);
  EXPECT_GE(x.weight_bytes, size_t(pc.total - pc.mtp) * 4);
  const kv::CacheGeometry gx =
      kv::plan_cache_geometry(x.cache_specs, x.bytes_per_slot * 4 + x.bytes_per_block * 10, 4, 4, "test");
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

TEST(CudaModelPlan, EngineSelection) {
  ModelLoadOptions o;
  o.env.accelerator = Accelerator::kCPU;
  EXPECT_FALSE(use_accelerator(o));
  o.env.accelerator = Accelerator::kNvidia;
  EXPECT_TRUE(use_accelerator(o));
  o.env.accelerator = Accelerator::kAuto;
  EXPECT_EQ(use_accelerator(o), cuda::cuda_device_count() > 0);
  EXPECT_EQ(accelerator_count(), cuda::cuda_device_count());
}

}  // namespace
}  // namespace deepinfer::model::v4
