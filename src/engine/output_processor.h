// OutputProcessor: turns per-sequence token updates into vLLM-shaped RequestOutputs.
// Owns everything text-side: incremental detokenization (complete UTF-8 only), stop strings
// (found across token boundaries; the text is cut before the stop string unless
// include_stop_str_in_output), streaming hold-back of a possible partial stop string,
// logprob formatting, the n samples of one prompt, and metrics.
// Stop strings change request state, which only Scheduler::update does: scan_stops() runs the
// same text logic over a step's tokens on a copy of each sequence's text tail (nothing changes)
// and reports where a stop string completes or the text fails; update() ends the accepted run
// there; process() then appends exactly the committed tokens and finds the same stop.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepinfer/outputs.h"
#include "engine/adapters.h"
#include "engine/messages.h"

namespace deepinfer::engine {

class OutputProcessor {
 public:
  explicit OutputProcessor(const TextCodec* codec) : codec_(codec) {}

  // Registers a prompt whose n samples run as seq_ids[i] (sample index i).
  void add(const std::string& request_id, std::string prompt_text, std::shared_ptr<const std::vector<int32_t>> prompt_ids,
           std::shared_ptr<const SamplingParams> params, const std::vector<int64_t>& seq_ids, double arrival_time);

  // Where the tokens of `result` would end a sequence by a stop string or a text error
  // (side-effect free; at most one event per sequence, its first).
  std::vector<StopEvent> scan_stops(const ModelRunnerOutput& result) const;

  struct Result {
    std::vector<RequestOutput> outputs;       // requests with something to report this step
  };
  // Precondition: every stop string or text error the updates' tokens hit was reported by
  // scan_stops and ended its update (finished); InternalError otherwise.
  Result process(const std::vector<SeqUpdate>& updates, double now);
  size_t num_unfinished() const { return parents_.size(); }

 private:
  struct Child {
    std::vector<int32_t> token_ids;
    std::vector<PositionLogprobs> logprobs;
    double cum_logprob = 0;
    std::string text;      // decoded so far (after stop-string truncation)
    std::string pending;   // bytes of an incomplete UTF-8 character
    size_t sent_tokens = 0, sent_text = 0;  // what delta outputs already carried
    std::string finish_reason;
    std::optional<int32_t> stop_token_id;
    std::optional<std::string> stop_string;
    bool finished() const { return !finish_reason.empty(); }
  };
  struct Parent {
    std::string request_id, prompt_text;
    std::shared_ptr<const std::vector<int32_t>> prompt_ids;
    std::shared_ptr<const SamplingParams> params;
    std::vector<int64_t> seq_ids;
    std::vector<Child> children;
    std::optional<std::vector<std::optional<PositionLogprobs>>> prompt_logprobs;
    RequestMetrics metrics;
    int64_t num_cached_tokens = 0;  // prompt tokens a prefix hit served (the most of its samples)
    int num_finished = 0;
    std::string error;  // set when this request's text processing failed; the request ends alone
  };

  PositionLogprobs format_logprobs(const TokenLogprobs& lp) const;
  // Appends a token's bytes to (text, pending): complete UTF-8 goes to text. Returns the stop
  // string that now ends `text` (text is cut before it, or after it with
  // include_stop_str_in_output; pending cleared), or null. Throws when the codec fails.
  const std::string* append_text(const SamplingParams& sp, std::string& text, std::string& pending, int32_t token) const;
  void finish_child(Parent& p, Child& c, const std::string& reason);
  RequestOutput make_output(Parent& p);

  const TextCodec* codec_;
  std::unordered_map<std::string, Parent> parents_;
  std::unordered_map<int64_t, std::pair<std::string, int>> seq_owner_;  // seq -> (request id, sample index)
};

}  // namespace deepinfer::engine
