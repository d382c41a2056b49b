// `deepinfer router`: one OpenAI-compatible endpoint in front of several `deepinfer serve`
// replicas (docs/ROUTER.md).
//
//   POST /v1/completions, /v1/chat/completions  forwarded to a replica (router/pool.h's rule),
//                                               streamed responses passed through event by event
//   GET  /v1/models, /v1/models/{id}            forwarded to a live replica
//   GET  /health                                200 while at least one replica is up, else 503
//   GET  /metrics                               the router's own Prometheus text
//   GET  /router/backends                       JSON: each replica's state, load and counters
//
// Retry rule: a request goes to another replica (each replica at most once) as long as nothing
// of its response has reached the client: the connection failed or was lost before the
// response head, the replica answered 503 (queue full, shutting down), a whole (non-streamed)
// response was cut short, or a stream ended before its first event. Once an event of a stream
// was forwarded, a lost replica ends the stream with an error event (code "replica_failed")
// and no retry, so a client never sees output from two replicas. 4xx and other 5xx answers
// are passed through as they are.
//
// Threads: the HTTP layer's I/O threads (server/http.h) only parse and dispatch; each
// forwarded request runs on a thread of its own, blocked on its replica (router/upstream.h).
// A client that leaves cancels its upstream call, which the replica sees as a disconnect and
// aborts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "router/pool.h"
#include "server/http.h"

namespace deepinfer::router {

struct RouterOptions {
  std::vector<std::string> backends;  // replica URLs (http://host:port)
  // Prefill/decode disaggregation (docs/ROUTER.md): instead of `backends`, prefill servers and
  // decode servers (`serve --kv-role prefill|decode`). Each request is prefilled on one, its KV
  // state handed to a decode server, which continues it and answers the client.
  std::vector<std::string> prefill, decode;
  server::HttpOptions http;
  PoolOptions pool;
  CallTimeouts timeouts;
  int64_t default_max_tokens = 256;  // the load estimate of a request without max_tokens
};

struct RouterState;

class Router {
 public:
  // InvalidArgument for a bad backend URL or option.
  explicit Router(RouterOptions options);
  ~Router();  // stop()
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  void start();      // polls the replicas once, then binds and serves
  int port() const;  // the bound port
  void stop();       // stops HTTP, cancels upstream calls, joins every thread. Idempotent.
  BackendPool& pool();          // the replicas that answer clients (the decode servers when disaggregated)
  BackendPool* prefill_pool();  // null unless disaggregated

 private:
  std::unique_ptr<RouterState> st_;
  std::unique_ptr<server::HttpServer> http_;
};

}  // namespace deepinfer::router
