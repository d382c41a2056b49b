// OpenAI request parsing shared by /v1/completions and /v1/chat/completions: typed field access
// that names the field in every error (400, OpenAI-style body, `param` set), unknown fields
// refused as OpenAI does ("Unrecognized request argument supplied"), the sampling fields,
// response_format / so_args, and the pieces of the response bodies both endpoints share
// (usage, error bodies).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer::server {

using json = nlohmann::json;

// An error answered with `status` and an OpenAI error body.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string code = "")
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string param;  // the request field at fault, "" when none
  std::string code;   // machine-readable code ("queue_full", "model_not_found"), "" = null
};
[[noreturn]] void bad_request(const std::string& message, const std::string& param = "");

// {"error": {"message", "type", "param", "code"}}; type from the status (invalid_request_error,
// not_found_error, server_error, service_unavailable).
std::string error_body(int status, const std::string& message, const std::string& param = "",
                       const std::string& code = "");
// Serialises a response value (invalid UTF-8, which engine text never has, becomes U+FFFD).
std::string dump(const json& v);

// The fields of one JSON object, read by name and type. Whatever was not read is unknown:
// check_unknown() refuses it.
class Fields {
 public:
  Fields(const json& object, std::string where);  // where: "" (the body) or e.g. "messages[2]"
  bool has(const char* key) const;                 // present and not null
  const json* get(const char* key);                // marks read; null when absent or null
  std::optional<std::string> str(const char* key);
  std::optional<bool> boolean(const char* key);
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi);
  std::optional<double> number(const char* key, double lo, double hi);
  void ignore(const char* key) { read_.insert(key); }  // accepted and not used
  void check_unknown() const;
  std::string name(const char* key) const { return where_.empty() ? key : where_ + "." + key; }

 private:
  const json& obj_;
  std::string where_;
  std::set<std::string> read_;
};

// JSON body text -> object (400 for malformed JSON or a body that is not an object).
json parse_body(const std::string& body);

struct CommonOptions {
  std::string model;          // "" when absent
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool continuous_usage = false;      // stream_options.continuous_usage_stats (vLLM)
};
// The fields both endpoints share: model, stream, stream_options, n, sampling values, stop,
// seed, logit_bias and vLLM's extras (top_k, min_p, repetition_penalty, min_tokens, ignore_eos,
// stop_token_ids, skip_special_tokens, include_stop_str_in_output), user (ignored). Structured
// outputs are parsed separately (structured_outputs()).
CommonOptions parse_common(Fields& f, SamplingParams& sp, int64_t vocab_size);
// response_format ({"type": "text" | "json_object" | "json_schema", "json_schema": {"schema"}})
// and deepinfer's so_args (the Python API's spelling: json / json_schema, regex, choice,
// grammar / ebnf, json_object, schema_type + schema, trigger_token_ids, bound_token_id; also
// accepted as structured_outputs). At most one of them.
std::optional<StructuredOutputsParams> structured_outputs(Fields& f, int64_t vocab_size);

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens,
                std::optional<int64_t> reasoning_tokens = std::nullopt);
// Prompt tokens served from the prefix cache (RequestOutput::num_cached_tokens once the engine
// reports it, 0 before).
int64_t cached_prompt_tokens(const RequestOutput& o);

}  // namespace deepinfer::server
