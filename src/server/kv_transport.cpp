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

namespace deepinfer::server {
namespace {
constexpr uint32_t kBye = 0xFFFFFFFFu;          // the sender stops: the receiver ends too
constexpr size_t kMaxUnclaimed = 256;           // arrivals nobody took (a decode request that never came)

std::vector<uint8_t> message(const std::string& id, const engine::KvBundle* b, uint32_t tag) {
  std::vector<uint8_t> m(sizeof(uint32_t));
  const uint32_t n = tag == kBye ? kBye : uint32_t(id.size());
  std::memcpy(m.data(), &n, sizeof n);
  m.insert(m.end(), id.begin(), id.end());
  if (b) {
    const std::vector<uint8_t> e = engine::encode_kv_bundle(*b);
    m.insert(m.end(), e.begin(), e.end());
  }
  return m;
}

bool safe_name(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; });
}
}  // namespace

struct KvTransport::Core {
  KvTransportOptions opt;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  struct Pair {
    std::string peer;
    bool connected = false, broken = false;
    std::deque<std::pair<std::string, engine::KvBundle>> queue;  // prefill: waiting to go
  };
  std::vector<Pair> pairs;  // fixed after construction
  std::map<std::string, engine::KvBundle> arrived;
  std::deque<std::string> arrival_order;
  std::function<void()> on_arrival;

  void run_pair(size_t i);
  void send_loop(parallel::ProcessGroup& pg, Pair& p);
  void receive_loop(parallel::ProcessGroup& pg, Pair& p);
};

void KvTransport::Core::run_pair(size_t i) {
  Pair& p = pairs[i];
  const bool prefill = opt.role == "prefill";
  parallel::GlooGroupOptions g;
  g.rendezvous_dir = opt.rendezvous_dir;
  g.name = "kv." + (prefill ? opt.name : p.peer) + "." + (prefill ? p.peer : opt.name);
  g.rank = prefill ? 0 : 1;
  g.size = 2;
  g.timeout = std::chrono::milliseconds(int64_t(std::max(opt.connect_timeout_s, 4 * opt.heartbeat_s) * 1000));
  std::unique_ptr<parallel::ProcessGroup> pg;
  try {
    pg = parallel::make_gloo_group(g);
  } catch (const std::exception& e) {
    DI_WARN("kv transport: ", g.name, " did not connect: ", e.what());
    std::lock_guard<std::mutex> lock(mu);
    p.broken = true;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    p.connected = true;
  }
  DI_INFO("kv transport: ", g.name, " connected (", pg->describe(), ")");
  try {
    if (prefill) send_loop(*pg, p);
    else receive_loop(*pg, p);
  } catch (const std::exception& e) {
    DI_WARN("kv transport: ", g.name, " broke: ", e.what());
  }
  std::lock_guard<std::mutex> lock(mu);
  p.connected = false;
  p.broken = true;
  p.queue.clear();
}

void KvTransport::Core::send_loop(parallel::ProcessGroup& pg, Pair& p) {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::duration<double>(opt.heartbeat_s), [&] { return stop || !p.queue.empty(); });
    if (stop) {
      lock.unlock();
      parallel::broadcast_bytes(pg, message("", nullptr, kBye), 0);
      return;
    }
    std::vector<uint8_t> m;
    if (p.queue.empty()) {
      m = message("", nullptr, 0);  // heartbeat
    } else {
      m = message(p.queue.front().first, &p.queue.front().second, 0);
      p.queue.pop_front();
    }
    lock.unlock();
    parallel::broadcast_bytes(pg, std::move(m), 0);
  }
}

void KvTransport::Core::receive_loop(parallel::ProcessGroup& pg, Pair& p) {
  for (;;) {
    const std::vector<uint8_t> m = parallel::broadcast_bytes(pg, {}, 0);
    uint32_t n = 0;
    if (m.size() < sizeof n) DI_THROW(InternalError, "kv transport: a message of ", m.size(), " bytes");
    std::memcpy(&n, m.data(), sizeof n);
    if (n == kBye) return;
    std::lock_guard<std::mutex> lock(mu);
    if (stop) return;
    if (n == 0) continue;  // heartbeat
    if (m.size() < sizeof n + n) DI_THROW(InternalError, "kv transport: a message cut inside its id");
    const std::string id(reinterpret_cast<const char*>(m.data() + sizeof n), n);
    try {
      arrived[id] = engine::decode_kv_bundle(std::span<const uint8_t>(m).subspan(sizeof n + n));
    } catch (const Error& e) {
      DI_WARN("kv transport: bundle ", id, " from ", p.peer, " refused: ", e.what());
      continue;
    }
    arrival_order.push_back(id);
    while (arrival_order.size() > kMaxUnclaimed) {
      arrived.erase(arrival_order.front());
      arrival_order.pop_front();
    }
    if (on_arrival) on_arrival();
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

std::optional<engine::KvBundle> KvTransport::take(const std::string& id) {
  std::lock_guard<std::mutex> lock(core_->mu);
  auto it = core_->arrived.find(id);
  if (it == core_->arrived.end()) return std::nullopt;
  engine::KvBundle b = std::move(it->second);
  core_->arrived.erase(it);
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

void KvTransport::stop() {
  std::lock_guard<std::mutex> lock(core_->mu);
  core_->stop = true;
  core_->on_arrival = nullptr;
  core_->cv.notify_all();
}

}  // namespace deepinfer::server
