// BackendPool: the router's replicas, their health and load, and the routing rule.
//
// Health and load: a thread polls every replica's GET /load (server.cpp: running / waiting
// sequences and tokens, KV usage) every `poll_interval_s`. A replica that refuses the
// connection is out of the pool at once; one that answers slowly or with an error leaves after
// `down_after_failures` polls in a row; a replica that is out comes back with its first good
// answer. A forwarding failure (connect refused, connection lost) also takes it out at once.
//
// Load of a replica, in tokens: max(reported, in flight). `reported` is the replica's running +
// waiting tokens at the last poll; `in flight` is the router's own estimate of what it has sent
// there and not seen finish (prompt tokens + max_tokens per request), which is current between
// polls. The max, not the sum: the router's requests are part of what the replica reports.
//
// The rule (choose()): the request's prompt is cut into blocks of `block_chars` characters and
// hashed as a chain (a block's hash covers every block before it). The affinity table maps a
// block hash to the replica that was last sent a prompt containing that block. The candidate is
// the replica of the longest matched chain. It is chosen unless it is out of the pool, was
// already tried for this request, or is overloaded by a clear margin:
//     load(candidate) > affinity_factor * load(least loaded) + affinity_slack_tokens
// or its KV usage exceeds kv_usage_limit. Otherwise (and without a match) the least loaded
// replica is chosen (ties: fewest requests in flight, then the lowest index). Policy kRandom
// picks uniformly among the live replicas (the comparison baseline), kLeastLoad ignores prefixes.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "router/upstream.h"

namespace deepinfer::router {

enum class Policy { kAffinity, kLeastLoad, kRandom };
Policy parse_policy(const std::string& name);  // affinity | least-load | random; InvalidArgument

struct PoolOptions {
  Policy policy = Policy::kAffinity;
  double poll_interval_s = 0.5;
  double poll_timeout_s = 2;
  int down_after_failures = 2;
  int64_t block_chars = 256;
  double affinity_factor = 2.0;
  int64_t affinity_slack_tokens = 2048;
  double kv_usage_limit = 0.95;
  size_t affinity_table_entries = 1 << 16;  // block hashes remembered (least recently used go)
  uint64_t seed = 0;                        // kRandom
};

// What one replica reported at its last good poll.
struct ReportedLoad {
  int64_t running_seqs = 0, waiting_seqs = 0;
  int64_t running_tokens = 0, waiting_tokens = 0;
  double kv_usage = 0;
  std::string kv_name;  // disaggregation: the server's KV transport name ("" = none)
};

struct BackendStatus {
  std::string url;
  bool up = false;
  ReportedLoad reported;
  int64_t inflight_requests = 0, inflight_tokens = 0;
  int64_t dispatched = 0;       // attempts sent here
  int64_t failures = 0;         // attempts that failed here
  std::string last_error;
  int64_t load_tokens() const;  // the rule's load
};

struct Choice {
  int backend = -1;
  bool affinity_hit = false;     // went to the replica of its matched prefix
  bool affinity_override = false;  // had a match, went elsewhere (overloaded, out, tried)
  int64_t matched_blocks = 0;
};

// FNV-1a chain hashes of the full `block_chars` blocks of `text`.
std::vector<uint64_t> prefix_hashes(const std::string& text, int64_t block_chars);

class BackendPool {
 public:
  BackendPool(std::vector<Url> backends, PoolOptions options);
  ~BackendPool();  // stop()
  void start();    // first poll of every replica (so the pool starts knowing who is up), then the thread
  void stop();

  int size() const { return int(backends_.size()); }
  const Url& url(int b) const { return backends_[size_t(b)].url; }
  // A replica for a request with these prefix hashes, not in `tried`; nullopt when none is up.
  std::optional<Choice> choose(const std::vector<uint64_t>& hashes, const std::vector<bool>& tried);
  // Marks a request dispatched to `b` (in flight; its prefix now belongs to `b`) / done.
  void begin(int b, const std::vector<uint64_t>& hashes, int64_t est_tokens);
  void end(int b, int64_t est_tokens, bool failed, const std::string& error = "");
  void mark_down(int b, const std::string& why);
  std::vector<BackendStatus> status() const;
  int num_up() const;
  void poll_now();  // one poll round on the caller's thread (tests)

 private:
  struct Backend {
    Url url;
    BackendStatus st;
    int consecutive_failures = 0;
  };
  struct AffinityEntry {
    int backend;
    std::list<uint64_t>::iterator lru;
  };
  void poll_one(int b);
  void run();
  int least_loaded(const std::vector<bool>& tried) const;  // -1 when none is up and untried

  PoolOptions opt_;
  std::vector<Backend> backends_;  // fixed size; fields under mu_
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, AffinityEntry> affinity_;
  std::list<uint64_t> affinity_lru_;  // least recently used first
  std::mt19937_64 rng_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace deepinfer::router
