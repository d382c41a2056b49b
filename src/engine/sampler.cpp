#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/parallel.h"
#include "engine/philox.h"

namespace deepinfer::engine {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool allowed(const std::vector<uint32_t>& mask, int64_t t) { return (mask[size_t(t >> 5)] >> (t & 31)) & 1u; }

// Best-first order of `ids` by value, ties broken by the lower id (deterministic).
void sort_desc(std::vector<int32_t>& ids, const std::vector<float>& v, size_t k) {
  auto cmp = [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  k = std::min(k, ids.size());
  if (k < ids.size()) std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), cmp);
  else std::sort(ids.begin(), ids.end(), cmp);
}

void apply_penalties(const SamplingRow& r, std::vector<float>& l, int64_t vocab) {
  const SamplingParams& p = *r.params;
  if (p.repetition_penalty != 1.0f) {
    std::vector<uint8_t> seen(size_t(vocab), 0);
    auto mark = [&](const std::vector<int32_t>* ids) {
      if (ids) for (int32_t t : *ids) if (t >= 0 && t < vocab) seen[size_t(t)] = 1;
    };
    mark(r.prompt_ids);
    mark(r.output_ids);
    for (int64_t t = 0; t < vocab; ++t)
      if (seen[size_t(t)]) l[size_t(t)] = l[size_t(t)] > 0 ? l[size_t(t)] / p.repetition_penalty : l[size_t(t)] * p.repetition_penalty;
  }
  if ((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && r.output_ids) {
    std::vector<int32_t> count(size_t(vocab), 0);
    for (int32_t t : *r.output_ids) if (t >= 0 && t < vocab) ++count[size_t(t)];
    for (int64_t t = 0; t < vocab; ++t)
      if (count[size_t(t)] > 0) l[size_t(t)] -= p.frequency_penalty * float(count[size_t(t)]) + p.presence_penalty;
  }
}

int32_t argmax(const std::vector<float>& l) {
  int32_t best = 0;
  for (size_t t = 1; t < l.size(); ++t) if (l[t] > l[size_t(best)]) best = int32_t(t);
  return best;
}
}  // namespace

TokenLogprobs compute_logprobs(const float* logits, int64_t vocab, int32_t token, int top_n) {
  DI_CHECK(token >= 0 && token < vocab, "token=", token, " vocab=", vocab);
  float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t t = 0; t < vocab; ++t) sum += std::exp(double(logits[t]) - mx);
  double lse = mx + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = float(double(logits[token]) - lse);
  int32_t rank = 1;
  for (int64_t t = 0; t < vocab; ++t) rank += logits[t] > logits[token];
  out.rank = rank;
  if (top_n > 0) {
    std::vector<float> v(logits, logits + vocab);
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    sort_desc(ids, v, size_t(top_n));
    for (int i = 0; i < top_n && i < vocab; ++i) out.top.emplace_back(ids[size_t(i)], float(double(v[size_t(ids[size_t(i)])]) - lse));
  }
  return out;
}

std::vector<float> processed_logits(const SamplingRow& r, int64_t vocab) {
  const SamplingParams& p = *r.params;
  std::vector<float> l(r.logits, r.logits + vocab);
  for (auto [t, b] : p.logit_bias) if (t >= 0 && t < vocab) l[size_t(t)] += b;
  int64_t n_out = r.output_ids ? int64_t(r.output_ids->size()) : 0;
  if (n_out < p.min_tokens) {
    if (r.eos_token_id >= 0 && r.eos_token_id < vocab) l[size_t(r.eos_token_id)] = kNegInf;
    for (int32_t t : p.stop_token_ids) if (t >= 0 && t < vocab) l[size_t(t)] = kNegInf;
  }
  if (r.allowed_mask) {
    DI_CHECK(int64_t(r.allowed_mask->size()) * 32 >= vocab, "grammar bitmask too short");
    for (int64_t t = 0; t < vocab; ++t) if (!allowed(*r.allowed_mask, t)) l[size_t(t)] = kNegInf;
  }
  apply_penalties(r, l, vocab);
  return l;
}

std::vector<double> processed_probs(const SamplingRow& r, int64_t vocab) {
  const SamplingParams& p = *r.params;
  std::vector<float> l = processed_logits(r, vocab);
  for (float& x : l) x /= p.temperature;
  float mx = *std::max_element(l.begin(), l.end());
  std::vector<double> prob(size_t(vocab), 0.0);
  if (mx == kNegInf) return prob;  // nothing allowed: caller falls back
  double sum = 0;
  for (int64_t t = 0; t < vocab; ++t) sum += prob[size_t(t)] = std::exp(double(l[size_t(t)]) - mx);
  for (double& x : prob) x /= sum;
  // min-p relative to the most likely token (whose prob is exp(0)/sum).
  if (p.min_p > 0) {
    double thr = p.min_p * (1.0 / sum);
    for (double& x : prob) if (x < thr) x = 0;
  }
  bool need_sort = (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f;
  if (need_sort) {
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < vocab; ++t) if (prob[size_t(t)] > 0) ids.push_back(int32_t(t));
    std::vector<float> key(static_cast<size_t>(vocab));
    for (int64_t t = 0; t < vocab; ++t) key[size_t(t)] = float(prob[size_t(t)]);
    size_t keep = ids.size();
    if (p.top_k > 0) keep = std::min(keep, size_t(p.top_k));
    sort_desc(ids, key, keep);
    if (p.top_p < 1.0f) {
      // Smallest best-first prefix whose mass (within the top-k set) reaches top_p.
      double mass = 0;
      for (size_t i = 0; i < keep; ++i) mass += prob[size_t(ids[i])];
      double acc = 0;
      size_t i = 0;
      for (; i < keep; ++i) {
        acc += prob[size_t(ids[i])];
        if (acc >= p.top_p * mass) { ++i; break; }
      }
      keep = std::max<size_t>(1, std::min(i, keep));
    }
    std::vector<double> kept(size_t(vocab), 0.0);
    for (size_t i = 0; i < keep; ++i) kept[size_t(ids[i])] = prob[size_t(ids[i])];
    prob.swap(kept);
  }
  double total = std::accumulate(prob.begin(), prob.end(), 0.0);
  for (double& x : prob) x /= total;
  return prob;
}

namespace {
SampleResult sample_one(const SamplingRow& r, int64_t vocab) {
  const SamplingParams& p = *r.params;
  SampleResult res;
  if (p.greedy()) {
    std::vector<float> l = processed_logits(r, vocab);
    res.token = argmax(l);
    if (l[size_t(res.token)] == kNegInf) res.token = int32_t(std::max<int64_t>(r.eos_token_id, 0));
  } else {
    std::vector<double> prob = processed_probs(r, vocab);
    double u = philox_uniform(r.seed, r.sample_index, r.position);
    double acc = 0;
    int32_t last_kept = -1;
    for (int64_t t = 0; t < vocab; ++t) {
      if (prob[size_t(t)] <= 0) continue;
      last_kept = int32_t(t);
      acc += prob[size_t(t)];
      if (u < acc) break;
    }
    // u is below the total mass (1 up to rounding); rounding can leave it past the last
    // kept token, which then takes it. No kept token at all: fall back to EOS.
    res.token = last_kept >= 0 ? last_kept : int32_t(std::max<int64_t>(r.eos_token_id, 0));
  }
  if (p.logprobs) res.logprobs = compute_logprobs(r.logits, vocab, res.token, *p.logprobs);
  return res;
}
}  // namespace

std::vector<SampleResult> sample_rows(std::span<const SamplingRow> rows, int64_t vocab) {
  std::vector<SampleResult> out(rows.size());
  parallel_for(0, int64_t(rows.size()), [&](int64_t i) { out[size_t(i)] = sample_one(rows[size_t(i)], vocab); });
  return out;
}

}  // namespace deepinfer::engine
