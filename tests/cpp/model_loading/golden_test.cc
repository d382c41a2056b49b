// Loads the golden fixtures of tests/data/golden (see its README): tiny/ and tiny_clamp/ in the
// transformers layout; tiny_official/ (release layout, FP8/FP4 + mtp.0) when present, checked
// against tiny/ within the FP8/FP4 rounding.
#include <cmath>

#include "io/safetensors.h"
#include "model/deepseek_v4/weights.h"
#include "test_util.h"

using namespace deepinfer;
using namespace deepinfer::model::v4;
using namespace di_test;

namespace {
fs::path golden(const std::string& name) { return source_dir() / "tests" / "data" / "golden" / name; }

float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  return m;
}
}  // namespace

class GoldenTransformers : public testing::TestWithParam<std::string> {};

TEST_P(GoldenTransformers, LoadsCompletely) {
  const fs::path d = golden(GetParam());
  if (!fs::exists(d / "config.json")) GTEST_SKIP() << "golden fixture " << d << " not present";
  DeepseekV4Config c = DeepseekV4Config::from_file(d.string());
  EXPECT_EQ(c.layout, CheckpointLayout::kTransformers);
  DeepseekV4Weights w = DeepseekV4Weights::load(d.string(), c, {.progress = false});
  EXPECT_EQ(w.layout, CheckpointLayout::kTransformers);
  EXPECT_TRUE(w.ignored_tensors.empty()) << w.ignored_tensors.front();
  ASSERT_EQ(int64_t(w.layers.size()), c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    EXPECT_EQ(w.layers[l].attn.compressor.has_value(), c.layer_types[l] != AttnKind::kSliding);
    EXPECT_EQ(w.layers[l].attn.indexer.has_value(), c.layer_types[l] == AttnKind::kCSA);
    EXPECT_EQ(w.layers[l].ffn.tid2eid.defined(), c.mlp_types[l] == MlpKind::kHashMoE);
    EXPECT_EQ(int64_t(w.layers[l].ffn.experts.size()), c.n_routed_experts);
  }
  // Every tensor is a view: the embedding points into the mapped file.
  auto ck = std::static_pointer_cast<io::Checkpoint>(w.keepalive);
  EXPECT_EQ(w.embed.raw_data(), ck->get("model.embed_tokens.weight").raw_data());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTransformers, testing::Values("tiny", "tiny_clamp"));

TEST(GoldenOfficial, DequantisedWeightsMatchTransformersLayout) {
  const fs::path dof = golden("tiny_official"), dhf = golden("tiny");
  if (!fs::exists(dof / "config.json") || !fs::exists(dhf / "config.json"))
    GTEST_SKIP() << "golden fixture tiny_official/ (or tiny/) not present yet";
  DeepseekV4Config co = DeepseekV4Config::from_file(dof.string()), ch = DeepseekV4Config::from_file(dhf.string());
  EXPECT_EQ(co.layout, CheckpointLayout::kOfficial);
  DeepseekV4Weights o = DeepseekV4Weights::load(dof.string(), co, {.progress = false});
  DeepseekV4Weights h = DeepseekV4Weights::load(dhf.string(), ch, {.progress = false});
  EXPECT_EQ(o.layout, CheckpointLayout::kOfficial);
  EXPECT_TRUE(o.ignored_tensors.empty()) << o.ignored_tensors.front();
  EXPECT_EQ(int64_t(o.mtp.size()), co.num_mtp_layers);
  ASSERT_EQ(o.layers.size(), h.layers.size());
  // Relative error bounds of the stored encodings vs the fp32 (bf16-exact) originals.
  auto check = [](const Linear& q, const Linear& r, const std::string& what) {
    Tensor a = q.dequantize_f32(), b = r.dequantize_f32();
    float amax = 0;
    for (int64_t i = 0; i < b.numel(); ++i) amax = std::max(amax, std::fabs(b.data<float>()[i]));
    const float tol = q.format == WeightFormat::kFP4 ? 0.25f * amax : q.format == WeightFormat::kFP8Block ? amax / 16.f : 0.f;
    EXPECT_LE(max_abs_diff(a, b), tol) << what;
  };
  for (size_t l = 0; l < o.layers.size(); ++l) {
    const auto &a = o.layers[l], &b = h.layers[l];
    const std::string L = "layer " + std::to_string(l);
    check(a.attn.wq_a, b.attn.wq_a, L + " wq_a");
    check(a.attn.wq_b, b.attn.wq_b, L + " wq_b");
    check(a.attn.wkv, b.attn.wkv, L + " wkv");
    check(a.attn.wo_a, b.attn.wo_a, L + " wo_a");
    check(a.attn.wo_b, b.attn.wo_b, L + " wo_b");
    check(a.ffn.shared.w1, b.ffn.shared.w1, L + " shared.w1");
    for (size_t e = 0; e < a.ffn.experts.size(); ++e) {
      check(a.ffn.experts[e].w1, b.ffn.experts[e].w1, L + " expert w1");
      check(a.ffn.experts[e].w3, b.ffn.experts[e].w3, L + " expert w3");
      check(a.ffn.experts[e].w2, b.ffn.experts[e].w2, L + " expert w2");
    }
    EXPECT_EQ(max_abs_diff(a.attn_norm.to_f32(), b.attn_norm.to_f32()), 0.f) << L;  // bf16-exact originals
    EXPECT_EQ(max_abs_diff(a.hc_attn.fn.to_f32(), b.hc_attn.fn.to_f32()), 0.f) << L;
  }
  EXPECT_EQ(max_abs_diff(o.embed.to_f32(), h.embed.to_f32()), 0.f);
}
