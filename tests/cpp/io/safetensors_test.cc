// SafetensorsFile / Checkpoint / SafetensorsWriter: round trips and one test per kind of bad file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/numeric.h"
#include "io/safetensors.h"

using namespace deepinfer;
using namespace deepinfer::io;
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("di_io_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Writes a safetensors file with a hand-made header (for corrupt-header tests).
void write_raw(const fs::path& p, const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
  std::ofstream out(p, std::ios::binary);
  uint64_t n = claimed_len ? claimed_len : header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  std::string data(data_bytes, '\x01');
  out << data;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected CheckpointError";
  return "";
}

Tensor ramp(const Shape& s, float mul) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = mul * float(i % 97) - 3.5f;
  return Tensor::from_vector(v, s);
}
}  // namespace

TEST(Safetensors, RoundTripAllDtypes) {
  fs::path d = fresh_dir("rt");
  SafetensorsWriter w;
  Tensor a = ramp({3, 5}, 0.25f), b = ramp({7}, -1.5f).to(DType::kBF16), c = ramp({2, 2, 3}, 0.5f).to(DType::kF8E4M3);
  std::vector<uint8_t> e8 = {120, 127, 130};
  std::vector<int64_t> ids = {0, -5, int64_t(1) << 40};
  w.add("a", a);
  w.add("b", b);
  w.add("c", c);
  w.add_raw("scale", "F8_E8M0", {3}, e8.data(), e8.size());
  w.add_raw("ids", "I64", {3}, ids.data(), 24);
  w.add_raw("empty", "F32", {0, 4}, nullptr, 0);
  w.set_metadata("format", "pt");
  w.write((d / "x.safetensors").string());

  auto f = SafetensorsFile::open((d / "x.safetensors").string());
  EXPECT_EQ(f->tensors().size(), 6u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  Tensor ra = f->tensor("a");
  EXPECT_EQ(ra.dtype(), DType::kF32);
  EXPECT_EQ(ra.shape(), (Shape{3, 5}));
  EXPECT_EQ(std::memcmp(ra.raw_data(), a.raw_data(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(f->tensor("b").raw_data(), b.raw_data(), b.nbytes()), 0);
  EXPECT_EQ(f->tensor("c").dtype(), DType::kF8E4M3);
  EXPECT_EQ(std::memcmp(f->tensor("c").raw_data(), c.raw_data(), c.nbytes()), 0);
  EXPECT_FLOAT_EQ(f->tensor("scale").to_f32().data<float>()[2], 8.f);  // 2^(130-127)
  // "ids" sits off 8-byte alignment in this file (no padding between tensors): read through an
  // aligned copy, not a misaligned view (UBSan: misaligned reference binding).
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f->tensor("ids").raw_data()) % alignof(int64_t), 0u);
  EXPECT_EQ(f->tensor("ids").data<int64_t>()[2], int64_t(1) << 40);
  EXPECT_EQ(f->tensor("empty").numel(), 0);
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_NE(error_of([&] { f->tensor("nope"); }).find("x.safetensors: no tensor 'nope'"), std::string::npos);
}

TEST(Safetensors, ViewOutlivesFileAndCheckpoint) {
  fs::path d = fresh_dir("alive");
  SafetensorsWriter w;
  w.add("t", ramp({4, 4}, 1.f));
  w.write((d / "model.safetensors").string());
  Tensor t;
  {
    Checkpoint c = Checkpoint::open(d.string());
    t = c.get("t");
  }
  EXPECT_FLOAT_EQ(t.data<float>()[5], 5.f - 3.5f);
}

TEST(Safetensors, MultiShardIndex) {
  fs::path d = fresh_dir("shards");
  SafetensorsWriter w1, w2;
  w1.add("layers.0.w", ramp({2, 3}, 1.f));
  w2.add("layers.1.w", ramp({4}, 2.f));
  w2.add("head", ramp({5}, 3.f));
  w1.write((d / "model-00001-of-00002.safetensors").string());
  w2.write((d / "model-00002-of-00002.safetensors").string());
  write_index(d.string(), {{"layers.0.w", "model-00001-of-00002.safetensors"},
                           {"layers.1.w", "model-00002-of-00002.safetensors"},
                           {"head", "model-00002-of-00002.safetensors"}},
              100);
  // A stray file that the index does not name must not be read.
  write_raw(d / "junk.safetensors", "{not json", 0);
  Checkpoint c = Checkpoint::open(d.string());
  EXPECT_EQ(c.files().size(), 2u);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"head", "layers.0.w", "layers.1.w"}));
  EXPECT_EQ(c.file_of("layers.1.w"), "model-00002-of-00002.safetensors");
  EXPECT_EQ(c.get("head").shape(), (Shape{5}));
  EXPECT_FLOAT_EQ(c.get("layers.1.w").data<float>()[1], 2.f - 3.5f);
  EXPECT_NE(error_of([&] { c.get("missing.w"); }).find("no tensor 'missing.w'"), std::string::npos);
}

TEST(Safetensors, GlobsAllShardsWithoutIndex) {
  fs::path d = fresh_dir("glob");
  SafetensorsWriter w1, w2;
  w1.add("a", ramp({2}, 1.f));
  w2.add("b", ramp({2}, 1.f));
  w1.write((d / "part-a.safetensors").string());
  w2.write((d / "part-b.safetensors").string());
  EXPECT_EQ(Checkpoint::open(d.string()).num_tensors(), 2u);
  // The same name in two shards is ambiguous.
  SafetensorsWriter w3;
  w3.add("a", ramp({2}, 1.f));
  w3.write((d / "part-c.safetensors").string());
  std::string e = error_of([&] { Checkpoint::open(d.string()); });
  EXPECT_NE(e.find("part-c.safetensors: tensor 'a' is also in part-a.safetensors"), std::string::npos) << e;
}

TEST(SafetensorsErrors, TruncatedShard) {
  fs::path d = fresh_dir("trunc");
  SafetensorsWriter w;
  w.add("first", ramp({16}, 1.f));
  w.add("layers.3.attn.wkv.weight", ramp({8, 8}, 1.f));
  w.write((d / "model.safetensors").string());
  fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 10);
  std::string e = error_of([&] { Checkpoint::open(d.string()); });
  EXPECT_NE(e.find("model.safetensors: tensor 'layers.3.attn.wkv.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(SafetensorsErrors, BadJsonHeader) {
  fs::path d = fresh_dir("badjson");
  write_raw(d / "model.safetensors", "{\"a\": {\"dtype\": \"F32\", ", 16);
  std::string e = error_of([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_NE(e.find("model.safetensors: corrupt header"), std::string::npos) << e;
}

TEST(SafetensorsErrors, HeaderLengthPastEof) {
  fs::path d = fresh_dir("hdrlen");
  write_raw(d / "model.safetensors", "{}", 0, 1 << 20);
  std::string e = error_of([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_NE(e.find("model.safetensors: header length 1048576 runs past the end of the file"), std::string::npos) << e;
  std::ofstream(d / "tiny.safetensors") << "abc";
  e = error_of([&] { SafetensorsFile::open((d / "tiny.safetensors").string()); });
  EXPECT_NE(e.find("tiny.safetensors: file is 3 bytes"), std::string::npos) << e;
}

TEST(SafetensorsErrors, OverlappingRanges) {
  fs::path d = fresh_dir("overlap");
  write_raw(d / "model.safetensors",
            R"({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
            R"( "y": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
            24);
  std::string e = error_of([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_NE(e.find("model.safetensors: tensors 'x' [0,16) and 'y' [8,24) overlap"), std::string::npos) << e;
}

TEST(SafetensorsErrors, ShapeDoesNotMatchByteRange) {
  fs::path d = fresh_dir("range");
  write_raw(d / "model.safetensors", R"({"w": {"dtype": "BF16", "shape": [3, 4], "data_offsets": [0, 16]}})", 16);
  std::string e = error_of([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_NE(e.find("tensor 'w': byte range 16 != 24 for BF16[3,4]"), std::string::npos) << e;
}

TEST(SafetensorsErrors, UnknownDtype) {
  fs::path d = fresh_dir("dtype");
  write_raw(d / "model.safetensors", R"({"w": {"dtype": "Q4_K", "shape": [4], "data_offsets": [0, 4]}})", 4);
  std::string e = error_of([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_NE(e.find("model.safetensors: tensor 'w': unknown dtype 'Q4_K'"), std::string::npos) << e;
}

TEST(SafetensorsErrors, IndexPointsAtMissingShard) {
  fs::path d = fresh_dir("missing_shard");
  SafetensorsWriter w;
  w.add("a", ramp({2}, 1.f));
  w.write((d / "model-00001-of-00002.safetensors").string());
  write_index(d.string(), {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}, 8);
  std::string e = error_of([&] { Checkpoint::open(d.string()); });
  EXPECT_NE(e.find("model.safetensors.index.json: shard model-00002-of-00002.safetensors (holding tensor 'b') does not exist"),
            std::string::npos) << e;
}

TEST(SafetensorsErrors, IndexNamesTensorTheShardLacks) {
  fs::path d = fresh_dir("index_lies");
  SafetensorsWriter w;
  w.add("a", ramp({2}, 1.f));
  w.write((d / "model-00001-of-00001.safetensors").string());
  write_index(d.string(), {{"a", "model-00001-of-00001.safetensors"}, {"ghost", "model-00001-of-00001.safetensors"}}, 8);
  std::string e = error_of([&] { Checkpoint::open(d.string()); });
  EXPECT_NE(e.find("tensor 'ghost' is listed in shard model-00001-of-00001.safetensors but that shard does not contain it"),
            std::string::npos) << e;
}

TEST(SafetensorsErrors, EmptyOrMissingFolder) {
  fs::path d = fresh_dir("empty");
  EXPECT_NE(error_of([&] { Checkpoint::open(d.string()); }).find("no model.safetensors.index.json"), std::string::npos);
  EXPECT_NE(error_of([&] { Checkpoint::open((d / "nope").string()); }).find("no such checkpoint folder"),
            std::string::npos);
}
