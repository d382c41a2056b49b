// What the router's handlers share (router.cpp, forward.cpp): the pool, the counters, the
// threads of forwarded requests and their upstream calls (cancelled at stop).
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "router/pool.h"
#include "router/router.h"
#include "server/http.h"

namespace deepinfer::router {

struct RouterCounters {
  std::mutex mu;
  std::map<std::pair<std::string, int>, int64_t> responses;  // (path, status) -> count
  int64_t retries = 0;            // attempts after the first
  int64_t stream_failures = 0;    // streams cut after output started (error event sent)
  int64_t affinity_hits = 0, affinity_overrides = 0, affinity_lookups = 0;
  int64_t prefills = 0, prefill_failures = 0;  // disaggregation: prefill calls, failed ones (decoded colocated)
  void count(const std::string& path, int status) {
    std::lock_guard<std::mutex> lock(mu);
    responses[{path, status}]++;
  }
};

// Threads of forwarded requests: spawned per request, all joined (after their upstream calls
// were cancelled) by stop().
class RequestThreads {
 public:
  // False (nothing started) once stopping.
  bool spawn(std::function<void()> fn);
  void register_call(const std::shared_ptr<UpstreamCall>& c);
  void unregister_call(const std::shared_ptr<UpstreamCall>& c);
  void stop();  // cancels the registered calls, waits for every thread

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;
  bool stopping_ = false;
  std::set<std::shared_ptr<UpstreamCall>> calls_;
};

struct RouterState {
  RouterOptions opt;
  std::unique_ptr<BackendPool> pool;     // replicas answering clients (decode servers when disaggregated)
  std::unique_ptr<BackendPool> prefill;  // disaggregation's prefill servers, null = colocated
  RouterCounters counters;
  RequestThreads threads;
};

// A generation request (POST /v1/completions or /v1/chat/completions), on its own thread.
void forward_generation(RouterState& st, const server::HttpRequest& req, std::shared_ptr<server::Responder> resp);
// A GET forwarded to the first live replica that answers (/v1/models...).
void forward_get(RouterState& st, const server::HttpRequest& req, std::shared_ptr<server::Responder> resp);
void send_router_error(RouterState& st, server::Responder& r, const std::string& path, int status,
                       const std::string& message, const std::string& code);

}  // namespace deepinfer::router
