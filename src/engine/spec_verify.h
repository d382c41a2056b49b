// Draft verification: which of a sequence's L drafts a verify step accepts, given what the
// target produced at each of its 1 + L sampling rows (row i scores the position of drafts[i];
// row L is the bonus position after the last draft).
//
// The rule today, kMatchTargetDraw: row i is sampled exactly as plain decoding would sample that
// position if drafts[0, i) had been committed (same processed logits, grammar mask, penalties
// over that history, and the same Philox draw keyed by the position), and draft i is accepted
// iff it equals that draw. Greedy: the longest prefix matching the target's argmax, plus the
// target's token at the first mismatch (or the bonus) — exact. Sampling: the output is
// token-identical to plain decoding with the same seed, at a lower acceptance than rejection
// sampling would reach.
//
// Seam for rejection sampling (issue #11): a kRejectionSampling rule accepts draft i with
// probability min(1, p_i(d_i) / q_i(d_i)) and draws the correction from norm(max(0, p_i - q_i));
// it needs the target's processed probabilities p_i of each row (sampler.h processed_probs) and
// the drafter's q_i (model::Drafter::propose's draft_logits). It replaces verify_drafts(); the
// rest of the flow (the runner's rows, update()'s commit and rollback) does not change.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::engine {

enum class DraftAcceptance { kMatchTargetDraw };

struct VerifyResult {
  int32_t num_accepted = 0;      // drafts accepted, in [0, L]
  std::vector<int32_t> tokens;   // [num_accepted + 1]: drafts[0, k) then target_draws[k]
};

// drafts: [L]; target_draws: [L + 1], target_draws[i] the target's token at row i.
VerifyResult verify_drafts(std::span<const int32_t> drafts, std::span<const int32_t> target_draws,
                           DraftAcceptance rule = DraftAcceptance::kMatchTargetDraw);

}  // namespace deepinfer::engine
