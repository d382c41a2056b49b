// Scheduler: decides, each step, which sequences run and how many tokens each gets.
// It schedules token counts, not phases: a decode is 1 token, a prefill chunk is up to the
// remaining budget, and both share a step (vLLM v1's model).
//
// Policy (first-come first-served, starvation free):
//  1. Running sequences in arrival order each get min(remaining tokens, budget). When the
//     cache cannot grow one, the latest-arrived running sequence is preempted (cache freed,
//     recomputed from scratch later) until it fits, possibly itself.
//  2. If nothing was preempted, waiting sequences are admitted in arrival order while the
//     token budget, max_num_seqs and the cache allow; the head of the queue is never
//     skipped, so an old request cannot starve behind younger ones.
// Preempted sequences return to the waiting queue in arrival order, ahead of younger ones.
// Plan-then-commit: schedule() only changes scheduling state; token results arrive in
// update(), the single place where a sequence's tokens and status change.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache_manager.h"
#include "engine/messages.h"
#include "engine/request.h"

namespace deepinfer::engine {

struct SchedulerConfig {
  int64_t max_num_seqs = 64;              // sequences in one step
  int64_t max_num_batched_tokens = 2048;  // tokens in one step
  int64_t max_model_len = 0;              // prompt + output limit per sequence
  bool enable_chunked_prefill = true;     // off: a prefill runs whole or waits
};

struct SchedulerStats {
  int64_t num_steps = 0;
  int64_t num_preemptions = 0;
  int64_t max_tokens_in_step = 0;
  int64_t max_seqs_in_step = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KVCacheManager& cache, int64_t vocab_size);

  // Takes ownership; the request must already be validated (Engine::add_request).
  void add(std::unique_ptr<Request> request);
  SchedulerOutput schedule();
  // Applies a step's results; returns one update per scheduled or finished sequence.
  std::vector<SeqUpdate> update(const SchedulerOutput& out, const ModelRunnerOutput& result);
  // Finishes a sequence from outside the model loop (stop string, abort). No-op if unknown.
  void finish(int64_t seq_id, FinishReason reason);

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  const Request* get(int64_t seq_id) const;
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  bool schedule_running(SchedulerOutput& out, int64_t& budget);
  void schedule_waiting(SchedulerOutput& out, int64_t& budget);
  void preempt(Request* r, SchedulerOutput& out);
  void insert_waiting(Request* r);
  void insert_running(Request* r);
  void fill_grammar_masks(SchedulerOutput& out);
  bool apply_token(Request& r, const SampledToken& s);  // true when it finished the sequence
  void release(Request& r);

  SchedulerConfig config_;
  KVCacheManager& cache_;
  int64_t vocab_size_;
  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;   // arrival order
  std::vector<Request*> running_;  // arrival order
  std::vector<int64_t> finished_since_last_;
  std::unordered_map<int64_t, bool> first_scheduled_pending_;
  SchedulerStats stats_;
};

}  // namespace deepinfer::engine
