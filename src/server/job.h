// One HTTP generation request as the engine sees it: one engine request per prompt (each with
// `n` choices), outputs in delta form gathered into one response (choice index = prompt * n +
// sample). The job owns the response's life: headers when every engine request is admitted
// (streaming), a chunk per new piece, usage and [DONE] at the end, or one JSON body; a request
// refused at admission answers 400 (its siblings aborted); a client that leaves aborts them all.
// The endpoint formats choices through the hooks (completions: text; chat: message / delta).
//
// Threads: submit() on a prep worker, everything else on the engine thread; one mutex guards
// the state, since a shutdown rejection may arrive on the submitting thread.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/state.h"

namespace deepinfer::server {

class Job : public std::enable_shared_from_this<Job> {
 public:
  Job(ServerState& st, std::shared_ptr<Responder> resp, std::string path, std::string id, const CommonOptions& common,
      int n);
  virtual ~Job() = default;
  // Reserves the sequences (503 when the waiting queue is full: false), then hands one engine
  // request per prompt to the loop and arranges the abort on disconnect.
  bool submit(std::vector<std::vector<int32_t>> prompts, const SamplingParams& params, double received);
  // Disaggregation (router-internal header "X-Deepinfer-Kv: send=ID;to=PEER" or "recv=ID"):
  // applied to a single-prompt n = 1 request when this server has a KV transport, else ignored.
  void set_kv(const HttpRequest& req);

  void admitted(int k);
  void output(int k, RequestOutput&& o);
  void rejected(int k, const std::string& message, bool internal);

 protected:
  // Hooks, called with the lock held, on the engine thread.
  virtual void on_piece(int choice, const CompletionOutput& c) = 0;  // new text / tokens
  virtual void on_choice_end(int choice, const CompletionOutput& c) = 0;  // after its last piece
  virtual json response_body() = 0;                                    // not streaming: the whole answer
  virtual void on_stream_start() {}
  virtual std::optional<int64_t> reasoning_tokens() const { return std::nullopt; }  // usage detail
  // usage.completion_tokens: every choice's tokens (completions with best_of > n: the returned ones).
  virtual int64_t usage_completion_tokens() const;

  json chunk_base(const char* object) const;  // id, object, created, model
  void emit(const json& chunk);               // one SSE event
  json usage() const;
  bool stream() const { return common_.stream; }
  int n() const { return n_; }
  ServerState& st_;
  std::vector<int64_t> completion_tokens_;  // per choice

 private:
  void fail(int status, const std::string& message, bool internal);
  void finish_all();
  void abort_all();

  std::shared_ptr<Responder> resp_;
  std::string path_, id_;
  CommonOptions common_;
  int n_ = 1;
  std::mutex mu_;
  std::vector<std::string> engine_ids_;
  std::string kv_send_id_, kv_send_to_, kv_recv_id_;
  std::vector<int64_t> prompt_tokens_, cached_tokens_;
  std::vector<bool> done_, choice_done_;
  int admitted_ = 0, finished_ = 0;
  bool started_ = false, failed_ = false, ended_ = false;
};

}  // namespace deepinfer::server
