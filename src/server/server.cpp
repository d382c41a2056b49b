// Server: builds the engine, the loop and the HTTP layer; routes requests. GET endpoints are
// answered on the I/O thread (they only read gauges); generation requests go to a prep worker,
// which parses, tokenizes and compiles, then hands them to the engine loop (server/job.h).
#include "server/server.h"

#include <chrono>
#include <filesystem>
#include <random>

#include "core/check.h"
#include "core/env.h"
#include "core/logging.h"
#include "deepinfer/tokenizer.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "model/registry.h"
#include "server/state.h"

namespace deepinfer::server {

WorkQueue::WorkQueue(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i)
    threads_.emplace_back([this] {
      for (;;) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
          if (tasks_.empty()) return;
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    });
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkQueue::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

std::string ServerState::new_id(const char* prefix) {
  // Random per server start (ids of two runs never collide in logs), then a counter.
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%08llx%llu", prefix, static_cast<unsigned long long>(rng() & 0xFFFFFFFFu),
                static_cast<unsigned long long>(next_id++));
  return buf;
}

void send_json(ServerState& st, Responder& r, const std::string& path, int status, const json& body, Headers extra) {
  st.metrics.count_http(path, status);
  r.send(status, "application/json", dump(body), std::move(extra));
}

void send_error(ServerState& st, Responder& r, const std::string& path, const ApiError& e) {
  st.metrics.count_http(path, e.status);
  Headers extra;
  if (e.status == 503) extra.emplace_back("Retry-After", "1");
  r.send(e.status, "application/json", error_body(e.status, e.what(), e.param, e.code), std::move(extra));
}

namespace {
ChatFormat chat_format_for(const std::string& flag, const std::string& model_path) {
  if (flag == "v4") return ChatFormat::kV4;
  if (flag == "v41" || flag == "v4.1") return ChatFormat::kV41;
  if (flag != "auto") DI_THROW(InvalidArgument, "--chat-format '", flag, "' is not one of: auto, v4, v41");
  std::string arch;
  try {
    if (std::filesystem::exists(model_path + "/config.json")) arch = model::config_architecture(model_path);
  } catch (const Error&) {
  }
  return arch.find("V41") != std::string::npos ? ChatFormat::kV41 : ChatFormat::kV4;
}

// GET /load: what a router balances on (router/pool.h), lighter than /metrics' text. Queued
// requests (accepted, not yet in the engine) count as waiting; their tokens are not known yet.
json load_body(const ServerState& st) {
  const EngineGauges g = st.metrics.gauges();
  return {{"num_requests_running", g.num_running},
          {"num_requests_waiting", g.num_waiting + g.num_queued},
          {"running_tokens", g.running_tokens},
          {"waiting_tokens", g.waiting_tokens},
          {"kv_cache_usage", g.kv_usage},
          {"kv_blocks_free", g.kv_blocks_free},
          {"kv_blocks_total", g.kv_blocks_total}};
}

// GET /load's disaggregation part: this server's role and name, and its transfer counters.
void add_kv_load(const ServerState& st, json& j) {
  if (!st.kv) return;
  const KvCounters c = st.loop->kv_counters();
  j["kv_role"] = st.kv->options().role;
  j["kv_name"] = st.kv->options().name;
  j["kv_peers_connected"] = st.kv->num_connected();
  j["kv_transport"] = kv_transport_name(st.kv->options().transport);
  const KvTransportStats ts = st.kv->stats();
  j["kv_payloads"] = {{"ipc_sent", ts.ipc_sent}, {"host_sent", ts.host_sent}, {"ipc_fallbacks", ts.ipc_fallbacks},
                      {"ipc_received", ts.ipc_received}, {"host_received", ts.host_received}};
  j["kv_transfers"] = {{"sent", c.sent},         {"send_failed", c.send_failed}, {"exported_tokens", c.exported_tokens},
                       {"received", c.received}, {"timed_out", c.timed_out},     {"imported_tokens", c.imported_tokens},
                       {"import_failed", c.import_failed}};
}

json models_body(const ServerState& st) {
  return {{"object", "list"},
          {"data",
           json::array({{{"id", st.model_name},
                         {"object", "model"},
                         {"created", st.created},
                         {"owned_by", "deepinfer"},
                         {"root", st.model_path},
                         {"max_model_len", st.max_model_len}}})}};
}

void route(ServerState& st, HttpRequest&& req, std::shared_ptr<Responder> resp) {
  const std::string path = req.path;
  auto post_only = [&](void (*handler)(ServerState&, const HttpRequest&, std::shared_ptr<Responder>)) {
    if (req.method != "POST") return send_error(st, *resp, path, ApiError(405, "use POST for " + path));
    if (!st.opt.api_key.empty() && req.header("Authorization") != "Bearer " + st.opt.api_key)
      return send_error(st, *resp, path, ApiError(401, "a valid API key is required (Authorization: Bearer ...)", "", "invalid_api_key"));
    auto shared = std::make_shared<HttpRequest>(std::move(req));
    st.prep->post([&st, shared, resp, handler, path] {
      try {
        handler(st, *shared, resp);
      } catch (const ApiError& e) {
        if (e.status == 400) st.metrics.count_rejected("invalid_request");
        send_error(st, *resp, path, e);
      } catch (const InternalError& e) {
        send_error(st, *resp, path, ApiError(500, std::string("internal error: ") + e.what()));
      } catch (const Error& e) {
        st.metrics.count_rejected("invalid_request");
        send_error(st, *resp, path, ApiError(400, e.what()));
      } catch (const std::exception& e) {
        send_error(st, *resp, path, ApiError(500, std::string("internal error: ") + e.what()));
      }
    });
  };
  if (path == "/v1/completions") return post_only(handle_completions);
  if (path == "/v1/chat/completions") return post_only(handle_chat);
  const bool get = req.method == "GET" || req.method == "HEAD";
  if (path == "/health" || path == "/v1/models" || path == "/metrics" || path == "/version" || path == "/load") {
    if (!get) return send_error(st, *resp, path, ApiError(405, "use GET for " + path));
    if (path == "/health") {
      st.metrics.count_http(path, 200);
      return resp->send(200, "application/json", "{}");
    }
    if (path == "/version") return send_json(st, *resp, path, 200, {{"version", "0.1.0"}});
    if (path == "/load") {
      json j = load_body(st);
      add_kv_load(st, j);
      return send_json(st, *resp, path, 200, j);
    }
    if (path == "/v1/models") return send_json(st, *resp, path, 200, models_body(st));
    st.metrics.count_http(path, 200);
    return resp->send(200, "text/plain; version=0.0.4", st.metrics.render(st.model_name));
  }
  if (path.rfind("/v1/models/", 0) == 0) {
    const std::string name = path.substr(11);
    if (name == st.model_name) return send_json(st, *resp, path, 200, models_body(st)["data"][0]);
    return send_error(st, *resp, "/v1/models/*", ApiError(404, "The model '" + name + "' does not exist", "model", "model_not_found"));
  }
  send_error(st, *resp, "other", ApiError(404, "no endpoint " + req.method + " " + path));
}
}  // namespace

Server::Server(ServeOptions options) : st_(std::make_unique<ServerState>()) {
  EnvConfig env = EnvConfig::from_environment();
  LLMConfig cfg = options.llm;
  const std::string path = engine::resolve_model_path(cfg, env);
  cfg.model = path;
  init(std::move(options), engine::build_engine(cfg, env), path);
}

Server::Server(ServeOptions options, std::unique_ptr<engine::Engine> eng, std::string model_path)
    : st_(std::make_unique<ServerState>()) {
  init(std::move(options), std::move(eng), std::move(model_path));
}

void Server::init(ServeOptions options, std::unique_ptr<engine::Engine> eng, std::string model_path) {
  DI_CHECK(eng != nullptr, "Server needs an engine");
  ServerState& st = *st_;
  st.opt = std::move(options);
  st.model_path = model_path;
  st.model_name = st.opt.served_model_name;
  if (st.model_name.empty()) {
    st.model_name = std::filesystem::path(model_path).filename().string();
    if (st.model_name.empty()) st.model_name = model_path;
  }
  st.chat_format = chat_format_for(st.opt.chat_format, model_path);
  st.vocab_size = eng->model().vocab_size();
  st.max_model_len = eng->max_model_len();
  if (eng->codec()) st.tokenizer = eng->codec()->tokenizer();
  RequestContext& rc = st.request;
  rc.vocab_size = st.vocab_size;
  rc.model_name = st.model_name;
  rc.model_path = st.model_path;
  rc.chat_format = st.chat_format;
  rc.tokenizer = st.tokenizer;
  if (const engine::TextCodec* codec = eng->codec()) {  // owned by the engine, which outlives the state's use
    rc.encode = [codec](std::string_view t) { return codec->encode(t); };
    rc.decode = [codec](const std::vector<int32_t>& ids) { return codec->decode(ids, false); };
    rc.chat_prompt = [codec](const std::vector<ChatMessage>& m, const ChatTemplateOptions& o) { return codec->chat_prompt(m, o); };
  }
  st.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (st.opt.max_waiting < 1) DI_THROW(InvalidArgument, "--max-waiting must be >= 1, got ", st.opt.max_waiting);
  if (!st.opt.kv.role.empty()) {
    // The IPC staging is sized for the longest prefix a request can hand over (max_model_len's
    // blocks), so no bundle has to fall back to the host hop for its size.
    KvTransportOptions kv = st.opt.kv;
    model::CausalLM& m = eng->model();
    kv.device = m.paged_block_bytes() > 0 ? m.device_ordinal() : -1;
    const int64_t bt = eng->cache().geometry().block_tokens;
    if (kv.ipc_buffer_bytes == 0 && bt > 0)
      kv.ipc_buffer_bytes = size_t((st.max_model_len + bt - 1) / bt) * m.paged_block_bytes();
    st.kv = std::make_unique<KvTransport>(std::move(kv));
  }
  st.loop = std::make_unique<EngineLoop>(std::move(eng), EngineLoopOptions{st.opt.max_waiting, st.kv.get(), st.opt.kv_wait_s},
                                         st.metrics);
  st.prep = std::make_unique<WorkQueue>(st.opt.prep_threads);
  ServerState* s = st_.get();
  http_ = std::make_unique<HttpServer>(
      st.opt.http, [s](HttpRequest&& r, std::shared_ptr<Responder> resp) { route(*s, std::move(r), std::move(resp)); },
      [](int status, const std::string& msg) { return error_body(status, msg); });
}

Server::~Server() { stop(); }

void Server::start() { http_->start(); }
int Server::port() const { return http_->port(); }
const std::string& Server::model_name() const { return st_->model_name; }

void Server::stop() {
  if (!st_) return;
  if (http_) http_->stop();  // no new requests; responses in flight are dropped
  if (st_->prep) st_->prep.reset();
  if (st_->loop) st_->loop->stop();
  if (st_->kv) st_->kv->stop();
}

int64_t Server::kv_blocks_free() const { return st_->metrics.gauges().kv_blocks_free; }
int64_t Server::kv_blocks_total() const { return st_->metrics.gauges().kv_blocks_total; }
int64_t Server::num_unfinished() const {
  const EngineGauges g = st_->metrics.gauges();
  return g.num_running + g.num_waiting + g.num_queued;
}

}  // namespace deepinfer::server
