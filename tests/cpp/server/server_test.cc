// The server end to end over loopback, on the builtin toy model: endpoints, streaming equal to
// the whole answer, errors with OpenAI bodies (and the server still serving), limits (413, 503),
// and a client that leaves mid-stream: its request aborted and its KV blocks freed.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/server.h"

namespace deepinfer::server {
namespace {
using nlohmann::json;

struct Reply {
  int status = 0;
  std::string head, body;
};

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += size_t(n);
  }
}

std::string request(const std::string& method, const std::string& path, const std::string& body) {
  return method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Decodes a chunked body.
std::string unchunk(const std::string& b) {
  std::string out;
  size_t p = 0;
  while (p < b.size()) {
    const size_t e = b.find("\r\n", p);
    if (e == std::string::npos) break;
    const size_t n = std::stoul(b.substr(p, e - p), nullptr, 16);
    if (n == 0) break;
    out += b.substr(e + 2, n);
    p = e + 2 + n + 2;
  }
  return out;
}

Reply call(int port, const std::string& method, const std::string& path, const std::string& body = "") {
  const int fd = connect_to(port);
  send_all(fd, request(method, path, body));
  std::string all;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) all.append(buf, size_t(n));
  ::close(fd);
  Reply r;
  const size_t h = all.find("\r\n\r\n");
  if (h == std::string::npos) return r;
  r.head = all.substr(0, h);
  r.body = all.substr(h + 4);
  r.status = std::stoi(all.substr(9, 3));
  if (r.head.find("Transfer-Encoding: chunked") != std::string::npos) r.body = unchunk(r.body);
  return r;
}

ServeOptions toy_options() {
  ServeOptions o;
  o.llm.model = "builtin:toy";
  o.llm.max_num_seqs = 4;
  o.llm.max_model_len = 4096;
  o.http.port = 0;
  o.http.max_body_bytes = 1 << 16;
  o.served_model_name = "toy";
  return o;
}

void expect_error(const Reply& r, int status, const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << r.body;
  }
}

// A counter of GET /metrics (summed over its label sets), -1 when absent.
double metric(int port, const std::string& name) {
  const std::string body = call(port, "GET", "/metrics").body;
  double sum = -1;
  for (size_t p = 0; (p = body.find("\n" + name, p)) != std::string::npos; ++p) {
    const size_t e = body.find('\n', p + 1);
    const std::string line = body.substr(p + 1, e - p - 1);
    sum = std::max(sum, 0.0) + std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// Waits until `finished` requests have ended and the engine holds nothing (every KV block free).
bool wait_idle(const Server& s, int port, double finished) {
  for (int i = 0; i < 1000; ++i) {
    if (metric(port, "deepinfer_request_success_total") >= finished && s.num_unfinished() == 0 &&
        s.kv_blocks_free() == s.kv_blocks_total() && s.kv_blocks_total() > 0)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(Server, EndpointsAndStreamingEqualsWhole) {
  Server s(toy_options());
  s.start();
  const int port = s.port();
  EXPECT_EQ(call(port, "GET", "/health").status, 200);
  const Reply models = call(port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "toy");
  const std::string req = R"({"model": "toy", "prompt": "Hello", "max_tokens": 24, "temperature": 0, "ignore_eos": true)";
  const Reply whole = call(port, "POST", "/v1/completions", req + "}");
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json w = json::parse(whole.body);
  const std::string text = w["choices"][0]["text"];
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(w["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(w["usage"]["completion_tokens"], 24);
  EXPECT_GT(w["usage"]["prompt_tokens"].get<int>(), 0);
  const Reply st = call(port, "POST", "/v1/completions", req + R"(, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(st.status, 200) << st.body;
  EXPECT_NE(st.head.find("text/event-stream"), std::string::npos);
  std::string joined, finish;
  bool done = false, usage = false;
  for (size_t p = 0; (p = st.body.find("data: ", p)) != std::string::npos;) {
    const size_t e = st.body.find("\n\n", p);
    const std::string ev = st.body.substr(p + 6, e - p - 6);
    p = e;
    if (ev == "[DONE]") {
      done = true;
      continue;
    }
    const json c = json::parse(ev);
    if (c.contains("usage") && c["choices"].empty()) {
      usage = true;
      EXPECT_EQ(c["usage"]["completion_tokens"], 24);
      continue;
    }
    joined += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_TRUE(usage);
  EXPECT_EQ(joined, text);
  EXPECT_EQ(finish, "length");
  // Chat on the toy model (its codec has no tools; the plain V4 prompt).
  const Reply chat = call(port, "POST", "/v1/chat/completions",
                          R"({"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(json::parse(chat.body)["choices"][0]["message"]["role"], "assistant");
  const Reply metrics = call(port, "GET", "/metrics");
  EXPECT_NE(metrics.body.find("deepinfer_time_to_first_token_seconds_count"), std::string::npos);
  EXPECT_TRUE(wait_idle(s, port, 3));
}

TEST(Server, BadRequestsFailAloneWithOpenAiErrors) {
  Server s(toy_options());
  s.start();
  const int port = s.port();
  expect_error(call(port, "POST", "/v1/completions", "{not json"), 400);
  expect_error(call(port, "POST", "/v1/completions", "[1, 2]"), 400);
  expect_error(call(port, "POST", "/v1/completions", R"({"prompt": "a", "temperature": "hot"})"), 400, "temperature");
  expect_error(call(port, "POST", "/v1/completions", R"({"prompt": "a", "bogus_field": 1})"), 400, "bogus_field");
  expect_error(call(port, "POST", "/v1/completions", R"({"max_tokens": 3})"), 400, "prompt");
  expect_error(call(port, "POST", "/v1/completions", R"({"prompt": "a", "model": "nope"})"), 404, "model");
  expect_error(call(port, "POST", "/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})"), 400,
               "messages[0].role");
  expect_error(call(port, "POST", "/v1/chat/completions", R"({"messages": []})"), 400, "messages");
  expect_error(call(port, "POST", "/v1/completions", R"({"prompt": "a", "so_args": {"regex": "("}})"), 400);
  expect_error(call(port, "GET", "/v1/completions"), 405);
  expect_error(call(port, "GET", "/nowhere"), 404);
  expect_error(call(port, "POST", "/v1/completions", "{\"prompt\": \"" + std::string(70000, 'a') + "\"}"), 413);
  // A prompt longer than the model allows fails at admission, alone.
  expect_error(call(port, "POST", "/v1/completions", "{\"prompt\": \"" + std::string(5000, 'b') + "\"}"), 400);
  const Reply ok = call(port, "POST", "/v1/completions", R"({"prompt": "still serving", "max_tokens": 3})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_TRUE(wait_idle(s, port, 1));
}

TEST(Server, StructuredOutputThroughSoArgs) {
  Server s(toy_options());
  s.start();
  const Reply r = call(s.port(), "POST", "/v1/completions",
                       R"({"prompt": "x", "max_tokens": 20, "so_args": {"regex": "[0-9]{3}-[a-c]{2}"}})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string text = json::parse(r.body)["choices"][0]["text"];
  ASSERT_EQ(text.size(), 6u) << text;
  EXPECT_TRUE(std::isdigit(text[0]) && text[3] == '-' && text[4] >= 'a' && text[4] <= 'c') << text;
}

TEST(Server, DisconnectMidStreamAbortsAndFreesTheCache) {
  Server s(toy_options());
  s.start();
  const int port = s.port();
  const int fd = connect_to(port);
  send_all(fd, request("POST", "/v1/completions",
                       R"({"prompt": "long", "max_tokens": 2000, "ignore_eos": true, "stream": true})"));
  char buf[4096];
  std::string got;
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, size_t(n));
  }
  ::close(fd);
  EXPECT_TRUE(wait_idle(s, port, 1)) << "running+waiting " << s.num_unfinished() << ", free blocks " << s.kv_blocks_free()
                                     << "/" << s.kv_blocks_total();
  EXPECT_EQ(metric(port, "deepinfer_request_finish_total{model_name=\"toy\",finished_reason=\"abort\"}"), 1);
  EXPECT_EQ(metric(port, "deepinfer_request_finish_total{model_name=\"toy\",finished_reason=\"length\"}"), -1);
  EXPECT_EQ(call(port, "POST", "/v1/completions", R"({"prompt": "after", "max_tokens": 2})").status, 200);
}

TEST(Server, DisconnectOnAKeepAliveConnectionsSecondRequest) {
  Server s(toy_options());
  s.start();
  const int port = s.port();
  const int fd = connect_to(port);
  auto keep_alive = [](const std::string& body) {
    return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const std::string first = R"({"prompt": "a", "max_tokens": 2})";
  send_all(fd, keep_alive(first));
  char buf[4096];
  std::string got;
  while (got.find("\"usage\"") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, size_t(n));
  }
  // The same connection's next request waits for its answer (not streamed); the client leaves.
  send_all(fd, keep_alive(R"({"prompt": "b", "max_tokens": 2040, "ignore_eos": true})"));
  ::close(fd);
  EXPECT_TRUE(wait_idle(s, port, 2));
  EXPECT_EQ(metric(port, "deepinfer_request_finish_total{model_name=\"toy\",finished_reason=\"abort\"}"), 1);
}

TEST(Server, FullQueueAnswers503) {
  ServeOptions o = toy_options();
  o.max_waiting = 2;
  Server s(o);
  s.start();
  // Three sequences cannot wait where two may.
  const Reply r = call(s.port(), "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 2, "n": 3})");
  expect_error(r, 503);
  EXPECT_NE(r.head.find("Retry-After: 1"), std::string::npos) << r.head;
  EXPECT_NE(r.body.find("queue_full"), std::string::npos) << r.body;
  EXPECT_EQ(call(s.port(), "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 2, "n": 2})").status, 200);
  EXPECT_EQ(metric(s.port(), "deepinfer_request_rejected_total{model_name=\"toy\",reason=\"queue_full\"}"), 1);
}

}  // namespace
}  // namespace deepinfer::server
