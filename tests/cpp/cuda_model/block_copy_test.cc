// Device gather / scatter of paged cache blocks (block_copy.h, GpuCache::gather_blocks /
// scatter_blocks; disaggregation's device hop, issue #18). On caches of odd layer mixes (layers
// with entries and index keys, entries only, none; bf16 and f32; a 14-byte part that forces the
// 1-byte copy unit), every block filled with random non-zero bytes through the host tier's copy:
//  * gather of an odd block list == the host copy's bytes of the same blocks (the bundle is the
//    same bytes whichever side made it);
//  * scatter of those bytes into other blocks == the original blocks; blocks not listed keep
//    their bytes (poison check);
//  * an id out of range or listed twice is refused with InvalidArgument naming it (no GPU needed).
// BlockCopy.Bandwidth prints "[block-copy] ..." lines: the kernel vs one cudaMemcpyAsync per
// (block, part), and the host hop (device -> pinned host -> device), in GB/s.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "model/deepseek/cuda/block_copy.h"
#include "model/deepseek/cuda/cuda_cache.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {
namespace cuda = deepinfer::cuda;
namespace {

#define REQUIRE_GPU()                                                                      \
  do {                                                                                     \
    if (cuda::cuda_device_count() == 0)                                                    \
      GTEST_SKIP() << "CUDA test skipped: " << cuda::cuda_unavailable_reason();            \
  } while (0)

kv::LayerCacheSpec layer(int64_t ratio, int64_t d, int64_t index_dim) {
  kv::LayerCacheSpec s;
  s.window = 8;
  s.ring_rows = 9;
  s.head_dim = d;
  s.ratio = ratio;
  s.comp_width = ratio ? d : 0;
  s.state_rows = ratio ? 2 * ratio : 0;
  s.index_dim = index_dim;
  s.index_width = index_dim ? 2 * index_dim : 0;
  s.index_state_rows = index_dim ? 2 * ratio : 0;
  return s;
}

struct Fixture {
  cuda::Stream stream;
  GpuCache cache;
  size_t bb = 0;
  std::vector<std::vector<uint8_t>> content;  // by block id: what was written
  Fixture(const std::vector<kv::LayerCacheSpec>& specs, int64_t blocks, DType dt, uint32_t seed) {
    kv::CacheGeometry g;
    g.block_tokens = 256;
    g.num_blocks = blocks;
    g.num_slots = 2;
    cache = GpuCache(specs, g, dt, 0, stream.get());
    bb = cache.block_bytes();
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(1, 255);  // non-zero: a zeroed (unwritten) byte shows
    content.resize(size_t(blocks));
    std::vector<HostBlockCopy> copies;
    for (int64_t b = 0; b < blocks; ++b) {
      content[size_t(b)].resize(bb);
      for (uint8_t& x : content[size_t(b)]) x = uint8_t(byte(rng));
      copies.push_back({int32_t(b), content[size_t(b)].data()});
    }
    cache.copy_blocks(copies, /*to_host=*/false, stream.get());
  }
  std::vector<uint8_t> host_export(const std::vector<int32_t>& ids) {
    std::vector<uint8_t> out(ids.size() * bb);
    std::vector<HostBlockCopy> copies;
    for (size_t i = 0; i < ids.size(); ++i) copies.push_back({ids[i], out.data() + i * bb});
    cache.copy_blocks(copies, /*to_host=*/true, stream.get());
    return out;
  }
};

struct Case {
  const char* name;
  std::vector<kv::LayerCacheSpec> specs;
  DType dt;
};

std::vector<Case> cases() {
  return {
      // V4-like: CSA layers with index keys, HCA entries only, a window-only layer.
      {"bf16 mixed", {layer(4, 64, 32), layer(128, 64, 0), layer(0, 64, 0), layer(4, 48, 16)}, DType::kBF16},
      {"f32 mixed", {layer(4, 24, 8), layer(0, 16, 0), layer(128, 40, 0)}, DType::kF32},
      // ratio 256: one entry per block, d = 7 in bf16 -> a 14-byte part, the 1-byte unit.
      {"bf16 odd", {layer(256, 7, 0), layer(8, 12, 5)}, DType::kBF16},
  };
}

TEST(BlockCopy, GatherEqualsHostExportAndScatterRestores) {
  REQUIRE_GPU();
  for (const Case& c : cases()) {
    Fixture f(c.specs, 37, c.dt, 17);
    ASSERT_GT(f.bb, 0u) << c.name;
    const std::vector<int32_t> src = {5, 0, 36, 11, 12, 7, 29};  // odd order, both ends
    const std::vector<int32_t> dst = {30, 1, 20, 2, 35, 3, 9};
    cuda::DeviceBuffer staging(src.size() * f.bb);
    DI_CUDA_CHECK(cudaMemsetAsync(staging.data(), 0, staging.size_bytes(), f.stream.get()));
    f.cache.gather_blocks(src, staging.data(), f.stream.get());
    std::vector<uint8_t> packed(staging.size_bytes());
    cuda::copy_d2h(packed.data(), staging.data(), packed.size(), f.stream.get());
    EXPECT_TRUE(packed == f.host_export(src)) << c.name << ": gather differs from the host export";
    for (size_t i = 0; i < src.size(); ++i)
      EXPECT_EQ(0, std::memcmp(packed.data() + i * f.bb, f.content[size_t(src[i])].data(), f.bb)) << c.name << " " << i;

    f.cache.scatter_blocks(dst, staging.data(), f.stream.get());
    const std::vector<uint8_t> after = f.host_export(dst);
    EXPECT_TRUE(after == packed) << c.name << ": scatter did not write the gathered bytes";
    // Blocks in neither list (and the sources) keep their bytes.
    const std::vector<int32_t> others = {4, 6, 8, 10, 5, 0, 36};
    const std::vector<uint8_t> kept = f.host_export(others);
    for (size_t i = 0; i < others.size(); ++i)
      EXPECT_EQ(0, std::memcmp(kept.data() + i * f.bb, f.content[size_t(others[i])].data(), f.bb))
          << c.name << ": block " << others[i] << " changed";
  }
}

TEST(BlockCopy, EmptyListIsANoOp) {
  REQUIRE_GPU();
  Fixture f(cases()[0].specs, 4, DType::kBF16, 3);
  f.cache.gather_blocks({}, nullptr, f.stream.get());
  f.cache.scatter_blocks({}, nullptr, f.stream.get());
  f.stream.synchronize();
  EXPECT_TRUE(f.host_export({0, 1, 2, 3}) ==
              [&] {
                std::vector<uint8_t> v;
                for (int b = 0; b < 4; ++b) v.insert(v.end(), f.content[size_t(b)].begin(), f.content[size_t(b)].end());
                return v;
              }());
}

// No GPU needed: the checks run before any CUDA call.
TEST(BlockCopy, BadBlockListsAreRefusedByName) {
  auto msg = [](std::vector<int32_t> ids, int64_t n) -> std::string {
    try {
      check_block_list(ids, n, "test gather");
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(msg({3, 1, 4}, 5), "");
  EXPECT_NE(msg({3, 1, 3}, 5).find("block id 3 at position 2 repeats position 0"), std::string::npos) << msg({3, 1, 3}, 5);
  EXPECT_NE(msg({0, 5}, 5).find("block id 5 at position 1 outside [0, 5)"), std::string::npos) << msg({0, 5}, 5);
  EXPECT_NE(msg({-1}, 5).find("test gather: block id -1"), std::string::npos);
  // The copy unit: 16 only when every address, size and offset allows it.
  alignas(16) static char pool[64];
  const BlockPart a{pool, 32, 0}, odd{pool, 14, 32};
  EXPECT_EQ(block_copy_unit(std::vector<BlockPart>{a}, pool, 32), 16);
  EXPECT_EQ(block_copy_unit(std::vector<BlockPart>{a, {pool, 12, 32}}, pool, 44), 4);
  EXPECT_EQ(block_copy_unit(std::vector<BlockPart>{a, odd}, pool, 46), 1);
}

TEST(BlockCopy, BadBlockListsAreRefusedOnTheCache) {
  REQUIRE_GPU();
  Fixture f(cases()[2].specs, 9, DType::kBF16, 5);
  cuda::DeviceBuffer staging(4 * f.bb);
  EXPECT_THROW(f.cache.gather_blocks(std::vector<int32_t>{1, 2, 1}, staging.data(), f.stream.get()), InvalidArgument);
  EXPECT_THROW(f.cache.scatter_blocks(std::vector<int32_t>{9}, staging.data(), f.stream.get()), InvalidArgument);
  EXPECT_THROW(f.cache.gather_blocks(std::vector<int32_t>{0}, nullptr, f.stream.get()), InvalidArgument);
}

// The default model's block is ~26 KB; this sizes a production-like one (8 CSA layers of d 512
// bf16 with 128-wide index keys: 640 KB a block) so the figures are bandwidth, not launch cost.
TEST(BlockCopy, Bandwidth) {
  REQUIRE_GPU();
  std::vector<kv::LayerCacheSpec> specs;
  for (int i = 0; i < 8; ++i) specs.push_back(layer(4, 512, 128));
  const int64_t n = 192;
  Fixture f(specs, 2 * n + 1, DType::kBF16, 9);
  std::vector<int32_t> src, dst;
  for (int64_t i = 0; i < n; ++i) {
    src.push_back(int32_t(2 * i + 1));  // every other block: no contiguous runs to merge
    dst.push_back(int32_t(2 * i));
  }
  const size_t bytes = size_t(n) * f.bb;
  cuda::DeviceBuffer staging(bytes);
  auto time_ms = [&](auto&& body) {
    body();  // warm
    f.stream.synchronize();
    cuda::Event t0(true), t1(true);
    constexpr int kReps = 10;
    t0.record(f.stream.get());
    for (int r = 0; r < kReps; ++r) body();
    t1.record(f.stream.get());
    t1.synchronize();
    return double(t1.elapsed_ms_since(t0)) / kReps;
  };
  const double gather = time_ms([&] { f.cache.gather_blocks(src, staging.data(), f.stream.get()); });
  const double scatter = time_ms([&] { f.cache.scatter_blocks(dst, staging.data(), f.stream.get()); });
  // The alternative: one device-to-device cudaMemcpyAsync per (block, part).
  const double memcpys = time_ms([&] {
    size_t off = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t l = 0; l < int64_t(specs.size()); ++l) {
        GpuLayerCache& L = f.cache.layer(l);
        const size_t e = L.comp.size_bytes() / size_t(2 * n + 1), k = L.index_keys.size_bytes() / size_t(2 * n + 1);
        DI_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(staging.data()) + off, L.comp.as<char>() + size_t(src[i]) * e,
                                      e, cudaMemcpyDeviceToDevice, f.stream.get()));
        off += e;
        DI_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(staging.data()) + off,
                                      L.index_keys.as<char>() + size_t(src[i]) * k, k, cudaMemcpyDeviceToDevice,
                                      f.stream.get()));
        off += k;
      }
  });
  // The host hop today: device -> pinned host (export) and back (import).
  cuda::PinnedBuffer host(bytes);
  std::vector<HostBlockCopy> out, in;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back({src[size_t(i)], host.as<uint8_t>() + size_t(i) * f.bb});
    in.push_back({dst[size_t(i)], host.as<uint8_t>() + size_t(i) * f.bb});
  }
  const auto h0 = std::chrono::steady_clock::now();
  f.cache.copy_blocks(out, true, f.stream.get());
  const auto h1 = std::chrono::steady_clock::now();
  f.cache.copy_blocks(in, false, f.stream.get());
  const auto h2 = std::chrono::steady_clock::now();
  const double d2h = std::chrono::duration<double, std::milli>(h1 - h0).count();
  const double h2d = std::chrono::duration<double, std::milli>(h2 - h1).count();
  auto gbs = [&](double ms) { return double(bytes) / (ms * 1e6); };
  std::printf("[block-copy] %lld blocks x %zu B = %.1f MB, %zu parts a block\n", (long long)n, f.bb, bytes / 1e6,
              2 * specs.size());
  std::printf("[block-copy] gather kernel %.3f ms (%.0f GB/s), scatter kernel %.3f ms (%.0f GB/s)\n", gather,
              gbs(gather), scatter, gbs(scatter));
  std::printf("[block-copy] per-part cudaMemcpyAsync D2D %.3f ms (%.0f GB/s, %lld copies)\n", memcpys, gbs(memcpys),
              (long long)(n * 2 * int64_t(specs.size())));
  std::printf("[block-copy] host hop: to pinned host %.3f ms (%.1f GB/s), back %.3f ms (%.1f GB/s)\n", d2h, gbs(d2h),
              h2d, gbs(h2d));
  EXPECT_TRUE(f.host_export(dst) == f.host_export(src));  // the timed scatters wrote the sources' bytes
}

}  // namespace
}  // namespace deepinfer::model::ds::cuda
