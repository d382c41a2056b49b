#include "engine/spec_verify.h"

#include <algorithm>

#include "core/check.h"
#include "engine/philox.h"

namespace deepinfer::engine {

int32_t draw_weighted(std::span<const float> w, double u) {
  double total = 0;
  for (float x : w) total += x > 0 ? double(x) : 0.0;
  DI_CHECK(total > 0, "draw_weighted: no positive weight among ", w.size());
  const double target = u * total;
  double acc = 0;
  int32_t last = -1;
  for (size_t t = 0; t < w.size(); ++t) {
    if (!(w[t] > 0)) continue;
    last = int32_t(t);
    acc += double(w[t]);
    if (target < acc) break;
  }
  return last;  // rounding can leave the target past the last positive weight, which then takes it
}

int32_t rejection_sample(std::span<const double> p, std::span<const float> q, int32_t draft, double u_accept,
                         double u_residual, bool* accepted) {
  DI_CHECK(p.size() == q.size() && draft >= 0 && size_t(draft) < p.size(), "rejection_sample: p of ", p.size(),
           " q of ", q.size(), " draft ", draft);
  double qsum = 0;
  for (float x : q) qsum += x > 0 ? double(x) : 0.0;
  const double qd = q[size_t(draft)] > 0 ? double(q[size_t(draft)]) / qsum : 0.0, pd = p[size_t(draft)];
  DI_CHECK(qd > 0, "rejection_sample: draft ", draft, " has q = ", qd, " (it was not drawn from q)");
  // Accept with probability min(1, p/q): u < p/q, written without the division.
  *accepted = u_accept * qd < pd;
  if (*accepted) return draft;
  // Residual norm(max(0, p - q)), drawn by inverse CDF in id order (as the sampler draws).
  auto residual = [&](size_t t) { return std::max(0.0, p[t] - (q[t] > 0 ? double(q[t]) / qsum : 0.0)); };
  double total = 0;
  for (size_t t = 0; t < p.size(); ++t) total += residual(t);
  int32_t last = -1;
  if (total > 0) {
    const double target = u_residual * total;
    double acc = 0;
    for (size_t t = 0; t < p.size(); ++t) {
      const double r = residual(t);
      if (r <= 0) continue;
      last = int32_t(t);
      acc += r;
      if (target < acc) return last;
    }
    if (last >= 0) return last;  // rounding left the target past the last residual token
  }
  // p <= q everywhere means p == q, where a rejection has probability 0; under rounding, draw
  // from p itself.
  double acc = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] <= 0) continue;
    last = int32_t(t);
    acc += p[t];
    if (u_residual < acc) return last;
  }
  DI_CHECK(last >= 0, "rejection_sample: the target distribution is empty");
  return last;
}

VerifyResult verify_drafts(std::span<const int32_t> drafts, std::span<const int32_t> target_draws,
                           std::span<const std::vector<float>> draft_probs, const TargetProbs& target_probs,
                           const VerifyKey& key) {
  DI_CHECK(target_draws.size() == drafts.size() + 1, "verify: ", target_draws.size(), " target rows for ",
           drafts.size(), " drafts");
  DI_CHECK(draft_probs.empty() || draft_probs.size() == drafts.size(), "verify: ", draft_probs.size(),
           " draft distributions for ", drafts.size(), " drafts");
  VerifyResult r;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const bool sampled = !draft_probs.empty() && !draft_probs[i].empty();
    if (!sampled) {  // one-hot q: coupled to plain decoding's draw
      if (drafts[i] != target_draws[i]) {
        r.tokens.push_back(target_draws[i]);
        return r;
      }
    } else {
      DI_CHECK(bool(target_probs), "verify: a sampled draft without target probabilities");
      const std::vector<double> p = target_probs(int32_t(i));
      const int64_t pos = key.first_position + int64_t(i);
      bool accepted = false;
      const int32_t tok =
          rejection_sample(p, draft_probs[i], drafts[i], philox_uniform(key.seed, key.sample_index, pos, DrawStream::kSpecAccept),
                           philox_uniform(key.seed, key.sample_index, pos, DrawStream::kSpecResidual), &accepted);
      if (!accepted) {
        r.tokens.push_back(tok);
        return r;
      }
    }
    r.tokens.push_back(drafts[i]);
    ++r.num_accepted;
  }
  r.tokens.push_back(target_draws[drafts.size()]);  // the bonus: plain decoding's draw after all drafts
  return r;
}

VerifyResult verify_decided(std::span<const int32_t> drafts, std::span<const int32_t> target_draws,
                            std::span<const int32_t> accepted, std::span<const int32_t> residual) {
  DI_CHECK(target_draws.size() == drafts.size() + 1 && accepted.size() == drafts.size() &&
               residual.size() == drafts.size(),
           "verify: ", target_draws.size(), " target rows, ", accepted.size(), " decisions and ", residual.size(),
           " residuals for ", drafts.size(), " drafts");
  VerifyResult r;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const int32_t a = accepted[i];
    if (a != -1 && a != 0 && a != 1)
      DI_THROW(InternalError, "verify: draft ", i, " (token ", drafts[i], ") has decision ", a,
               a == -2 ? " (q = 0 at the draft: it was not drawn from its recorded distribution)" : "");
    const bool ok = a == -1 ? drafts[i] == target_draws[i] : a == 1;
    if (!ok) {
      r.tokens.push_back(a == -1 ? target_draws[i] : residual[i]);
      return r;
    }
    r.tokens.push_back(drafts[i]);
    ++r.num_accepted;
  }
  r.tokens.push_back(target_draws[drafts.size()]);
  return r;
}

}  // namespace deepinfer::engine
