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

namespace deepinfer::server {

struct KvTransportOptions {
  std::string role;            // "" (off) | "prefill" | "decode"
  std::string rendezvous_dir;  // shared by every prefill and decode server of the deployment
  std::string name;            // this server's name (a file-name-safe word, unique in the deployment)
  std::vector<std::string> peers;  // the other side's names
  double connect_timeout_s = 600;
  double heartbeat_s = 5;
};

class KvTransport {
 public:
  // InvalidArgument for a bad role, a missing directory, or an unsafe name; starts the pairs.
  explicit KvTransport(KvTransportOptions options);
  ~KvTransport();  // stop()
  KvTransport(const KvTransport&) = delete;
  KvTransport& operator=(const KvTransport&) = delete;

  const KvTransportOptions& options() const;
  bool is_prefill() const { return options().role == "prefill"; }
  bool is_decode() const { return options().role == "decode"; }
  // Prefill: queues `bundle` for `peer`; false for a name that is not a peer.
  bool send(const std::string& peer, const std::string& id, engine::KvBundle bundle);
  // Decode: the bundle `id` if it has arrived (each is handed over once).
  std::optional<engine::KvBundle> take(const std::string& id);
  bool has(const std::string& id) const;
  void set_on_arrival(std::function<void()> f);
  int num_connected() const;
  void stop();

 private:
  struct Core;  // shared with the pair threads, which are detached: a pair still meeting its
                // peer cannot be interrupted, and must not hold up a server's shutdown
  std::shared_ptr<Core> core_;
};

}  // namespace deepinfer::server
