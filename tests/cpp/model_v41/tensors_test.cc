// The V4.1 tensor table against the goldens' checkpoints in both layouts: every listed tensor is
// there with its shape and release storage (FP8 + 32x32 scales, packed FP4 + per-32 scales, FP8
// Engram rows + per-row scales, bf16/f32 elsewhere), every checkpoint tensor is listed or belongs
// to a part the main model skips (DSpark, vision), and no name is listed twice.
#include "model/deepseek_v41/tensors.h"

#include <gtest/gtest.h>

#include <set>

#include "io/safetensors.h"
#include "model/deepseek_v41/plan.h"
#include "test_util.h"

namespace deepinfer::model::v41 {
namespace {
using v41_test::golden;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string scale_name(const std::string& weight) {
  return weight.substr(0, weight.size() - std::string(".weight").size()) + ".scale";
}

void expect_tensor(const io::Checkpoint& ck, const std::string& n, const std::set<std::string>& dtypes,
                   const Shape& shape, std::set<std::string>& seen) {
  ASSERT_TRUE(ck.contains(n)) << n;
  const io::TensorInfo& ti = ck.info(n);
  EXPECT_TRUE(dtypes.count(ti.st_dtype)) << n << " is " << ti.st_dtype;
  EXPECT_EQ(ti.shape, shape) << n;
  EXPECT_TRUE(seen.insert(n).second) << n << " listed twice";
}

void check_fixture(const std::string& dir, bool release) {
  SCOPED_TRACE(dir);
  const DeepseekV41Config c = DeepseekV41Config::from_file((golden(dir) / "config.json").string());
  const io::Checkpoint ck = io::Checkpoint::open(golden(dir).string());
  V41TensorTable t = v41_tensor_table(c, v41_plan(c, {}));
  const bool dspark = c.dspark.num_stages > 0 && ck.contains("mtp.0.attn_norm.weight");
  if (dspark)
    for (V41Entry& e : v41_dspark_table(c).entries) t.entries.push_back(std::move(e));
  std::set<std::string> seen;
  const std::set<std::string> kFloatTypes = {"F32", "BF16"}, kBf16 = {"BF16"};
  int64_t unused = 0, engram_tables = 0;
  for (const V41Entry& e : t.entries) {
    unused += !e.used;
    for (const V41Part& p : e.parts) {
      const std::string n = release ? p.name : (p.hf.empty() ? "model." + p.name : p.hf);
      if (!release) {
        expect_tensor(ck, n, kFloatTypes, p.shape, seen);
        if (e.store == V41Store::kEngramTable) {  // all ones: a float table has no scale to apply
          const std::string s = scale_name(n);
          expect_tensor(ck, s, kFloatTypes, {p.shape[0], p.shape[1] / 32}, seen);
          ++engram_tables;
        }
        continue;
      }
      const int64_t out = p.shape.empty() ? 0 : p.shape[0], in = p.shape.size() > 1 ? p.shape[1] : 0;
      switch (e.store) {
        case V41Store::kFloat: expect_tensor(ck, n, kFloatTypes, p.shape, seen); break;
        case V41Store::kPlain: case V41Store::kEmbed: case V41Store::kHead:
          expect_tensor(ck, n, kBf16, p.shape, seen);
          break;
        case V41Store::kDense:
          expect_tensor(ck, n, {"F8_E4M3"}, p.shape, seen);
          expect_tensor(ck, scale_name(n), {"F8_E8M0"},
                        {ceil_div(out, c.fp8_block_out), ceil_div(in, c.fp8_block_in)}, seen);
          break;
        case V41Store::kExpert:
          expect_tensor(ck, n, {"I8"}, {out, in / 2}, seen);
          expect_tensor(ck, scale_name(n), {"F8_E8M0"}, {out, in / c.fp4_block}, seen);
          break;
        case V41Store::kEngramTable:
          expect_tensor(ck, n, {"F8_E4M3"}, p.shape, seen);
          expect_tensor(ck, scale_name(n), {"F8_E8M0"}, {out, in / 32}, seen);
          ++engram_tables;
          break;
      }
    }
  }
  EXPECT_EQ(unused, c.num_layers);  // one gate.bias_vl per layer
  EXPECT_EQ(engram_tables, int64_t(c.engram.layer_ids.size()));
  int64_t skipped = 0;
  for (const std::string& n : ck.names()) {
    if (seen.count(n)) continue;
    EXPECT_TRUE(v41_skipped_tensor(n)) << n << " is in the checkpoint but not in the table";
    ++skipped;
  }
  EXPECT_EQ(skipped, 0);
  EXPECT_EQ(dspark, dir == "v41_a_release");  // the one fixture with DSpark stages
}

TEST(V41Tensors, GoldenCheckpointsBothLayouts) {
  check_fixture("v41_a", false);
  check_fixture("v41_b", false);
  check_fixture("v41_a_release", true);
  check_fixture("v41_b_release", true);
}

TEST(V41Tensors, ReleasedShapes) {
  const DeepseekV41Config c = DeepseekV41Config::from_json_string(v41_test::release_json().dump(), "config.json");
  const V41TensorTable t = v41_tensor_table(c, v41_plan(c, {}));
  std::set<std::string> names;
  int64_t experts = 0;
  for (const V41Entry& e : t.entries) {
    for (const V41Part& p : e.parts) EXPECT_TRUE(names.insert(p.name).second) << p.name;
    experts += e.store == V41Store::kExpert && e.expert_w13;
  }
  EXPECT_EQ(experts, 40 * 384);
  auto shape_of = [&](const std::string& n) {
    for (const V41Entry& e : t.entries)
      for (const V41Part& p : e.parts)
        if (p.name == n) return p.shape;
    return Shape{};
  };
  EXPECT_EQ(shape_of("layers.1.engram.embed.weight"), (Shape{384006168, 256}));
  EXPECT_EQ(shape_of("layers.14.engram.wkv.weight"), (Shape{25600, 6144}));
  EXPECT_EQ(shape_of("layers.20.attn.indexer.wk.weight"), (Shape{128, 512}));
  EXPECT_EQ(shape_of("layers.24.attn.indexer.wq_b.weight"), (Shape{32 * 128, 1280}));
  EXPECT_TRUE(shape_of("layers.24.attn.indexer.wk.weight").empty());  // Reindex: the source's keys
  EXPECT_TRUE(shape_of("layers.20.attn.compressor.wgate.weight").empty());  // ratio 1: no gate
  EXPECT_EQ(shape_of("layers.8.attn.compressor.wgate.weight"), (Shape{512, 5120}));
  EXPECT_TRUE(shape_of("layers.3.attn.compressor.wkv.weight").empty());  // Reuse owns nothing
  EXPECT_EQ(shape_of("layers.39.ffn.experts.383.w2.weight"), (Shape{5120, 2304}));
  // DSpark: heterogeneous stages (main_proj on the first, the heads on the last), 128 experts each.
  const V41TensorTable d = v41_dspark_table(c);
  std::set<std::string> dn;
  int64_t dexperts = 0;
  for (const V41Entry& e : d.entries) {
    for (const V41Part& p : e.parts) EXPECT_TRUE(dn.insert(p.name).second && !names.count(p.name)) << p.name;
    dexperts += e.store == V41Store::kExpert && e.expert_w13;
    EXPECT_GE(e.layer, 40);
  }
  EXPECT_EQ(dexperts, 3 * 128);
  auto dshape = [&](const std::string& n) {
    for (const V41Entry& e : d.entries)
      if (e.name() == n) return e.parts[0].shape;
    return Shape{};
  };
  EXPECT_EQ(dshape("mtp.0.main_proj.weight"), (Shape{5120, 15360}));
  EXPECT_TRUE(dshape("mtp.1.main_proj.weight").empty());
  EXPECT_EQ(dshape("mtp.2.markov_head.head.weight"), (Shape{129280, 256}));
  EXPECT_EQ(dshape("mtp.2.confidence_head.proj.weight"), (Shape{1, 5376}));
  EXPECT_TRUE(dshape("mtp.0.confidence_head.proj.weight").empty());
  EXPECT_TRUE(v41_skipped_tensor("mtp.0.main_proj.weight"));
  EXPECT_TRUE(v41_skipped_tensor("model.vision.blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(v41_skipped_tensor("layers.0.attn.wkv.weight"));
}

}  // namespace
}  // namespace deepinfer::model::v41
