// KvTransport: KV bundles (engine/kv_transfer.h) from prefill servers to decode servers over
// the parallel layer's process groups (parallel/process_group.h): one 2-rank group per
// (prefill, decode) pair, rank 0 the prefill side, met through a shared rendezvous directory
// (gloo's file store over TCP on CPU hosts; docs/ROUTER.md has the GPU design). The group's
// broadcast from rank 0 carries each message: transfer id, then the encoded bundle.
//
//   prefill: send(peer, id, bundle) queues it; the pair's sender thread broadcasts it, and an
//            empty heartbeat every heartbeat_s while idle, so the receiver's collective never
//            times out on a quiet link.
//   decode:  the pair's receiver thread stores arrivals by id; take(id) hands one over (once),
//            `on_arrival` wakes whoever waits (the engine loop).
// Payload path (--kv-transport, kv_ipc.h): a pair whose ends are both CUDA engines on one host
// moves device bundles through two CUDA IPC staging buffers of the prefill process (the host
// message then carries a buffer index and the layout, the decode side reads the payload in place
// and acks on a reverse channel); any other pair, and any bundle the staging cannot take in
// time, goes the host hop (the payload inside the host message). Each pair logs which it uses.
// Pairs connect in the background (a server starts serving before its peers are up); a bundle
// for a pair that is not connected waits in its queue. A broken pair (peer died) logs and
// stops; its queued bundles are dropped. A transfer that never arrives costs only speed: the
// decode server recomputes the prompt (server/engine_loop.h).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/kv_transfer.h"
#include "server/kv_ipc.h"

namespace deepinfer::server {

struct KvTransportOptions {
  std::string role;            // "" (off) | "prefill" | "decode"
  std::string rendezvous_dir;  // shared by every prefill and decode server of the deployment
  std::string name;            // this server's name (a file-name-safe word, unique in the deployment)
  std::vector<std::string> peers;  // the other side's names
  double connect_timeout_s = 600;
  double heartbeat_s = 5;
  KvTransportKind transport = KvTransportKind::kAuto;  // --kv-transport
  int device = -1;              // the engine's CUDA device ordinal; -1: not a GPU engine
  size_t ipc_buffer_bytes = 0;  // prefill: each staging buffer (the server sizes it for the longest prefix)
  double ipc_wait_s = 2;        // prefill: longest wait for a free staging buffer, then the host hop
  double ipc_unclaimed_s = 30;  // decode: an IPC bundle nobody took in this long is dropped (frees the buffer)
};

// What went which way (tests, logs).
struct KvTransportStats {
  int64_t ipc_sent = 0, host_sent = 0;          // prefill: bundles per path
  int64_t ipc_fallbacks = 0;                    // prefill: device bundles that went the host hop
  int64_t buffer_waits = 0;                     // prefill: bundles that waited for a staging buffer
  int64_t ipc_received = 0, host_received = 0;  // decode
  int64_t acks = 0;                             // prefill: kConsumed acks back; decode: sent
};

class KvTransport {
 public:
  // InvalidArgument for a bad role, a missing directory, an unsafe name, or --kv-transport
  // cuda-ipc where it cannot be honoured (a CPU engine, a build without CUDA); starts the pairs.
  explicit KvTransport(KvTransportOptions options);
  ~KvTransport();  // stop()
  KvTransport(const KvTransport&) = delete;
  KvTransport& operator=(const KvTransport&) = delete;

  const KvTransportOptions& options() const;
  bool is_prefill() const { return options().role == "prefill"; }
  bool is_decode() const { return options().role == "decode"; }
  // Prefill: queues `bundle` for `peer`; false for a name that is not a peer.
  bool send(const std::string& peer, const std::string& id, engine::KvBundle bundle);
  // Prefill: whether to export for `peer` with the payload on the device (the pair uses, or is
  // still agreeing on, cuda-ipc); a device bundle that cannot go through IPC still goes the host hop.
  bool wants_device_bundle(const std::string& peer) const;
  // Decode: the bundle `id` if it has arrived (each is handed over once). An IPC bundle's
  // device_blocks are the peer's staging buffer, released to it when the last copy of the
  // bundle is destroyed: import it, then drop it, without delay.
  std::optional<engine::KvBundle> take(const std::string& id);
  bool has(const std::string& id) const;
  void set_on_arrival(std::function<void()> f);
  int num_connected() const;
  KvTransportStats stats() const;
  void stop();

 private:
  struct Core;  // shared with the pair threads, which are detached: a pair still meeting its
                // peer cannot be interrupted, and must not hold up a server's shutdown
  std::shared_ptr<Core> core_;
};

}  // namespace deepinfer::server
