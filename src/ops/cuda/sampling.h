// Token sampler on the GPU: logits [B, V] f32 -> one token per row, the device twin of the CPU
// sampler (src/engine/sampler.{h,cpp}), following it step by step in the same precision:
//   fp32: copy -> logit bias (entries in order) -> banned ids = -inf (min_tokens: EOS + stop
//         ids) -> grammar bitmask -> repetition (prompt+output), presence/frequency (output)
//         penalties; greedy = argmax, ties to the lowest id; nothing allowed -> eos_token_id.
//   fp64: l/T (fp32 division) -> e = exp(l - max) -> p = e / Σe -> min-p (p < min_p·(1/Σe) -> 0)
//         -> top-k over keys (float(p), lower id first) -> top-p: smallest best-first prefix
//         of the top-k set whose mass reaches top_p·mass -> normalise by the kept total ->
//         inverse CDF in id order with u = Philox4x32-10(seed, sample_index, position), the
//         generator of src/engine/philox.h bit for bit.
// Logprobs are of the raw logits (log-softmax, lse in fp64), as on the CPU; rank = 1 + #tokens
// with a strictly larger raw logit; top-N best first, ties to the lower id.
//
// Exactness vs the CPU sampler: every fp32 step is the same IEEE operation in the same order
// (no FMA contraction), and top-k / top-N sets are exact (radix select on unique 64-bit keys).
// The fp64 sums (Σe, top-p mass and prefix, the draw's CDF) are fixed-order block reductions,
// not the CPU's left-to-right loop, and CUDA's exp/log may differ from glibc's in the last ulp.
// Both only move a boundary by ~1e-16 relative: the token differs only when u, the top-p
// target or the min-p threshold lands within ~1e-13 of a boundary (never seen in the tests);
// logprobs agree to a float ulp. Results never depend on batch neighbours or run (no atomics
// in any sum; the blocks of a row fold their partials in rank order).
//
// Cost: each row runs on a thread-block cluster of sampling_blocks_per_row(vocab) 512-thread
// blocks (8 at V = 129280; the split depends on the vocabulary only, so a row gives the same bits
// in any batch); reductions are block-level, then the blocks' partials in rank order through
// distributed shared memory. A greedy row without bias / banned ids / penalties is one pass over
// the raw logits (masked on the fly); otherwise the processed logits, then the probabilities, live
// in the fp64 workspace [B, V] (8 B per logit). A sampled row is ~4 passes over V plus radix
// passes (early exit once the bucket's smallest key is the answer): top-k counts 8-bit digits
// (<= 8 passes), top-p sums masses over 4-bit digits (<= 16 passes); logprobs add 2 passes, top-N
// another 8-bit count select.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::ops::cuda {

constexpr int kSamplingMaxTopLogprobs = 64;  // largest top-N per row

// Per-row parameters (plain data, device array [B]). Mirrors deepinfer::SamplingParams plus
// the row's draw key and its ranges in the shared entry lists below. Checked on the host by
// check_sampling_rows() when the caller builds them.
struct SamplingRowParams {
  float temperature = 1.0f;         // < 1e-5 = greedy (SamplingParams::greedy)
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1]
  int32_t top_k = 0;                // <= 0 = off
  float repetition_penalty = 1.0f;  // > 0, tokens in prompt or output
  float presence_penalty = 0.0f;    // output tokens
  float frequency_penalty = 0.0f;   // output tokens, times their count
  int32_t top_logprobs = 0;         // N best raw logprobs to write, [0, max_top_logprobs]
  uint64_t seed = 0;                // Philox key
  uint32_t sample_index = 0;        // which of the request's n samples
  int64_t position = 0;             // absolute position of the token being drawn
  int32_t eos_token_id = -1;        // the token when nothing is allowed (< 0 -> 0)
  int32_t has_mask = 0;             // 1: apply this row of allowed_mask
  int32_t bias_begin = 0, bias_end = 0;        // [begin, end) into bias_ids / bias_values
  int32_t banned_begin = 0, banned_end = 0;    // into banned_ids
  int32_t penalty_begin = 0, penalty_end = 0;  // into penalty_ids / penalty_counts
  // Speculative decoding (src/engine/spec_verify.h's rules, on the device; kSpecPlain = none):
  //  kSpecDraft: the row is a drafter row. q = float(p) of the processed distribution is written
  //    to spec_q [vocab] (one-hot at the fallback token when nothing is allowed) and the token is
  //    the inverse-CDF draw over those float weights (normalised by their fp64 sum) with
  //    u = Philox(seed, sample_index, position, kSpecDraft): engine::draw_weighted's rule, so q is
  //    exactly the distribution the draft came from.
  //  kSpecVerify: the row also rejection-samples `spec_draft`, drawn from the weights spec_q
  //    [vocab] (a kSpecDraft row's q), against this row's p: accepted iff
  //    u_a * q(d) / sum q < p(d) (u_a: kSpecAccept); on rejection, the residual draw from
  //    norm(max(0, p - q / sum q)) (u_r: kSpecResidual; p itself when the residual is empty):
  //    engine::rejection_sample's rule. The row's own token is drawn as plain sampling draws it.
  //  Both need a sampled row (temperature >= 1e-5) and spec_q non-null.
  int32_t spec_mode = 0;
  int32_t spec_draft = -1;
  float* spec_q = nullptr;  // device [vocab]; written (kSpecDraft) or read (kSpecVerify)
};

constexpr int32_t kSpecPlain = 0, kSpecDraft = 1, kSpecVerify = 2;

struct SampleParams {
  const float* logits = nullptr;        // [batch, vocab] f32, row stride logits_stride
  int64_t logits_stride = 0;            // >= vocab
  int64_t batch = 0;
  int64_t vocab = 0;                    // < 2^31 - 1
  const SamplingRowParams* rows = nullptr;  // [batch]
  // Logit bias: (id, value) added in entry order (repeated ids add twice, as on the CPU).
  const int32_t* bias_ids = nullptr;    // [num_bias]
  const float* bias_values = nullptr;   // [num_bias]
  int64_t num_bias = 0;
  // Ids forced to -inf (min_tokens not reached: EOS and stop token ids).
  const int32_t* banned_ids = nullptr;  // [num_banned]
  int64_t num_banned = 0;
  // Penalty entries: each id UNIQUE within a row (make_penalty_entries builds them), the
  // union of prompt and output tokens; count = occurrences in the output (0: prompt only).
  const int32_t* penalty_ids = nullptr;     // [num_penalty]
  const int32_t* penalty_counts = nullptr;  // [num_penalty]
  int64_t num_penalty = 0;
  // Grammar bitmask, bit t of word t/32 set = allowed (the structured module's layout).
  const uint32_t* allowed_mask = nullptr;   // [batch, mask_stride] or null (no row masked)
  int64_t mask_stride = 0;                  // words per row, >= ceil(vocab / 32)
  // Outputs.
  int32_t* tokens = nullptr;            // [batch]
  float* logprobs = nullptr;            // [batch] raw logprob of the token, or null
  int32_t* ranks = nullptr;             // [batch] rank of the token, or null
  int32_t* top_ids = nullptr;           // [batch, max_top_logprobs] or null; unused slots -1
  float* top_logprobs = nullptr;        // [batch, max_top_logprobs]; unused slots -inf
  int max_top_logprobs = 0;             // output row width, <= kSamplingMaxTopLogprobs
  // kSpecVerify rows' decisions (needed when any row verifies; other rows are left alone):
  // spec_accepted 1 / 0 (-2: q(draft) = 0, the draft was not drawn from q), spec_residual the
  // token the row emits if verification stops there: the residual draw (rejected) or the draft
  // (accepted); spec_residual_logprob / _rank its raw logprob and rank when logprobs is non-null
  // (its top-N is the row's own).
  int32_t* spec_accepted = nullptr;     // [batch]
  int32_t* spec_residual = nullptr;     // [batch]
  float* spec_residual_logprob = nullptr;  // [batch]
  int32_t* spec_residual_rank = nullptr;   // [batch]
  // Scratch: sampling_workspace_bytes(batch, vocab) bytes, 8-byte aligned.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

size_t sampling_workspace_bytes(int64_t batch, int64_t vocab);

// Throws InvalidArgument naming "row i: field" for a value the kernel does not accept
// (ranges, list bounds against the entry counts, top_logprobs > max_top_logprobs).
void check_sampling_rows(std::span<const SamplingRowParams> rows, const SampleParams& p);

// Penalty entries of one row from its prompt and output ids: sorted unique ids in [0, vocab),
// count = occurrences in `output`. Appends to `ids` / `counts`.
void make_penalty_entries(std::span<const int32_t> prompt, std::span<const int32_t> output, int64_t vocab,
                          std::vector<int32_t>& ids, std::vector<int32_t>& counts);

// Blocks (one cluster) per row for this vocabulary: ceil(vocab / 4096), clamped to [1, 8].
int sampling_blocks_per_row(int64_t vocab);

// Validates the shape, pointers and workspace (InvalidArgument, before any CUDA call), then
// launches sampling_blocks_per_row(p.vocab) blocks per row on `stream`.
void sample(const SampleParams& p, cudaStream_t stream);
// The same with a forced split (1..8; 0 = sampling_blocks_per_row): for tests and timing only.
// The fp64 sums' order, hence their last bits, depends on the split (never on the batch).
void sample(const SampleParams& p, cudaStream_t stream, int blocks_per_row);

}  // namespace deepinfer::ops::cuda
