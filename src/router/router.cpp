// Router: the front HTTP server (server/http.h, the same layer `serve` uses), the dispatch of
// each path, the router's own /health, /metrics and /router/backends.
#include "router/router.h"

#include <nlohmann/json.hpp>
#include <thread>

#include "core/logging.h"
#include "deepinfer/error.h"
#include "router/state.h"
#include "server/protocol.h"

namespace deepinfer::router {
using nlohmann::json;

bool RequestThreads::spawn(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    active_++;
  }
  std::thread([this, fn = std::move(fn)]() mutable {
    try {
      std::function<void()> f = std::move(fn);  // its captures go before stop() may return
      f();
    } catch (const std::exception& e) {
      DI_WARN("router: request thread failed: ", e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) cv_.notify_all();
  }).detach();
  return true;
}

void RequestThreads::register_call(const std::shared_ptr<UpstreamCall>& c) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.insert(c);
  if (stopping_) c->cancel();
}

void RequestThreads::unregister_call(const std::shared_ptr<UpstreamCall>& c) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(c);
}

void RequestThreads::stop() {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  for (const auto& c : calls_) c->cancel();
  cv_.wait(lock, [&] { return active_ == 0; });
}

namespace {
std::string render_metrics(RouterState& st) {
  std::string out;
  auto line = [&](const std::string& name, const std::string& labels, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + buf + "\n";
  };
  auto help = [&](const char* name, const char* type, const char* text) {
    out += std::string("# HELP ") + name + " " + text + "\n# TYPE " + name + " " + type + "\n";
  };
  const std::vector<BackendStatus> bs = st.pool->status();
  help("deepinfer_router_backend_up", "gauge", "1 while the replica is in the pool");
  for (const auto& b : bs) line("deepinfer_router_backend_up", "backend=\"" + b.url + "\"", b.up);
  help("deepinfer_router_backend_inflight_requests", "gauge", "requests the router has in flight there");
  for (const auto& b : bs) line("deepinfer_router_backend_inflight_requests", "backend=\"" + b.url + "\"", double(b.inflight_requests));
  help("deepinfer_router_backend_load_tokens", "gauge", "the routing rule's load (max of reported and in flight)");
  for (const auto& b : bs) line("deepinfer_router_backend_load_tokens", "backend=\"" + b.url + "\"", double(b.load_tokens()));
  help("deepinfer_router_backend_dispatched_total", "counter", "attempts sent to the replica");
  for (const auto& b : bs) line("deepinfer_router_backend_dispatched_total", "backend=\"" + b.url + "\"", double(b.dispatched));
  help("deepinfer_router_backend_failures_total", "counter", "attempts that failed on the replica");
  for (const auto& b : bs) line("deepinfer_router_backend_failures_total", "backend=\"" + b.url + "\"", double(b.failures));
  std::lock_guard<std::mutex> lock(st.counters.mu);
  help("deepinfer_router_responses_total", "counter", "responses by path and status");
  for (const auto& [k, n] : st.counters.responses)
    line("deepinfer_router_responses_total", "path=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"", double(n));
  help("deepinfer_router_retries_total", "counter", "attempts on another replica after one failed before output");
  line("deepinfer_router_retries_total", "", double(st.counters.retries));
  help("deepinfer_router_stream_failures_total", "counter", "streams cut by a replica failure after output started");
  line("deepinfer_router_stream_failures_total", "", double(st.counters.stream_failures));
  help("deepinfer_router_prefills_total", "counter", "disaggregation: requests prefilled on a prefill server");
  line("deepinfer_router_prefills_total", "", double(st.counters.prefills));
  help("deepinfer_router_prefill_failures_total", "counter", "of those, failed (the decode server computed the prompt)");
  line("deepinfer_router_prefill_failures_total", "", double(st.counters.prefill_failures));
  help("deepinfer_router_affinity_lookups_total", "counter", "requests whose prompt prefix was seen before");
  line("deepinfer_router_affinity_lookups_total", "", double(st.counters.affinity_lookups));
  help("deepinfer_router_affinity_hits_total", "counter", "of those, sent to the replica that had it");
  line("deepinfer_router_affinity_hits_total", "", double(st.counters.affinity_hits));
  help("deepinfer_router_affinity_overrides_total", "counter", "of those, sent elsewhere (overloaded or out)");
  line("deepinfer_router_affinity_overrides_total", "", double(st.counters.affinity_overrides));
  return out;
}

json backends_json(RouterState& st) {
  json arr = json::array();
  for (const BackendStatus& b : st.pool->status())
    arr.push_back({{"url", b.url},
                   {"up", b.up},
                   {"running_seqs", b.reported.running_seqs},
                   {"waiting_seqs", b.reported.waiting_seqs},
                   {"running_tokens", b.reported.running_tokens},
                   {"waiting_tokens", b.reported.waiting_tokens},
                   {"kv_cache_usage", b.reported.kv_usage},
                   {"inflight_requests", b.inflight_requests},
                   {"inflight_tokens", b.inflight_tokens},
                   {"load_tokens", b.load_tokens()},
                   {"dispatched", b.dispatched},
                   {"failures", b.failures},
                   {"last_error", b.last_error}});
  json out = {{"backends", arr}};
  if (st.prefill) {
    json pre = json::array();
    for (const BackendStatus& b : st.prefill->status())
      pre.push_back({{"url", b.url}, {"up", b.up}, {"load_tokens", b.load_tokens()}, {"dispatched", b.dispatched},
                     {"failures", b.failures}, {"last_error", b.last_error}});
    out["prefill"] = pre;
  }
  return out;
}

void route(RouterState& st, server::HttpRequest&& req, std::shared_ptr<server::Responder> resp) {
  const std::string path = req.path;
  const bool get = req.method == "GET" || req.method == "HEAD";
  auto on_thread = [&](void (*fn)(RouterState&, const server::HttpRequest&, std::shared_ptr<server::Responder>)) {
    auto shared = std::make_shared<server::HttpRequest>(std::move(req));
    if (!st.threads.spawn([&st, shared, resp, fn] { fn(st, *shared, resp); }))
      send_router_error(st, *resp, path, 503, "the router is shutting down", "");
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (req.method != "POST") return send_router_error(st, *resp, path, 405, "use POST for " + path, "");
    return on_thread(forward_generation);
  }
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) {
    if (!get) return send_router_error(st, *resp, path, 405, "use GET for " + path, "");
    return on_thread(forward_get);
  }
  if (path == "/health" || path == "/metrics" || path == "/router/backends") {
    if (!get) return send_router_error(st, *resp, path, 405, "use GET for " + path, "");
    st.counters.count(path, 200);
    if (path == "/metrics") return resp->send(200, "text/plain; version=0.0.4", render_metrics(st));
    if (path == "/router/backends") return resp->send(200, "application/json", server::dump(backends_json(st)));
    const int up = st.pool->num_up();
    if (up == 0) return send_router_error(st, *resp, path, 503, "no backend is up", "no_backend");
    return resp->send(200, "application/json", server::dump(json{{"backends_up", up}}));
  }
  send_router_error(st, *resp, "other", 404, "no endpoint " + req.method + " " + path, "");
}
}  // namespace

Router::Router(RouterOptions options) : st_(std::make_unique<RouterState>()) {
  st_->opt = std::move(options);
  std::vector<Url> urls;
  const bool disagg = !st_->opt.prefill.empty() || !st_->opt.decode.empty();
  if (disagg && !st_->opt.backends.empty())
    DI_THROW(InvalidArgument, "give either --backends or --prefill with --decode, not both");
  if (disagg && (st_->opt.prefill.empty() || st_->opt.decode.empty()))
    DI_THROW(InvalidArgument, "disaggregation needs both --prefill and --decode servers");
  for (const std::string& u : disagg ? st_->opt.decode : st_->opt.backends) urls.push_back(parse_url(u));
  if (disagg) {
    std::vector<Url> p;
    for (const std::string& u : st_->opt.prefill) p.push_back(parse_url(u));
    st_->prefill = std::make_unique<BackendPool>(std::move(p), st_->opt.pool);
  }
  if (st_->opt.pool.block_chars < 1)
    DI_THROW(InvalidArgument, "--affinity-block-chars must be >= 1, got ", st_->opt.pool.block_chars);
  if (st_->opt.pool.poll_interval_s <= 0)
    DI_THROW(InvalidArgument, "--health-interval-s must be > 0, got ", st_->opt.pool.poll_interval_s);
  st_->pool = std::make_unique<BackendPool>(std::move(urls), st_->opt.pool);
  RouterState* s = st_.get();
  http_ = std::make_unique<server::HttpServer>(
      st_->opt.http,
      [s](server::HttpRequest&& r, std::shared_ptr<server::Responder> resp) { route(*s, std::move(r), std::move(resp)); },
      [](int status, const std::string& msg) { return server::error_body(status, msg); });
}

Router::~Router() { stop(); }

void Router::start() {
  if (st_->prefill) st_->prefill->start();
  st_->pool->start();
  http_->start();
}

int Router::port() const { return http_->port(); }
BackendPool& Router::pool() { return *st_->pool; }
BackendPool* Router::prefill_pool() { return st_->prefill.get(); }

void Router::stop() {
  if (!st_) return;
  http_->stop();
  st_->threads.stop();
  st_->pool->stop();
  if (st_->prefill) st_->prefill->stop();
}

}  // namespace deepinfer::router
