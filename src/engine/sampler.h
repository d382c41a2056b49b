// Sampler: raw logits -> one token per row. Stateless; each row carries everything that
// decides its draw (params, history, grammar mask, Philox key), so rows never influence
// each other and the result is identical on any batch layout.
//
// Per row, in order (vLLM v1's order): logit bias; min_tokens masks EOS and stop tokens;
// grammar mask; repetition (prompt+output), presence and frequency (output) penalties;
// then greedy argmax, or temperature -> min-p -> top-k -> top-p -> one inverse-CDF draw over
// the kept tokens in id order with u = Philox(seed, sample_index, position).
// Logprobs are always of the raw model logits (vLLM's default "raw_logprobs").
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "deepinfer/sampling_params.h"

namespace deepinfer::engine {

struct SamplingRow {
  const float* logits = nullptr;                    // [vocab] raw logits of this row
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;                                // Philox key
  uint32_t sample_index = 0;                        // which of the request's n samples
  int64_t position = 0;                             // absolute position of the token being drawn
  const std::vector<int32_t>* prompt_ids = nullptr;  // for the repetition penalty
  const std::vector<int32_t>* output_ids = nullptr;  // tokens generated so far
  const std::vector<uint32_t>* allowed_mask = nullptr;  // [ceil(vocab/32)] bit set = allowed; null = all
  int64_t eos_token_id = -1;
};

struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.0f;
  int32_t rank = 0;                                 // 1 + #tokens with a strictly larger logit
  std::vector<std::pair<int32_t, float>> top;       // top-N (token, logprob), best first, ties by id
};

struct SampleResult {
  int32_t token = -1;
  TokenLogprobs logprobs;                           // filled when params->logprobs is set
  // A row that also rejection-sampled its draft on the device (DeviceSampler, SpecRow kVerify):
  // 1 accepted, 0 rejected, -2 the draft has q = 0 (-1: no such decision); the token the row
  // emits then (the residual draw on rejection, the draft when accepted) with its raw logprob and
  // rank (its top-N is logprobs.top, the row's own).
  int32_t spec_accepted = -1;
  int32_t spec_residual = -1;
  float spec_residual_logprob = 0.0f;
  int32_t spec_residual_rank = 0;
};

// Log-softmax of `logits` [vocab]: the entry for `token` plus the `top_n` best.
TokenLogprobs compute_logprobs(const float* logits, int64_t vocab, int32_t token, int top_n);

// The distribution a non-greedy row draws from (after every processing step), [vocab],
// zeros for removed tokens, summing to 1. Exposed for tests.
std::vector<double> processed_probs(const SamplingRow& row, int64_t vocab);

// Applies bias, min_tokens, grammar mask and penalties to a copy of the row's logits.
std::vector<float> processed_logits(const SamplingRow& row, int64_t vocab);

// Samples each row independently (in parallel over rows); results in row order.
std::vector<SampleResult> sample_rows(std::span<const SamplingRow> rows, int64_t vocab);

}  // namespace deepinfer::engine
