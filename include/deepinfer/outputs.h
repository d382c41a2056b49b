// What generate() returns, shaped like vLLM's RequestOutput / CompletionOutput.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace deepinfer {

struct Logprob {
  float logprob = 0.0f;      // log-softmax of the raw model logits
  int32_t rank = 0;          // 1 = most likely token
  std::string decoded_token; // empty when detokenization is off
};
// One position: the chosen (sampled or prompt) token first, then the top-N not already listed.
using PositionLogprobs = std::vector<std::pair<int32_t, Logprob>>;

struct CompletionOutput {
  int index = 0;                       // which of the n samples
  std::string text;                    // cumulative, or the new piece for OutputKind::kDelta
  std::vector<int32_t> token_ids;      // same convention as text
  std::optional<double> cumulative_logprob;              // set when logprobs were requested
  std::optional<std::vector<PositionLogprobs>> logprobs; // one entry per token in token_ids
  std::string finish_reason;           // "" while running, else "stop" | "length" | "abort" | "error"
  std::optional<int32_t> stop_token_id;  // the stop/eos token that finished it
  std::optional<std::string> stop_string;  // the stop string that finished it
  bool finished() const { return !finish_reason.empty(); }
};

struct RequestMetrics {
  double arrival_time = 0;          // seconds since the epoch
  double first_scheduled_time = 0;
  double first_token_time = 0;
  double last_token_time = 0;
  double finished_time = 0;
  int64_t num_generation_tokens = 0;  // over all n samples
  int64_t num_preemptions = 0;
  // Speculative decoding, over all n samples (0 / empty without drafts): steps that verified
  // drafts, drafts verified and accepted, and per draft position i how often it was verified and
  // accepted. Acceptance length (tokens per verify step) = 1 + accepted / verify steps.
  int64_t num_verify_steps = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_draft_tokens = 0;
  std::vector<int64_t> draft_verified_per_position, draft_accepted_per_position;
};

struct RequestOutput {
  std::string request_id;
  std::string prompt;                  // text prompt, "" for token-id prompts
  std::vector<int32_t> prompt_token_ids;
  // [prompt_len] entry 0 is nullopt (no logits precede the first token); set when requested.
  std::optional<std::vector<std::optional<PositionLogprobs>>> prompt_logprobs;
  std::vector<CompletionOutput> outputs;
  bool finished = false;
  RequestMetrics metrics;
  // Prompt tokens served from the prefix cache instead of computed (vLLM's num_cached_tokens;
  // the most of its samples, at their first scheduling).
  int64_t num_cached_tokens = 0;
  // Non-empty when the request was rejected (bad prompt or parameters); outputs is then empty.
  std::string error;
};

// Device time of one kind of operation over the steps profiled (LLM::take_op_profile): the model
// backend's ops (a linear of one shape and format, the sparse attention, the MoE experts, ...),
// each timed on the device between two events. Benchmarks only: profiling runs every step eagerly.
struct OpTiming {
  std::string op;      // "linear fp8 4096x1024", "sparse_attention", "moe_experts", ...
  int64_t calls = 0;
  double ms = 0;       // summed over the calls
};

}  // namespace deepinfer
