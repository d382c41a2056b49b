#include "engine/spec_budget.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/causal_lm.h"
#include "model/drafter.h"

namespace deepinfer::engine {

namespace {
void check_points(std::vector<std::pair<int64_t, double>>& points, const char* what, bool zero_ok) {
  std::sort(points.begin(), points.end());
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].first <= 0 || !std::isfinite(points[i].second) || points[i].second < 0 ||
        (!zero_ok && points[i].second == 0))
      DI_THROW(InvalidArgument, what, " point ", i, ": ", points[i].first, ", ", points[i].second,
               " s (counts must be positive, times ", zero_ok ? "non-negative" : "positive", ")");
    if (i > 0 && points[i].first == points[i - 1].first)
      DI_THROW(InvalidArgument, what, " points: two for ", points[i].first);
  }
}

// Piecewise linear through sorted points, flat before the first, extended after the last.
double interpolate(const std::vector<std::pair<int64_t, double>>& points, int64_t x) {
  if (points.size() == 1 || x <= points.front().first) return points.front().second;
  size_t hi = 1;
  while (hi + 1 < points.size() && points[hi].first < x) ++hi;
  const auto [x0, c0] = points[hi - 1];
  const auto [x1, c1] = points[hi];
  return c0 + (c1 - c0) * double(x - x0) / double(x1 - x0);
}
}  // namespace

StepCostModel::StepCostModel(std::vector<std::pair<int64_t, double>> points) : points_(std::move(points)) {
  check_points(points_, "step cost", false);
}

double StepCostModel::predict(int64_t tokens) const {
  if (points_.empty()) return 1.0;
  return std::max(interpolate(points_, tokens), points_.front().second * 1e-3);  // never 0 on a noisy fall
}

void StepCostModel::set_draft_rounds(std::vector<std::pair<int64_t, double>> points) {
  check_points(points, "draft round cost", true);
  draft_points_ = std::move(points);
}

double StepCostModel::predict_draft_round(int64_t seqs) const {
  return draft_points_.empty() ? 0.0 : std::max(interpolate(draft_points_, seqs), 0.0);
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
  // Drafter rounds the choice asks for next step: the longest verified run l asks for
  // min(l + 1, max drafts) drafts, i.e. that many rounds minus the first (always run: it feeds).
  int64_t max_drafts = 0;
  for (const DraftCandidate& c : candidates) max_drafts = std::max<int64_t>(max_drafts, int64_t(c.accept.size()));
  const double round = cost.predict_draft_round(int64_t(candidates.size()));
  auto step_time = [&](int64_t n, int64_t longest) {
    return cost.predict(base_tokens + n) + round * double(std::max<int64_t>(std::min(longest + 1, max_drafts) - 1, 0));
  };
  double value = base_value, best_rate = base_value / step_time(0, 0);
  int64_t best_n = 0, longest = 0;
  for (int64_t n = 1; n <= n_max; ++n) {
    const Gain& g = gains[size_t(n - 1)];
    value += g.value;
    longest = std::max<int64_t>(longest, g.index + 1);
    const double rate = value / step_time(n, longest);
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

namespace {
// Seconds of one further drafter round after a 1-token step of B sequences (B = 1 and max_seqs):
// (time of a proposal of 3 drafts - time of 1 draft) / 2, best of `repeats`. Empty without a
// drafter that drafts 3, or when the cache cannot hold the sequences.
std::vector<std::pair<int64_t, double>> measure_draft_rounds(model::CausalLM& m, const kv::CacheGeometry& g,
                                                             int64_t max_seqs, bool device_logits, int repeats) {
  model::Drafter* d = m.drafter();
  std::vector<std::pair<int64_t, double>> out;
  if (!d || d->max_draft_tokens() < 3 || m.max_rollback() < 3) return out;
  const int64_t most = std::min({std::max<int64_t>(max_seqs, 1), g.num_slots, g.num_blocks});
  for (int64_t B : {int64_t(1), most}) {
    if (!out.empty() && B <= out.back().first) break;
    model::ForwardBatch b;
    for (int64_t s = 0; s < B; ++s) {
      b.seqs.push_back({.cache_slot = int32_t(s), .block_table = {int32_t(s)}, .num_computed_tokens = 0,
                        .num_new_tokens = 1});
      b.token_ids.push_back(int32_t((s * 131 + 3) % m.vocab_size()));
      b.hidden_indices.push_back(int32_t(s));
      b.logits_indices.push_back(int32_t(s));
    }
    double t[2] = {0, 0};
    for (int r = 0; r < std::max(repeats, 1); ++r)
      for (int k = 0; k < 2; ++k) {
        for (int64_t s = 0; s < B; ++s) m.reset_slot(int32_t(s));
        const model::ForwardOutput o = m.run(b, {.logits_on_device = device_logits, .hidden_to_host = !device_logits});
        model::DraftBatch db;
        db.target_hidden = o.hidden;
        for (int64_t s = 0; s < B; ++s)
          db.seqs.push_back({.cache_slot = int32_t(s), .block_table = {int32_t(s)}, .first_position = 0,
                             .num_positions = 1, .next_tokens = {int32_t((s * 17 + 5) % m.vocab_size())},
                             .num_drafts = k == 0 ? 1 : 3, .first_hidden_row = s});
        m.synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        d->propose(db);
        m.synchronize();
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        t[k] = r == 0 ? dt : std::min(t[k], dt);
      }
    out.push_back({B, std::max((t[1] - t[0]) / 2, 0.0)});
  }
  return out;
}
}  // namespace

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
  StepCostModel cost(std::move(points));
  cost.set_draft_rounds(measure_draft_rounds(m, g, max_seqs, device_logits, repeats));
  for (int64_t s = 0; s < std::min<int64_t>(std::max<int64_t>(max_seqs, 1), g.num_slots); ++s) m.reset_slot(int32_t(s));
  return cost;
}

}  // namespace deepinfer::engine
