// Scheduler: decides, each step, which sequences run and how many tokens each gets.
// It schedules token counts, not phases: a decode is 1 token, a verify step 1 + L (the last
// committed token and L drafts), a prefill chunk up to the remaining budget, and all share a
// step (vLLM v1's model).
//
// Policy (first-come first-served, starvation free):
//  1. Running sequences in arrival order each get min(remaining tokens, budget), plus their
//     drafts when the chunk reaches the last committed token (trimmed to the budget left,
//     num_speculative_tokens, max_tokens, the grammar and, with varlen_drafts, the step's
//     draft-length choice made for all sequences before the pass). When the cache cannot grow one,
//     its drafts go first, then the latest-arrived running sequence is preempted (cache freed,
//     recomputed from scratch later) until it fits, possibly itself.
//  2. If nothing was preempted, waiting sequences are admitted, each starting after the longest
//     cached prefix of its tokens (PrefixCache: shared blocks + a slot checkpoint), in arrival order while the
//     token budget, max_num_seqs and the cache allow; the head of the queue is never
//     skipped, so an old request cannot starve behind younger ones.
// Preempted sequences return to the waiting queue in arrival order, ahead of younger ones.
// Plan-then-commit: schedule() only changes scheduling state; token results arrive in
// update(), the single place where a sequence's tokens and status change: it commits a step's
// accepted tokens one by one (EOS, stop ids, max_tokens, min_tokens, the grammar and stop
// strings found by the output processor end the run there), rolls back what was not accepted
// (num_computed_tokens, blocks past the new end) and stores the drafter's next proposals.
// Caches of finished or preempted sequences are released after the last step that used them.
#pragma once
#include <chrono>
#include <optional>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache_manager.h"
#include "engine/messages.h"
#include "engine/prefix_cache.h"
#include "engine/request.h"
#include "engine/spec_budget.h"

namespace deepinfer::engine {

struct SchedulerConfig {
  int64_t max_num_seqs = 64;              // sequences in one step
  int64_t max_num_batched_tokens = 2048;  // tokens in one step, drafts included
  int64_t max_model_len = 0;              // prompt + output limit per sequence
  bool enable_chunked_prefill = true;     // off: a prefill runs whole or waits
  int32_t num_speculative_tokens = 0;     // most drafts one sequence verifies per step
  // Variable-length verification (spec_budget.h): each sequence verifies the drafts that maximise
  // the step's expected committed tokens per predicted step time; off: every sequence verifies
  // num_speculative_tokens (trimmed by the budget, max_tokens and its grammar).
  bool varlen_drafts = false;
  StepCostModel step_cost;                // the engine's measured cost curve (varlen only)
  // Adaptive drafting (spec_adaptive.h): a request stops drafting while its measured acceptance
  // cannot pay for the drafting steps' measured cost.
  bool adaptive_drafts = false;
  DraftGateConfig draft_gate;
  PrefixCacheConfig prefix_cache;         // prefix reuse (on by default)
  // Bounded replay (CausalLM::replay_keep(), V4.1 compact prefill): a prefix hit ends at or before
  // the request's tail start (prompt length - replay_keep), since the later layers' window rows
  // there depend on where that tail starts. 0 = full prefill.
  int64_t replay_keep = 0;
};

struct SchedulerStats {
  int64_t num_steps = 0;
  int64_t num_preemptions = 0;
  int64_t max_tokens_in_step = 0;
  int64_t max_seqs_in_step = 0;
  int64_t num_draft_tokens = 0;           // drafts verified
  int64_t num_accepted_drafts = 0;        // drafts the target accepted (committed or not)
  int64_t num_verify_steps = 0;           // (sequence, step) pairs that verified >= 1 draft
  // Drafting configured: steps the drafter followed (SchedulerOutput::feeds_drafter) and plain
  // steps (adaptive drafting stopped every scheduled sequence, or a probe).
  int64_t num_drafter_steps = 0, num_plain_steps = 0;
  // [num_speculative_tokens] how often draft i was verified / accepted (accepted implies all
  // earlier drafts of that step were).
  std::vector<int64_t> draft_verified_at, draft_accepted_at;
};

// What a rank's scheduler holds now, for the data-parallel engine's request placement.
struct SchedulerLoad {
  int64_t running_seqs = 0, waiting_seqs = 0;
  int64_t running_tokens = 0;  // tokens of the running sequences (their cache)
  int64_t waiting_tokens = 0;  // tokens of waiting sequences not yet in the cache (prefill left)
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KVCacheManager& cache, int64_t vocab_size);

  // Takes ownership; the request must already be validated (Engine::add_request).
  void add(std::unique_ptr<Request> request);
  // Plans the next step. With a step in flight (asynchronous scheduling: schedule() before the
  // previous step's update()), it plans as if that step completed: every sequence it samples
  // gains one token, whose id the runner takes from the device; one whose last token (max_tokens)
  // is in flight is not scheduled; one that stops there (EOS, stop ids/strings, grammar) is, and
  // update() drops that row. Grammar masks are not part of the plan: grammar_masks() builds them
  // once the previous step was applied.
  SchedulerOutput schedule();
  // Bitmasks of `out`'s sampling sequences with a grammar (rows after drafts[0, i)). Call after
  // update() applied every step before `out`, so each matcher has accepted its tokens.
  std::vector<SeqGrammarMasks> grammar_masks(const SchedulerOutput& out);
  // Grammar masks are filled through `c` (its fill_bitmasks: in parallel on its workers); null
  // = one matcher after another. The compiler outlives the scheduler.
  void set_grammar_compiler(GrammarCompiler* c) { grammar_compiler_ = c; }
  // Applies step `out`'s results (`result` answers it; `stops` are the output processor's
  // stop-string / text-error events on result's tokens) and completes the step for the cache.
  // Returns one update per scheduled sequence that was still running.
  std::vector<SeqUpdate> update(const SchedulerOutput& out, const ModelRunnerOutput& result,
                                std::span<const StopEvent> stops = {});
  // Ends a sequence from outside the model loop (the user aborted it). No-op if unknown.
  void abort(int64_t seq_id);

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  const Request* get(int64_t seq_id) const;
  const SchedulerStats& stats() const { return stats_; }
  const DraftGate& draft_gate() const { return gate_; }
  SchedulerLoad load() const;
  const SchedulerConfig& config() const { return config_; }
  const PrefixCache& prefix_cache() const { return prefix_; }
  const HostBlockTier& host_tier() const { return host_; }
  // Prefill/decode disaggregation (Engine::export_prefix / import_prefix): the longest cached
  // prefix of a prompt (device blocks only, no stats counted) and a checkpoint brought in.
  PrefixMatch match_prefix(std::span<const int32_t> prompt) { return prefix_.match(cache_, prompt, {}, false, nullptr); }
  void put_checkpoint(const SavedCheckpoint& c) { prefix_.put(c); }

 private:
  bool schedule_running(SchedulerOutput& out, int64_t& budget);
  void schedule_waiting(SchedulerOutput& out, int64_t& budget);
  // The drafts `r` verifies this step if it gets `room` more tokens (a prefix of its proposals),
  // at most `cap` (varlen's choice; -1: no cap).
  std::vector<int32_t> plan_drafts(Request& r, int64_t room, int32_t cap) const;
  // Varlen: the draft count each decoding sequence is given this step (seq id -> cap).
  std::unordered_map<int64_t, int32_t> varlen_caps(int64_t budget) const;
  void record_verify(Request& r, int32_t n_drafts, int32_t accepted);
  // Adaptive drafting: whether `r` drafts this step (probes and the gate's judgement).
  bool gate_drafts(Request& r, int64_t step_id);
  // Adaptive drafting: whether `r`, stopped this step (gate_drafts false), still feeds the drafter.
  bool gate_feeds(const Request& r, int64_t step_id) const;
  // Adaptive drafting: the kind of the planned step `out` (timed when it is applied).
  void label_step(const SchedulerOutput& out);
  void time_step(const SchedulerOutput& out);
  void preempt(Request* r, SchedulerOutput& out);
  void insert_waiting(Request* r);
  void insert_running(Request* r);
  // Prefill chunk length after prefix caching's cut at a checkpoint boundary.
  int64_t chunk_tokens(const Request& r, int64_t n, int64_t from = -1) const;
  // Asks for slot checkpoints at the block boundaries `r`'s step of n committed tokens + drafts reaches.
  void plan_checkpoints(const Request& r, int64_t n, std::span<const int32_t> drafts, SchedulerOutput& out) const;
  // Stores the checkpoints a step saved.
  // Stores what the runner saved; a deferred checkpoint is keyed first (keyed_checkpoints).
  void store_checkpoints(std::span<const SavedCheckpoint> saved, int64_t unsaveable);
  // result's checkpoints with the deferred ones keyed from their sequence's tokens (call before
  // update() changes any request; one whose sequence ended before its step is dropped).
  std::vector<SavedCheckpoint> keyed_checkpoints(const ModelRunnerOutput& result) const;
  // The chain hash of r's first `blocks` blocks (what KVCacheManager hashes them as).
  uint64_t chain_hash(const Request& r, int64_t blocks) const;
  // Blocks whose hash left the device cache this step: spilled to the host tier, or their
  // checkpoints dropped (a checkpoint is of no use without its blocks).
  void drain_evictions(SchedulerOutput& out);
  // Commits tokens[0, n) of a step one by one; true when one of them finished the sequence.
  bool commit_tokens(Request& r, const SampledSeq& s, int32_t n, const StopEvent* stop, SeqUpdate& u);
  bool apply_token(Request& r, int32_t token);  // true when it finished the sequence
  void release(Request& r);

  SchedulerConfig config_;
  KVCacheManager& cache_;
  PrefixCache prefix_;
  HostBlockTier host_;
  int64_t vocab_size_;
  GrammarCompiler* grammar_compiler_ = nullptr;
  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
  std::deque<Request*> waiting_;   // arrival order
  std::vector<Request*> running_;  // arrival order
  std::vector<int64_t> finished_since_last_;
  std::unordered_map<int64_t, bool> first_scheduled_pending_;
  int64_t next_step_id_ = 0;
  SchedulerStats stats_;
  AcceptanceModel acceptance_;  // calibration of the drafter's confidence (varlen)
  // Adaptive drafting: the gate, probe steps left, planned steps' kinds and the last update time.
  DraftGate gate_;
  int32_t probe_left_ = 0;
  int64_t silent_seqs_ = 0;  // this step's scheduled sequences that neither draft nor feed the drafter
  std::optional<double> batch_tokens_;  // this step's mean tokens per verify step of judgeable requests
  std::unordered_map<int64_t, std::pair<DraftGate::StepKind, int64_t>> step_kinds_;
  std::optional<std::chrono::steady_clock::time_point> last_update_;
};

}  // namespace deepinfer::engine
