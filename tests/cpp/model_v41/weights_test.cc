// V41Weights::load on the goldens: the release layout (FP8 32x32, packed FP4, FP8 Engram rows)
// decodes to exactly the transformers layout's values (the fixtures hold the same weights), the
// Engram table read by row equals the float table, the DSpark stages load, and bad
// checkpoints are refused naming the tensor.
#include "model/deepseek_v41/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "deepinfer/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace deepinfer::model::v41 {
namespace {
using v41_test::golden;
namespace fs = std::filesystem;

DeepseekV41Config cfg_of(const std::string& dir) {
  return DeepseekV41Config::from_file((golden(dir) / "config.json").string());
}

void expect_same_values(const std::string& hf_dir, const std::string& rel_dir) {
  SCOPED_TRACE(rel_dir);
  const DeepseekV41Config ch = cfg_of(hf_dir), cr = cfg_of(rel_dir);
  const V41Weights h = V41Weights::load(golden(hf_dir).string(), ch);
  const V41Weights r = V41Weights::load(golden(rel_dir).string(), cr);
  EXPECT_EQ(h.layout, V41Layout::kTransformers);
  EXPECT_EQ(r.layout, V41Layout::kRelease);
  ASSERT_EQ(h.num_dspark, 0);  // the HF fixtures have no DSpark stages; main entries come first
  ASSERT_EQ(h.table.entries.size(), r.table.entries.size() - v41_dspark_table(cr).entries.size() * (r.num_dspark > 0));
  int64_t fp8 = 0, fp4 = 0, zeros = 0;
  for (size_t i = 0; i < h.table.entries.size(); ++i) {
    const V41Entry& e = r.table.entries[i];
    ASSERT_EQ(e.name(), h.table.entries[i].name());
    for (const v4::Linear& l : r.parts[i]) {
      fp8 += l.format == v4::WeightFormat::kFP8Block;
      fp4 += l.format == v4::WeightFormat::kFP4;
    }
    if (e.store == V41Store::kEngramTable) {
      const int64_t rows = e.parts[0].shape[0], dim = e.parts[0].shape[1];
      std::vector<int64_t> ids;
      for (int64_t k = 0; k < rows; k += 7) ids.push_back(k);
      ids.push_back(rows - 1);
      std::vector<float> a(ids.size() * size_t(dim)), b(a.size());
      engram_rows_f32(r.parts[i][0], ids.data(), int64_t(ids.size()), a.data());
      engram_rows_f32(h.parts[i][0], ids.data(), int64_t(ids.size()), b.data());
      EXPECT_EQ(a, b) << e.name();
      EXPECT_EQ(r.parts[i][0].format, v4::WeightFormat::kFP8Block);
      const int64_t bad = rows;
      EXPECT_THROW(engram_rows_f32(r.parts[i][0], &bad, 1, a.data()), InvalidArgument);
      continue;
    }
    const Tensor a = r.entry_f32(i, cr), b = h.entry_f32(i, ch);
    ASSERT_EQ(a.shape(), b.shape()) << e.name();
    // Equal values (a packed-FP4 zero may carry the other sign than the float file's: -0 == +0).
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    int64_t diff = 0, signed_zero = 0;
    for (int64_t j = 0; j < a.numel(); ++j) {
      diff += !(pa[j] == pb[j]);
      signed_zero += pa[j] == 0.f && std::signbit(pa[j]) != std::signbit(pb[j]);
    }
    EXPECT_EQ(diff, 0) << e.name() << " differs between layouts";
    if (e.store != V41Store::kExpert) { EXPECT_EQ(signed_zero, 0) << e.name(); }
    zeros += signed_zero;
  }
  EXPECT_GT(fp8, 0);
  EXPECT_GT(fp4, 0);
  std::printf("%s: %lld packed-fp4 zeros with the other sign\n", rel_dir.c_str(), (long long)zeros);
}

TEST(V41Weights, ReleaseDecodesToTransformersValues) {
  expect_same_values("v41_a", "v41_a_release");
  expect_same_values("v41_b", "v41_b_release");
  const V41Weights r = V41Weights::load(golden("v41_a_release").string(), cfg_of("v41_a_release"));
  EXPECT_TRUE(r.skipped.empty());  // its DSpark stages are loaded, not skipped
  EXPECT_EQ(r.num_dspark, 3);
  const int64_t mp = r.find("mtp.0.main_proj.weight");
  ASSERT_GE(mp, 0);
  EXPECT_EQ(r.parts[size_t(mp)][0].format, v4::WeightFormat::kFP8Block);
  EXPECT_EQ(r.entry_f32(size_t(mp), cfg_of("v41_a_release")).size(1), 3 * 32);
  EXPECT_GE(r.find("layers.6.attn.compressor.wkv.weight"), 0);
  EXPECT_EQ(r.find("layers.7.attn.compressor.wkv.weight"), -1);
}

// A copy of v41_b_release with one tensor changed by `edit` (name -> replacement or drop).
std::string broken_copy(const std::string& tag, const std::string& drop, const std::string& add_name) {
  const fs::path src = golden("v41_b_release");
  const fs::path dst = fs::temp_directory_path() / ("v41_weights_" + tag + std::to_string(::getpid()));
  fs::remove_all(dst);
  fs::create_directories(dst);
  fs::copy_file(src / "config.json", dst / "config.json");
  const io::Checkpoint ck = io::Checkpoint::open(src.string());
  io::SafetensorsWriter wr;
  for (const std::string& n : ck.names()) {
    if (n == drop) continue;
    const io::TensorInfo& ti = ck.info(n);
    const Tensor t = ck.get(n);
    wr.add_raw(n, ti.st_dtype, ti.shape, t.raw_data(), size_t(ti.end - ti.begin));
  }
  if (!add_name.empty()) {
    const float one = 1.f;
    wr.add_raw(add_name, "F32", {1}, &one, sizeof one);
  }
  wr.write((dst / "model.safetensors").string());
  return dst.string();
}

TEST(V41Weights, BadCheckpointsNameTheTensor) {
  const DeepseekV41Config c = cfg_of("v41_b_release");
  {
    const std::string d = broken_copy("scale", "layers.3.attn.wq_b.scale", "");
    const std::string m = v41_test::error_of<CheckpointError>([&] { V41Weights::load(d, c); });
    EXPECT_NE(m.find("layers.3.attn.wq_b.scale"), std::string::npos) << m;
    fs::remove_all(d);
  }
  {
    const std::string d = broken_copy("expert", "layers.2.ffn.experts.4.w2.weight", "");
    const std::string m = v41_test::error_of<CheckpointError>([&] { V41Weights::load(d, c); });
    EXPECT_NE(m.find("layers.2.ffn.experts.4.w2.weight"), std::string::npos) << m;
    fs::remove_all(d);
  }
  {
    const std::string d = broken_copy("extra", "", "layers.2.attn.brand_new");
    const std::string m = v41_test::error_of<CheckpointError>([&] { V41Weights::load(d, c); });
    EXPECT_NE(m.find("layers.2.attn.brand_new"), std::string::npos) << m;
    fs::remove_all(d);
  }
}

}  // namespace
}  // namespace deepinfer::model::v41
