// ToyDrafter: a deterministic model::Drafter over ToyModel for engine tests. It continues the
// target exactly from its hidden rows (ToyState), so its greedy drafts are what the target's
// raw argmax would produce, and a pattern decides how many of them it proposes correctly
// before a deliberately wrong one: any acceptance length 0..L can be forced.
// It also checks that the engine feeds it as the Drafter contract says: each slot's positions
// contiguous (a fresh sequence starts at 0), every hidden row consistent with the token fed
// after the previous one, and no positions of rejected drafts.
#pragma once
#include <cstdint>
#include <functional>
#include <unordered_map>

#include "engine/toy_model.h"
#include "model/drafter.h"

namespace deepinfer::engine {

// How many drafts, of those proposed after the anchor at position `anchor_position`, are the
// target's greedy continuation (the rest start with a token the target would not pick).
using ToyAcceptPattern = std::function<int32_t(int64_t anchor_position)>;

class ToyDrafter final : public model::Drafter {
 public:
  ToyDrafter(const ToyModelConfig& config, int64_t max_draft_tokens, ToyAcceptPattern pattern)
      : cfg_(config), max_drafts_(max_draft_tokens), pattern_(std::move(pattern)) {}
  // Picker mode (rejection-sampling tests): every draft is the batch's DraftPicker's choice from
  // the target's logits perturbed by `noise` (a fixed pseudo-random offset per token and
  // position), so the draft distribution q differs from the target's p; the pattern is unused.
  void use_picker(float noise) { picker_noise_ = noise; }
  // Accepts feeds that skip positions (plain steps of adaptive drafting: no drafter follows them);
  // by default a slot's positions must be contiguous. Skipped positions are counted.
  void allow_gaps(bool on) { allow_gaps_ = on; }
  int64_t num_skipped_positions() const { return num_skipped_; }
  std::string describe() const override { return "ToyDrafter"; }
  int64_t max_draft_tokens() const override { return max_drafts_; }
  std::vector<model::DraftProposal> propose(const model::DraftBatch& batch, Tensor* draft_logits = nullptr) override;

  // The target restored `slot` from a snapshot at `position` (prefix reuse): feeding resumes there.
  void restored(int32_t slot, int64_t position) { next_position_[slot] = position; }
  int64_t num_fed_positions() const { return num_fed_; }
  int64_t num_proposed() const { return num_proposed_; }

 private:
  model::DraftProposal propose_one(const model::DraftSeq& s, const float* last_hidden, model::DraftPicker* picker,
                                   size_t seq);
  void check_feed(const model::DraftSeq& s, const float* hidden0) const;

  ToyModelConfig cfg_;
  int64_t max_drafts_;
  ToyAcceptPattern pattern_;
  std::unordered_map<int32_t, int64_t> next_position_;  // slot -> first position not yet fed
  int64_t num_fed_ = 0, num_proposed_ = 0, num_skipped_ = 0;
  bool allow_gaps_ = false;
  float picker_noise_ = -1.f;  // < 0: pattern mode
};

}  // namespace deepinfer::engine
