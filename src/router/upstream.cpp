#include "router/upstream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>

#include "deepinfer/error.h"
#include "core/check.h"

namespace deepinfer::router {
namespace http = boost::beast::http;
namespace net = boost::asio;

Url parse_url(const std::string& url) {
  std::string s = url;
  if (s.rfind("http://", 0) == 0) s = s.substr(7);
  else if (s.find("://") != std::string::npos)
    DI_THROW(InvalidArgument, "backend URL '", url, "': only http:// is supported");
  while (!s.empty() && s.back() == '/') s.pop_back();
  const size_t colon = s.rfind(':');
  if (s.empty() || s.find('/') != std::string::npos || colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    DI_THROW(InvalidArgument, "backend URL '", url, "' is not http://HOST:PORT");
  Url u;
  u.host = s.substr(0, colon);
  const std::string port = s.substr(colon + 1);
  if (!std::all_of(port.begin(), port.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) ||
      port.size() > 5 || std::stoi(port) < 1 || std::stoi(port) > 65535)
    DI_THROW(InvalidArgument, "backend URL '", url, "': port '", port, "' is not in [1, 65535]");
  u.port = std::stoi(port);
  u.text = "http://" + u.host + ":" + port;
  return u;
}

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::kConnect: return "connect";
    case Stage::kSend: return "send";
    case Stage::kHead: return "response head";
    case Stage::kBody: return "response body";
  }
  return "?";
}

struct UpstreamCall::Parser {
  http::response_parser<http::string_body> p;
  std::function<void(std::string_view)>* sink = nullptr;  // set while read_body runs
  // Beast keeps a reference to the chunk callback: it lives here, beside the parser.
  std::function<std::size_t(std::uint64_t, boost::beast::string_view, boost::beast::error_code&)> on_chunk;
};

namespace {
int wait_fd(int fd, short events, double timeout_s) {
  pollfd p{fd, events, 0};
  const int ms = timeout_s <= 0 ? 0 : int(std::min(timeout_s * 1000.0, 2e9));
  for (;;) {
    const int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    return r;  // 0: timeout
  }
}

int connect_to(const Url& url, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int g = ::getaddrinfo(url.host.c_str(), std::to_string(url.port).c_str(), &hints, &res);
  if (g != 0) throw UpstreamError(Stage::kConnect, url.text + ": cannot resolve host: " + gai_strerror(g));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int flags = ::fcntl(fd, F_GETFL, 0);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_fd(fd, POLLOUT, timeout_s) <= 0) {
        why = "connect timed out";
        ::close(fd);
        fd = -1;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
      continue;
    }
    ::fcntl(fd, F_SETFL, flags);  // blocking again; reads wait in poll() first
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ::freeaddrinfo(res);
  if (fd < 0) throw UpstreamError(Stage::kConnect, url.text + ": " + why);
  return fd;
}
}  // namespace

UpstreamCall::UpstreamCall(const Url& url, const std::string& method, const std::string& target,
                           const std::string& body, const Headers& headers, CallTimeouts timeouts)
    : url_(url), timeouts_(timeouts), parser_(std::make_unique<Parser>()) {
  parser_->p.body_limit(std::numeric_limits<std::uint64_t>::max());
  parser_->p.header_limit(1 << 20);
  parser_->on_chunk = [this](std::uint64_t, boost::beast::string_view data, boost::beast::error_code&) {
    if (parser_->sink) (*parser_->sink)(std::string_view(data.data(), data.size()));
    return data.size();
  };
  parser_->p.on_chunk_body(parser_->on_chunk);
  fd_ = connect_to(url_, timeouts_.connect_s);
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: " + url_.host + ":" + std::to_string(url_.port) +
                    "\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
  req += "\r\n";
  req += body;
  size_t off = 0;
  while (off < req.size()) {
    if (cancelled_) throw UpstreamError(Stage::kSend, describe() + ": cancelled");
    const ssize_t n = ::send(fd_, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw UpstreamError(Stage::kSend, describe() + ": send failed: " + std::strerror(errno));
    off += size_t(n);
  }
}

UpstreamCall::~UpstreamCall() {
  std::lock_guard<std::mutex> lock(fd_mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void UpstreamCall::cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> lock(fd_mu_);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

std::string UpstreamCall::describe() const { return url_.text; }

size_t UpstreamCall::recv_some(Stage stage) {
  char buf[1 << 16];
  for (;;) {
    if (cancelled_) throw UpstreamError(stage, describe() + ": cancelled");
    const int w = wait_fd(fd_, POLLIN, timeouts_.read_s);
    if (w == 0) throw UpstreamError(stage, describe() + ": no data for " + std::to_string(timeouts_.read_s) + " s");
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (cancelled_) throw UpstreamError(stage, describe() + ": cancelled");
    if (n < 0) throw UpstreamError(stage, describe() + ": " + std::strerror(errno));
    buf_.append(buf, size_t(n));
    return size_t(n);
  }
}

int UpstreamCall::read_head() {
  auto& p = parser_->p;
  while (!p.is_header_done()) {
    if (buf_.empty() && recv_some(Stage::kHead) == 0)
      throw UpstreamError(Stage::kHead, describe() + ": connection closed before the response head");
    boost::beast::error_code ec;
    const size_t used = p.put(net::buffer(buf_.data(), buf_.size()), ec);
    buf_.erase(0, used);
    if (ec == http::error::need_more) {
      if (recv_some(Stage::kHead) == 0)
        throw UpstreamError(Stage::kHead, describe() + ": connection closed before the response head");
      continue;
    }
    if (ec) throw UpstreamError(Stage::kHead, describe() + ": malformed response: " + ec.message());
  }
  return int(p.get().result_int());
}

std::string UpstreamCall::header(std::string_view name) const {
  const auto& h = parser_->p.get();
  auto it = h.find(boost::beast::string_view(name.data(), name.size()));
  return it == h.end() ? std::string() : std::string(it->value());
}

void UpstreamCall::read_body(const std::function<void(std::string_view)>& on_data) {
  auto& p = parser_->p;
  p.eager(true);  // off while reading the head: body bytes then would reach no sink
  std::function<void(std::string_view)> sink = on_data;
  parser_->sink = &sink;
  auto flush_plain = [&] {  // a body with Content-Length lands in the string body
    std::string& b = p.get().body();
    if (!b.empty()) {
      on_data(b);
      b.clear();
    }
  };
  try {
    while (!p.is_done()) {
      boost::beast::error_code ec;
      if (!buf_.empty()) {
        const size_t used = p.put(net::buffer(buf_.data(), buf_.size()), ec);
        buf_.erase(0, used);
        flush_plain();
        if (ec && ec != http::error::need_more)
          throw UpstreamError(Stage::kBody, describe() + ": malformed response body: " + ec.message());
        if (p.is_done()) break;
        if (!ec && used > 0) continue;
      }
      if (recv_some(Stage::kBody) == 0) {
        p.put_eof(ec);
        flush_plain();
        if (ec) throw UpstreamError(Stage::kBody, describe() + ": connection closed before the response ended");
        break;
      }
    }
  } catch (...) {
    parser_->sink = nullptr;
    throw;
  }
  parser_->sink = nullptr;
}

std::string UpstreamCall::read_all() {
  std::string out;
  read_body([&](std::string_view d) { out.append(d); });
  return out;
}

std::pair<int, std::string> simple_get(const Url& url, const std::string& target, double timeout_s) {
  UpstreamCall c(url, "GET", target, "", {}, {timeout_s, timeout_s});
  const int status = c.read_head();
  return {status, c.read_all()};
}

std::pair<int, std::string> simple_post(const Url& url, const std::string& target, const std::string& body,
                                        double timeout_s) {
  UpstreamCall c(url, "POST", target, body, {{"Content-Type", "application/json"}}, {timeout_s, timeout_s});
  const int status = c.read_head();
  return {status, c.read_all()};
}

}  // namespace deepinfer::router
