// The CUDA IPC hand-off's host side (issue #18, docs/ROUTER.md): the messages a (prefill, decode)
// pair exchanges when the KV payload moves between the processes through device memory rather
// than through the host, and the prefill side's staging-buffer reuse rule. No CUDA here (the
// device half is kv_ipc_device.h), so all of this is tested on any machine.
//
// The protocol, per pair (kv_transport.h carries the messages):
//   prefill -> decode, once, the pair's first message: IpcHello. With `offer`, it names two
//     device staging buffers (cudaIpcMemHandle) and one interprocess event per buffer
//     (cudaIpcEventHandle) that the decode side opens once; without, the pair uses the host hop.
//   decode -> prefill, on a reverse channel opened only when offered: IpcAck kAccept (handles
//     opened: the pair uses cuda-ipc) or kRefuse (why; the pair uses the host hop).
//   per bundle, prefill -> decode: IpcBundleRef (buffer index, sequence number, byte count,
//     layout) plus the bundle minus its payload (tokens, checkpoint, header). The prefill side
//     copied the payload into that buffer and recorded the buffer's event on its stream before
//     sending; the decode side waits for the event, then reads the payload in place.
//   per bundle, decode -> prefill: IpcAck kConsumed (buffer, seq) once the decode side's last
//     read of the buffer has completed (its import finished or the bundle was dropped). Only then
//     does StagingRing hand that buffer out again.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv_transfer.h"

namespace deepinfer::server {

// --kv-transport: cuda-ipc (demand it: refused on a CPU engine), host (the gloo host hop), auto
// (cuda-ipc where both ends are CUDA engines on one host, else host).
enum class KvTransportKind { kAuto, kHost, kCudaIpc };
// InvalidArgument naming the value and the choices.
KvTransportKind parse_kv_transport(const std::string& s);
const char* kv_transport_name(KvTransportKind k);

constexpr uint32_t kIpcBuffers = 2;       // double-buffered staging: one fills while one is read
constexpr size_t kIpcHandleBytes = 64;    // sizeof cudaIpcMemHandle_t == sizeof cudaIpcEventHandle_t
using IpcHandle = std::array<uint8_t, kIpcHandleBytes>;

struct IpcHello {
  bool offer = false;            // false: host bundles only (`reason` says why)
  std::string reason;
  std::string host_id;           // hostname and boot id: CUDA IPC handles only open on one host
  int64_t pid = 0;               // the exporting process (for log lines)
  std::array<uint8_t, 16> device_uuid{};  // the exporting GPU (ordinals differ between processes)
  uint64_t buffer_bytes = 0;     // each staging buffer's size
  std::vector<IpcHandle> mem_handles;    // [kIpcBuffers]
  std::vector<IpcHandle> event_handles;  // [kIpcBuffers]
};
std::vector<uint8_t> encode_ipc_hello(const IpcHello& h);
// InvalidArgument naming the field for a truncated, trailing or inconsistent message.
IpcHello decode_ipc_hello(std::span<const uint8_t> bytes);

// Where one bundle's payload lies: bytes [0, bytes) of staging buffer `buffer`, num_blocks rows
// of block_bytes (the host export's layout, engine/kv_transfer.h).
struct IpcBundleRef {
  uint32_t buffer = 0;
  uint64_t seq = 0;          // StagingRing's number for this use of the buffer (the ack names it)
  uint64_t bytes = 0;
  uint64_t num_blocks = 0;
  uint64_t block_bytes = 0;
};
// `b` is the bundle without its payload (b.blocks empty, not on the device); its tokens travel
// beside the header so the header encodes as an empty bundle.
std::vector<uint8_t> encode_ipc_bundle(const IpcBundleRef& ref, const engine::KvBundle& b);
// InvalidArgument naming the field when the message is cut, a buffer index is out of range, the
// layout disagrees with the header (block size, block count x tokens, byte count) or the payload
// would not fit `buffer_bytes`.
std::pair<IpcBundleRef, engine::KvBundle> decode_ipc_bundle(std::span<const uint8_t> bytes, uint64_t buffer_bytes);

struct IpcAck {
  enum Kind : uint8_t { kAccept = 1, kRefuse = 2, kConsumed = 3, kHeartbeat = 4, kBye = 5 };
  Kind kind = kHeartbeat;
  uint32_t buffer = 0;  // kConsumed
  uint64_t seq = 0;     // kConsumed
  std::string reason;   // kRefuse
};
std::vector<uint8_t> encode_ipc_ack(const IpcAck& a);
IpcAck decode_ipc_ack(std::span<const uint8_t> bytes);  // InvalidArgument for a bad kind or length

// The prefill side's buffer reuse: a buffer is free, or in flight under the sequence number it
// was handed out with, until the decode side's kConsumed for exactly that (buffer, seq) returns.
// Not thread-safe (the transport guards it with its mutex).
class StagingRing {
 public:
  explicit StagingRing(uint32_t num_buffers = kIpcBuffers);
  // A free buffer (the one after the last handed out, so both alternate) and its fresh sequence
  // number, now in flight; nullopt while every buffer is in flight.
  std::optional<std::pair<uint32_t, uint64_t>> acquire();
  // InvalidArgument for a buffer out of range, not in flight, or in flight under another seq (a
  // stale or duplicated ack must never free a buffer the peer may still be reading).
  void release(uint32_t buffer, uint64_t seq);
  uint32_t num_free() const;
  uint32_t size() const { return uint32_t(in_flight_.size()); }

 private:
  std::vector<uint64_t> in_flight_;  // [num_buffers] 0 = free, else the seq it went out with
  uint64_t next_seq_ = 1;
  uint32_t next_ = 0;                // where acquire() starts looking
};

}  // namespace deepinfer::server
