// The CUDA IPC hand-off between TWO PROCESSES on one GPU (server/kv_transport.h, kv_ipc.h): this
// binary forks and execs itself; the parent is the prefill side, the child (the test named in
// --gtest_filter, with DI_KV_IPC_CHILD set) the decode side. The blocks live in paged "pools"
// moved by the CUDA backend's real gather / scatter kernels (block_copy.h), as an engine's would.
//   TwoProcessesHandOffBitIdentical: 7 bundles of odd block counts back to back (both staging
//     buffers and the ack exercised: the prefill side must wait for buffers), each gathered from
//     random distinct blocks of the prefill pools and scattered into other random blocks of the
//     decode pools; the decode side checks every byte of its pools (written blocks equal the
//     prefill's rows, the others untouched).
//   HandOffBandwidth: ~64 MB and ~1 GB bundles through cuda-ipc and through the host hop, one at a
//     time, send() to the decode side's scatter complete (one clock: same host); prints
//     KVIPC_BENCH lines.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/deepseek/cuda/block_copy.h"
#include "ops/cuda/runtime.h"
#include "server/kv_transport.h"

extern char** environ;

namespace deepinfer::server {
namespace {
namespace bc = deepinfer::model::ds::cuda;
using Clock = std::chrono::steady_clock;

// One side's paged pools: `part_bytes.size()` pools of num_blocks blocks each (a block's bytes in
// pool p: part_bytes[p]); a packed row is the parts in order (block_copy.h's layout).
struct Pools {
  std::vector<uint64_t> part_bytes;
  int64_t num_blocks = 0;
  std::vector<deepinfer::cuda::DeviceBuffer> pools;
  deepinfer::cuda::DeviceBuffer table;
  deepinfer::cuda::Stream stream;
  Pools(std::vector<uint64_t> parts, int64_t n) : part_bytes(std::move(parts)), num_blocks(n) {
    for (uint64_t b : part_bytes) pools.emplace_back(size_t(b * uint64_t(n)));
  }
  size_t block_bytes() const {
    size_t s = 0;
    for (uint64_t b : part_bytes) s += b;
    return s;
  }
  // gather (rows -> staging) or scatter (staging -> blocks); complete on return.
  void copy(const std::vector<int32_t>& ids, void* staging, bool gather) {
    bc::check_block_list(ids, num_blocks, "test pool");
    std::vector<bc::BlockPart> parts;
    uint64_t off = 0;
    for (size_t p = 0; p < pools.size(); ++p) {
      parts.push_back({pools[p].as<char>(), part_bytes[p], off});
      off += part_bytes[p];
    }
    const std::vector<uint8_t> t = bc::pack_block_copy_table(parts, ids);
    if (table.size_bytes() < t.size()) table = deepinfer::cuda::DeviceBuffer(t.size());
    deepinfer::cuda::copy_h2d(table.data(), t.data(), t.size(), stream.get());
    bc::launch_block_copy(table.data(), int(parts.size()), int64_t(ids.size()), static_cast<char*>(staging), block_bytes(),
                          bc::block_copy_unit(parts, staging, block_bytes()), gather, stream.get());
    stream.synchronize();
  }
  void fill(uint8_t v) {
    for (auto& p : pools) DI_CUDA_CHECK(cudaMemset(p.data(), v, p.size_bytes()));
  }
  std::vector<std::vector<uint8_t>> download() const {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& p : pools) {
      out.emplace_back(p.size_bytes());
      deepinfer::cuda::copy_d2h(out.back().data(), p.data(), p.size_bytes(), nullptr);
    }
    return out;
  }
};

// Byte j of packed row i of bundle k: both processes compute it, never zero (pools start at 0xA5
// on the decode side, so an unwritten or misplaced byte shows).
uint8_t row_byte(uint64_t k, uint64_t i, uint64_t j) {
  uint64_t x = (k + 1) * 0x9E3779B97F4A7C15ull ^ (i + 1) * 0xC2B2AE3D27D4EB4Full ^ (j + 1) * 0x165667B19E3779F9ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return uint8_t(x % 255 + 1);
}

std::vector<int32_t> distinct_ids(int64_t n, int64_t of, uint64_t seed) {
  std::vector<int32_t> all(static_cast<size_t>(of));
  for (int64_t i = 0; i < of; ++i) all[size_t(i)] = int32_t(i);
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  all.resize(size_t(n));
  return all;
}

// The check test's shape: 3 pools (block rows of 2640 bytes), 7 bundles of odd block counts.
const std::vector<uint64_t> kParts = {2064, 528, 48};
const std::vector<int64_t> kBlocks = {37, 5, 111, 1, 19, 63, 3};
constexpr int64_t kPoolBlocks = 257;
constexpr int64_t kBlockTokens = 4;

std::string fresh_dir() {
  const auto d = std::filesystem::temp_directory_path() /
                 ("di_kv_ipc_gpu_" + std::to_string(getpid()) + "_" + std::to_string(Clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(d);
  return d.string();
}

// Runs this binary's test `filter` in a child with DI_KV_IPC_CHILD=dir; returns its pid.
pid_t spawn_child(const std::string& filter, const std::string& dir) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back("DI_KV_IPC_CHILD=" + dir);
  std::vector<char*> envp;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string arg = "--gtest_filter=" + filter;
  char* argv[] = {self.data(), arg.data(), nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    execve(self.c_str(), argv, envp.data());
    _exit(127);
  }
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

KvTransportOptions side(const std::string& role, const std::string& dir, const std::string& me, const std::string& peer,
                        KvTransportKind kind, size_t buffer_bytes) {
  KvTransportOptions o;
  o.role = role;
  o.rendezvous_dir = dir;
  o.name = me;
  o.peers = {peer};
  o.heartbeat_s = 0.5;
  o.connect_timeout_s = 60;
  o.transport = kind;
  o.device = 0;
  o.ipc_buffer_bytes = buffer_bytes;
  o.ipc_wait_s = 20;  // a test on a busy machine: never fall back for lack of time
  return o;
}

// A device bundle of `ids`' rows gathered from `pools`.
engine::KvBundle device_bundle(Pools& pools, const std::vector<int32_t>& ids, uint64_t k) {
  engine::KvBundle b;
  b.hash_seed = 1000 + k;
  b.block_tokens = kBlockTokens;
  b.block_bytes = pools.block_bytes();
  for (size_t t = 0; t < ids.size() * kBlockTokens; ++t) b.tokens.push_back(int32_t(k * 7919 + t + 1));
  b.checkpoint.num_tokens = b.num_tokens();
  b.checkpoint.bytes.assign(8, uint8_t(k + 1));
  auto buf = std::make_shared<deepinfer::cuda::DeviceBuffer>(ids.size() * b.block_bytes);
  pools.copy(ids, buf->data(), true);
  b.device_blocks = {.owner = buf, .data = buf->data(), .bytes = ids.size() * b.block_bytes, .device = 0};
  return b;
}

std::optional<engine::KvBundle> wait_take(KvTransport& t, const std::string& id, double seconds) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    if (auto b = t.take(id)) return b;
    if (Clock::now() > until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

const char* child_dir() { return std::getenv("DI_KV_IPC_CHILD"); }

#define DI_REQUIRE_GPU_HERE()                                                                  \
  do {                                                                                         \
    if (deepinfer::cuda::cuda_device_count() == 0)                                             \
      GTEST_SKIP() << "CUDA test skipped: " << deepinfer::cuda::cuda_unavailable_reason();     \
  } while (0)

// ---- the decode side (child) ----

TEST(KvIpcGpu, DecodeChildCheck) {
  if (!child_dir()) GTEST_SKIP() << "the decode half of TwoProcessesHandOffBitIdentical (run by it)";
  KvTransport dec(side("decode", child_dir(), "d0", "p0", KvTransportKind::kCudaIpc, 0));
  Pools pools(kParts, kPoolBlocks);
  for (size_t k = 0; k < kBlocks.size(); ++k) {
    pools.fill(0xA5);
    std::optional<engine::KvBundle> b = wait_take(dec, "b" + std::to_string(k), 120);
    ASSERT_TRUE(b.has_value()) << "bundle " << k << " never arrived";
    ASSERT_TRUE(b->on_device()) << "bundle " << k << " came the host hop";
    ASSERT_EQ(b->num_tokens(), kBlocks[k] * kBlockTokens);
    ASSERT_EQ(b->device_blocks.bytes, size_t(kBlocks[k]) * pools.block_bytes());
    EXPECT_EQ(b->hash_seed, 1000 + k);
    EXPECT_EQ(b->checkpoint.bytes, std::vector<uint8_t>(8, uint8_t(k + 1)));
    for (size_t t = 0; t < b->tokens.size(); ++t) ASSERT_EQ(b->tokens[t], int32_t(k * 7919 + t + 1));
    if (k == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // hold buffer 0: the sender must wait
    const std::vector<int32_t> ids = distinct_ids(kBlocks[k], kPoolBlocks, 500 + k);
    pools.copy(ids, b->device_blocks.data, false);  // scatter straight from the peer's staging buffer
    b.reset();                                      // consumed: the ack frees the buffer
    const auto host = pools.download();
    std::vector<int64_t> row_of(kPoolBlocks, -1);
    for (size_t i = 0; i < ids.size(); ++i) row_of[size_t(ids[i])] = int64_t(i);
    size_t bad = 0;
    for (int64_t blk = 0; blk < kPoolBlocks; ++blk) {
      uint64_t off = 0;
      for (size_t p = 0; p < kParts.size(); ++p) {
        for (uint64_t j = 0; j < kParts[p]; ++j) {
          const uint8_t got = host[p][size_t(uint64_t(blk) * kParts[p] + j)];
          const uint8_t want = row_of[size_t(blk)] < 0 ? 0xA5 : row_byte(k, uint64_t(row_of[size_t(blk)]), off + j);
          bad += got != want;
        }
        off += kParts[p];
      }
    }
    EXPECT_EQ(bad, 0u) << "bundle " << k << ": " << bad << " bytes differ";
  }
  std::printf("KVIPC_CHECK decode: %zu bundles, ipc_received=%lld host_received=%lld\n", kBlocks.size(),
              (long long)dec.stats().ipc_received, (long long)dec.stats().host_received);
  EXPECT_EQ(dec.stats().ipc_received, int64_t(kBlocks.size()));
  const auto until = Clock::now() + std::chrono::seconds(30);  // let the last ack leave before stopping
  while (dec.stats().acks < int64_t(kBlocks.size()) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(dec.stats().acks, int64_t(kBlocks.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

// ---- the prefill side (parent) ----

TEST(KvIpcGpu, TwoProcessesHandOffBitIdentical) {
  DI_REQUIRE_GPU_HERE();
  if (child_dir()) GTEST_SKIP() << "in the child";
  const std::string dir = fresh_dir();
  const pid_t child = spawn_child("KvIpcGpu.DecodeChildCheck", dir);
  Pools pools(kParts, kPoolBlocks);
  int64_t most = 0;
  for (int64_t n : kBlocks) most = std::max(most, n);
  KvTransport pre(side("prefill", dir, "p0", "d0", KvTransportKind::kCudaIpc, size_t(most) * pools.block_bytes()));
  // Wait for the pair to agree on cuda-ipc, then send all bundles back to back.
  const auto until = Clock::now() + std::chrono::seconds(120);
  while (!pre.wants_device_bundle("d0") && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (size_t k = 0; k < kBlocks.size(); ++k) {
    // Prefill pools: junk everywhere, bundle k's rows at its random source blocks.
    const std::vector<int32_t> ids = distinct_ids(kBlocks[k], kPoolBlocks, 100 + k);
    std::mt19937_64 g(k);
    std::vector<std::vector<uint8_t>> host(kParts.size());
    for (size_t p = 0; p < kParts.size(); ++p) {
      host[p].resize(size_t(kParts[p] * kPoolBlocks));
      for (auto& x : host[p]) x = uint8_t(g() | 1);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      uint64_t off = 0;
      for (size_t p = 0; p < kParts.size(); ++p) {
        for (uint64_t j = 0; j < kParts[p]; ++j) host[p][size_t(uint64_t(ids[i]) * kParts[p] + j)] = row_byte(k, i, off + j);
        off += kParts[p];
      }
    }
    for (size_t p = 0; p < kParts.size(); ++p) deepinfer::cuda::copy_h2d(pools.pools[p].data(), host[p].data(), host[p].size(), nullptr);
    ASSERT_TRUE(pre.send("d0", "b" + std::to_string(k), device_bundle(pools, ids, k)));
  }
  const int rc = wait_child(child);
  EXPECT_EQ(rc, 0) << "the decode process failed (its output is above)";
  const KvTransportStats s = pre.stats();
  std::printf("KVIPC_CHECK prefill: ipc_sent=%lld host_sent=%lld fallbacks=%lld buffer_waits=%lld acks=%lld\n",
              (long long)s.ipc_sent, (long long)s.host_sent, (long long)s.ipc_fallbacks, (long long)s.buffer_waits,
              (long long)s.acks);
  EXPECT_EQ(s.ipc_sent, int64_t(kBlocks.size()));
  EXPECT_EQ(s.host_sent, 0);
  EXPECT_GE(s.buffer_waits, 1) << "the decode side held buffer 0: some bundle must have waited for a buffer";
  pre.stop();
  std::filesystem::remove_all(dir);
}

// ---- bandwidth: cuda-ipc vs the host hop, same run ----

// Block rows of 640 KiB in 16 pools (the default model's layout is 16 parts a block).
const std::vector<uint64_t> kBenchParts(16, 40960);
const std::vector<int64_t> kBenchBlocks = {103, 1639};  // ~67.5 MB and ~1.07 GB
constexpr int kBenchReps = 3;
constexpr int64_t kBenchPool = 1700;

void signal_done(const std::string& dir, const std::string& id) { std::ofstream(dir + "/done." + id) << "1"; }
bool wait_done(const std::string& dir, const std::string& id, double seconds) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (!std::filesystem::exists(dir + "/done." + id)) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

TEST(KvIpcGpu, DecodeChildBench) {
  if (!child_dir()) GTEST_SKIP() << "the decode half of HandOffBandwidth (run by it)";
  const std::string dir = child_dir();
  KvTransport ipc(side("decode", dir, "d0", "p0", KvTransportKind::kCudaIpc, 0));
  KvTransport host(side("decode", dir, "d1", "p1", KvTransportKind::kHost, 0));
  Pools pools(kBenchParts, kBenchPool);
  deepinfer::cuda::DeviceBuffer landing(size_t(kBenchBlocks.back()) * pools.block_bytes());  // the host hop's H2D
  for (const char* kind : {"cuda-ipc", "host"}) {
    KvTransport& t = std::string(kind) == "host" ? host : ipc;
    for (int64_t n : kBenchBlocks)
      for (int r = 0; r < kBenchReps; ++r) {
        const std::string id = std::string(kind) + "." + std::to_string(n) + "." + std::to_string(r);
        std::optional<engine::KvBundle> b = wait_take(t, id, 300);
        ASSERT_TRUE(b.has_value()) << id;
        const std::vector<int32_t> ids = distinct_ids(n, kBenchPool, uint64_t(n + r));
        if (b->on_device()) {
          pools.copy(ids, b->device_blocks.data, false);
        } else {
          deepinfer::cuda::copy_h2d(landing.data(), b->blocks.data(), b->blocks.size(), nullptr);
          pools.copy(ids, landing.data(), false);
        }
        const auto t1 = Clock::now();
        int64_t t0 = 0;
        std::memcpy(&t0, b->checkpoint.bytes.data(), sizeof t0);
        const double ms = double(std::chrono::duration_cast<std::chrono::nanoseconds>(t1.time_since_epoch()).count() - t0) / 1e6;
        const double bytes = double(size_t(n) * pools.block_bytes());
        std::printf("KVIPC_BENCH transport=%s path=%s blocks=%lld bytes=%.0f rep=%d ms=%.3f GB/s=%.2f\n", kind,
                    b->on_device() ? "ipc" : "host", (long long)n, bytes, r, ms, bytes / ms / 1e6);
        std::fflush(stdout);
        b.reset();
        signal_done(dir, id);
      }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

TEST(KvIpcGpu, HandOffBandwidth) {
  DI_REQUIRE_GPU_HERE();
  if (child_dir()) GTEST_SKIP() << "in the child";
  const std::string dir = fresh_dir();
  const pid_t child = spawn_child("KvIpcGpu.DecodeChildBench", dir);
  Pools pools(kBenchParts, kBenchPool);
  pools.fill(0x3C);
  const size_t cap = size_t(kBenchBlocks.back()) * pools.block_bytes();
  KvTransport ipc(side("prefill", dir, "p0", "d0", KvTransportKind::kCudaIpc, cap));
  KvTransport host(side("prefill", dir, "p1", "d1", KvTransportKind::kHost, cap));
  const auto until = Clock::now() + std::chrono::seconds(120);
  while ((!ipc.wants_device_bundle("d0") || host.num_connected() == 0) && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (const char* kind : {"cuda-ipc", "host"}) {
    KvTransport& t = std::string(kind) == "host" ? host : ipc;
    for (int64_t n : kBenchBlocks)
      for (int r = 0; r < kBenchReps; ++r) {
        const std::string id = std::string(kind) + "." + std::to_string(n) + "." + std::to_string(r);
        engine::KvBundle b = device_bundle(pools, distinct_ids(n, kBenchPool, uint64_t(7 * n + r)), uint64_t(r));
        const int64_t t0 = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
        std::memcpy(b.checkpoint.bytes.data(), &t0, sizeof t0);  // the child's clock is this one (same host)
        ASSERT_TRUE(t.send(std::string(kind) == "host" ? "d1" : "d0", id, std::move(b)));
        ASSERT_TRUE(wait_done(dir, id, 300)) << id;
      }
  }
  EXPECT_EQ(wait_child(child), 0);
  EXPECT_EQ(ipc.stats().ipc_sent, int64_t(kBenchBlocks.size()) * kBenchReps);
  EXPECT_EQ(host.stats().host_sent, int64_t(kBenchBlocks.size()) * kBenchReps);
  ipc.stop();
  host.stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer::server
