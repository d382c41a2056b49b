// HTTP/1.1 over Boost.Beast (request parsing, timeouts) and Asio (sockets, strands). Responses
// are formatted here (status line, headers, chunked framing): the only parts of HTTP a JSON /
// SSE server writes, and simpler than Beast's serializers for a body that arrives in pieces
// from another thread.
//
// One Session per connection, all of its state touched on its strand only:
//   read header -> (100-continue) -> read body -> handler(request, Exchange)
//   while the handler's response is pending, an async_wait for readability on the socket
//   notices the client's EOF (a client that left: the Exchange's disconnect callback fires)
//   response bytes are queued and written one batch at a time; when the response has ended
//   and is written, the next request is read (keep-alive) or the connection is closed.
// An Exchange is the handler's side of one request; it may outlive its request (a late call
// from the engine thread), so every call it queues checks that it is still the session's
// current exchange.
#include "server/http.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "core/check.h"
#include "core/logging.h"
#include "deepinfer/error.h"

namespace deepinfer::server {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::string HttpRequest::header(std::string_view name) const {
  auto eq = [](std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
  };
  for (const auto& [k, v] : headers)
    if (eq(k, name)) return v;
  return "";
}

namespace {
const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

// Status line and headers. `length` < 0: chunked (or, for HTTP/1.0, delimited by the close).
std::string response_head(int status, const std::string& content_type, const Headers& extra, int64_t length,
                          bool keep_alive, bool http10) {
  std::string h = (http10 ? "HTTP/1.0 " : "HTTP/1.1 ") + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  h += "Server: deepinfer\r\n";
  if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
  if (length >= 0) h += "Content-Length: " + std::to_string(length) + "\r\n";
  else if (!http10) h += "Transfer-Encoding: chunked\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [k, v] : extra) h += k + ": " + v + "\r\n";
  h += "\r\n";
  return h;
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}
}  // namespace

struct HttpServer::Impl {
  // Declared before the io_context: sessions destroyed with its handlers still count down.
  HttpOptions opt;
  Handler handler;
  ErrorBody error_body;
  std::atomic<int64_t> open{0}, total{0}, mid_response{0};
  std::atomic<bool> stopped{false};
  int bound_port = 0;
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;

  void accept();
};

namespace {
class Session;

class Exchange final : public Responder, public std::enable_shared_from_this<Exchange> {
 public:
  explicit Exchange(std::weak_ptr<Session> s) : session_(std::move(s)) {}
  void send(int status, std::string content_type, std::string body, Headers extra) override;
  void start_stream(int status, std::string content_type, Headers extra) override;
  void write(std::string data) override;
  void end() override;
  void on_disconnect(std::function<void()> f) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!gone_) {
        callback_ = std::move(f);
        return;
      }
    }
    if (f) f();
  }
  bool disconnected() const override { return gone_.load(); }
  // Strand: the client left before the response ended.
  void fire_disconnect() {
    std::function<void()> f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_) return;
      gone_ = true;
      f = std::move(callback_);
    }
    if (f) f();
  }

 private:
  template <class F>
  void post(F&& f);
  std::weak_ptr<Session> session_;
  std::mutex mu_;
  std::function<void()> callback_;
  std::atomic<bool> gone_{false};
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl& srv) : stream_(std::move(socket)), srv_(srv) {}
  ~Session() { srv_.open--; }
  void start() { net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); }); }
  void start_busy() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->reject(503, "the server has too many open connections (" + std::to_string(self->srv_.opt.max_connections) + ")");
    });
  }
  net::any_io_executor executor() { return stream_.get_executor(); }
  const Exchange* current() const { return ex_.get(); }

  // ---- the current exchange's calls (strand) ----
  void send(int status, const std::string& ct, const std::string& body, const Headers& extra) {
    if (answered_) return;
    answered_ = done_ = true;
    queue(response_head(status, ct, extra, int64_t(body.size()), keep_alive_, http10_) + body);
  }
  void start_stream(int status, const std::string& ct, const Headers& extra) {
    if (answered_) return;
    answered_ = streaming_ = true;
    if (http10_) keep_alive_ = false;  // HTTP/1.0 has no chunks: the close ends the body
    queue(response_head(status, ct, extra, -1, keep_alive_, http10_));
  }
  void write_chunk(const std::string& data) {
    if (!streaming_ || done_ || data.empty()) return;
    if (http10_) return queue(data);
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    queue(size + data + "\r\n");
  }
  void end_stream() {
    if (!streaming_ || done_) return;
    done_ = true;
    queue(http10_ ? std::string() : std::string("0\r\n\r\n"));
  }

 private:
  void read_header() {
    parser_.emplace();
    parser_->body_limit(srv_.opt.max_body_bytes);
    parser_->header_limit(std::uint32_t(std::min<size_t>(srv_.opt.max_header_bytes, UINT32_MAX)));
    stream_.expires_after(seconds(srv_.opt.idle_timeout_s));
    http::async_read_header(stream_, buf_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }
  bool read_failed(beast::error_code ec) {
    if (!ec) return false;
    if (ec == http::error::body_limit)
      reject(413, "request body is larger than the server's limit of " + std::to_string(srv_.opt.max_body_bytes) + " bytes");
    else if (ec == http::error::header_limit)
      reject(431, "request headers are larger than the server's limit of " + std::to_string(srv_.opt.max_header_bytes) +
                      " bytes");
    else if (ec.category() == http::make_error_code(http::error::bad_method).category() &&
             ec != http::error::end_of_stream && ec != http::error::partial_message)
      reject(400, "malformed HTTP request: " + ec.message());
    else
      close();  // EOF, reset, timeout, a half-sent request
    return true;
  }
  void on_header(beast::error_code ec) {
    if (read_failed(ec)) return;
    auto& req = parser_->get();
    const auto len = parser_->content_length();
    if (len && *len > srv_.opt.max_body_bytes) return read_failed(http::error::body_limit), void();
    const auto expect = req[http::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      // curl waits a second for this before sending a body over 1 KiB.
      continue_line_ = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(continue_line_), [self = shared_from_this()](beast::error_code e, size_t) {
        if (e) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }
  void read_body() {
    http::async_read(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }
  void on_body(beast::error_code ec) {
    if (read_failed(ec)) return;
    http::request<http::string_body> req = parser_->release();
    HttpRequest r;
    r.method = std::string(req.method_string());
    const std::string target(req.target());
    const size_t q = target.find('?');
    r.path = target.substr(0, q);
    if (q != std::string::npos) r.query = target.substr(q + 1);
    for (const auto& f : req) r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    r.body = std::move(req.body());
    http10_ = req.version() < 11;
    keep_alive_ = req.keep_alive();
    answered_ = done_ = streaming_ = false;
    stream_.expires_never();
    ex_ = std::make_shared<Exchange>(weak_from_this());
    watch();
    std::shared_ptr<Exchange> ex = ex_;
    try {
      srv_.handler(std::move(r), ex);
    } catch (const std::exception& e) {
      DI_WARN("server: handler failed: ", e.what());
      send(500, "application/json", srv_.error_body(500, std::string("internal error: ") + e.what()), {});
    }
  }
  // Notices the client's EOF while the response is pending.
  void watch() {
    if (watching_) return;
    watching_ = true;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      self->watching_ = false;
      // Cancelled when a response ended; a keep-alive request that started since needs a watch.
      if (ec == net::error::operation_aborted && !self->closed_ && self->ex_ && !self->done_) return self->watch();
      if (ec || self->closed_ || !self->ex_ || self->done_) return;
      char c;
      beast::error_code e2;
      self->stream_.socket().non_blocking(true, e2);  // the peek must never wait on an I/O thread
      const size_t n = self->stream_.socket().receive(net::buffer(&c, 1), tcp::socket::message_peek, e2);
      if (e2 == net::error::would_block || e2 == net::error::try_again) return self->watch();  // woken early
      if (e2 || n == 0) self->disconnect();
      // Otherwise the client sent its next request early: it is read after this response.
    });
  }
  void queue(std::string bytes) {
    out_ += bytes;
    if (!writing_) flush();
  }
  void flush() {
    if (closed_) return;
    if (out_.empty()) {
      writing_ = false;
      if (done_) response_done();
      return;
    }
    writing_ = true;
    wbuf_.swap(out_);
    out_.clear();
    stream_.expires_after(seconds(srv_.opt.write_timeout_s));
    net::async_write(stream_, net::buffer(wbuf_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->disconnect();
      self->stream_.expires_never();
      self->wbuf_.clear();
      self->flush();
    });
  }
  void response_done() {
    ex_.reset();
    if (!keep_alive_ || close_after_) return close_gracefully();
    if (watching_) {
      beast::error_code e;
      stream_.socket().cancel(e);  // the watch's handler sees operation_aborted
    }
    read_header();
  }
  // An error response the HTTP layer writes itself; the connection closes after it.
  void reject(int status, const std::string& message) {
    close_after_ = true;
    keep_alive_ = false;
    ex_.reset();
    answered_ = done_ = true;
    const std::string body = srv_.error_body(status, message);
    queue(response_head(status, "application/json", {}, int64_t(body.size()), false, false) + body);
  }
  void disconnect() {
    if (closed_) return;
    if (ex_ && !done_) {
      srv_.mid_response++;
      std::shared_ptr<Exchange> ex = std::move(ex_);
      ex->fire_disconnect();
    }
    close();
  }
  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code e;
    stream_.socket().shutdown(tcp::socket::shutdown_both, e);
    stream_.close();
  }
  // After an error response: stop sending, read what the client still sends (so that closing
  // does not reset the connection before it read the response), then close.
  void close_gracefully() {
    beast::error_code e;
    stream_.socket().shutdown(tcp::socket::shutdown_send, e);
    drain_left_ = size_t(64) << 20;
    drain();
  }
  void drain() {
    drain_buf_.resize(64 << 10);
    stream_.expires_after(std::chrono::seconds(2));
    stream_.async_read_some(net::buffer(drain_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec || n >= self->drain_left_) return self->close();
      self->drain_left_ -= n;
      self->drain();
    });
  }

  beast::tcp_stream stream_;
  HttpServer::Impl& srv_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<Exchange> ex_;  // the request being answered
  std::string out_, wbuf_, continue_line_, drain_buf_;
  size_t drain_left_ = 0;
  bool writing_ = false, watching_ = false, closed_ = false, close_after_ = false;
  bool answered_ = false, done_ = false, streaming_ = false, keep_alive_ = false, http10_ = false;
};

template <class F>
void Exchange::post(F&& f) {
  std::shared_ptr<Session> s = session_.lock();
  if (!s) return;
  // Holding `self` keeps this address from being reused by a later exchange meanwhile.
  net::post(s->executor(), [s, self = shared_from_this(), f = std::forward<F>(f)]() mutable {
    if (s->current() == self.get()) f(*s);  // a late call for an earlier request does nothing
  });
}
void Exchange::send(int status, std::string ct, std::string body, Headers extra) {
  post([=, body = std::move(body)](Session& s) { s.send(status, ct, body, extra); });
}
void Exchange::start_stream(int status, std::string ct, Headers extra) {
  post([=](Session& s) { s.start_stream(status, ct, extra); });
}
void Exchange::write(std::string data) {
  post([data = std::move(data)](Session& s) { s.write_chunk(data); });
}
void Exchange::end() {
  post([](Session& s) { s.end_stream(); });
}
}  // namespace

void HttpServer::Impl::accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (stopped) return;
    if (!ec) {
      const int64_t now_open = ++open;
      total++;
      auto s = std::make_shared<Session>(std::move(socket), *this);
      if (now_open > opt.max_connections) s->start_busy();
      else s->start();
    } else if (ec == net::error::operation_aborted) {
      return;
    }
    accept();
  });
}

HttpServer::HttpServer(HttpOptions options, Handler handler, ErrorBody error_body) : impl_(std::make_shared<Impl>()) {
  impl_->opt = std::move(options);
  impl_->handler = std::move(handler);
  impl_->error_body = std::move(error_body);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& m = *impl_;
  if (m.opt.port < 0 || m.opt.port > 65535) DI_THROW(InvalidArgument, "--port ", m.opt.port, " is outside [0, 65535]");
  if (m.opt.io_threads < 1) DI_THROW(InvalidArgument, "HTTP I/O threads must be >= 1, got ", m.opt.io_threads);
  beast::error_code ec;
  tcp::endpoint ep;
  net::ip::address addr = net::ip::make_address(m.opt.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, std::uint16_t(m.opt.port));
  } else {
    tcp::resolver res(m.ioc);
    auto r = res.resolve(m.opt.host, std::to_string(m.opt.port), ec);
    if (ec || r.empty()) DI_THROW(InvalidArgument, "--host '", m.opt.host, "' does not resolve: ", ec.message());
    ep = r.begin()->endpoint();
  }
  tcp::acceptor a(m.ioc);
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    DI_THROW(InvalidArgument, "cannot listen on ", m.opt.host, ":", m.opt.port, ": ", ec.message());
  m.bound_port = a.local_endpoint().port();
  m.acceptor.emplace(std::move(a));
  m.work.emplace(m.ioc.get_executor());
  m.accept();
  for (int i = 0; i < m.opt.io_threads; ++i) m.threads.emplace_back([&m] { m.ioc.run(); });
}

int HttpServer::port() const { return impl_->bound_port; }

void HttpServer::stop() {
  Impl& m = *impl_;
  if (m.stopped.exchange(true)) return;
  if (m.acceptor) {
    net::post(m.ioc, [&m] {
      beast::error_code e;
      m.acceptor->close(e);
    });
  }
  m.work.reset();
  m.ioc.stop();
  for (std::thread& t : m.threads) t.join();
  m.threads.clear();
}

HttpCounters HttpServer::counters() const {
  return {impl_->open.load(), impl_->total.load(), impl_->mid_response.load()};
}

}  // namespace deepinfer::server
