#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/parallel.h"
#include "engine/philox.h"

namespace deepinfer::engine {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool allowed(const std::vector<uint32_t>& mask, int64_t t) { return (mask[size_t(t >> 5)] >> (t & 31)) & 1u; }

// Per-thread scratch for one row: the sampler runs rows in parallel and each would otherwise
// allocate (and page-fault in) several vocab-sized buffers per token.
struct RowScratch {
  std::vector<float> logits, key;         // [vocab]
  std::vector<double> prob;               // [vocab]
  std::vector<int32_t> ids, ids_tmp;      // [#tokens with prob > 0]
  std::vector<uint32_t> bits, bits_tmp;   // radix keys
  std::vector<uint64_t> packed;           // selection keys
};

// Stable LSD radix sort of `ids` by v[id] descending, for v >= 0 (not NaN): the bits of a
// non-negative float order like the float, so the digits of ~bits sort descending. Stability
// keeps equal values in input order. Three 11-bit passes, O(n): ~1 ms at vocab 129k where a
// comparison sort through the indirect key takes ~15 ms. Returns false (ids untouched) when
// some value is negative, -0 or NaN.
bool radix_sort_desc(std::vector<int32_t>& ids, const std::vector<float>& v, RowScratch& s) {
  constexpr int kBits = 11, kBuckets = 1 << kBits;
  const size_t n = ids.size();
  s.bits.resize(n);
  s.bits_tmp.resize(n);
  s.ids_tmp.resize(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &v[size_t(ids[i])], sizeof(b));
    if (b > 0x7f800000u) return false;  // sign bit set, or NaN
    s.bits[i] = ~b;
  }
  for (int shift = 0; shift < 32; shift += kBits) {
    size_t count[kBuckets + 1] = {};
    for (size_t i = 0; i < n; ++i) ++count[((s.bits[i] >> shift) & (kBuckets - 1)) + 1];
    if (count[((s.bits[0] >> shift) & (kBuckets - 1)) + 1] == n) continue;  // one digit value: pass is a no-op
    for (int d = 0; d < kBuckets; ++d) count[d + 1] += count[d];
    for (size_t i = 0; i < n; ++i) {
      const size_t dst = count[(s.bits[i] >> shift) & (kBuckets - 1)]++;
      s.bits_tmp[dst] = s.bits[i];
      s.ids_tmp[dst] = ids[i];
    }
    s.bits.swap(s.bits_tmp);
    ids.swap(s.ids_tmp);
  }
  return true;
}

// The best k of `ids` by v[id] descending (ties: lower id) into ids[0:k), sorted, for v >= 0:
// selection over packed (~bits << 32 | id) keys, so comparisons are plain integer compares
// instead of two indirect float loads. Returns false (ids untouched) for a negative/NaN value.
bool select_desc(std::vector<int32_t>& ids, const std::vector<float>& v, size_t k, RowScratch& s) {
  std::vector<uint64_t>& packed = s.packed;
  packed.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t b;
    std::memcpy(&b, &v[size_t(ids[i])], sizeof(b));
    if (b > 0x7f800000u) return false;  // sign bit set, or NaN
    packed[i] = (uint64_t(~b) << 32) | uint32_t(ids[i]);
  }
  std::nth_element(packed.begin(), packed.begin() + ptrdiff_t(k - 1), packed.end());
  std::sort(packed.begin(), packed.begin() + ptrdiff_t(k));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(uint32_t(packed[i]));
  return true;
}

// Best-first order of the first k of `ids` by value, ties broken by the lower id
// (deterministic; the rest of `ids` is left in unspecified order). Precondition: `ids` is
// ascending (the radix path relies on it for ties).
void sort_desc(std::vector<int32_t>& ids, const std::vector<float>& v, size_t k, RowScratch& s) {
  auto cmp = [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  k = std::min(k, ids.size());
  if (k == 0) return;
  // The order is strict, so every method yields the same first k: select-then-sort for a
  // short prefix, a stable radix sort (ties keep the ascending ids) for a long one.
  if (k * 16 < ids.size()) {
    if (!select_desc(ids, v, k, s)) {
      std::nth_element(ids.begin(), ids.begin() + (k - 1), ids.end(), cmp);
      std::sort(ids.begin(), ids.begin() + k, cmp);
    }
  } else if (!radix_sort_desc(ids, v, s)) {
    std::sort(ids.begin(), ids.end(), cmp);
  }
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
    RowScratch scratch;
    sort_desc(ids, v, size_t(top_n), scratch);
    for (int i = 0; i < top_n && i < vocab; ++i) out.top.emplace_back(ids[size_t(i)], float(double(v[size_t(ids[size_t(i)])]) - lse));
  }
  return out;
}

namespace {
// processed_logits() into `l` (resized to vocab).
void processed_logits_into(const SamplingRow& r, int64_t vocab, std::vector<float>& l) {
  const SamplingParams& p = *r.params;
  l.assign(r.logits, r.logits + vocab);
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
}

// processed_probs() into s.prob, using the rest of `s` as scratch.
void processed_probs_into(const SamplingRow& r, int64_t vocab, RowScratch& s) {
  const SamplingParams& p = *r.params;
  std::vector<float>& l = s.logits;
  processed_logits_into(r, vocab, l);
  // Element-wise loops are vectorised explicitly (the engine builds at -O2): IEEE division and
  // conversion give the same bits in vector and scalar form. Sums stay scalar, in id order.
  const float temperature = p.temperature;
  float* lp = l.data();
#pragma omp simd
  for (int64_t t = 0; t < vocab; ++t) lp[t] /= temperature;
  float mx = *std::max_element(l.begin(), l.end());
  std::vector<double>& prob = s.prob;
  prob.assign(size_t(vocab), 0.0);
  if (mx == kNegInf) return;  // nothing allowed: caller falls back
  double sum = 0;
  for (int64_t t = 0; t < vocab; ++t) sum += prob[size_t(t)] = std::exp(double(l[size_t(t)]) - mx);
  double* pr = prob.data();
#pragma omp simd
  for (int64_t t = 0; t < vocab; ++t) pr[t] /= sum;
  // min-p relative to the most likely token (whose prob is exp(0)/sum).
  if (p.min_p > 0) {
    double thr = p.min_p * (1.0 / sum);
    for (double& x : prob) if (x < thr) x = 0;
  }
  bool need_sort = (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f;
  if (need_sort) {
    std::vector<int32_t>& ids = s.ids;
    ids.clear();
    for (int64_t t = 0; t < vocab; ++t) if (prob[size_t(t)] > 0) ids.push_back(int32_t(t));
    std::vector<float>& key = s.key;
    key.resize(size_t(vocab));
    float* kp = key.data();
#pragma omp simd
    for (int64_t t = 0; t < vocab; ++t) kp[t] = float(pr[t]);
    size_t keep = ids.size();
    if (p.top_k > 0) keep = std::min(keep, size_t(p.top_k));
    sort_desc(ids, key, keep, s);
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
    // Drop everything but the first `keep` ids: the rest of `ids`, and tokens never listed
    // (prob 0 or NaN), in place.
    for (size_t i = keep; i < ids.size(); ++i) prob[size_t(ids[i])] = 0.0;
    for (double& x : prob) if (!(x > 0)) x = 0.0;
  }
  double total = std::accumulate(prob.begin(), prob.end(), 0.0);
#pragma omp simd
  for (int64_t t = 0; t < vocab; ++t) pr[t] /= total;
}

RowScratch& thread_scratch() {
  thread_local RowScratch s;
  return s;
}
}  // namespace

std::vector<float> processed_logits(const SamplingRow& r, int64_t vocab) {
  std::vector<float> l;
  processed_logits_into(r, vocab, l);
  return l;
}

std::vector<double> processed_probs(const SamplingRow& r, int64_t vocab) {
  RowScratch s;
  processed_probs_into(r, vocab, s);
  return std::move(s.prob);
}

namespace {
// True when processed_logits() would return the raw logits unchanged, so a greedy row can
// take the argmax in place (no [vocab] copy per token).
bool logits_untouched(const SamplingRow& r) {
  const SamplingParams& p = *r.params;
  const int64_t n_out = r.output_ids ? int64_t(r.output_ids->size()) : 0;
  const bool min_tokens_active = n_out < p.min_tokens;
  const bool penalties = p.repetition_penalty != 1.0f ||
                         ((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && r.output_ids);
  return p.logit_bias.empty() && !min_tokens_active && !r.allowed_mask && !penalties;
}

int32_t argmax(const float* l, int64_t vocab) {
  int32_t best = 0;
  for (int64_t t = 1; t < vocab; ++t) if (l[t] > l[best]) best = int32_t(t);
  return best;
}

SampleResult sample_one(const SamplingRow& r, int64_t vocab) {
  const SamplingParams& p = *r.params;
  SampleResult res;
  if (p.greedy()) {
    float best;
    if (logits_untouched(r)) {
      res.token = argmax(r.logits, vocab);
      best = r.logits[res.token];
    } else {
      std::vector<float>& l = thread_scratch().logits;
      processed_logits_into(r, vocab, l);
      res.token = argmax(l);
      best = l[size_t(res.token)];
    }
    if (best == kNegInf) res.token = int32_t(std::max<int64_t>(r.eos_token_id, 0));
  } else {
    RowScratch& scratch = thread_scratch();
    processed_probs_into(r, vocab, scratch);
    const std::vector<double>& prob = scratch.prob;
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
  // A greedy row is one pass over the logits (~0.1 ms at vocab 129k); waking the thread pool
  // for a few of those costs more than it saves on a busy machine (idle workers then spin).
  // Rows with temperature (exp, sorting) or logprobs are heavy enough to split.
  bool heavy = false;
  for (const SamplingRow& r : rows) heavy |= !r.params->greedy() || r.params->logprobs.has_value();
  const int64_t grain = heavy ? 1 : std::max<int64_t>(1, (int64_t(1) << 21) / std::max<int64_t>(1, vocab));
  parallel_for(0, int64_t(rows.size()), [&](int64_t i) { out[size_t(i)] = sample_one(rows[size_t(i)], vocab); }, grain);
  return out;
}

}  // namespace deepinfer::engine
