// flash_stack_config (V4-Flash dims, first N layers of the Flash schedule) and the fast random
// checkpoint writer (RandomCheckpointOptions::fast) behind `deepinfer make-flash-stack`.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <unistd.h>

#include "core/parallel.h"
#include "deepinfer/error.h"
#include "moments.h"
#include "model/deepseek_v4/random_checkpoint.h"
#include "model/deepseek_v4/weights.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {
namespace fs = std::filesystem;
using namespace deepinfer;
using namespace deepinfer::model::v4;

// The CLI's --small widths: same schedule, vocab, experts and top-k; narrow linears.
DeepseekV4Config small_flash(int64_t layers) {
  DeepseekV4Config c = flash_stack_config(layers);
  c.hidden_size = 256;
  c.num_heads = 8;
  c.head_dim = 128;
  c.q_lora_rank = 128;
  c.o_groups = 2;
  c.o_lora_rank = 128;
  c.moe_intermediate_size = 128;
  c.index_n_heads = 8;
  c.index_head_dim = 64;
  c.n_routed_experts = 16;  // these two keep the test fast; the writer does not care
  c.vocab_size = 8192;
  return c;
}

std::string tmp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("di_flash_stack_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

using flash_stack_test::moments;
}  // namespace

TEST(FlashStack, ConfigMatchesTheFlashSchedule) {
  DeepseekV4Config c = flash_stack_config(6);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.q_lora_rank, 1024);
  EXPECT_EQ(c.o_groups * c.o_lora_rank, 8 * 1024);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.schedule_str(), "S S C H C H");
  EXPECT_EQ(c.compress_ratio, (std::vector<int64_t>{0, 0, 4, 128, 4, 128}));
  EXPECT_EQ(c.num_hash_layers(), 3);
  EXPECT_EQ(c.mlp_types[3], MlpKind::kMoE);
  EXPECT_EQ(c.dense_format, WeightFormat::kFP8Block);
  EXPECT_EQ(c.expert_format, WeightFormat::kFP4);
  EXPECT_EQ(c.num_mtp_layers, 0);
  DeepseekV4Config all = flash_stack_config(43);
  EXPECT_EQ(all.compress_ratio.back(), 4);  // [0,0] + [4,128]*20 + [4]
  EXPECT_EQ(all.compress_ratio[41], 128);
  // The JSON round trip gives the same schedule.
  DeepseekV4Config back = DeepseekV4Config::from_json_string(c.to_json_string(), "flash/config.json");
  EXPECT_EQ(back.schedule_str(), "S S C H C H");
  EXPECT_EQ(back.num_hash_layers(), 3);
  EXPECT_THROW(flash_stack_config(0), InvalidArgument);
  EXPECT_THROW(flash_stack_config(44), InvalidArgument);
}

TEST(FlashStack, FastWriterLoadsWithTheRightScales) {
  const std::string dir = tmp_dir("load");
  const DeepseekV4Config c = small_flash(4);
  write_random_checkpoint(dir, c, {.seed = 3, .num_shards = 3, .fast = true});
  ASSERT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  DeepseekV4Config cfg = DeepseekV4Config::from_file(dir);
  EXPECT_EQ(cfg.schedule_str(), "S S C H");
  DeepseekV4Weights w = DeepseekV4Weights::load(dir, cfg, {.progress = false});
  EXPECT_TRUE(w.ignored_tensors.empty());
  const LayerWeights& L3 = w.layers[3];
  EXPECT_EQ(L3.ffn.experts[5].w1.format, WeightFormat::kFP4);
  EXPECT_EQ(L3.attn.wq_b.format, WeightFormat::kFP8Block);
  auto [em, es] = moments(L3.ffn.experts[5].w1.dequantize_f32());  // N(0, 0.06), FP4-rounded
  EXPECT_NEAR(em, 0.0, 0.003);
  EXPECT_NEAR(es, 0.06, 0.006);
  auto [qm, qs] = moments(L3.attn.wq_b.dequantize_f32());  // N(0, 1/sqrt(128)), FP8-rounded
  EXPECT_NEAR(qm, 0.0, 0.003);
  EXPECT_NEAR(qs, 1 / std::sqrt(128.0), 0.004);
  auto [nm, ns] = moments(L3.attn_norm.to_f32());  // 1 + N(0, 0.1)
  EXPECT_NEAR(nm, 1.0, 0.02);
  EXPECT_NEAR(ns, 0.1, 0.02);
  // Hash routing: k distinct experts in range on every row.
  Tensor t = w.layers[0].ffn.tid2eid.to_f32();
  ASSERT_EQ(t.size(1), 6);
  for (int64_t r = 0; r < t.size(0); r += 997) {
    std::set<int> ids;
    for (int64_t j = 0; j < 6; ++j) {
      const int e = int(t.data<float>()[r * 6 + j]);
      EXPECT_GE(e, 0);
      EXPECT_LT(e, c.n_routed_experts);
      ids.insert(e);
    }
    EXPECT_EQ(ids.size(), 6u) << "row " << r;
  }
  fs::remove_all(dir);
}

TEST(FlashStack, FastWriterBytesDoNotDependOnThreads) {
  const DeepseekV4Config c = small_flash(3);
  const std::string a = tmp_dir("t1"), b = tmp_dir("tn");
#if defined(_OPENMP)
  const int n = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  write_random_checkpoint(a, c, {.seed = 9, .fast = true});
#if defined(_OPENMP)
  omp_set_num_threads(std::max(n, 3));
#endif
  write_random_checkpoint(b, c, {.seed = 9, .fast = true});
#if defined(_OPENMP)
  omp_set_num_threads(n);
#endif
  EXPECT_EQ(slurp(fs::path(a) / "model.safetensors"), slurp(fs::path(b) / "model.safetensors"));
  const std::string d = tmp_dir("seed");
  write_random_checkpoint(d, c, {.seed = 10, .fast = true});
  EXPECT_NE(slurp(fs::path(a) / "model.safetensors"), slurp(fs::path(d) / "model.safetensors"));
  for (const auto& p : {a, b, d}) fs::remove_all(p);
}

TEST(FlashStack, FastWriterRejectsTheTransformersLayout) {
  const std::string dir = tmp_dir("hf");
  EXPECT_THROW(write_random_checkpoint(dir, small_flash(1),
                                       {.layout = CheckpointLayout::kTransformers, .fast = true}),
               InvalidArgument);
  fs::remove_all(dir);
}
