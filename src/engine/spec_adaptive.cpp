#include "engine/spec_adaptive.h"

#include <algorithm>

namespace deepinfer::engine {

int DraftGate::bucket(int64_t seqs) {
  int b = 0;
  for (int64_t n = std::max<int64_t>(seqs, 1); n > 1 && b + 1 < kBuckets; n >>= 1) ++b;
  return b;
}

void DraftGate::add(Time& t, double seconds, double alpha, int64_t step) {
  // The first samples of a shape may include one-off work (graph captures, allocations): the
  // smallest of the first three seeds the average; later samples are clamped to twice it.
  if (t.samples < 3) {
    t.seconds = t.samples == 0 ? seconds : std::min(t.seconds, seconds);
  } else {
    t.seconds += alpha * (std::min(seconds, 2.0 * t.seconds) - t.seconds);
  }
  t.samples++;
  t.step = step;
}

void DraftGate::observe_step(StepKind kind, int64_t seqs, double seconds, int64_t step) {
  if (!(seconds > 0) || kind == StepKind::kOther) return;
  Time& t = kind == StepKind::kDrafting ? drafting_[size_t(bucket(seqs))] : plain_[size_t(bucket(seqs))];
  add(t, seconds, config_.alpha, step);
}

void DraftGate::observe_verify(Seq& s, int32_t tokens) const {
  // A plain mean until the request can be judged, then an exponential average.
  if (s.verifies < config_.min_verifies)
    s.tokens_per_verify = (s.tokens_per_verify * s.verifies + tokens) / double(s.verifies + 1);
  else
    s.tokens_per_verify += config_.alpha * (tokens - s.tokens_per_verify);
  s.verifies++;
}

std::optional<double> DraftGate::threshold(int64_t seqs) const {
  if (config_.forced_threshold > 0) return config_.forced_threshold;
  const Time& d = drafting_[size_t(bucket(seqs))];
  const Time& p = plain_[size_t(bucket(seqs))];
  if (d.samples == 0 || p.samples == 0 || !(p.seconds > 0)) return std::nullopt;
  return d.seconds / p.seconds;
}

bool DraftGate::wants_probe(int64_t step, int64_t seqs, bool judgeable) const {
  if (!judgeable || config_.forced_threshold > 0 || (last_probe_ >= 0 && step - last_probe_ < 64)) return false;
  const Time& d = drafting_[size_t(bucket(seqs))];
  const Time& p = plain_[size_t(bucket(seqs))];
  if (d.samples == 0) return false;  // nothing to compare with yet
  return p.samples == 0 || step - p.step > config_.probe_every;
}

void DraftGate::probe_started(int64_t step) {
  last_probe_ = step;
  stats_.probes++;
}

bool DraftGate::drafts(Seq& s, int64_t step, int64_t seqs, std::optional<double> batch_tokens) {
  if (s.off_until >= 0) {
    if (step < s.off_until) return false;
    s.off_until = -1;  // re-probe: judged again after min_verifies fresh verify steps
    s.verifies = 0;
    s.tokens_per_verify = 0;
    stats_.reprobes++;
    return true;
  }
  if (s.verifies < config_.min_verifies) return true;
  const std::optional<double> th = threshold(seqs);
  if (!th) return true;
  stats_.last_threshold = *th;
  if (batch_tokens.value_or(s.tokens_per_verify) >= *th * config_.hysteresis) {
    s.off_period = 0;  // drafting pays (again): the next stop starts short
    return true;
  }
  s.off_period = s.off_period > 0 ? std::min(2 * s.off_period, config_.max_off_steps) : config_.off_steps;
  s.off_until = step + s.off_period;
  stats_.stops++;
  if (!s.ever_off) {
    s.ever_off = true;
    stats_.requests_stopped++;
    stats_.stopped_tokens_per_verify += s.tokens_per_verify;
  }
  return false;
}

}  // namespace deepinfer::engine
