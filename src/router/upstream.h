// A blocking HTTP/1.1 client for the router's calls to its replicas: one request per connection
// (Connection: close), POSIX sockets with poll() timeouts, responses parsed by Beast's parser fed
// from our own reads. Blocking, because each forwarded request runs on its own router thread;
// POSIX rather than Asio's sync calls, because those ignore socket timeouts, and a call must be
// cancellable from another thread (the client left, the router stops): cancel() shuts the socket
// down, which wakes the blocked read at once.
//
// Failure stages matter to the router (a request may be retried only while nothing of its
// response reached the client), so every error is an UpstreamError naming its stage.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::router {

using Headers = std::vector<std::pair<std::string, std::string>>;

// "http://host:port" (also "host:port"; no path, no TLS).
struct Url {
  std::string host;
  int port = 80;
  std::string text;  // normalised "http://host:port"
};
// InvalidArgument naming `url` when it is not http://host:port.
Url parse_url(const std::string& url);

enum class Stage { kConnect, kSend, kHead, kBody };
const char* stage_name(Stage s);

struct UpstreamError : std::runtime_error {
  UpstreamError(Stage stage, const std::string& what) : std::runtime_error(what), stage(stage) {}
  Stage stage;
};

struct CallTimeouts {
  double connect_s = 2;
  double read_s = 600;  // between two reads (a long queue wait or prefill sends nothing)
};

class UpstreamCall {
 public:
  // Connects and sends the whole request. UpstreamError (kConnect / kSend) on failure.
  UpstreamCall(const Url& url, const std::string& method, const std::string& target, const std::string& body,
               const Headers& headers, CallTimeouts timeouts);
  ~UpstreamCall();
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;

  // Reads up to the end of the response head; the status. UpstreamError(kHead).
  int read_head();
  std::string header(std::string_view name) const;  // case-insensitive, "" when absent
  // Reads the body to its end, calling `on_data` with each decoded piece as it arrives (chunk
  // framing removed). UpstreamError(kBody) when the connection ends before the message does.
  void read_body(const std::function<void(std::string_view)>& on_data);
  std::string read_all();  // read_body into one string

  // Any thread: aborts the call (the blocked read fails); idempotent.
  void cancel();
  bool cancelled() const { return cancelled_.load(); }

 private:
  struct Parser;
  size_t recv_some(Stage stage);  // appends to buf_; 0 at EOF
  std::string describe() const;

  Url url_;
  CallTimeouts timeouts_;
  int fd_ = -1;
  std::mutex fd_mu_;  // cancel() vs the destructor's close
  std::atomic<bool> cancelled_{false};
  std::unique_ptr<Parser> parser_;
  std::string buf_;  // received, not yet parsed
};

// GET `target` with a short timeout: (status, body). UpstreamError on failure.
std::pair<int, std::string> simple_get(const Url& url, const std::string& target, double timeout_s);
// POST a JSON body: (status, body).
std::pair<int, std::string> simple_post(const Url& url, const std::string& target, const std::string& body,
                                        double timeout_s);

}  // namespace deepinfer::router
