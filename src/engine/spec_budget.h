// Variable-length verification (DEEPINFER_ENABLE_MTP_VARLEN=1): how many of its drafts each
// sequence verifies this step, chosen for the whole step at once.
//
// Model. Verifying the first l drafts of a sequence commits 1 + sum_{j<=l} prod_{i<=j} a_i
// tokens in expectation, a_i the probability that draft i is accepted given drafts < i were.
// A step of T tokens costs c(T) seconds (StepCostModel, measured by the engine at start-up).
// The step's drafts maximise (expected committed tokens of its sampling sequences) / c(T): the
// marginal gains prod_{i<=j} a_i fall along each sequence, so the best choice for any number of
// extra tokens N takes the N largest gains (each sequence's gains in order); the planner scans N.
//
// a_i comes from the drafter's confidence: V4's MTP has no confidence head, so a draft's
// estimate is the drafter's own probability of it (its raw softmax), calibrated by what the
// engine observed: AcceptanceModel keeps, per draft position and probability decile, how often
// such drafts were accepted, and blends that with the raw probability (a prior worth a few
// observations). V4.1's DSpark confidence head plugs in as the raw estimate instead.
#pragma once
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace deepinfer::kv {
struct CacheGeometry;
}
namespace deepinfer::model {
class CausalLM;
}

namespace deepinfer::engine {

// Predicted step time (seconds) for a step of T tokens: piecewise linear through measured
// (tokens, seconds) points, flat before the first and extended along the last segment after the
// last. Empty: every step costs 1 (drafts are then free, verified whenever they may be accepted).
class StepCostModel {
 public:
  StepCostModel() = default;
  // Points with distinct token counts > 0 (sorted here); times > 0.
  explicit StepCostModel(std::vector<std::pair<int64_t, double>> points);
  double predict(int64_t tokens) const;
  const std::vector<std::pair<int64_t, double>>& points() const { return points_; }
  bool empty() const { return points_.empty(); }
  // The drafter's cost: seconds of one further draft round (one more draft for every drafting
  // sequence) with `seqs` sequences drafting, piecewise linear through (seqs, seconds) points
  // (same rules as above, times >= 0). None set: drafting is free (0).
  void set_draft_rounds(std::vector<std::pair<int64_t, double>> points);
  double predict_draft_round(int64_t seqs) const;
  const std::vector<std::pair<int64_t, double>>& draft_points() const { return draft_points_; }

 private:
  std::vector<std::pair<int64_t, double>> points_, draft_points_;
};

// Calibrated acceptance probability of a draft from the drafter's raw probability of it.
class AcceptanceModel {
 public:
  static constexpr int kPositions = 8;   // draft positions tracked apart (later ones share the last)
  static constexpr int kBins = 10;       // raw probability deciles
  static constexpr double kPrior = 4.0;  // weight of the raw probability, in observations

  double predict(int32_t position, float draft_prob) const;
  // A verified draft: accepted, or the first rejected one (drafts after it are not observed).
  void observe(int32_t position, float draft_prob, bool accepted);
  int64_t num_observed() const { return observed_; }

 private:
  struct Cell {
    double accepted = 0, seen = 0;
  };
  static int bin(float p);
  std::array<std::array<Cell, kBins>, kPositions> cells_{};
  int64_t observed_ = 0;
};

// One sampling sequence that could verify drafts this step.
struct DraftCandidate {
  std::vector<double> accept;  // [max drafts] a_i, conditional acceptance of draft i
};

// Draft lengths [candidates] maximising expected committed tokens per predicted step time for a
// step whose other tokens number `base_tokens` (every candidate's own token included), using at
// most `max_extra` draft tokens in all (the token budget left). The step time counts the drafter
// rounds the choice asks for next (varlen asks each sequence for one draft more than it verified,
// so the longest verified run l costs min(l + 1, max drafts) - 1 rounds beyond the first), at
// cost.predict_draft_round(candidates).
std::vector<int32_t> choose_draft_lengths(const std::vector<DraftCandidate>& candidates, int64_t base_tokens,
                                          int64_t max_extra, const StepCostModel& cost);

// Measures the model's step time for verify-shaped steps of up to `max_tokens` tokens (1, 2, 4,
// ... and max_tokens), the tokens spread over up to `max_seqs` sequences starting at position 0,
// every row's logits and hidden rows asked for (as a verify step with drafting asks), and, when
// the model has a drafter, the cost of a further draft round after 1-token steps of 1 and
// max_seqs sequences (proposals of 1 and 3 drafts timed), best of
// `repeats` (the first warms up: a device backend captures its graphs on later ones). Runs before the engine hands out any cache: it writes slots and blocks of
// `geometry` and resets the slots it used. `device_logits`: leave logits on the device (the
// engine samples there).
StepCostModel measure_step_cost(model::CausalLM& model, const kv::CacheGeometry& geometry, int64_t max_tokens,
                                int64_t max_seqs, bool device_logits, int repeats = 3);

}  // namespace deepinfer::engine
