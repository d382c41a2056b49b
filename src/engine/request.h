// Request: the scheduler's record of one sequence (one of a prompt's n samples). Its state
// changes only in Scheduler (schedule / update / finish); other parts read it or get copies
// through SchedulerOutput.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/sampling_params.h"
#include "engine/adapters.h"
#include "engine/spec_adaptive.h"

namespace deepinfer::engine {

enum class RequestStatus { kWaiting, kRunning, kFinished };
enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* finish_reason_name(FinishReason r);

struct Request {
  int64_t seq_id = 0;                   // engine-unique id of this sequence
  int64_t arrival = 0;                  // FCFS order (shared by a prompt's n samples)
  uint32_t sample_index = 0;            // which of the n samples
  uint64_t seed = 0;                    // Philox key
  std::shared_ptr<const SamplingParams> params;
  std::shared_ptr<const std::vector<int32_t>> prompt_ids;  // [prompt_len]
  std::vector<int32_t> output_ids;      // generated so far
  int64_t max_output_tokens = 0;        // min(max_tokens, max_model_len - prompt_len)
  int64_t eos_token_id = -1;
  std::unique_ptr<GrammarMatcher> grammar;  // null unless structured outputs

  RequestStatus status = RequestStatus::kWaiting;
  int64_t num_computed_tokens = 0;      // tokens whose cache entries exist
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;           // set when a stop/eos token finished it
  int64_t num_preemptions = 0;
  int64_t num_cached_tokens = -1;       // tokens a prefix hit served at first admission (-1 = not yet)
  int64_t branch_point = 0;             // PrefixMatch::cached_tokens past its hit at admission (0 = none)
  // Drafts the drafter proposed after the last output token, verified when next scheduled
  // (vLLM v1's spec_token_ids). Cleared when sent to the runner and on preemption.
  std::vector<int32_t> draft_tokens;
  std::vector<float> draft_logprobs;    // [draft_tokens] the drafter's raw log-probability of each
  std::vector<float> verifying_logprobs;  // of the drafts sent in the last step (acceptance calibration)
  DraftGate::Seq draft_gate;            // adaptive drafting (spec_adaptive.h)
  int64_t last_step_id = -1;            // last step that ran it: its cache is released after that one
  // Asynchronous scheduling: what the steps scheduled but not yet applied by update() will add.
  // schedule() plans the next step as if they had completed (each sampling step adds one token);
  // update() moves their share into num_computed_tokens / output_ids. Both are 0 between a
  // synchronous update and the next schedule, and after a preemption.
  int64_t inflight_tokens = 0;          // committed positions (drafts excluded) they compute
  int32_t inflight_samples = 0;         // tokens they sample

  int64_t prompt_len() const { return int64_t(prompt_ids->size()); }
  int64_t num_tokens() const { return prompt_len() + int64_t(output_ids.size()); }
  int64_t scheduled_computed() const { return num_computed_tokens + inflight_tokens; }
  int64_t scheduled_tokens() const { return num_tokens() + inflight_samples; }
  int64_t scheduled_outputs() const { return int64_t(output_ids.size()) + inflight_samples; }
  int32_t token_at(int64_t pos) const {
    return pos < prompt_len() ? (*prompt_ids)[size_t(pos)] : output_ids[size_t(pos - prompt_len())];
  }
};

}  // namespace deepinfer::engine
