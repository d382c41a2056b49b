// The serving engine loop: one thread owns the Engine and steps it while requests come and go.
//
//   HTTP / prep threads ──submit(Submission)──► inbox ─┐
//                       ──abort(id)─────────────► aborts ├─► engine thread: add_request / abort /
//                                                        │   step, outputs routed by request id
//   OutputSink::on_output ◄──────────────────────────────┘   to each request's sink
//
// Admission is bounded: try_reserve() counts a request's sequences against max_waiting (the
// sequences accepted but not yet running: reserved, queued, or waiting in the scheduler); over
// the bound it fails and the caller answers 503. Tokenization and grammar compilation happen
// before submit (on other threads), so the engine thread only validates and queues.
// Cancellation: abort(id) ends the request in the engine (its cache released by the scheduler)
// and the sink gets the final output with finish_reason "abort".
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "deepinfer/llm.h"
#include "server/metrics.h"

namespace deepinfer::engine {
class Engine;
}

namespace deepinfer::server {

// Receives one request's outputs on the engine thread. Must not block: hand them on.
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // Every output of the request; the last has finished = true (error set when it failed).
  virtual void on_output(RequestOutput&& out) = 0;
  // add_request refused it (bad prompt or parameters: `message` says which); no output follows.
  virtual void on_rejected(const std::string& message, bool internal) = 0;
  // add_request accepted it (outputs follow): a streaming response starts its headers here.
  virtual void on_admitted() {}
};

struct Submission {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  std::shared_ptr<OutputSink> sink;
  double received_time = 0;  // seconds since the epoch, when the HTTP request arrived
  int64_t reserved = 0;      // sequences reserved with try_reserve (released at admission)
  // Prefill/decode disaggregation (server/kv_transport.h), single-prompt n = 1 requests only.
  // Prefill side: when the request finishes, its prompt's cached prefix goes to decode server
  // `kv_send_to` as transfer `kv_send_id`. Decode side: admission waits (up to kv_wait_s) for
  // transfer `kv_recv_id` and imports it first; without it the prompt is simply computed here.
  std::string kv_send_id, kv_send_to, kv_recv_id;
};

class KvTransport;

struct EngineLoopOptions {
  int64_t max_waiting = 512;  // sequences accepted but not yet running
  KvTransport* kv = nullptr;  // disaggregation (outlives the loop), null = off
  double kv_wait_s = 10;      // longest wait of a decode request for its transfer
};

struct KvCounters {
  int64_t sent = 0, send_failed = 0, exported_tokens = 0;    // prefill side
  int64_t received = 0, timed_out = 0, imported_tokens = 0;  // decode side
  int64_t import_failed = 0;                                 // refused or no room
};

class EngineLoop {
 public:
  EngineLoop(std::unique_ptr<engine::Engine> engine, EngineLoopOptions options, ServerMetrics& metrics);
  ~EngineLoop();  // stop()
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Counts `num_seqs` against max_waiting; false (nothing counted) when it is full or stopped.
  bool try_reserve(int64_t num_seqs);
  void release(int64_t num_seqs);  // a reservation that will not be submitted
  // Hands a request to the engine thread (its reservation included). After stop(), the sink is
  // told at once that the server is shutting down.
  void submit(Submission s);
  void abort(const std::string& request_id);
  // Aborts everything, joins the thread. Idempotent.
  void stop();

  // Immutable after construction, safe from any thread: the tokenizer and the grammar compiler
  // (whose compile() is thread-safe) and the model's limits.
  const engine::Engine& engine() const { return *engine_; }
  int64_t num_waiting() const;
  KvCounters kv_counters() const;

 private:
  struct Tracked {
    std::shared_ptr<OutputSink> sink;
    double received = 0, first_token = 0;
    int64_t prompt_tokens = 0;
    std::vector<int32_t> kv_prompt;  // prefill side: the prompt whose prefix is sent at the end
    std::string kv_send_id, kv_send_to;
  };
  struct Parked {  // a decode request waiting for its transfer
    Submission s;
    double deadline = 0;
  };
  void run();
  void admit(Submission& s);
  // Decode side: admits the parked requests whose transfer arrived or whose wait ran out.
  void admit_parked(bool stopping, const std::vector<std::string>& aborts);
  void export_kv(Tracked& t, const RequestOutput& o);
  void deliver(std::vector<RequestOutput>&& outs);
  void fail_all(const std::string& why);
  void publish();

  std::unique_ptr<engine::Engine> engine_;
  EngineLoopOptions options_;
  ServerMetrics& metrics_;
  mutable std::mutex mu_;  // guards everything down to `stop_`
  std::condition_variable cv_;
  std::deque<Submission> inbox_;
  std::vector<std::string> aborts_;
  int64_t reserved_ = 0;        // sequences reserved or queued in the inbox
  int64_t engine_waiting_ = 0;  // the scheduler's waiting sequences after the last step
  bool busy_ = false;           // the engine has unfinished requests
  bool stop_ = false;
  bool kv_arrived_ = false;     // a transfer arrived since the loop last looked
  KvCounters kv_counters_;
  std::vector<Parked> parked_;  // engine thread only
  std::unordered_map<std::string, Tracked> tracked_;  // engine thread only
  std::thread thread_;
};

}  // namespace deepinfer::server
