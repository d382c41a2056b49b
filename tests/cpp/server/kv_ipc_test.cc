// The CUDA IPC hand-off's host side (server/kv_ipc.h) and the transport's pair protocol on a CPU
// build: message codecs (round trips, every truncation, inconsistent fields), the staging ring's
// reuse rule (a buffer is never handed out again before its own ack), --kv-transport parsing and
// refusal, and a prefill/decode pair over gloo loopback that agrees on the host hop and still
// moves a bundle. The two-process GPU test is kv_ipc_gpu_test.cc.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "deepinfer/error.h"
#include "parallel/gloo_group.h"
#include "server/kv_ipc.h"
#include "server/kv_ipc_device.h"
#include "server/kv_transport.h"

namespace deepinfer::server {
namespace {

engine::KvBundle header_bundle(int64_t num_blocks, int64_t block_tokens, size_t block_bytes, uint64_t seed) {
  std::mt19937_64 g(seed);
  engine::KvBundle b;
  b.hash_seed = g() | 1;
  b.block_tokens = block_tokens;
  b.block_bytes = block_bytes;
  for (int64_t i = 0; i < num_blocks * block_tokens; ++i) b.tokens.push_back(int32_t(g() % 100000) + 1);
  b.checkpoint.num_tokens = b.num_tokens();
  for (int i = 0; i < 37; ++i) b.checkpoint.bytes.push_back(uint8_t(g() | 1));
  return b;
}

IpcHello offer() {
  IpcHello h;
  h.offer = true;
  h.host_id = "box/1234";
  h.pid = 4242;
  for (size_t i = 0; i < h.device_uuid.size(); ++i) h.device_uuid[i] = uint8_t(i * 7 + 1);
  h.buffer_bytes = 123457;
  for (uint32_t i = 0; i < kIpcBuffers; ++i) {
    IpcHandle m, e;
    for (size_t j = 0; j < m.size(); ++j) m[j] = uint8_t(j + i + 3), e[j] = uint8_t(200 - j - i);
    h.mem_handles.push_back(m);
    h.event_handles.push_back(e);
  }
  return h;
}

TEST(KvIpc, ParsesTransportAndRefusesOthers) {
  EXPECT_EQ(parse_kv_transport("auto"), KvTransportKind::kAuto);
  EXPECT_EQ(parse_kv_transport("host"), KvTransportKind::kHost);
  EXPECT_EQ(parse_kv_transport("cuda-ipc"), KvTransportKind::kCudaIpc);
  EXPECT_STREQ(kv_transport_name(KvTransportKind::kCudaIpc), "cuda-ipc");
  try {
    parse_kv_transport("nccl");
    FAIL() << "accepted nccl";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'nccl' is not one of: cuda-ipc, host, auto"), std::string::npos) << e.what();
  }
}

TEST(KvIpc, HelloRoundTripsAndRefusesBadBytes) {
  const IpcHello h = offer();
  const std::vector<uint8_t> e = encode_ipc_hello(h);
  const IpcHello d = decode_ipc_hello(e);
  EXPECT_TRUE(d.offer);
  EXPECT_EQ(d.host_id, h.host_id);
  EXPECT_EQ(d.pid, h.pid);
  EXPECT_EQ(d.device_uuid, h.device_uuid);
  EXPECT_EQ(d.buffer_bytes, h.buffer_bytes);
  EXPECT_EQ(d.mem_handles, h.mem_handles);
  EXPECT_EQ(d.event_handles, h.event_handles);
  for (size_t cut = 0; cut < e.size(); ++cut)
    EXPECT_THROW(decode_ipc_hello(std::span<const uint8_t>(e).first(cut)), InvalidArgument) << cut;
  std::vector<uint8_t> longer = e;
  longer.push_back(0);
  EXPECT_THROW(decode_ipc_hello(longer), InvalidArgument);
  IpcHello no = h;
  no.event_handles.pop_back();  // an offer must name every buffer's event
  EXPECT_THROW(decode_ipc_hello(encode_ipc_hello(no)), InvalidArgument);
  IpcHello refuse;
  refuse.reason = "the prefill engine is not on a GPU";
  const IpcHello r = decode_ipc_hello(encode_ipc_hello(refuse));
  EXPECT_FALSE(r.offer);
  EXPECT_EQ(r.reason, refuse.reason);
}

TEST(KvIpc, BundleRoundTripsWithoutItsPayload) {
  const engine::KvBundle b = header_bundle(19, 3, 2640, 7);
  const IpcBundleRef ref{.buffer = 1, .seq = 5, .bytes = 19 * 2640, .num_blocks = 19, .block_bytes = 2640};
  const std::vector<uint8_t> e = encode_ipc_bundle(ref, b);
  EXPECT_LT(e.size(), 19u * 3 * 4 + 300) << "the payload must not travel in the message";
  auto [r, d] = decode_ipc_bundle(e, 19 * 2640);
  EXPECT_EQ(r.buffer, 1u);
  EXPECT_EQ(r.seq, 5u);
  EXPECT_EQ(r.bytes, ref.bytes);
  EXPECT_EQ(d.tokens, b.tokens);
  EXPECT_EQ(d.hash_seed, b.hash_seed);
  EXPECT_EQ(d.block_tokens, 3);
  EXPECT_EQ(d.block_bytes, 2640u);
  EXPECT_EQ(d.checkpoint.num_tokens, b.checkpoint.num_tokens);
  EXPECT_EQ(d.checkpoint.bytes, b.checkpoint.bytes);
  EXPECT_TRUE(d.blocks.empty());
  for (size_t cut = 0; cut < e.size(); ++cut)
    EXPECT_THROW(decode_ipc_bundle(std::span<const uint8_t>(e).first(cut), 19 * 2640), InvalidArgument) << cut;
}

TEST(KvIpc, BundleRefusesInconsistentLayout) {
  const engine::KvBundle b = header_bundle(5, 4, 96, 11);
  const IpcBundleRef good{.buffer = 0, .seq = 1, .bytes = 5 * 96, .num_blocks = 5, .block_bytes = 96};
  auto refused = [&](IpcBundleRef ref, uint64_t buffer_bytes, const char* needle) {
    try {
      decode_ipc_bundle(encode_ipc_bundle(ref, b), buffer_bytes);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  IpcBundleRef r = good;
  r.buffer = kIpcBuffers;
  refused(r, 1 << 20, "field 'buffer'");
  r = good;
  r.seq = 0;
  refused(r, 1 << 20, "field 'seq'");
  r = good;
  r.block_bytes = 95;
  refused(r, 1 << 20, "field 'block_bytes'");
  r = good;
  r.num_blocks = 4;
  refused(r, 1 << 20, "field 'num_blocks'");
  r = good;
  r.bytes = 5 * 96 - 1;
  refused(r, 1 << 20, "field 'bytes'");
  r = good;
  r.bytes = uint64_t(1) << 63;  // would wrap num_blocks x block_bytes checks done naively
  r.num_blocks = 5;
  refused(r, 1 << 20, "field 'bytes'");
  refused(good, 5 * 96 - 1, "staging buffer");
  engine::KvBundle with_payload = b;
  with_payload.blocks.assign(5 * 96, 1);
  EXPECT_THROW(encode_ipc_bundle(good, with_payload), InvalidArgument);
}

TEST(KvIpc, AckRoundTripsAndRefusesBadKind) {
  IpcAck a;
  a.kind = IpcAck::kConsumed;
  a.buffer = 1;
  a.seq = 99;
  a.reason = "x";
  std::vector<uint8_t> e = encode_ipc_ack(a);
  const IpcAck d = decode_ipc_ack(e);
  EXPECT_EQ(d.kind, IpcAck::kConsumed);
  EXPECT_EQ(d.buffer, 1u);
  EXPECT_EQ(d.seq, 99u);
  EXPECT_EQ(d.reason, "x");
  for (size_t cut = 0; cut < e.size(); ++cut)
    EXPECT_THROW(decode_ipc_ack(std::span<const uint8_t>(e).first(cut)), InvalidArgument) << cut;
  e[4] = 77;  // the kind byte, after the magic
  EXPECT_THROW(decode_ipc_ack(e), InvalidArgument);
}

TEST(KvIpc, RingAlternatesAndWaitsForItsOwnAck) {
  StagingRing ring;
  auto a = ring.acquire(), b = ring.acquire();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->first, 0u);
  EXPECT_EQ(b->first, 1u);
  EXPECT_LT(a->second, b->second);
  EXPECT_FALSE(ring.acquire()) << "both buffers in flight";
  EXPECT_THROW(ring.release(0, b->second), InvalidArgument) << "another use's seq must not free buffer 0";
  EXPECT_THROW(ring.release(2, 1), InvalidArgument);
  EXPECT_EQ(ring.num_free(), 0u);
  ring.release(1, b->second);  // out of order: buffer 1 comes back first
  EXPECT_THROW(ring.release(1, b->second), InvalidArgument) << "a duplicated ack";
  auto c = ring.acquire();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->first, 1u);
  EXPECT_GT(c->second, b->second);
  EXPECT_THROW(ring.release(1, b->second), InvalidArgument) << "a stale ack of the buffer's previous use";
  ring.release(0, a->second);
  ring.release(1, c->second);
  EXPECT_EQ(ring.num_free(), 2u);
  EXPECT_THROW(StagingRing(0), InvalidArgument);
}

// Random interleavings of sends and (out-of-order) acks: a buffer the peer still reads is never
// handed out, every ack frees exactly its buffer, and all buffers come back.
TEST(KvIpc, RingNeverReusesABufferInFlight) {
  for (uint32_t n : {1u, 2u, 3u}) {
    StagingRing ring(n);
    std::mt19937 g(n);
    std::vector<std::pair<uint32_t, uint64_t>> reading;  // what the "decode side" holds
    int sent = 0;
    for (int step = 0; step < 2001; ++step) {
      if (g() % 2 == 0) {
        auto s = ring.acquire();
        if (reading.size() == n) {
          EXPECT_FALSE(s);
          continue;
        }
        ASSERT_TRUE(s);
        for (const auto& r : reading) EXPECT_NE(r.first, s->first) << "buffer " << s->first << " handed out twice";
        reading.push_back(*s);
        ++sent;
      } else if (!reading.empty()) {
        const size_t k = g() % reading.size();
        ring.release(reading[k].first, reading[k].second);
        reading.erase(reading.begin() + ptrdiff_t(k));
      }
      EXPECT_EQ(ring.num_free(), n - reading.size());
    }
    EXPECT_GT(sent, 300);
  }
}

std::string fresh_dir(const char* tag) {
  const auto d = std::filesystem::temp_directory_path() /
                 (std::string("di_kv_ipc_") + tag + "_" + std::to_string(::getpid()) + "_" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::create_directories(d);
  return d.string();
}

TEST(KvIpc, CudaIpcOnACpuEngineIsRefused) {
  KvTransportOptions o;
  o.role = "decode";
  o.rendezvous_dir = fresh_dir("refuse");
  o.name = "d0";
  o.peers = {"p0"};
  o.transport = KvTransportKind::kCudaIpc;
  o.device = -1;
  try {
    KvTransport t(o);
    FAIL() << "accepted cuda-ipc on a CPU engine";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-transport cuda-ipc needs a CUDA engine"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(o.rendezvous_dir);
}

// CPU engines under --kv-transport auto: the hello offers nothing, both sides settle on the host
// hop, and a bundle still arrives whole.
TEST(KvIpc, CpuPairAgreesOnTheHostHop) {
  if (!parallel::have_gloo()) GTEST_SKIP() << "no gloo in this build";
  const std::string dir = fresh_dir("host");
  KvTransportOptions p, d;
  p.role = "prefill", p.rendezvous_dir = dir, p.name = "p0", p.peers = {"d0"}, p.heartbeat_s = 0.2;
  d.role = "decode", d.rendezvous_dir = dir, d.name = "d0", d.peers = {"p0"}, d.heartbeat_s = 0.2;
  KvTransport dec(d), pre(p);
  EXPECT_FALSE(pre.wants_device_bundle("d0"));
  engine::KvBundle b = header_bundle(3, 4, 40, 3);
  for (int i = 0; i < 3 * 40; ++i) b.blocks.push_back(uint8_t(i * 13 + 1));
  const engine::KvBundle want = b;
  ASSERT_TRUE(pre.send("d0", "x1", std::move(b)));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!dec.has("x1") && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::optional<engine::KvBundle> got = dec.take("x1");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tokens, want.tokens);
  EXPECT_EQ(got->blocks, want.blocks);
  EXPECT_EQ(got->checkpoint.bytes, want.checkpoint.bytes);
  EXPECT_EQ(pre.stats().host_sent, 1);
  EXPECT_EQ(pre.stats().ipc_sent, 0);
  EXPECT_EQ(dec.stats().host_received, 1);
  pre.stop();
  dec.stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deepinfer::server
