// A small HTTP/1.1 server on Boost.Beast + Asio (docs/SERVER.md says why this library): async
// I/O on a few threads for many keep-alive and streaming connections, whole responses with
// Content-Length or chunked ones (server-sent events), body and header limits answered with
// 413 / 431, and client disconnects noticed while a response is still being prepared (a pending
// read on the idle socket completes at EOF), so a request whose client left can be aborted.
//
// Threads: handlers run on an I/O thread and must not block (they hand work to other threads).
// A Responder may be used from any thread; its calls are queued to the connection's strand.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::server {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string path;     // the target without its query
  std::string query;    // after '?', "" when none
  std::string body;
  Headers headers;      // as received
  std::string header(std::string_view name) const;  // case-insensitive; "" when absent
};

// The response side of one request. Exactly one of send() or start_stream() ... end() answers it;
// later calls and calls after the client left are ignored. Thread-safe.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send(int status, std::string content_type, std::string body, Headers extra = {}) = 0;
  // Chunked response: headers now, then each write() as one chunk, end() to finish.
  virtual void start_stream(int status, std::string content_type, Headers extra = {}) = 0;
  virtual void write(std::string data) = 0;
  virtual void end() = 0;
  // `f` runs once, on an I/O thread, when the client disconnects before the response ended
  // (immediately if it already has). Replaces an earlier callback.
  virtual void on_disconnect(std::function<void()> f) = 0;
  virtual bool disconnected() const = 0;
};

using Handler = std::function<void(HttpRequest&& request, std::shared_ptr<Responder> responder)>;
// Body of the error responses the HTTP layer writes itself (400, 413, 431, 503).
using ErrorBody = std::function<std::string(int status, const std::string& message)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0: an ephemeral port (see HttpServer::port)
  int io_threads = 2;
  size_t max_body_bytes = size_t(32) << 20; // larger bodies get 413
  size_t max_header_bytes = size_t(64) << 10;  // larger headers get 431
  double idle_timeout_s = 60;               // keep-alive connection waiting for a request
  double write_timeout_s = 60;              // a client that stops reading is dropped
  int64_t max_connections = 4096;           // more are answered 503 and closed
};

struct HttpCounters {
  int64_t connections_open = 0;
  int64_t connections_total = 0;
  int64_t disconnects_mid_response = 0;
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, Handler handler, ErrorBody error_body);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  // Binds and starts the I/O threads. Throws InvalidArgument for a host that does not parse or
  // an address that cannot be bound (naming it and the reason).
  void start();
  int port() const;  // the bound port (after start)
  // Stops accepting, closes every connection and joins the I/O threads. Idempotent.
  void stop();
  HttpCounters counters() const;

  struct Impl;  // http.cpp (its sessions reach it)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
