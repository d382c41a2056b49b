// Forwarding one request to the replicas, with the retry rule of router.h: an attempt either
// answers the client (kDone) or fails before anything reached the client (kRetry), and only
// the latter may go to another replica.
#include <nlohmann/json.hpp>
#include <random>

#include "core/logging.h"
#include "router/state.h"
#include "server/protocol.h"

namespace deepinfer::router {
using nlohmann::json;

namespace {
// What the router reads of a request body: streaming or not, the text its prefix affinity
// hashes, and its size estimate for the load.
struct RequestInfo {
  bool stream = false;
  std::string affinity_text;
  int64_t est_tokens = 0;
  std::string prefill_body;  // disaggregation: the body a prefill server gets; "" = not eligible
};

// The request as a prefill server runs it: one token, not streamed (its answer is discarded;
// the decode server samples the first token itself). Only single-prompt, n = 1 requests.
std::string prefill_body(json j) {
  if (j.contains("n") && j["n"] != 1) return "";
  if (j.contains("prompt")) {
    const json& p = j["prompt"];
    const bool single = p.is_string() || (p.is_array() && !p.empty() && p[0].is_number()) ||
                        (p.is_array() && p.size() == 1);
    if (!single) return "";
  }
  for (const char* k : {"stream", "stream_options", "max_completion_tokens", "min_tokens"}) j.erase(k);
  j["max_tokens"] = 1;
  return j.dump();
}

std::string content_text(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array())
    for (const json& part : content)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
  return out;
}

RequestInfo inspect(const std::string& body, int64_t default_max_tokens) {
  RequestInfo info;
  const json j = json::parse(body, nullptr, false);
  if (!j.is_object()) return info;  // the replica answers it with its 400
  info.stream = j.value("stream", false) == true;
  int64_t prompt_tokens = 0;
  if (j.contains("messages") && j["messages"].is_array()) {
    // The conversation as the template will see it: roles and contents, in order.
    for (const json& m : j["messages"]) {
      if (!m.is_object()) continue;
      info.affinity_text += m.value("role", std::string()) + "\n";
      if (m.contains("content")) info.affinity_text += content_text(m["content"]) + "\n";
    }
    prompt_tokens = int64_t(info.affinity_text.size() / 4);  // ~4 characters a token
  } else if (j.contains("prompt")) {
    const json& p = j["prompt"];
    const json& first = p.is_array() && !p.empty() && !p[0].is_number() ? p[0] : p;
    if (first.is_string()) {
      info.affinity_text = first.get<std::string>();
      prompt_tokens = int64_t(info.affinity_text.size() / 4);
    } else if (first.is_array()) {
      // Token ids: hashed as their decimal text, so the same ids match whatever block boundary.
      for (const json& t : first) info.affinity_text += t.dump() + ",";
      prompt_tokens = int64_t(first.size());
    }
  }
  int64_t max_tokens = default_max_tokens;
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (j.contains(k) && j[k].is_number_integer()) max_tokens = j[k].get<int64_t>();
  const int64_t n = j.contains("n") && j["n"].is_number_integer() ? std::max<int64_t>(1, j["n"].get<int64_t>()) : 1;
  info.est_tokens = n * (prompt_tokens + std::max<int64_t>(0, max_tokens));
  info.prefill_body = prefill_body(j);
  return info;
}

server::Headers forwarded_headers(const server::HttpRequest& req, const server::Headers& extra = {}) {
  server::Headers h = extra;
  for (const char* k : {"Content-Type", "Authorization", "Accept", "X-Request-Id"}) {
    const std::string v = req.header(k);
    if (!v.empty()) h.emplace_back(k, v);
  }
  return h;
}

enum class Outcome { kDone, kRetry };

struct Attempt {
  RouterState& st;
  const server::HttpRequest& req;
  std::shared_ptr<server::Responder> resp;
  const RequestInfo& info;
  int backend;
  server::Headers extra_headers;  // to the replica (the KV transfer id)
  std::string error;  // why it failed (kRetry, or a stream cut after output)
  bool replica_lost = false;

  server::Headers reply_headers(const UpstreamCall& c) const {
    server::Headers h{{"X-Deepinfer-Backend", st.pool->url(backend).text}};
    const std::string ra = c.header("Retry-After");
    if (!ra.empty()) h.emplace_back("Retry-After", ra);
    return h;
  }

  // A stream: events forwarded whole (an error event can then always be appended cleanly).
  Outcome stream(UpstreamCall& c, int status) {
    bool started = false;
    std::string pending;
    auto forward_events = [&](std::string_view data) {
      pending.append(data);
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        if (!started) {
          resp->start_stream(status, c.header("Content-Type"), reply_headers(c));
          started = true;
        }
        resp->write(pending.substr(0, end + 2));
        pending.erase(0, end + 2);
      }
    };
    try {
      c.read_body(forward_events);
    } catch (const UpstreamError& e) {
      error = e.what();
      replica_lost = !c.cancelled();
      if (!started) return Outcome::kRetry;
      std::lock_guard<std::mutex> lock(st.counters.mu);
      st.counters.stream_failures++;
    }
    if (!started) resp->start_stream(status, c.header("Content-Type"), reply_headers(c));
    if (!pending.empty() && error.empty()) resp->write(pending);  // a cut event is dropped, not mangled
    if (!error.empty()) {
      const std::string msg = "the replica serving this request (" + st.pool->url(backend).text +
                              ") failed after the stream started; the output above is incomplete: " + error;
      resp->write("data: " + server::error_body(502, msg, "", "replica_failed") + "\n\n");
    }
    resp->end();
    st.counters.count(req.path, error.empty() ? status : 502);
    return Outcome::kDone;
  }

  Outcome run() {
    std::shared_ptr<UpstreamCall> c;
    try {
      c = std::make_shared<UpstreamCall>(st.pool->url(backend), req.method, req.path, req.body,
                                         forwarded_headers(req, extra_headers), st.opt.timeouts);
    } catch (const UpstreamError& e) {
      error = e.what();
      replica_lost = true;
      return Outcome::kRetry;
    }
    st.threads.register_call(c);
    resp->on_disconnect([c] { c->cancel(); });
    Outcome o = Outcome::kRetry;
    try {
      o = exchange(*c);
    } catch (const UpstreamError& e) {
      error = e.what();
      replica_lost = !c->cancelled();
      o = Outcome::kRetry;
    }
    resp->on_disconnect(nullptr);
    st.threads.unregister_call(c);
    if (resp->disconnected()) return Outcome::kDone;  // the client left: nobody to answer
    return o;
  }

  Outcome exchange(UpstreamCall& c) {
    const int status = c.read_head();
    const std::string ct = c.header("Content-Type");
    if (status == 503) {
      error = st.pool->url(backend).text + " answered 503: " + c.read_all();
      return Outcome::kRetry;
    }
    if (info.stream && status == 200 && ct.find("text/event-stream") != std::string::npos) return stream(c, status);
    std::string body = c.read_all();  // a cut body throws: nothing was sent, so it is retried
    resp->send(status, ct, std::move(body), reply_headers(c));
    st.counters.count(req.path, status);
    return Outcome::kDone;
  }
};
}  // namespace

void send_router_error(RouterState& st, server::Responder& r, const std::string& path, int status,
                       const std::string& message, const std::string& code) {
  st.counters.count(path, status);
  server::Headers extra;
  if (status == 503) extra.emplace_back("Retry-After", "1");
  r.send(status, "application/json", server::error_body(status, message, "", code), std::move(extra));
}

std::string new_transfer_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "t%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xFFFFFFFFu));
  return buf;
}

// Disaggregation: runs the prompt on a prefill server, which hands its KV state to decode server
// `decode` (by its transport name). Returns the header the decode call carries, or none when no
// prefill server managed it (the decode server then computes the prompt itself: slower, same
// output).
server::Headers prefill_on_the_way(RouterState& st, const server::HttpRequest& req, const RequestInfo& info,
                                   const std::vector<uint64_t>& hashes, int decode) {
  const std::string peer = st.pool->status()[size_t(decode)].reported.kv_name;
  if (!st.prefill || info.prefill_body.empty() || peer.empty()) return {};
  std::vector<bool> tried(size_t(st.prefill->size()), false);
  for (int attempt = 0; attempt < st.prefill->size(); ++attempt) {
    const std::optional<Choice> choice = st.prefill->choose(hashes, tried);
    if (!choice) break;
    const int p = choice->backend;
    tried[size_t(p)] = true;
    const std::string id = new_transfer_id();
    st.prefill->begin(p, hashes, info.est_tokens);
    std::string error;
    try {
      UpstreamCall c(st.prefill->url(p), "POST", req.path, info.prefill_body,
                     forwarded_headers(req, {{"X-Deepinfer-Kv", "send=" + id + ";to=" + peer}}), st.opt.timeouts);
      const int status = c.read_head();
      const std::string body = c.read_all();
      if (status != 200) error = st.prefill->url(p).text + " answered " + std::to_string(status) + ": " + body;
    } catch (const UpstreamError& e) {
      error = e.what();
      if (e.stage == Stage::kConnect || e.stage == Stage::kHead) st.prefill->mark_down(p, error);
    }
    st.prefill->end(p, info.est_tokens, !error.empty(), error);
    std::lock_guard<std::mutex> lock(st.counters.mu);
    st.counters.prefills++;
    if (error.empty()) return {{"X-Deepinfer-Kv", "recv=" + id}};
    st.counters.prefill_failures++;
    DI_WARN("router: prefill on ", st.prefill->url(p).text, " failed: ", error);
  }
  return {};
}

void forward_generation(RouterState& st, const server::HttpRequest& req, std::shared_ptr<server::Responder> resp) {
  const RequestInfo info = inspect(req.body, st.opt.default_max_tokens);
  const std::vector<uint64_t> hashes = prefix_hashes(info.affinity_text, st.opt.pool.block_chars);
  std::vector<bool> tried(size_t(st.pool->size()), false);
  std::string errors;
  for (int attempt = 0; attempt < st.pool->size(); ++attempt) {
    const std::optional<Choice> choice = st.pool->choose(hashes, tried);
    if (!choice) break;
    {
      std::lock_guard<std::mutex> lock(st.counters.mu);
      if (attempt > 0) st.counters.retries++;
      if (attempt == 0 && choice->matched_blocks > 0) st.counters.affinity_lookups++;
      if (attempt == 0 && choice->affinity_hit && choice->matched_blocks > 0) st.counters.affinity_hits++;
      if (attempt == 0 && choice->affinity_override) st.counters.affinity_overrides++;
    }
    const int b = choice->backend;
    tried[size_t(b)] = true;
    st.pool->begin(b, hashes, info.est_tokens);
    // The transfer goes to the first decode server chosen; a retry elsewhere computes the prompt.
    Attempt a{st, req, resp, info, b, attempt == 0 ? prefill_on_the_way(st, req, info, hashes, b) : server::Headers{}, "",
              false};
    const Outcome o = a.run();
    st.pool->end(b, info.est_tokens, !a.error.empty(), a.error);
    if (a.replica_lost) st.pool->mark_down(b, a.error);
    if (o == Outcome::kDone) return;
    DI_WARN("router: ", req.path, " on ", st.pool->url(b).text, " failed before any output, retrying elsewhere: ", a.error);
    errors += (errors.empty() ? "" : "; ") + a.error;
  }
  if (errors.empty())
    return send_router_error(st, *resp, req.path, 503, "no replica is available (every backend is out of the pool)",
                             "no_backend");
  send_router_error(st, *resp, req.path, 502, "every replica tried failed before answering: " + errors,
                    "replica_failed");
}

void forward_get(RouterState& st, const server::HttpRequest& req, std::shared_ptr<server::Responder> resp) {
  std::vector<bool> tried(size_t(st.pool->size()), false);
  for (int attempt = 0; attempt < st.pool->size(); ++attempt) {
    const std::optional<Choice> choice = st.pool->choose({}, tried);
    if (!choice) break;
    tried[size_t(choice->backend)] = true;
    try {
      auto [status, body] = simple_get(st.pool->url(choice->backend), req.path, st.opt.timeouts.connect_s + 5);
      st.counters.count(req.path, status);
      return resp->send(status, "application/json", std::move(body),
                        {{"X-Deepinfer-Backend", st.pool->url(choice->backend).text}});
    } catch (const UpstreamError& e) {
      if (e.stage == Stage::kConnect) st.pool->mark_down(choice->backend, e.what());
    }
  }
  send_router_error(st, *resp, req.path, 503, "no replica is available to answer " + req.path, "no_backend");
}

}  // namespace deepinfer::router
