// Hostile safetensors files and folders (issue #20): deep JSON in the header, sizes that
// overflow, shard paths that are not regular files. Each is a CheckpointError naming the file,
// within a time budget, and the message is valid UTF-8.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/strings.h"
#include "io/safetensors.h"

using namespace deepinfer;
using namespace deepinfer::io;
namespace fs = std::filesystem;

namespace {
fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(testing::TempDir()) / ("di_io_hostile_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
  std::ofstream out(p, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data_bytes, '\0');
}

std::string deep(size_t depth) { return std::string(depth, '[') + "0" + std::string(depth, ']'); }

// Runs f under a wall-clock budget; returns the CheckpointError message.
template <typename F>
std::string checkpoint_error(F&& f, double budget_s = 2.0) {
  auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    f();
    ADD_FAILURE() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    msg = e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), budget_s) << msg;
  EXPECT_EQ(first_invalid_utf8(msg), std::string::npos) << msg;
  return msg;
}
#define EXPECT_HAS(s, needle) EXPECT_NE((s).find(needle), std::string::npos) << (s)
}  // namespace

TEST(SafetensorsHostile, DeepMetadataValue) {
  fs::path d = fresh_dir("meta");
  write_raw(d / "model.safetensors", R"({"__metadata__": {"k": )" + deep(100000) + "}}", 0);
  std::string e = checkpoint_error([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_HAS(e, "model.safetensors: corrupt header (not valid JSON): nested deeper than 256 levels");
}

TEST(SafetensorsHostile, DeepShape) {
  fs::path d = fresh_dir("shape");
  write_raw(d / "model.safetensors", R"({"w": {"dtype": "F32", "shape": )" + deep(100000) + R"(, "data_offsets": [0, 4]}})", 4);
  std::string e = checkpoint_error([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_HAS(e, "nested deeper than 256 levels");
  // Shallow but not integers: the message quotes a short rendering of the value.
  write_raw(d / "b.safetensors", R"({"w": {"dtype": "F32", "shape": [[[1, 2]]], "data_offsets": [0, 4]}})", 4);
  e = checkpoint_error([&] { SafetensorsFile::open((d / "b.safetensors").string()); });
  EXPECT_HAS(e, "tensor 'w': shape entries must be integers in [0, 2^63), got [[[1,2]]]");
}

TEST(SafetensorsHostile, ShapeProductsThatOverflow) {
  fs::path d = fresh_dir("overflow");
  // 2^32 * 2^32 elements: the old code multiplied in int64 (undefined) and compared garbage.
  write_raw(d / "a.safetensors", R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  std::string e = checkpoint_error([&] { SafetensorsFile::open((d / "a.safetensors").string()); });
  EXPECT_HAS(e, "tensor 'w': shape [4294967296,4294967296] has more elements than 64-bit sizes can hold");
  // A zero dim does not hide an overflowing remainder (strides over the others must exist).
  write_raw(d / "b.safetensors", R"({"w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  e = checkpoint_error([&] { SafetensorsFile::open((d / "b.safetensors").string()); });
  EXPECT_HAS(e, "has more elements than 64-bit sizes can hold");
  // Past int64: refused instead of wrapping to a negative dim.
  write_raw(d / "c.safetensors", R"({"w": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 0]}})", 0);
  e = checkpoint_error([&] { SafetensorsFile::open((d / "c.safetensors").string()); });
  EXPECT_HAS(e, "shape entries must be integers in [0, 2^63)");
  // A legitimate empty tensor still opens.
  write_raw(d / "ok.safetensors", R"({"w": {"dtype": "F32", "shape": [0, 7], "data_offsets": [0, 0]}})", 0);
  EXPECT_EQ(SafetensorsFile::open((d / "ok.safetensors").string())->tensors().size(), 1u);
}

TEST(SafetensorsHostile, CorruptHeaderBytesGiveCheckpointErrorInUtf8) {
  fs::path d = fresh_dir("bytes");
  write_raw(d / "model.safetensors", std::string("{\"w\": \xff\xfe\x80 }"), 0);
  std::string e = checkpoint_error([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_HAS(e, "corrupt header (not valid JSON)");
}

TEST(SafetensorsHostile, NamedPipeShardDoesNotBlock) {
  fs::path d = fresh_dir("fifo");
  ASSERT_EQ(::mkfifo((d / "model.safetensors").c_str(), 0600), 0);
  std::string e = checkpoint_error([&] { Checkpoint::open(d.string()); });
  EXPECT_HAS(e, "model.safetensors: is a named pipe, not a regular file");
  e = checkpoint_error([&] { SafetensorsFile::open((d / "model.safetensors").string()); });
  EXPECT_HAS(e, "is a named pipe");
}

TEST(SafetensorsHostile, NamedPipeIndexAndShardOutsideTheFolder) {
  fs::path d = fresh_dir("fifo_index");
  ASSERT_EQ(::mkfifo((d / "model.safetensors.index.json").c_str(), 0600), 0);
  std::string e = checkpoint_error([&] { Checkpoint::open(d.string()); });
  EXPECT_HAS(e, "model.safetensors.index.json: is a named pipe, not a regular file");
  fs::remove(d / "model.safetensors.index.json");
  std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"a": "../elsewhere.safetensors"}})";
  e = checkpoint_error([&] { Checkpoint::open(d.string()); });
  EXPECT_HAS(e, "weight_map['a'] = '../elsewhere.safetensors' is not a file name in the checkpoint folder");
  std::ofstream(d / "model.safetensors.index.json", std::ios::trunc) << R"({"weight_map": )" + deep(100000) + "}";
  e = checkpoint_error([&] { Checkpoint::open(d.string()); });
  EXPECT_HAS(e, "model.safetensors.index.json: not valid JSON: nested deeper than 256 levels");
}

// Found by fuzz_safetensors_index (tests/fuzz/regressions/safetensors_index): a shard name longer
// than the OS allows threw std::filesystem_error out of Checkpoint::open (terminate in the fuzzer).
TEST(SafetensorsHostile, ShardNameTooLongIsACheckpointError) {
  fs::path d = fresh_dir("long_shard");
  const std::string shard = "model-00002-of-00002.safe" + std::string(5000, '[') + "tensors";
  std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"a": ")" + shard + R"("}})";
  std::string e = checkpoint_error([&] { Checkpoint::open(d.string()); });
  EXPECT_HAS(e, "model.safetensors.index.json: shard model-00002-of-00002.safe[[[");
  EXPECT_HAS(e, "File name too long");
}

TEST(SafetensorsHostile, ProcessSurvivesAndGoodFilesStillOpen) {
  // After every failure above, a well-formed file in the same process opens normally.
  fs::path d = fresh_dir("after");
  SafetensorsWriter w;
  std::vector<float> v = {1.f, 2.f, 3.f};
  w.add("x", Tensor::from_vector(v, {3}));
  w.write((d / "model.safetensors").string());
  Checkpoint c = Checkpoint::open(d.string());
  EXPECT_EQ(c.get("x").data<float>()[2], 3.f);
}
