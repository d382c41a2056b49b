#include "router/pool.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/logging.h"
#include "deepinfer/error.h"

namespace deepinfer::router {

Policy parse_policy(const std::string& name) {
  if (name == "affinity") return Policy::kAffinity;
  if (name == "least-load") return Policy::kLeastLoad;
  if (name == "random") return Policy::kRandom;
  DI_THROW(InvalidArgument, "--policy '", name, "' is not one of: affinity, least-load, random");
}

int64_t BackendStatus::load_tokens() const {
  return std::max(inflight_tokens, reported.running_tokens + reported.waiting_tokens);
}

std::vector<uint64_t> prefix_hashes(const std::string& text, int64_t block_chars) {
  std::vector<uint64_t> out;
  if (block_chars <= 0) return out;
  uint64_t h = 1469598103934665603ull;  // FNV-1a offset basis; each block continues the chain
  for (size_t i = 0; i + size_t(block_chars) <= text.size(); i += size_t(block_chars)) {
    for (size_t k = i; k < i + size_t(block_chars); ++k) {
      h ^= static_cast<unsigned char>(text[k]);
      h *= 1099511628211ull;
    }
    out.push_back(h);
  }
  return out;
}

BackendPool::BackendPool(std::vector<Url> backends, PoolOptions options) : opt_(options), rng_(options.seed) {
  if (backends.empty()) DI_THROW(InvalidArgument, "the router needs at least one backend (--backends URL,URL,...)");
  for (Url& u : backends) {
    Backend b;
    b.st.url = u.text;
    b.url = std::move(u);
    backends_.push_back(std::move(b));
  }
}

BackendPool::~BackendPool() { stop(); }

void BackendPool::start() {
  poll_now();
  thread_ = std::thread([this] { run(); });
}

void BackendPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackendPool::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::duration<double>(opt_.poll_interval_s), [&] { return stop_; });
    if (stop_) break;
    lock.unlock();
    poll_now();
    lock.lock();
  }
}

void BackendPool::poll_now() {
  for (int b = 0; b < size(); ++b) poll_one(b);
}

void BackendPool::poll_one(int b) {
  Backend& be = backends_[size_t(b)];
  std::string error;
  bool refused = false;
  ReportedLoad load;
  try {
    auto [status, body] = simple_get(be.url, "/load", opt_.poll_timeout_s);
    if (status != 200) {
      error = "GET /load answered " + std::to_string(status);
    } else {
      const auto j = nlohmann::json::parse(body);
      load.running_seqs = j.value("num_requests_running", int64_t(0));
      load.waiting_seqs = j.value("num_requests_waiting", int64_t(0));
      load.running_tokens = j.value("running_tokens", int64_t(0));
      load.waiting_tokens = j.value("waiting_tokens", int64_t(0));
      load.kv_usage = j.value("kv_cache_usage", 0.0);
      load.kv_name = j.value("kv_name", std::string());
    }
  } catch (const UpstreamError& e) {
    error = e.what();
    refused = e.stage == Stage::kConnect;
  } catch (const std::exception& e) {
    error = std::string("GET /load: ") + e.what();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (error.empty()) {
    if (!be.st.up) DI_INFO("router: backend ", be.url.text, " is up");
    be.st.up = true;
    be.st.reported = load;
    be.consecutive_failures = 0;
    return;
  }
  be.st.last_error = error;
  if (refused || ++be.consecutive_failures >= opt_.down_after_failures) {
    if (be.st.up) DI_WARN("router: backend ", be.url.text, " leaves the pool: ", error);
    be.st.up = false;
  }
}

void BackendPool::mark_down(int b, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  Backend& be = backends_[size_t(b)];
  if (be.st.up) DI_WARN("router: backend ", be.url.text, " leaves the pool: ", why);
  be.st.up = false;
  be.st.last_error = why;
}

int BackendPool::least_loaded(const std::vector<bool>& tried) const {
  int best = -1;
  for (int b = 0; b < size(); ++b) {
    const BackendStatus& s = backends_[size_t(b)].st;
    if (!s.up || (b < int(tried.size()) && tried[size_t(b)])) continue;
    if (best < 0) {
      best = b;
      continue;
    }
    const BackendStatus& o = backends_[size_t(best)].st;
    if (s.load_tokens() < o.load_tokens() ||
        (s.load_tokens() == o.load_tokens() && s.inflight_requests < o.inflight_requests))
      best = b;
  }
  return best;
}

std::optional<Choice> BackendPool::choose(const std::vector<uint64_t>& hashes, const std::vector<bool>& tried) {
  std::lock_guard<std::mutex> lock(mu_);
  auto usable = [&](int b) {
    return b >= 0 && b < size() && backends_[size_t(b)].st.up && !(b < int(tried.size()) && tried[size_t(b)]);
  };
  Choice c;
  if (opt_.policy == Policy::kRandom) {
    std::vector<int> live;
    for (int b = 0; b < size(); ++b)
      if (usable(b)) live.push_back(b);
    if (live.empty()) return std::nullopt;
    c.backend = live[size_t(rng_() % live.size())];
    return c;
  }
  const int least = least_loaded(tried);
  if (least < 0) return std::nullopt;
  c.backend = least;
  if (opt_.policy != Policy::kAffinity) return c;
  // The longest matched chain: hashes chain, so the last one present wins.
  int cand = -1;
  for (size_t i = hashes.size(); i-- > 0;) {
    auto it = affinity_.find(hashes[i]);
    if (it == affinity_.end()) continue;
    cand = it->second.backend;
    c.matched_blocks = int64_t(i + 1);
    break;
  }
  if (cand < 0) return c;
  if (!usable(cand)) {
    c.affinity_override = true;
    return c;
  }
  const BackendStatus& s = backends_[size_t(cand)].st;
  const double limit = opt_.affinity_factor * double(backends_[size_t(least)].st.load_tokens()) +
                       double(opt_.affinity_slack_tokens);
  if (double(s.load_tokens()) > limit || s.reported.kv_usage > opt_.kv_usage_limit) {
    c.affinity_override = cand != least;
    c.affinity_hit = cand == least;
    return c;
  }
  c.backend = cand;
  c.affinity_hit = true;
  return c;
}

void BackendPool::begin(int b, const std::vector<uint64_t>& hashes, int64_t est_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  BackendStatus& s = backends_[size_t(b)].st;
  s.inflight_requests++;
  s.inflight_tokens += est_tokens;
  s.dispatched++;
  for (uint64_t h : hashes) {
    auto it = affinity_.find(h);
    if (it != affinity_.end()) {
      it->second.backend = b;
      affinity_lru_.splice(affinity_lru_.end(), affinity_lru_, it->second.lru);
      continue;
    }
    affinity_lru_.push_back(h);
    affinity_[h] = AffinityEntry{b, std::prev(affinity_lru_.end())};
    while (affinity_.size() > opt_.affinity_table_entries) {
      affinity_.erase(affinity_lru_.front());
      affinity_lru_.pop_front();
    }
  }
}

void BackendPool::end(int b, int64_t est_tokens, bool failed, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  BackendStatus& s = backends_[size_t(b)].st;
  s.inflight_requests--;
  s.inflight_tokens -= est_tokens;
  if (failed) {
    s.failures++;
    s.last_error = error;
  }
}

std::vector<BackendStatus> BackendPool::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BackendStatus> out;
  for (const Backend& b : backends_) out.push_back(b.st);
  return out;
}

int BackendPool::num_up() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const Backend& b : backends_) n += b.st.up;
  return n;
}

}  // namespace deepinfer::router
