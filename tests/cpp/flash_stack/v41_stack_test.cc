// The V4.1-Flash-shaped random stack (deepseek_v41/random_stack.h, `make-flash-stack --family v41`):
// the layer sample keeps each release layer's role, bad samples are refused naming the missing
// source, and the written checkpoint loads through the V4.1 loader with the intended scales.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

#include "deepinfer/error.h"
#include "moments.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/engram.h"
#include "model/deepseek_v41/random_stack.h"
#include "model/deepseek_v41/weights.h"

namespace {
namespace fs = std::filesystem;
using namespace deepinfer;
using namespace deepinfer::model::v41;

std::string tmp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("di_v41_stack_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

using flash_stack_test::moments;

DeepseekV41Config config_of(const V41StackOptions& o) {
  return DeepseekV41Config::from_json_string(v41_stack_config_json(o), "stack");
}
}  // namespace

TEST(V41Stack, DefaultSampleKeepsEveryRole) {
  V41StackOptions o;
  o.release_layers = v41_default_stack_layers(7);
  EXPECT_EQ(o.release_layers, (std::vector<int64_t>{0, 1, 2, 3, 20, 21, 24}));
  const DeepseekV41Config c = config_of(o);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.moe_intermediate_size, 2304);
  EXPECT_EQ(c.q_lora_rank, 1280);
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.fp8_block_out, 32);
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{0, 0, 2, 2, 1, 1, 1}));
  EXPECT_EQ(c.kv_source_layer_ids, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(c.index_source_layer_ids, (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(c.candidate_source_layer_id, 4);
  EXPECT_EQ(c.engram.layer_ids, (std::vector<int64_t>{1}));
  // S S F R F* R Xc: sliding, the ratio-2 source and its reuse, the candidate source, its reuse,
  // and a re-indexing layer inside the candidate mask.
  EXPECT_EQ(c.schedule_str(), "S S F R F* R Xc") << c.schedule_str();
  // Small samples are a prefix of the release (no layer without its source).
  EXPECT_EQ(v41_default_stack_layers(3), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(v41_default_stack_layers(9), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 20, 21, 24}));
}

TEST(V41Stack, EngramTableShrinksThroughItsBucketPrimes) {
  V41StackOptions o;
  o.release_layers = {0, 1, 2};
  o.engram_rows = 30000;
  const DeepseekV41Config c = config_of(o);
  ASSERT_EQ(c.engram.num_embeddings.size(), 1u);
  EXPECT_GT(c.engram.num_embeddings[0], 30000 * 9 / 10);
  EXPECT_LT(c.engram.num_embeddings[0], 30000 * 11 / 10);
  const std::vector<std::vector<int64_t>> primes = engram_primes(c.engram);
  int64_t rows = 0;
  for (int64_t p : primes.at(0)) rows += p;
  EXPECT_EQ(rows, c.engram.num_embeddings[0]);
}

TEST(V41Stack, RefusesALayerWithoutItsSource) {
  V41StackOptions o;
  o.release_layers = {0, 3};
  try {
    v41_stack_config_json(o);
    FAIL() << "accepted a reuse layer without its KV source";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("release layer 3 reads the compressed KV of layer 2"), std::string::npos)
        << e.what();
  }
  o.release_layers = {0, 24};  // 24 re-indexes layer 20's keys
  EXPECT_THROW(v41_stack_config_json(o), InvalidArgument);
  o.release_layers = {2, 2};
  EXPECT_THROW(v41_stack_config_json(o), InvalidArgument);
  o.release_layers = {40};
  EXPECT_THROW(v41_stack_config_json(o), InvalidArgument);
  o.release_layers = {};
  EXPECT_THROW(v41_stack_config_json(o), InvalidArgument);
  EXPECT_THROW(v41_default_stack_layers(0), InvalidArgument);
}

TEST(V41Stack, SmallStackLoadsWithTheRightScales) {
  const std::string dir = tmp_dir("load");
  V41StackOptions o;
  o.release_layers = {0, 1, 2, 20, 24};
  o.small = true;
  o.engram_rows = 5000;
  o.seed = 4;
  const uint64_t bytes = write_v41_stack(dir, o);
  EXPECT_GT(bytes, 0u);
  ASSERT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  const DeepseekV41Config c = DeepseekV41Config::from_file(dir);
  EXPECT_EQ(c.schedule_str(), "S S F F* Xc") << c.schedule_str();
  // The sidecar agrees with the config (the hasher checks classes and multipliers).
  EXPECT_NO_THROW(EngramHasher(c, EngramSidecar::from_file((fs::path(dir) / "engram_sidecar.json").string())));
  const V41Weights w = V41Weights::load(dir, c);
  EXPECT_TRUE(w.skipped.empty());
  auto entry = [&](const std::string& name) {
    const int64_t e = w.find(name);
    EXPECT_GE(e, 0) << name;
    return w.entry_f32(size_t(e), c);
  };
  auto [em, es] = moments(entry("layers.3.ffn.experts.5.w2.weight"));  // N(0, 0.06), FP4-rounded
  EXPECT_NEAR(em, 0.0, 0.003);
  EXPECT_NEAR(es, 0.06, 0.006);
  auto [qm, qs] = moments(entry("layers.4.attn.wq_b.weight"));  // N(0, 1/sqrt(128)), FP8 32x32
  EXPECT_NEAR(qm, 0.0, 0.003);
  EXPECT_NEAR(qs, 1 / std::sqrt(128.0), 0.004);
  auto [nm, ns] = moments(entry("layers.2.attn_norm.weight"));  // 1 + N(0, 0.1)
  EXPECT_NEAR(nm, 1.0, 0.03);
  EXPECT_NEAR(ns, 0.1, 0.03);
  // The Engram table (read by row): N(0, 0.5), FP8 with a scale per row per 32.
  const int64_t te = w.find("layers.1.engram.embed.weight");
  ASSERT_GE(te, 0);
  std::vector<int64_t> ids(999);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 5);
  Tensor rows = Tensor::empty({int64_t(ids.size()), c.engram.head_dim}, DType::kF32);
  engram_rows_f32(w.parts[size_t(te)][0], ids.data(), int64_t(ids.size()), rows.data<float>());
  auto [gm, gs] = moments(rows);
  EXPECT_NEAR(gm, 0.0, 0.01);
  EXPECT_NEAR(gs, 0.5, 0.03);
  fs::remove_all(dir);
}
