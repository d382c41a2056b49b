// Draft verification: which of a sequence's L drafts a verify step accepts, given what the
// target produced at each of its 1 + L sampling rows (row i scores the position of drafts[i];
// row L is the bonus position after the last draft).
//
// Row i's target distribution p_i is what plain decoding would draw from at that position if
// drafts[0, i) had been committed (same processed logits, grammar mask, penalties over that
// history); target_draws[i] is plain decoding's own draw there (same Philox key). Per draft, by
// how it was drafted:
//  - a greedy draft (q_i one-hot at d_i: greedy requests, grammar requests, no picker): accept iff
//    d_i equals the target's draw, else emit the draw. This *is* speculative rejection sampling for
//    a one-hot q (accepted with probability p_i(d_i); a rejection emits p_i restricted to the other
//    tokens), coupled to plain decoding's draw, so the output is token-identical to plain decoding.
//  - a sampled draft (d_i ~ q_i, the request's processing over the drafter's logits): standard
//    speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023): accept with
//    probability min(1, p_i(d_i) / q_i(d_i)) using u = Philox(seed, sample index, position,
//    kSpecAccept); on rejection emit a draw from norm(max(0, p_i - q_i)) with Philox(...,
//    kSpecResidual). Every emitted token is distributed exactly as plain decoding's, and a seed
//    gives the same tokens every run (given the same drafts).
// After all L drafts are accepted the bonus token is target_draws[L] (plain decoding's draw).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace deepinfer::engine {

struct VerifyResult {
  int32_t num_accepted = 0;      // drafts accepted, in [0, L]
  std::vector<int32_t> tokens;   // [num_accepted + 1]: drafts[0, k) then the target's token at row k
};

// The Philox key of a sequence's verify rows: row i draws at position first_position + i.
struct VerifyKey {
  uint64_t seed = 0;
  uint32_t sample_index = 0;
  int64_t first_position = 0;
};

// p_i of row i, [vocab] summing to 1 (sampler.h processed_probs of that row); called only for
// rows whose draft was sampled, in row order, until the first rejection.
using TargetProbs = std::function<std::vector<double>(int32_t row)>;

// drafts: [L]; target_draws: [L + 1]; draft_probs: [L] or empty (all greedy), entry i the
// distribution q_i that drafts[i] was drawn from ([vocab] weights, draw_weighted) or empty for a
// greedy draft.
VerifyResult verify_drafts(std::span<const int32_t> drafts, std::span<const int32_t> target_draws,
                           std::span<const std::vector<float>> draft_probs = {}, const TargetProbs& target_probs = {},
                           const VerifyKey& key = {});

// The same result from decisions already taken per row (the device sampler's kSpecVerify rows,
// ops/cuda/sampling.h): accepted[i] 1 / 0 for a sampled draft (whose rejection emits
// residual[i]), -1 for a greedy one (accepted iff it equals target_draws[i]). Any other value
// (-2: the draft had q = 0) throws InternalError. Spans: drafts [L], target_draws [L + 1],
// accepted and residual [L].
VerifyResult verify_decided(std::span<const int32_t> drafts, std::span<const int32_t> target_draws,
                            std::span<const int32_t> accepted, std::span<const int32_t> residual);

// One rejection-sampling decision over explicit distributions (the rule for a sampled draft):
// returns the draft when accepted, else the residual draw. p: [vocab] summing to 1; q: [vocab]
// non-negative weights, normalised here (q[draft] > 0). u_accept, u_residual in [0, 1).
int32_t rejection_sample(std::span<const double> p, std::span<const float> q, int32_t draft, double u_accept,
                         double u_residual, bool* accepted);

// Inverse-CDF draw over non-negative weights w [vocab] in id order (normalised by their sum):
// how a sampled draft is drawn from q, so that q is exactly the distribution verify assumes.
int32_t draw_weighted(std::span<const float> w, double u);

}  // namespace deepinfer::engine
