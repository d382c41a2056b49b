// OutputProcessor: turns per-sequence token updates into vLLM-shaped RequestOutputs.
// Owns everything text-side: incremental detokenization (complete UTF-8 only), stop strings
// (found across token boundaries; the text is cut before the stop string unless
// include_stop_str_in_output), streaming hold-back of a possible partial stop string,
// logprob formatting, the n samples of one prompt, and metrics. It reports sequences that a
// stop string finished so the engine can tell the scheduler.
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

  struct Result {
    std::vector<RequestOutput> outputs;       // requests with something to report this step
    std::vector<int64_t> stopped_seq_ids;     // finished by a stop string or an error: the scheduler must finish them
  };
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
    int num_finished = 0;
    std::string error;  // set when this request's text processing failed; the request ends alone
  };

  PositionLogprobs format_logprobs(const TokenLogprobs& lp) const;
  // Appends a token's text; returns true when a stop string finished the child.
  bool append_text(Parent& p, Child& c, int32_t token);
  void finish_child(Parent& p, Child& c, const std::string& reason);
  RequestOutput make_output(Parent& p);

  const TextCodec* codec_;
  std::unordered_map<std::string, Parent> parents_;
  std::unordered_map<int64_t, std::pair<std::string, int>> seq_owner_;  // seq -> (request id, sample index)
};

}  // namespace deepinfer::engine
