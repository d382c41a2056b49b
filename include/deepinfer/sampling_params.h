// SamplingParams: how one request turns logits into tokens and when it stops, shaped like
// vLLM's SamplingParams. Plain data; `validate` is the single place that checks values and
// throws InvalidArgument naming the field, so a bad request fails alone at admission.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace deepinfer {

// Constrained decoding request (vLLM StructuredOutputsParams). Exactly one member is set.
struct StructuredOutputsParams {
  std::optional<std::string> json;                 // JSON schema text
  std::optional<std::string> regex;                // regular expression
  std::optional<std::vector<std::string>> choice;  // one of these strings
  std::optional<std::string> grammar;              // EBNF grammar text
  bool json_object = false;                        // any JSON object
  // A DSML tool-call block (so_args.tool_calls as JSON text: format v4 | v41, tools, mode
  // required | auto, parallel, function; docs/STRUCTURED.md).
  std::optional<std::string> tool_calls;
  // DeepInfer's trigger (so_args trigger_token_ids / bound_token_id): tokens are free until
  // this token sequence has appeared, then the constraint applies; once bound_token_id is
  // generated before that, the rest of the trigger is forced. Empty: constrained from the start.
  std::vector<int32_t> trigger_token_ids;
  std::optional<int32_t> bound_token_id;           // needs a non-empty trigger_token_ids
  int num_set() const {
    return int(json.has_value()) + int(regex.has_value()) + int(choice.has_value()) + int(grammar.has_value()) +
           int(json_object) + int(tool_calls.has_value());
  }
};

// What each streamed RequestOutput carries (vLLM RequestOutputKind).
enum class OutputKind { kCumulative, kDelta, kFinalOnly };

struct SamplingParams {
  int n = 1;                           // independent samples per prompt
  float temperature = 1.0f;            // 0 = greedy
  float top_p = 1.0f;                  // (0, 1]
  int top_k = 0;                       // 0 or -1 = off
  float min_p = 0.0f;                  // [0, 1]
  float presence_penalty = 0.0f;       // [-2, 2], over output tokens
  float frequency_penalty = 0.0f;      // [-2, 2], over output tokens
  float repetition_penalty = 1.0f;     // > 0, over prompt and output tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> added to its logit
  // Key of the counter-based generator: with a seed, draws depend only on (seed, sample
  // index, position), never on batch neighbours, n or preemption. Without, the engine
  // derives one from its own seed.
  std::optional<uint64_t> seed;

  std::optional<int> max_tokens = 16;  // nullopt = up to max_model_len
  int min_tokens = 0;                  // EOS / stop tokens are masked until this many
  std::vector<std::string> stop;       // stop strings (not in output unless include_stop_str_in_output)
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;

  std::optional<int> logprobs;         // top-N logprobs per output token (raw model logprobs)
  std::optional<int> prompt_logprobs;  // top-N logprobs per prompt token
  bool skip_special_tokens = true;
  bool detokenize = true;
  OutputKind output_kind = OutputKind::kCumulative;

  std::optional<StructuredOutputsParams> structured_outputs;

  bool greedy() const { return temperature < 1e-5f; }
  // Throws InvalidArgument naming the offending field. `vocab_size` bounds token ids.
  void validate(int64_t vocab_size) const;
};

}  // namespace deepinfer
