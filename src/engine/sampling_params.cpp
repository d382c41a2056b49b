// SamplingParams::validate: every user-facing check of sampling values lives here.
#include <cmath>

#include "core/check.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {
namespace {
void require(bool ok, const char* field, const std::string& why) {
  if (!ok) DI_THROW(InvalidArgument, "SamplingParams.", field, ": ", why);
}
}  // namespace

void SamplingParams::validate(int64_t vocab_size) const {
  using detail::str_cat;
  require(n >= 1 && n <= 1024, "n", str_cat("must be in [1, 1024], got ", n));
  require(std::isfinite(temperature) && temperature >= 0, "temperature", str_cat("must be >= 0, got ", temperature));
  require(top_p > 0 && top_p <= 1, "top_p", str_cat("must be in (0, 1], got ", top_p));
  require(top_k >= -1, "top_k", str_cat("must be -1, 0 (off) or positive, got ", top_k));
  require(min_p >= 0 && min_p <= 1, "min_p", str_cat("must be in [0, 1], got ", min_p));
  require(presence_penalty >= -2 && presence_penalty <= 2, "presence_penalty",
          str_cat("must be in [-2, 2], got ", presence_penalty));
  require(frequency_penalty >= -2 && frequency_penalty <= 2, "frequency_penalty",
          str_cat("must be in [-2, 2], got ", frequency_penalty));
  require(std::isfinite(repetition_penalty) && repetition_penalty > 0, "repetition_penalty",
          str_cat("must be > 0, got ", repetition_penalty));
  if (max_tokens) require(*max_tokens >= 1, "max_tokens", str_cat("must be >= 1, got ", *max_tokens));
  require(min_tokens >= 0, "min_tokens", str_cat("must be >= 0, got ", min_tokens));
  if (max_tokens) require(min_tokens <= *max_tokens, "min_tokens",
                          str_cat("(", min_tokens, ") must not exceed max_tokens (", *max_tokens, ")"));
  if (logprobs) require(*logprobs >= 0 && *logprobs <= 20, "logprobs", str_cat("must be in [0, 20], got ", *logprobs));
  if (prompt_logprobs)
    require(*prompt_logprobs >= 0 && *prompt_logprobs <= 20, "prompt_logprobs",
            str_cat("must be in [0, 20], got ", *prompt_logprobs));
  for (size_t i = 0; i < stop.size(); ++i) require(!stop[i].empty(), "stop", str_cat("entry ", i, " is empty"));
  for (int32_t t : stop_token_ids)
    require(t >= 0 && t < vocab_size, "stop_token_ids", str_cat("token id ", t, " is outside [0, ", vocab_size, ")"));
  for (auto [t, b] : logit_bias) {
    require(t >= 0 && t < vocab_size, "logit_bias", str_cat("token id ", t, " is outside [0, ", vocab_size, ")"));
    require(std::isfinite(b) && b >= -100 && b <= 100, "logit_bias", str_cat("bias for token ", t, " must be in [-100, 100]"));
  }
  if (structured_outputs) {
    int k = structured_outputs->num_set();
    require(k == 1, "structured_outputs",
            str_cat("exactly one of json, regex, choice, grammar, json_object, tool_calls must be set, got ", k));
    if (structured_outputs->choice) require(!structured_outputs->choice->empty(), "structured_outputs.choice", "is empty");
    for (int32_t t : structured_outputs->trigger_token_ids)
      require(t >= 0 && t < vocab_size, "structured_outputs.trigger_token_ids",
              str_cat("token id ", t, " is outside [0, ", vocab_size, ")"));
    if (const auto& b = structured_outputs->bound_token_id) {
      require(*b >= 0 && *b < vocab_size, "structured_outputs.bound_token_id",
              str_cat("token id ", *b, " is outside [0, ", vocab_size, ")"));
      require(!structured_outputs->trigger_token_ids.empty(), "structured_outputs.bound_token_id",
              "requires a non-empty trigger_token_ids");
    }
  }
}

}  // namespace deepinfer
