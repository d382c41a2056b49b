#include "server/kv_transport.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "core/logging.h"
#include "deepinfer/error.h"
#include "parallel/gloo_group.h"
#include "parallel/process_group.h"
#include "server/kv_ipc_device.h"

namespace deepinfer::server {
namespace {
// A forward message starts with a u32: the id's length, or one of these.
constexpr uint32_t kBye = 0xFFFFFFFFu;    // the sender stops: the receiver ends too
constexpr uint32_t kHello = 0xFFFFFFFEu;  // the pair's first message: an IpcHello follows
constexpr uint8_t kTagHost = 'H';         // after the id: an encoded bundle, payload inside
constexpr uint8_t kTagIpc = 'I';          // after the id: an IPC bundle (kv_ipc.h), payload in a staging buffer
constexpr size_t kMaxUnclaimed = 256;     // arrivals nobody took (a decode request that never came)

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> control(uint32_t code, std::span<const uint8_t> body = {}) {
  std::vector<uint8_t> m(sizeof code);
  std::memcpy(m.data(), &code, sizeof code);
  m.insert(m.end(), body.begin(), body.end());
  return m;
}

std::vector<uint8_t> tagged(const std::string& id, uint8_t tag, std::span<const uint8_t> body) {
  std::vector<uint8_t> m = control(uint32_t(id.size()));
  m.insert(m.end(), id.begin(), id.end());
  m.push_back(tag);
  m.insert(m.end(), body.begin(), body.end());
  return m;
}

IpcAck ack(IpcAck::Kind kind, uint32_t buffer = 0, uint64_t seq = 0, std::string reason = {}) {
  IpcAck a;
  a.kind = kind;
  a.buffer = buffer;
  a.seq = seq;
  a.reason = std::move(reason);
  return a;
}

bool safe_name(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; });
}

// Decode side: acks waiting to go back on the reverse channel. Its own lock, because a bundle's
// release (which queues an ack) may run wherever the bundle dies, the transport's lock held or not.
struct AckQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<IpcAck> q;
  bool closed = false;
  void push(IpcAck a) {
    std::lock_guard<std::mutex> lock(mu);
    q.push_back(std::move(a));
    cv.notify_all();
  }
};
}  // namespace

struct KvTransport::Core : std::enable_shared_from_this<KvTransport::Core> {
  KvTransportOptions opt;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  enum class Mode { kPending, kHost, kIpc };
  struct Pair {
    std::string peer;
    bool connected = false, broken = false;
    Mode mode = Mode::kPending;
    std::deque<std::pair<std::string, engine::KvBundle>> queue;  // prefill: waiting to go
    std::unique_ptr<IpcExporter> exporter;   // prefill, when offered
    StagingRing ring;                        // prefill: which staging buffer the peer still reads
    std::shared_ptr<IpcImporter> importer;   // decode, when accepted
    std::shared_ptr<AckQueue> acks = std::make_shared<AckQueue>();  // decode
  };
  std::vector<Pair> pairs;  // fixed after construction
  std::map<std::string, engine::KvBundle> arrived;
  std::deque<std::string> arrival_order;
  std::map<std::string, Clock::time_point> ipc_arrived;  // IPC arrivals not yet taken (they hold a peer buffer)
  std::function<void()> on_arrival;
  KvTransportStats stats;

  std::string pair_name(const Pair& p, const char* kind) const {
    const bool prefill = opt.role == "prefill";
    return std::string(kind) + "." + (prefill ? opt.name : p.peer) + "." + (prefill ? p.peer : opt.name);
  }
  std::unique_ptr<parallel::ProcessGroup> connect(const std::string& name, int rank) const;
  void run_pair(size_t i);
  void send_loop(parallel::ProcessGroup& pg, Pair& p, size_t i);
  std::vector<uint8_t> device_message(Pair& p, const std::string& id, engine::KvBundle& b, bool& staged);
  void receive_loop(parallel::ProcessGroup& pg, Pair& p, size_t i);
  void on_hello(Pair& p, size_t i, const IpcHello& h);
  void store(Pair& p, const std::string& id, engine::KvBundle b, bool ipc);
  void ack_receiver(size_t i);                  // prefill: the reverse channel
  void ack_sender(size_t i, IpcAck first);      // decode: the reverse channel
  void set_mode(Pair& p, Mode m, const std::string& why);
};

std::unique_ptr<parallel::ProcessGroup> KvTransport::Core::connect(const std::string& name, int rank) const {
  parallel::GlooGroupOptions g;
  g.rendezvous_dir = opt.rendezvous_dir;
  g.name = name;
  g.rank = rank;
  g.size = 2;
  g.timeout = std::chrono::milliseconds(int64_t(std::max(opt.connect_timeout_s, 4 * opt.heartbeat_s) * 1000));
  return parallel::make_gloo_group(g);
}

void KvTransport::Core::set_mode(Pair& p, Mode m, const std::string& why) {  // mu held
  p.mode = m;
  const std::string name = pair_name(p, "kv");
  if (m == Mode::kIpc) {
    DI_INFO("kv transport: ", name, " uses cuda-ipc (", why, ")");
  } else if (opt.transport == KvTransportKind::kCudaIpc) {
    DI_WARN("kv transport: ", name, " uses the host hop although --kv-transport cuda-ipc: ", why);
  } else {
    DI_INFO("kv transport: ", name, " uses the host hop (", why, ")");
  }
  cv.notify_all();
}

void KvTransport::Core::run_pair(size_t i) {
  Pair& p = pairs[i];
  const bool prefill = opt.role == "prefill";
  const std::string name = pair_name(p, "kv");
  std::unique_ptr<parallel::ProcessGroup> pg;
  try {
    pg = connect(name, prefill ? 0 : 1);
  } catch (const std::exception& e) {
    DI_WARN("kv transport: ", name, " did not connect: ", e.what());
    std::lock_guard<std::mutex> lock(mu);
    p.broken = true;
    cv.notify_all();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    p.connected = true;
  }
  DI_INFO("kv transport: ", name, " connected (", pg->describe(), ")");
  try {
    if (prefill) send_loop(*pg, p, i);
    else receive_loop(*pg, p, i);
  } catch (const std::exception& e) {
    DI_WARN("kv transport: ", name, " broke: ", e.what());
  }
  std::deque<std::pair<std::string, engine::KvBundle>> dropped;  // destroyed after the lock
  std::lock_guard<std::mutex> lock(mu);
  p.connected = false;
  p.broken = true;
  dropped.swap(p.queue);
  cv.notify_all();
}

void KvTransport::Core::send_loop(parallel::ProcessGroup& pg, Pair& p, size_t i) {
  // The hello first: offer the staging buffers where this side can (a GPU engine, not --kv-transport host).
  IpcHello h;
  if (opt.transport == KvTransportKind::kHost) h.reason = "--kv-transport host on the prefill server";
  else if (opt.device < 0 || !have_cuda_ipc()) h.reason = "the prefill engine is not on a GPU";
  else {
    try {
      auto ex = std::make_unique<IpcExporter>(opt.device, opt.ipc_buffer_bytes);
      h = ex->hello();
      std::lock_guard<std::mutex> lock(mu);
      p.exporter = std::move(ex);
    } catch (const Error& e) {
      h = IpcHello{};
      h.reason = std::string("the prefill side's staging buffers: ") + e.what();
    }
  }
  parallel::broadcast_bytes(pg, control(kHello, encode_ipc_hello(h)), 0);
  if (h.offer) {
    std::thread([core = shared_from_this(), i] { core->ack_receiver(i); }).detach();
  } else {
    std::lock_guard<std::mutex> lock(mu);
    set_mode(p, Mode::kHost, h.reason);
  }
  for (;;) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::duration<double>(opt.heartbeat_s), [&] { return stop || !p.queue.empty(); });
    if (stop) {
      lock.unlock();
      parallel::broadcast_bytes(pg, control(kBye), 0);
      return;
    }
    if (p.queue.empty()) {
      lock.unlock();
      parallel::broadcast_bytes(pg, control(0), 0);  // heartbeat
      continue;
    }
    auto [id, b] = std::move(p.queue.front());
    p.queue.pop_front();
    lock.unlock();
    bool staged = false;
    std::vector<uint8_t> m = b.on_device() ? device_message(p, id, b, staged) : tagged(id, kTagHost, engine::encode_kv_bundle(b));
    if (!staged) {
      std::lock_guard<std::mutex> l(mu);
      stats.host_sent++;
    }
    parallel::broadcast_bytes(pg, std::move(m), 0);
    if (staged) p.exporter->finish();  // the staging copy done: `b`'s device memory may go
  }
}

// A device bundle's message: through a staging buffer when the pair uses cuda-ipc and one frees
// up within ipc_wait_s, else the host hop (the payload copied to the host here).
std::vector<uint8_t> KvTransport::Core::device_message(Pair& p, const std::string& id, engine::KvBundle& b, bool& staged) {
  std::optional<std::pair<uint32_t, uint64_t>> slot;
  std::string why;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!p.exporter || b.device_blocks.bytes > p.exporter->buffer_bytes()) {
      why = p.exporter ? "larger than the staging buffer" : "no staging buffers";
    } else {
      const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.ipc_wait_s));
      bool waited = false;
      for (;;) {
        if (stop || p.mode == Mode::kHost) break;
        if (p.mode == Mode::kIpc && (slot = p.ring.acquire())) break;
        waited = true;
        if (cv.wait_until(lock, deadline) == std::cv_status::timeout) {
          if (p.mode == Mode::kIpc) slot = p.ring.acquire();
          break;
        }
      }
      stats.buffer_waits += waited;
      if (!slot) why = p.mode == Mode::kIpc ? "no staging buffer came free in time" : "the pair uses the host hop";
    }
    if (slot) stats.ipc_sent++;
    else stats.ipc_fallbacks++;
  }
  if (!slot) {
    if (p.mode == Mode::kIpc) DI_WARN("kv transport: bundle ", id, " to ", p.peer, " goes the host hop: ", why);
    b.blocks = IpcExporter::to_host(b.device_blocks.data, b.device_blocks.bytes, b.device_blocks.device);
    b.device_blocks = {};
    return tagged(id, kTagHost, engine::encode_kv_bundle(b));
  }
  p.exporter->stage(slot->first, b.device_blocks.data, b.device_blocks.bytes);
  staged = true;
  IpcBundleRef ref{.buffer = slot->first, .seq = slot->second, .bytes = b.device_blocks.bytes,
                   .num_blocks = b.block_bytes ? b.device_blocks.bytes / b.block_bytes : 0, .block_bytes = b.block_bytes};
  engine::KvBundle header;
  header.hash_seed = b.hash_seed;
  header.block_tokens = b.block_tokens;
  header.block_bytes = b.block_bytes;
  header.tokens = b.tokens;
  header.checkpoint = b.checkpoint;
  return tagged(id, kTagIpc, encode_ipc_bundle(ref, header));
}

void KvTransport::Core::ack_receiver(size_t i) {
  Pair& p = pairs[i];
  const std::string name = pair_name(p, "kvack");
  std::unique_ptr<parallel::ProcessGroup> pg;
  try {
    pg = connect(name, 1);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu);
    set_mode(p, Mode::kHost, std::string("the ack channel did not connect: ") + e.what());
    return;
  }
  try {
    for (;;) {
      const IpcAck a = decode_ipc_ack(parallel::broadcast_bytes(*pg, {}, 0));
      std::lock_guard<std::mutex> lock(mu);
      if (a.kind == IpcAck::kBye) break;
      if (a.kind == IpcAck::kAccept) set_mode(p, Mode::kIpc, a.reason);
      else if (a.kind == IpcAck::kRefuse) set_mode(p, Mode::kHost, "the decode side refused: " + a.reason);
      else if (a.kind == IpcAck::kConsumed) {
        p.ring.release(a.buffer, a.seq);
        stats.acks++;
        cv.notify_all();
      }
    }
  } catch (const std::exception& e) {
    DI_WARN("kv transport: ", name, " broke: ", e.what());
  }
  // Without acks no buffer can be reused safely: what follows goes the host hop (quietly when
  // this side is stopping: the peer's bye closes the channel then).
  std::lock_guard<std::mutex> lock(mu);
  if (stop) p.mode = Mode::kHost;
  else if (p.mode != Mode::kHost) set_mode(p, Mode::kHost, "the ack channel closed");
}

void KvTransport::Core::ack_sender(size_t i, IpcAck first) {
  Pair& p = pairs[i];
  const std::string name = pair_name(p, "kvack");
  std::shared_ptr<AckQueue> acks = p.acks;
  try {
    std::unique_ptr<parallel::ProcessGroup> pg = connect(name, 0);
    parallel::broadcast_bytes(*pg, encode_ipc_ack(first), 0);
    if (first.kind != IpcAck::kAccept) {
      parallel::broadcast_bytes(*pg, encode_ipc_ack(ack(IpcAck::kBye)), 0);
      return;
    }
    for (;;) {
      std::deque<IpcAck> out;
      bool closed = false;
      {
        std::unique_lock<std::mutex> lock(acks->mu);
        acks->cv.wait_for(lock, std::chrono::duration<double>(opt.heartbeat_s), [&] { return acks->closed || !acks->q.empty(); });
        out.swap(acks->q);
        closed = acks->closed;
      }
      if (out.empty() && !closed) out.push_back(ack(IpcAck::kHeartbeat));
      for (const IpcAck& a : out) parallel::broadcast_bytes(*pg, encode_ipc_ack(a), 0);
      {
        std::lock_guard<std::mutex> lock(mu);
        for (const IpcAck& a : out) stats.acks += a.kind == IpcAck::kConsumed;
      }
      if (closed) {
        parallel::broadcast_bytes(*pg, encode_ipc_ack(ack(IpcAck::kBye)), 0);
        return;
      }
    }
  } catch (const std::exception& e) {
    DI_WARN("kv transport: ", name, " broke: ", e.what());
  }
}

void KvTransport::Core::on_hello(Pair& p, size_t i, const IpcHello& h) {
  std::string why;
  std::shared_ptr<IpcImporter> importer;
  if (!h.offer) why = "the prefill side offers no cuda-ipc: " + h.reason;
  else if (opt.transport == KvTransportKind::kHost) why = "--kv-transport host on the decode server";
  else if (opt.device < 0 || !have_cuda_ipc()) why = "the decode engine is not on a GPU";
  else {
    try {
      importer = std::make_shared<IpcImporter>(h, opt.device);
    } catch (const Error& e) {
      why = std::string("opening the prefill side's handles failed: ") + e.what();
    }
  }
  std::string how;
  if (importer)
    how = std::string(importer->same_device() ? "the same GPU" : "a peer GPU") + ", " + std::to_string(kIpcBuffers) +
          " staging buffers of " + std::to_string((importer->buffer_bytes() + 1023) >> 10) + " KiB of process " +
          std::to_string(h.pid);
  {
    std::lock_guard<std::mutex> lock(mu);
    p.importer = importer;
    set_mode(p, importer ? Mode::kIpc : Mode::kHost, importer ? how : why);
  }
  if (h.offer) {
    IpcAck first = ack(importer ? IpcAck::kAccept : IpcAck::kRefuse, 0, 0, importer ? how : why);
    std::thread([core = shared_from_this(), i, first] { core->ack_sender(i, first); }).detach();
  }
}

void KvTransport::Core::store(Pair& p, const std::string& id, engine::KvBundle b, bool ipc) {
  std::vector<engine::KvBundle> dropped;  // destroyed after the lock (an IPC one queues its ack)
  std::lock_guard<std::mutex> lock(mu);
  if (stop) {
    dropped.push_back(std::move(b));
    return;
  }
  if (auto it = arrived.find(id); it != arrived.end()) {
    dropped.push_back(std::move(it->second));
    arrival_order.erase(std::find(arrival_order.begin(), arrival_order.end(), id));
  }
  arrived[id] = std::move(b);
  arrival_order.push_back(id);
  if (ipc) ipc_arrived[id] = Clock::now();
  else ipc_arrived.erase(id);
  (ipc ? stats.ipc_received : stats.host_received)++;
  while (arrival_order.size() > kMaxUnclaimed) {
    dropped.push_back(std::move(arrived[arrival_order.front()]));
    arrived.erase(arrival_order.front());
    ipc_arrived.erase(arrival_order.front());
    arrival_order.pop_front();
  }
  if (on_arrival) on_arrival();
}

void KvTransport::Core::receive_loop(parallel::ProcessGroup& pg, Pair& p, size_t i) {
  bool hello = false;
  for (;;) {
    const std::vector<uint8_t> m = parallel::broadcast_bytes(pg, {}, 0);
    uint32_t n = 0;
    if (m.size() < sizeof n) DI_THROW(InternalError, "kv transport: a message of ", m.size(), " bytes");
    std::memcpy(&n, m.data(), sizeof n);
    const std::span<const uint8_t> body = std::span<const uint8_t>(m).subspan(sizeof n);
    if (n == kBye) return;
    if (n == kHello) {
      on_hello(p, i, decode_ipc_hello(body));
      hello = true;
      continue;
    }
    if (!hello) DI_THROW(InternalError, "kv transport: the peer's first message is not a hello");
    {
      // IPC bundles nobody claimed in ipc_unclaimed_s hold a peer buffer: drop them (checked on
      // every message, heartbeats included).
      std::vector<engine::KvBundle> dropped;
      std::lock_guard<std::mutex> lock(mu);
      if (stop) return;
      const auto limit = Clock::now() - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.ipc_unclaimed_s));
      for (auto it = ipc_arrived.begin(); it != ipc_arrived.end();) {
        if (it->second > limit) {
          ++it;
          continue;
        }
        DI_WARN("kv transport: IPC bundle ", it->first, " was not claimed in ", opt.ipc_unclaimed_s, " s, dropped");
        dropped.push_back(std::move(arrived[it->first]));
        arrived.erase(it->first);
        arrival_order.erase(std::find(arrival_order.begin(), arrival_order.end(), it->first));
        it = ipc_arrived.erase(it);
      }
    }
    if (n == 0) continue;  // heartbeat
    if (body.size() < size_t(n) + 1) DI_THROW(InternalError, "kv transport: a message cut inside its id");
    const std::string id(reinterpret_cast<const char*>(body.data()), n);
    const uint8_t tag = body[n];
    const std::span<const uint8_t> payload = body.subspan(size_t(n) + 1);
    if (tag == kTagIpc) {
      std::shared_ptr<IpcImporter> imp;
      {
        std::lock_guard<std::mutex> lock(mu);
        imp = p.importer;
      }
      if (!imp) DI_THROW(InternalError, "kv transport: an IPC bundle on a pair that did not accept cuda-ipc");
      auto [ref, b] = decode_ipc_bundle(payload, imp->buffer_bytes());  // the peer is this build: a bad one is a bug
      imp->wait(ref.buffer);  // the peer's staging copy has landed
      const void* data = imp->buffer(ref.buffer);
      // The owner's release is the ack: the buffer goes back to the peer once nothing reads it.
      std::shared_ptr<void> owner(const_cast<void*>(data), [acks = p.acks, imp, ref = ref](void*) {
        acks->push(ack(IpcAck::kConsumed, ref.buffer, ref.seq));
      });
      b.device_blocks = {.owner = std::move(owner), .data = const_cast<void*>(data), .bytes = ref.bytes, .device = imp->device()};
      store(p, id, std::move(b), true);
    } else if (tag == kTagHost) {
      engine::KvBundle b;
      try {
        b = engine::decode_kv_bundle(payload);
      } catch (const Error& e) {
        DI_WARN("kv transport: bundle ", id, " from ", p.peer, " refused: ", e.what());
        continue;
      }
      store(p, id, std::move(b), false);
    } else {
      DI_THROW(InternalError, "kv transport: bundle ", id, " has an unknown tag ", int(tag));
    }
  }
}

KvTransport::KvTransport(KvTransportOptions options) : core_(std::make_shared<Core>()) {
  Core& c = *core_;
  c.opt = std::move(options);
  if (c.opt.role != "prefill" && c.opt.role != "decode")
    DI_THROW(InvalidArgument, "--kv-role '", c.opt.role, "' is not one of: prefill, decode");
  if (!std::filesystem::is_directory(c.opt.rendezvous_dir))
    DI_THROW(InvalidArgument, "--kv-rendezvous '", c.opt.rendezvous_dir, "' is not a directory");
  if (!safe_name(c.opt.name)) DI_THROW(InvalidArgument, "--kv-name '", c.opt.name, "' must be letters, digits, - or _");
  if (c.opt.peers.empty()) DI_THROW(InvalidArgument, "--kv-peers names no peer");
  if (c.opt.transport == KvTransportKind::kCudaIpc && (c.opt.device < 0 || !have_cuda_ipc()))
    DI_THROW(InvalidArgument, "--kv-transport cuda-ipc needs a CUDA engine, and this server's runs on the CPU",
             have_cuda_ipc() ? "" : " (this build has no CUDA)", ": use --kv-transport host or auto");
  if (c.opt.role == "prefill" && c.opt.transport != KvTransportKind::kHost && c.opt.device >= 0 && c.opt.ipc_buffer_bytes == 0)
    DI_THROW(InvalidArgument, "KvTransportOptions: ipc_buffer_bytes is 0 on a GPU prefill server");
  for (const std::string& p : c.opt.peers) {
    if (!safe_name(p)) DI_THROW(InvalidArgument, "--kv-peers: '", p, "' must be letters, digits, - or _");
    Core::Pair pair;
    pair.peer = p;
    c.pairs.push_back(std::move(pair));
  }
  if (!parallel::have_gloo()) DI_THROW(InvalidArgument, "--kv-role needs gloo, which this build lacks");
  for (size_t i = 0; i < c.pairs.size(); ++i) std::thread([core = core_, i] { core->run_pair(i); }).detach();
}

KvTransport::~KvTransport() { stop(); }

const KvTransportOptions& KvTransport::options() const { return core_->opt; }

bool KvTransport::send(const std::string& peer, const std::string& id, engine::KvBundle bundle) {
  std::lock_guard<std::mutex> lock(core_->mu);
  for (Core::Pair& p : core_->pairs)
    if (p.peer == peer) {
      if (p.broken) return false;
      p.queue.emplace_back(id, std::move(bundle));
      core_->cv.notify_all();
      return true;
    }
  return false;
}

bool KvTransport::wants_device_bundle(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(core_->mu);
  for (const Core::Pair& p : core_->pairs)
    if (p.peer == peer) return p.exporter && p.mode != Core::Mode::kHost && !p.broken;
  return false;
}

std::optional<engine::KvBundle> KvTransport::take(const std::string& id) {
  std::lock_guard<std::mutex> lock(core_->mu);
  auto it = core_->arrived.find(id);
  if (it == core_->arrived.end()) return std::nullopt;
  engine::KvBundle b = std::move(it->second);
  core_->arrived.erase(it);
  core_->ipc_arrived.erase(id);
  core_->arrival_order.erase(std::find(core_->arrival_order.begin(), core_->arrival_order.end(), id));
  return b;
}

bool KvTransport::has(const std::string& id) const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->arrived.count(id) > 0;
}

void KvTransport::set_on_arrival(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->on_arrival = std::move(f);
}

int KvTransport::num_connected() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  int n = 0;
  for (const Core::Pair& p : core_->pairs) n += p.connected;
  return n;
}

KvTransportStats KvTransport::stats() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->stats;
}

void KvTransport::stop() {
  std::vector<engine::KvBundle> dropped;  // unclaimed arrivals: an IPC one's release queues its ack first
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->stop = true;
  core_->on_arrival = nullptr;
  for (auto& [id, b] : core_->arrived) dropped.push_back(std::move(b));
  core_->arrived.clear();
  core_->arrival_order.clear();
  core_->ipc_arrived.clear();
  for (Core::Pair& p : core_->pairs) {
    std::lock_guard<std::mutex> l(p.acks->mu);
    p.acks->closed = true;
    p.acks->cv.notify_all();
  }
  core_->cv.notify_all();
}

}  // namespace deepinfer::server
