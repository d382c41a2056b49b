// What the request handlers share: the engine loop, metrics, the prep workers, the model's
// identity and limits, the chat format. Built once by Server; handlers only read it (the
// members with their own locks aside).
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/engine_loop.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/request.h"
#include "server/server.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::server {

// A fixed pool of threads running posted tasks in order of posting.
class WorkQueue {
 public:
  explicit WorkQueue(int threads);
  ~WorkQueue();  // runs what is queued, then joins
  void post(std::function<void()> task);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

struct ServerState {
  ServeOptions opt;
  ServerMetrics metrics;
  std::unique_ptr<KvTransport> kv;  // disaggregation, null = off; outlives the loop
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<WorkQueue> prep;
  std::string model_name, model_path;
  ChatFormat chat_format = ChatFormat::kV4;
  const Tokenizer* tokenizer = nullptr;  // null for a model without one (the toy codec)
  int64_t vocab_size = 0, max_model_len = 0;
  int64_t created = 0;  // seconds since the epoch, when the server started
  std::atomic<uint64_t> next_id{0};
  RequestContext request;  // what the request parsers need (server/request.h), set with the above

  std::string new_id(const char* prefix);  // "cmpl-<random>-<counter>"
};

// Writes an answer and counts it in the metrics.
void send_json(ServerState& st, Responder& r, const std::string& path, int status, const json& body,
               Headers extra = {});
void send_error(ServerState& st, Responder& r, const std::string& path, const ApiError& e);

// The request handlers (run on a prep worker).
void handle_completions(ServerState& st, const HttpRequest& req, std::shared_ptr<Responder> resp);
void handle_chat(ServerState& st, const HttpRequest& req, std::shared_ptr<Responder> resp);

}  // namespace deepinfer::server
