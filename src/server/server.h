// `deepinfer serve`: an OpenAI-compatible HTTP server over one engine (docs/SERVER.md).
//
//   POST /v1/completions       text completions (prompt: string, strings, token ids), SSE streaming
//   POST /v1/chat/completions  chat (V4 / V4.1 formats), tools (DSML), reasoning_content, SSE streaming
//   GET  /v1/models            the served model
//   GET  /health               200 while the engine loop runs
//   GET  /metrics              Prometheus text (server/metrics.h)
//
// Threads: HTTP I/O threads (never block) -> prep workers (parse, chat template, tokenize,
// compile the grammar, reserve a waiting slot) -> the engine thread (server/engine_loop.h), whose
// outputs are formatted into each request's response.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "deepinfer/llm.h"
#include "server/http.h"
#include "server/kv_transport.h"

namespace deepinfer::engine {
class Engine;
}

namespace deepinfer::server {

struct ServeOptions {
  LLMConfig llm;
  HttpOptions http;
  int64_t max_waiting = 512;       // sequences accepted but not yet running; more get 503
  std::string served_model_name;   // "" = the model folder's name
  std::string chat_format = "auto";  // v4 | v41 | auto (from config.json's architecture)
  int prep_threads = 2;            // tokenization and grammar compilation
  std::string api_key;             // "" = none; else "Authorization: Bearer <key>" is required on /v1
  KvTransportOptions kv;           // prefill/decode disaggregation (role "" = off)
  double kv_wait_s = 10;           // decode side: longest wait for a request's KV transfer
};

struct ServerState;

class Server {
 public:
  // Loads the model (throws what LLM's constructor throws) and starts the engine thread.
  explicit Server(ServeOptions options);
  // Takes an engine built elsewhere (tests: a small cache, a toy model).
  Server(ServeOptions options, std::unique_ptr<engine::Engine> engine, std::string model_path);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();      // binds and serves (HttpServer::start's errors)
  int port() const;  // the bound port
  void stop();       // stops HTTP, aborts what runs, joins every thread. Idempotent.
  const std::string& model_name() const;
  // Engine gauges as of the last step (tests check that aborted requests freed their blocks).
  int64_t kv_blocks_free() const;
  int64_t kv_blocks_total() const;
  int64_t num_unfinished() const;  // sequences running or waiting in the engine

 private:
  void init(ServeOptions options, std::unique_ptr<engine::Engine> engine, std::string model_path);
  std::unique_ptr<ServerState> st_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace deepinfer::server
