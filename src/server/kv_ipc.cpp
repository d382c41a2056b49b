#include "server/kv_ipc.h"

#include <cstring>

#include "deepinfer/error.h"
#include "parallel/wire.h"

namespace deepinfer::server {
namespace {
constexpr uint32_t kHelloMagic = 0x4F4C4849;   // "IHLO"
constexpr uint32_t kBundleMagic = 0x444E4249;  // "IBND"
constexpr uint32_t kAckMagic = 0x4B434149;     // "IACK"

using parallel::WireReader;
using parallel::WireSource;
using parallel::WireWriter;

// The control messages come from another server process: malformed ones are InvalidArgument.
WireReader peer_reader(std::span<const uint8_t> bytes, const char* what) { return {bytes, what, WireSource::kPeer}; }

void expect_magic(WireReader& r, uint32_t m) {
  if (r.get<uint32_t>("magic") != m) r.fail("bad magic (not this kind of message)");
}
}  // namespace

KvTransportKind parse_kv_transport(const std::string& s) {
  if (s == "auto") return KvTransportKind::kAuto;
  if (s == "host") return KvTransportKind::kHost;
  if (s == "cuda-ipc") return KvTransportKind::kCudaIpc;
  DI_THROW(InvalidArgument, "--kv-transport '", s, "' is not one of: cuda-ipc, host, auto");
}

const char* kv_transport_name(KvTransportKind k) {
  switch (k) {
    case KvTransportKind::kHost: return "host";
    case KvTransportKind::kCudaIpc: return "cuda-ipc";
    default: return "auto";
  }
}

std::vector<uint8_t> encode_ipc_hello(const IpcHello& h) {
  WireWriter w;
  w.put(kHelloMagic);
  w.put(uint8_t(h.offer));
  w.put_str(h.reason);
  w.put_str(h.host_id);
  w.put(h.pid);
  w.put_raw(h.device_uuid.data(), h.device_uuid.size());
  w.put(h.buffer_bytes);
  w.put(uint32_t(h.mem_handles.size()));
  for (const IpcHandle& x : h.mem_handles) w.put_raw(x.data(), x.size());
  w.put(uint32_t(h.event_handles.size()));
  for (const IpcHandle& x : h.event_handles) w.put_raw(x.data(), x.size());
  return w.take();
}

IpcHello decode_ipc_hello(std::span<const uint8_t> bytes) {
  WireReader r = peer_reader(bytes, "KV IPC hello");
  expect_magic(r, kHelloMagic);
  IpcHello h;
  h.offer = r.get<uint8_t>("offer") != 0;
  h.reason = r.get_str("reason");
  h.host_id = r.get_str("host_id");
  h.pid = r.get<int64_t>("pid");
  r.get_raw(h.device_uuid.data(), h.device_uuid.size(), "device_uuid");
  h.buffer_bytes = r.get<uint64_t>("buffer_bytes");
  for (auto* list : {&h.mem_handles, &h.event_handles}) {
    const uint32_t n = r.get<uint32_t>(list == &h.mem_handles ? "mem_handles.size" : "event_handles.size");
    if (n > kIpcBuffers * 4) DI_THROW(InvalidArgument, "KV IPC hello: ", n, " handles (at most ", kIpcBuffers * 4, ")");
    list->resize(n);
    for (IpcHandle& x : *list) r.get_raw(x.data(), x.size(), "handle");
  }
  r.expect_done();
  if (h.offer && (h.mem_handles.size() != kIpcBuffers || h.event_handles.size() != kIpcBuffers || h.buffer_bytes == 0))
    DI_THROW(InvalidArgument, "KV IPC hello: an offer needs ", kIpcBuffers, " memory and event handles and a buffer size (got ",
             h.mem_handles.size(), ", ", h.event_handles.size(), ", ", h.buffer_bytes, " bytes)");
  return h;
}

std::vector<uint8_t> encode_ipc_bundle(const IpcBundleRef& ref, const engine::KvBundle& b) {
  if (!b.blocks.empty() || b.on_device())
    DI_THROW(InvalidArgument, "KV IPC bundle: the header must not carry the payload (it is in the staging buffer)");
  WireWriter w;
  w.put(kBundleMagic);
  w.put(ref.buffer);
  w.put(ref.seq);
  w.put(ref.bytes);
  w.put(ref.num_blocks);
  w.put(ref.block_bytes);
  w.put_vec(b.tokens);
  engine::KvBundle header;  // no tokens, so the codec's payload checks pass on an empty bundle
  header.hash_seed = b.hash_seed;
  header.block_tokens = b.block_tokens;
  header.block_bytes = b.block_bytes;
  header.checkpoint = b.checkpoint;
  const std::vector<uint8_t> e = engine::encode_kv_bundle(header);
  w.put_raw(e.data(), e.size());  // the header's own codec, to the end of the message
  return w.take();
}

std::pair<IpcBundleRef, engine::KvBundle> decode_ipc_bundle(std::span<const uint8_t> bytes, uint64_t buffer_bytes) {
  WireReader r = peer_reader(bytes, "KV IPC bundle");
  expect_magic(r, kBundleMagic);
  IpcBundleRef ref;
  ref.buffer = r.get<uint32_t>("buffer");
  ref.seq = r.get<uint64_t>("seq");
  ref.bytes = r.get<uint64_t>("bytes");
  ref.num_blocks = r.get<uint64_t>("num_blocks");
  ref.block_bytes = r.get<uint64_t>("block_bytes");
  std::vector<int32_t> tokens = r.get_vec<int32_t>("tokens");
  engine::KvBundle b = engine::decode_kv_bundle(r.rest());
  b.tokens = std::move(tokens);
  if (ref.buffer >= kIpcBuffers)
    DI_THROW(InvalidArgument, "KV IPC bundle: field 'buffer' is ", ref.buffer, ", outside [0, ", kIpcBuffers, ")");
  if (ref.seq == 0) DI_THROW(InvalidArgument, "KV IPC bundle: field 'seq' is 0 (sequence numbers start at 1)");
  if (ref.block_bytes != b.block_bytes)
    DI_THROW(InvalidArgument, "KV IPC bundle: field 'block_bytes' is ", ref.block_bytes, ", the header says ", b.block_bytes);
  if (b.block_tokens <= 0 || b.num_tokens() % b.block_tokens != 0 ||
      uint64_t(b.num_tokens() / b.block_tokens) != ref.num_blocks)
    DI_THROW(InvalidArgument, "KV IPC bundle: field 'num_blocks' is ", ref.num_blocks, " for ", b.num_tokens(), " tokens in ",
             b.block_tokens, "-token blocks");
  // The division first: a hostile num_blocks x block_bytes could wrap around.
  if ((ref.num_blocks != 0 && ref.bytes / ref.num_blocks != ref.block_bytes) || ref.bytes != ref.num_blocks * ref.block_bytes)
    DI_THROW(InvalidArgument, "KV IPC bundle: field 'bytes' is ", ref.bytes, ", expected ", ref.num_blocks, " x ", ref.block_bytes);
  if (ref.bytes > buffer_bytes)
    DI_THROW(InvalidArgument, "KV IPC bundle: field 'bytes' is ", ref.bytes, ", larger than the ", buffer_bytes,
             "-byte staging buffer");
  if (b.checkpoint.num_tokens != b.num_tokens())
    DI_THROW(InvalidArgument, "KV IPC bundle: checkpoint at ", b.checkpoint.num_tokens, " tokens, the prefix has ",
             b.num_tokens());
  return {ref, std::move(b)};
}

std::vector<uint8_t> encode_ipc_ack(const IpcAck& a) {
  WireWriter w;
  w.put(kAckMagic);
  w.put(uint8_t(a.kind));
  w.put(a.buffer);
  w.put(a.seq);
  w.put_str(a.reason);
  return w.take();
}

IpcAck decode_ipc_ack(std::span<const uint8_t> bytes) {
  WireReader r = peer_reader(bytes, "KV IPC ack");
  expect_magic(r, kAckMagic);
  IpcAck a;
  const uint8_t k = r.get<uint8_t>("kind");
  if (k < IpcAck::kAccept || k > IpcAck::kBye) DI_THROW(InvalidArgument, "KV IPC ack: field 'kind' is ", int(k));
  a.kind = IpcAck::Kind(k);
  a.buffer = r.get<uint32_t>("buffer");
  a.seq = r.get<uint64_t>("seq");
  a.reason = r.get_str("reason");
  r.expect_done();
  return a;
}

StagingRing::StagingRing(uint32_t num_buffers) : in_flight_(num_buffers, 0) {
  if (num_buffers == 0) DI_THROW(InvalidArgument, "StagingRing: needs at least one buffer");
}

std::optional<std::pair<uint32_t, uint64_t>> StagingRing::acquire() {
  for (uint32_t k = 0; k < size(); ++k) {
    const uint32_t i = (next_ + k) % size();
    if (in_flight_[i] != 0) continue;
    in_flight_[i] = next_seq_++;
    next_ = (i + 1) % size();
    return std::make_pair(i, in_flight_[i]);
  }
  return std::nullopt;
}

void StagingRing::release(uint32_t buffer, uint64_t seq) {
  if (buffer >= size()) DI_THROW(InvalidArgument, "KV IPC ack: buffer ", buffer, " outside [0, ", size(), ")");
  if (in_flight_[buffer] == 0) DI_THROW(InvalidArgument, "KV IPC ack: buffer ", buffer, " (seq ", seq, ") is not in flight");
  if (in_flight_[buffer] != seq)
    DI_THROW(InvalidArgument, "KV IPC ack: buffer ", buffer, " is in flight as seq ", in_flight_[buffer], ", the ack names seq ",
             seq);
  in_flight_[buffer] = 0;
}

uint32_t StagingRing::num_free() const {
  uint32_t n = 0;
  for (uint64_t s : in_flight_) n += s == 0;
  return n;
}

}  // namespace deepinfer::server
