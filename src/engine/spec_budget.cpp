#include "engine/spec_budget.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/causal_lm.h"

namespace deepinfer::engine {

StepCostModel::StepCostModel(std::vector<std::pair<int64_t, double>> points) : points_(std::move(points)) {
  std::sort(points_.begin(), points_.end());
  for (size_t i = 0; i < points_.size(); ++i) {
    if (points_[i].first <= 0 || !(points_[i].second > 0) || !std::isfinite(points_[i].second))
      DI_THROW(InvalidArgument, "step cost point ", i, ": ", points_[i].first, " tokens, ", points_[i].second,
               " s (tokens and time must be positive)");
    if (i > 0 && points_[i].first == points_[i - 1].first)
      DI_THROW(InvalidArgument, "step cost points: two for ", points_[i].first, " tokens");
  }
}

double StepCostModel::predict(int64_t tokens) const {
  if (points_.empty()) return 1.0;
  if (points_.size() == 1 || tokens <= points_.front().first) return points_.front().second;
  size_t hi = 1;
  while (hi + 1 < points_.size() && points_[hi].first < tokens) ++hi;
  const auto [t0, c0] = points_[hi - 1];
  const auto [t1, c1] = points_[hi];
  const double c = c0 + (c1 - c0) * double(tokens - t0) / double(t1 - t0);
  return std::max(c, points_.front().second * 1e-3);  // a noisy falling segment never goes to 0
}

int AcceptanceModel::bin(float p) {
  const int b = int(std::floor(double(p) * kBins));
  return std::clamp(b, 0, kBins - 1);
}

double AcceptanceModel::predict(int32_t position, float draft_prob) const {
  const float p = std::isfinite(draft_prob) ? std::clamp(draft_prob, 0.f, 1.f) : 0.f;
  const Cell& c = cells_[size_t(std::clamp(position, 0, kPositions - 1))][size_t(bin(p))];
  return (c.accepted + kPrior * double(p)) / (c.seen + kPrior);
}

void AcceptanceModel::observe(int32_t position, float draft_prob, bool accepted) {
  const float p = std::isfinite(draft_prob) ? std::clamp(draft_prob, 0.f, 1.f) : 0.f;
  Cell& c = cells_[size_t(std::clamp(position, 0, kPositions - 1))][size_t(bin(p))];
  c.seen += 1;
  c.accepted += accepted ? 1 : 0;
  ++observed_;
}

std::vector<int32_t> choose_draft_lengths(const std::vector<DraftCandidate>& candidates, int64_t base_tokens,
                                          int64_t max_extra, const StepCostModel& cost) {
  struct Gain {
    double value;  // expected extra committed tokens of this draft (prod of a_i up to it)
    size_t seq;
    int32_t index;
  };
  std::vector<Gain> gains;
  for (size_t s = 0; s < candidates.size(); ++s) {
    double prod = 1;
    for (size_t i = 0; i < candidates[s].accept.size(); ++i) {
      prod *= std::clamp(candidates[s].accept[i], 0.0, 1.0);
      if (!(prod > 0)) break;
      gains.push_back({prod, s, int32_t(i)});
    }
  }
  // Largest gains first; a sequence's own gains never rise, and ties keep draft order, so every
  // prefix of this order gives each sequence a prefix of its drafts.
  std::stable_sort(gains.begin(), gains.end(), [](const Gain& a, const Gain& b) { return a.value > b.value; });
  const int64_t n_max = std::min<int64_t>(int64_t(gains.size()), std::max<int64_t>(max_extra, 0));
  const double base_value = double(candidates.size());
  double value = base_value, best_rate = base_value / cost.predict(base_tokens);
  int64_t best_n = 0;
  for (int64_t n = 1; n <= n_max; ++n) {
    value += gains[size_t(n - 1)].value;
    const double rate = value / cost.predict(base_tokens + n);
    if (rate > best_rate * (1 + 1e-12)) best_rate = rate, best_n = n;
  }
  std::vector<int32_t> lengths(candidates.size(), 0);
  for (int64_t n = 0; n < best_n; ++n) {
    const Gain& g = gains[size_t(n)];
    DI_CHECK(lengths[g.seq] == g.index, "draft gains out of order for candidate ", g.seq);
    lengths[g.seq] = g.index + 1;
  }
  return lengths;
}

StepCostModel measure_step_cost(model::CausalLM& m, const kv::CacheGeometry& g, int64_t max_tokens, int64_t max_seqs,
                                bool device_logits, int repeats) {
  std::vector<int64_t> sizes;
  for (int64_t t = 1; t < max_tokens; t *= 2) sizes.push_back(t);
  if (max_tokens > 0) sizes.push_back(max_tokens);
  std::vector<std::pair<int64_t, double>> points;
  const int64_t bt = std::max<int64_t>(g.block_tokens, 1);
  for (int64_t T : sizes) {
    // B sequences of T / B tokens (the first ones one more), each in its own slot and blocks.
    int64_t B = std::min({T, std::max<int64_t>(max_seqs, 1), g.num_slots});
    while (B > 1 && B * ((T + B - 1) / B + bt - 1) / bt > g.num_blocks) --B;
    const int64_t per = (T + B - 1) / B;
    if (B < 1 || B * ((per + bt - 1) / bt) > g.num_blocks) break;  // the cache cannot hold this step
    model::ForwardBatch b;
    int32_t next_block = 0;
    for (int64_t s = 0; s < B; ++s) {
      const int64_t n = T / B + (s < T % B ? 1 : 0);
      model::SeqInBatch q{.cache_slot = int32_t(s), .num_computed_tokens = 0, .num_new_tokens = int32_t(n)};
      for (int64_t k = 0; k < (n + bt - 1) / bt; ++k) q.block_table.push_back(next_block++);
      for (int64_t j = 0; j < n; ++j) b.token_ids.push_back(int32_t((s * 131 + j * 7 + 3) % m.vocab_size()));
      b.seqs.push_back(std::move(q));
    }
    for (int64_t t = 0; t < T; ++t) b.logits_indices.push_back(int32_t(t));
    b.hidden_indices = b.logits_indices;
    double best = 0;
    for (int r = 0; r < std::max(repeats, 1); ++r) {
      for (int64_t s = 0; s < B; ++s) m.reset_slot(int32_t(s));
      const auto t0 = std::chrono::steady_clock::now();
      m.run(b, {.logits_on_device = device_logits, .hidden_to_host = !device_logits});
      m.synchronize();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = r == 0 ? dt : std::min(best, dt);
    }
    points.push_back({T, std::max(best, 1e-9)});
  }
  for (int64_t s = 0; s < std::min<int64_t>(std::max<int64_t>(max_seqs, 1), g.num_slots); ++s) m.reset_slot(int32_t(s));
  return StepCostModel(std::move(points));
}

}  // namespace deepinfer::engine
