// Device sampler (see sampling.h for the semantics and the exactness policy). One block per
// row; the row's processed logits, then its probabilities, live in the fp64 workspace row.
// All fp32 arithmetic uses explicit _rn intrinsics so nvcc cannot contract it into FMAs the
// CPU twin (plain x86-64 SSE, no FMA) does not do.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <cmath>

#include "engine/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/sampling.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::kWarpSize;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kDigitBits = 4;  // radix digit of the selects: 16 buckets kept in registers
constexpr int kBuckets = 1 << kDigitBits;
constexpr float kGreedyBelow = 1e-5f;  // SamplingParams::greedy()

struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const { return a < b ? b : a; }
};

struct Smem {
  union {
    cub::BlockReduce<double, kThreads>::TempStorage red_d;
    cub::BlockReduce<float, kThreads>::TempStorage red_f;
    cub::BlockReduce<unsigned long long, kThreads>::TempStorage red_u;
    cub::BlockReduce<int, kThreads>::TempStorage red_i;
    cub::BlockScan<double, kThreads>::TempStorage scan_d;
  } tmp;
  int cnt[kWarps][kBuckets];       // per-warp bucket counts of one radix pass
  double mass[kWarps][kBuckets];   // per-warp bucket masses (top-p)
  int digit, digit_count;          // the pass's chosen bucket (-1: rounding fallback)
  double bcast_d;
  float bcast_f;
  int bcast_i;
  unsigned long long bcast_u;
  unsigned long long top_keys[kSamplingMaxTopLogprobs];
  int top_n;
};

// ---- fixed-order block reductions (CUB warp reductions, then warps in order); every thread
// gets the result ----
__device__ double block_sum(double v, Smem& s) {
  const double r = cub::BlockReduce<double, kThreads>(s.tmp.red_d).Sum(v);
  if (threadIdx.x == 0) s.bcast_d = r;
  __syncthreads();
  const double out = s.bcast_d;
  __syncthreads();
  return out;
}
__device__ int block_sum(int v, Smem& s) {
  const int r = cub::BlockReduce<int, kThreads>(s.tmp.red_i).Sum(v);
  if (threadIdx.x == 0) s.bcast_i = r;
  __syncthreads();
  const int out = s.bcast_i;
  __syncthreads();
  return out;
}
__device__ int block_max(int v, Smem& s) {
  const int r = cub::BlockReduce<int, kThreads>(s.tmp.red_i).Reduce(v, MaxOp{});
  if (threadIdx.x == 0) s.bcast_i = r;
  __syncthreads();
  const int out = s.bcast_i;
  __syncthreads();
  return out;
}
__device__ float block_max(float v, Smem& s) {
  const float r = cub::BlockReduce<float, kThreads>(s.tmp.red_f).Reduce(v, MaxOp{});
  if (threadIdx.x == 0) s.bcast_f = r;
  __syncthreads();
  const float out = s.bcast_f;
  __syncthreads();
  return out;
}
__device__ uint64_t block_max(uint64_t v, Smem& s) {
  const unsigned long long r =
      cub::BlockReduce<unsigned long long, kThreads>(s.tmp.red_u).Reduce((unsigned long long)v, MaxOp{});
  if (threadIdx.x == 0) s.bcast_u = r;
  __syncthreads();
  const uint64_t out = s.bcast_u;
  __syncthreads();
  return out;
}

// ---- keys: unique 64-bit, larger = better; value order first, then the LOWER id ----
__device__ __forceinline__ uint32_t order_bits(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;  // -0 ties with +0, as a float comparison says
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ uint64_t make_key(float v, int64_t t) {
  return (uint64_t(order_bits(v)) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(t));
}
__device__ __forceinline__ int32_t key_id(uint64_t key) { return int32_t(0xFFFFFFFFu - uint32_t(key)); }

// Draws: the engine's Philox4x32-10 keyed by (seed, sample index, position), the same code as
// the host sampler (src/engine/philox.h is host+device).
using engine::philox_uniform;

// Elements seen by the selects: candidate probabilities of the row (p > 0, key >= floor) ...
struct ProbElems {
  const double* w;
  uint64_t floor;
  __device__ bool operator()(int64_t t, uint64_t& key, double& weight) const {
    weight = w[t];
    if (!(weight > 0)) return false;
    key = make_key(__double2float_rn(weight), t);
    return key >= floor;
  }
};
// ... or the raw logits (top-N logprobs).
struct RawElems {
  const float* x;
  __device__ bool operator()(int64_t t, uint64_t& key, double& weight) const {
    key = make_key(x[t], t);
    weight = 0;
    return true;
  }
};

// Smallest key among elements whose key matches `prefix` on `mask`.
template <class Elems>
__device__ uint64_t min_matching_key(int64_t n, const Elems& elems, uint64_t prefix, uint64_t mask, Smem& s) {
  uint64_t best = 0;  // max of ~key
  for (int64_t t = threadIdx.x; t < n; t += kThreads) {
    uint64_t key;
    double w;
    if (elems(t, key, w) && (key & mask) == prefix) best = best > ~key ? best : ~key;
  }
  return ~block_max(best, s);
}

// Radix select over unique keys, kDigitBits per pass, most significant first.
//  kMass = false: the k-th largest key (1 <= k <= #elements).
//  kMass = true:  the first key, best first, at which the running mass reaches `target`
//                 (top-p); when rounding leaves it unreached, the smallest key of the bucket.
// Stops early once the chosen bucket's smallest key is the answer. Bucket sums are fixed-order.
template <bool kMass, class Elems>
__device__ uint64_t radix_select(int64_t n, const Elems& elems, int64_t k, double target, Smem& s) {
  uint64_t prefix = 0, mask = 0;
  int64_t rem = k;      // thread 0's: rank still to skip
  double above = 0.0;   // thread 0's: mass of the buckets above the chosen one
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int shift = 64 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    int cnt[kBuckets];
    double mass[kBuckets];
#pragma unroll
    for (int b = 0; b < kBuckets; ++b) {
      cnt[b] = 0;
      mass[b] = 0.0;
    }
    for (int64_t t = threadIdx.x; t < n; t += kThreads) {
      uint64_t key;
      double w;
      if (!elems(t, key, w) || (key & mask) != prefix) continue;
      const int d = int(key >> shift) & (kBuckets - 1);
#pragma unroll
      for (int b = 0; b < kBuckets; ++b) {
        cnt[b] += d == b;
        if constexpr (kMass) mass[b] += d == b ? w : 0.0;
      }
    }
#pragma unroll
    for (int b = 0; b < kBuckets; ++b) {
      for (int o = kWarpSize / 2; o > 0; o >>= 1) {
        cnt[b] += __shfl_xor_sync(0xffffffffu, cnt[b], o);
        if constexpr (kMass) mass[b] += __shfl_xor_sync(0xffffffffu, mass[b], o);
      }
      if (lane == 0) {
        s.cnt[warp][b] = cnt[b];
        s.mass[warp][b] = mass[b];
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1, chosen_count = 0;
      for (int b = kBuckets - 1; b >= 0 && chosen < 0; --b) {
        int c = 0;
        double m = 0.0;
        for (int w = 0; w < kWarps; ++w) {
          c += s.cnt[w][b];
          m += s.mass[w][b];
        }
        if (c == 0) continue;
        if (kMass ? above + m >= target : c >= rem) {
          chosen = b;
          chosen_count = kMass ? c : (c == rem ? 1 : c);  // 1: the bucket's smallest is the answer
        } else if (kMass) {
          above += m;
        } else {
          rem -= c;
        }
      }
      s.digit = chosen;
      s.digit_count = chosen_count;
    }
    __syncthreads();
    const int d = s.digit, c = s.digit_count;
    if (d < 0) return min_matching_key(n, elems, prefix, mask, s);  // top-p rounding fallback
    prefix |= uint64_t(d) << shift;
    mask |= uint64_t(kBuckets - 1) << shift;
    if (c == 1 || shift == 0) return shift == 0 ? prefix : min_matching_key(n, elems, prefix, mask, s);
  }
  return prefix;  // not reached
}

// fp32 processed logits of the row into w (stored as doubles): bias, banned, mask, penalties,
// each step after the previous one as in engine::processed_logits.
__device__ void build_logits(const SampleParams& p, const SamplingRowParams& r, const float* raw, double* w,
                             int64_t row) {
  const int64_t V = p.vocab;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) w[t] = double(raw[t]);
  __syncthreads();
  if (threadIdx.x == 0) {  // one thread: repeated ids add in entry order
    const int64_t end = std::min<int64_t>(r.bias_end, p.num_bias);
    for (int64_t i = std::max<int64_t>(r.bias_begin, 0); i < end; ++i) {
      const int32_t id = p.bias_ids[i];
      if (id >= 0 && id < V) w[id] = double(__fadd_rn(float(w[id]), p.bias_values[i]));
    }
  }
  __syncthreads();
  const int64_t ban_end = std::min<int64_t>(r.banned_end, p.num_banned);
  for (int64_t i = std::max<int64_t>(r.banned_begin, 0) + threadIdx.x; i < ban_end; i += kThreads) {
    const int32_t id = p.banned_ids[i];
    if (id >= 0 && id < V) w[id] = -INFINITY;
  }
  if (r.has_mask && p.allowed_mask) {
    const uint32_t* m = p.allowed_mask + row * p.mask_stride;
    for (int64_t t = threadIdx.x; t < V; t += kThreads)
      if (!((m[t >> 5] >> (t & 31)) & 1u)) w[t] = -INFINITY;
  }
  __syncthreads();
  const bool rep = r.repetition_penalty != 1.0f;
  const bool additive = r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f;
  const int64_t pen_end = std::min<int64_t>(r.penalty_end, p.num_penalty);
  for (int64_t i = std::max<int64_t>(r.penalty_begin, 0) + threadIdx.x; i < pen_end; i += kThreads) {
    const int32_t id = p.penalty_ids[i], count = p.penalty_counts[i];
    if (id < 0 || id >= V) continue;
    float v = float(w[id]);
    if (rep) v = v > 0 ? __fdiv_rn(v, r.repetition_penalty) : __fmul_rn(v, r.repetition_penalty);
    if (additive && count > 0)
      v = __fsub_rn(v, __fadd_rn(__fmul_rn(r.frequency_penalty, float(count)), r.presence_penalty));
    w[id] = double(v);
  }
  __syncthreads();
}

__device__ int32_t fallback_token(const SamplingRowParams& r, int64_t V) {
  return int32_t(std::min<int64_t>(std::max<int32_t>(r.eos_token_id, 0), V - 1));
}

// Greedy: argmax of the processed logits, ties to the lowest id.
__device__ int32_t greedy_token(const SamplingRowParams& r, const double* w, int64_t V, Smem& s) {
  uint64_t best = 0;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) {
    const uint64_t key = make_key(float(w[t]), t);
    best = best > key ? best : key;
  }
  best = block_max(best, s);
  return uint32_t(best >> 32) == order_bits(-INFINITY) ? fallback_token(r, V) : key_id(best);
}

// w: processed logits -> probabilities after temperature, min-p (returns #candidates), as in
// engine::processed_probs; 0 when nothing is allowed.
__device__ int to_probs(const SamplingRowParams& r, double* w, int64_t V, Smem& s) {
  float mx = -INFINITY;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) {
    const float v = __fdiv_rn(float(w[t]), r.temperature);
    w[t] = double(v);
    mx = fmaxf(mx, v);
  }
  mx = block_max(mx, s);
  if (mx == -INFINITY) return 0;
  double part = 0.0;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) {
    const double e = exp(w[t] - double(mx));
    w[t] = e;
    part += e;
  }
  const double sum = block_sum(part, s);
  const double thr = double(r.min_p) * (1.0 / sum);
  int n = 0;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) {
    double q = w[t] / sum;
    if (r.min_p > 0 && q < thr) q = 0.0;
    w[t] = q;
    n += q > 0;
  }
  return block_sum(n, s);
}

// Top-k then top-p over the candidates of w (zeroes the rest).
__device__ void apply_top_k_top_p(const SamplingRowParams& r, double* w, int64_t V, int n_cand, Smem& s) {
  int64_t keep = n_cand;
  if (r.top_k > 0) keep = std::min<int64_t>(keep, r.top_k);
  uint64_t cut = 0;
  if (keep < n_cand) cut = radix_select<false>(V, ProbElems{w, 0}, keep, 0.0, s);
  if (r.top_p < 1.0f) {
    double part = 0.0;
    for (int64_t t = threadIdx.x; t < V; t += kThreads) {
      uint64_t key;
      double q;
      if (ProbElems{w, cut}(t, key, q)) part += q;
    }
    const double mass = block_sum(part, s);
    cut = radix_select<true>(V, ProbElems{w, cut}, 0, double(r.top_p) * mass, s);
  }
  for (int64_t t = threadIdx.x; t < V; t += kThreads) {
    uint64_t key;
    double q;
    if (w[t] > 0 && !ProbElems{w, cut}(t, key, q)) w[t] = 0.0;
  }
  __syncthreads();
}

// Inverse CDF in id order over non-negative values f(t): the first t with f(t) > 0 and
// target < sum_{s<=t} f(s) (the host's left-to-right rule), else the last t with f(t) > 0
// (rounding left the target past the end), else -1. Each thread owns a contiguous id range;
// chunk sums are combined by a CUB exclusive scan (fixed order).
template <class F>
__device__ int32_t inverse_cdf(const F& f, int64_t V, double target, Smem& s) {
  const int64_t chunk = (V + kThreads - 1) / kThreads;
  const int64_t lo = std::min<int64_t>(V, threadIdx.x * chunk), hi = std::min<int64_t>(V, lo + chunk);
  double local = 0.0;
  for (int64_t t = lo; t < hi; ++t) local += f(t);
  double acc;
  cub::BlockScan<double, kThreads>(s.tmp.scan_d).ExclusiveSum(local, acc);
  __syncthreads();
  int found = -1, last = -1;
  for (int64_t t = lo; t < hi; ++t) {
    const double q = f(t);
    if (q <= 0) continue;
    last = int(t);
    acc += q;
    if (target < acc) {
      found = int(t);
      break;
    }
  }
  // Earliest found id: max of -id (ids < 2^31).
  found = block_max(found >= 0 ? -found : INT_MIN, s);
  if (found != INT_MIN) return -found;
  return block_max(last, s);
}

__device__ double kept_total(const double* w, int64_t V, Smem& s) {
  double part = 0.0;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) part += w[t];
  return block_sum(part, s);
}

// Plain sampling's draw: the first kept t with u < sum_{s<=t} p_s / total.
__device__ int32_t draw(const SamplingRowParams& r, const double* w, int64_t V, Smem& s) {
  const double total = kept_total(w, V, s);
  const double u = philox_uniform(r.seed, r.sample_index, r.position);
  const int32_t t = inverse_cdf([&](int64_t i) { return w[i] / total; }, V, u, s);
  return t >= 0 ? t : fallback_token(r, V);
}

// Sum of the positive float weights q (fp64, fixed order).
__device__ double weight_sum(const float* q, int64_t V, Smem& s) {
  double part = 0.0;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) part += q[t] > 0 ? double(q[t]) : 0.0;
  return block_sum(part, s);
}

// kSpecDraft: q = float(p) into r.spec_q (one-hot at the fallback when nothing is kept), then the
// draw over q's weights (engine::draw_weighted). n_cand == 0: nothing allowed.
__device__ int32_t draft_from_q(const SamplingRowParams& r, const double* w, int64_t V, int n_cand, Smem& s) {
  float* q = r.spec_q;
  const int32_t fb = fallback_token(r, V);
  const double total = n_cand > 0 ? kept_total(w, V, s) : 0.0;
  for (int64_t t = threadIdx.x; t < V; t += kThreads)
    q[t] = n_cand > 0 ? float(w[t] / total) : (t == fb ? 1.0f : 0.0f);
  __syncthreads();  // the block's global writes are visible to the block after the barrier
  const double qsum = weight_sum(q, V, s);
  if (!(qsum > 0)) {  // every kept p rounded to float 0: the host picker's one-hot fallback too
    for (int64_t t = threadIdx.x; t < V; t += kThreads) q[t] = t == fb ? 1.0f : 0.0f;
    return fb;
  }
  const double u = philox_uniform(r.seed, r.sample_index, r.position, engine::DrawStream::kSpecDraft);
  const int32_t t = inverse_cdf([&](int64_t i) { return q[i] > 0 ? double(q[i]) : 0.0; }, V, u * qsum, s);
  return t >= 0 ? t : fb;
}

// kSpecVerify: accept or resample r.spec_draft against p = w / total (engine::rejection_sample).
// Writes *accepted (1, 0, -2 when q(draft) = 0) and returns the residual token (the draft when
// accepted). n_cand == 0 (p empty): rejected, the fallback token.
__device__ int32_t verify_draft(const SamplingRowParams& r, const double* w, int64_t V, int n_cand, int* accepted,
                                Smem& s) {
  const float* q = r.spec_q;
  const int32_t d = r.spec_draft;
  const double qsum = weight_sum(q, V, s);
  const double qd = q[d] > 0 && qsum > 0 ? double(q[d]) / qsum : 0.0;
  if (!(qd > 0)) {
    *accepted = -2;
    return fallback_token(r, V);
  }
  if (n_cand == 0) {
    *accepted = 0;
    return fallback_token(r, V);
  }
  const double total = kept_total(w, V, s);
  const double pd = w[d] / total;
  const double u_a = philox_uniform(r.seed, r.sample_index, r.position, engine::DrawStream::kSpecAccept);
  if (u_a * qd < pd) {  // block-uniform: every thread computed the same values
    *accepted = 1;
    return d;
  }
  *accepted = 0;
  const double u_r = philox_uniform(r.seed, r.sample_index, r.position, engine::DrawStream::kSpecResidual);
  auto residual = [&](int64_t t) { return fmax(0.0, w[t] / total - (q[t] > 0 ? double(q[t]) / qsum : 0.0)); };
  double part = 0.0;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) part += residual(t);
  const double rtotal = block_sum(part, s);
  if (rtotal > 0) {
    const int32_t t = inverse_cdf(residual, V, u_r * rtotal, s);
    if (t >= 0) return t;
  }
  // p <= q everywhere (p == q up to rounding): draw from p itself.
  const int32_t t = inverse_cdf([&](int64_t i) { return w[i] / total; }, V, u_r, s);
  return t >= 0 ? t : fallback_token(r, V);
}

// Raw-logit logprob, rank and top-N of the chosen token (engine::compute_logprobs).
// `extra` >= 0: also the logprob and rank of that token (a verify row's residual draw).
__device__ void write_logprobs(const SampleParams& p, const SamplingRowParams& r, const float* raw, int32_t token,
                               int32_t extra, int64_t row, Smem& s) {
  const int64_t V = p.vocab;
  float mx = -INFINITY;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) mx = fmaxf(mx, raw[t]);
  mx = block_max(mx, s);
  double part = 0.0;
  int greater = 0, greater_extra = 0;
  const float tok_logit = raw[token], extra_logit = extra >= 0 ? raw[extra] : 0.0f;
  for (int64_t t = threadIdx.x; t < V; t += kThreads) {
    part += exp(double(raw[t]) - double(mx));
    greater += raw[t] > tok_logit;
    greater_extra += extra >= 0 && raw[t] > extra_logit;
  }
  const double lse = double(mx) + log(block_sum(part, s));
  greater = block_sum(greater, s);
  if (extra >= 0) greater_extra = block_sum(greater_extra, s);
  if (threadIdx.x == 0) {
    if (p.logprobs) p.logprobs[row] = float(double(tok_logit) - lse);
    if (p.ranks) p.ranks[row] = 1 + greater;
    if (extra >= 0 && p.spec_residual_logprob) p.spec_residual_logprob[row] = float(double(extra_logit) - lse);
    if (extra >= 0 && p.spec_residual_rank) p.spec_residual_rank[row] = 1 + greater_extra;
  }
  if (p.max_top_logprobs == 0 || !p.top_ids) return;
  const int n = int(std::min<int64_t>(std::clamp(r.top_logprobs, 0, p.max_top_logprobs), V));
  int32_t* ids = p.top_ids + row * p.max_top_logprobs;
  float* lps = p.top_logprobs + row * p.max_top_logprobs;
  for (int i = n + threadIdx.x; i < p.max_top_logprobs; i += kThreads) {
    ids[i] = -1;
    lps[i] = -INFINITY;
  }
  if (n == 0) return;
  const uint64_t cut = radix_select<false>(V, RawElems{raw}, n, 0.0, s);
  if (threadIdx.x == 0) s.top_n = 0;
  __syncthreads();
  for (int64_t t = threadIdx.x; t < V; t += kThreads) {
    const uint64_t key = make_key(raw[t], t);
    if (key >= cut) s.top_keys[atomicAdd(&s.top_n, 1)] = key;  // exactly n of them; sorted below
  }
  __syncthreads();
  if (threadIdx.x < n) {
    const uint64_t key = s.top_keys[threadIdx.x];
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += s.top_keys[j] > key;
    const int32_t id = key_id(key);
    ids[rank] = id;
    lps[rank] = float(double(raw[id]) - lse);
  }
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const __grid_constant__ SampleParams p) {
  __shared__ Smem s;
  const int64_t row = blockIdx.x, V = p.vocab;
  const SamplingRowParams r = p.rows[row];
  const float* raw = p.logits + row * p.logits_stride;
  double* w = static_cast<double*>(p.workspace) + row * V;
  build_logits(p, r, raw, w, row);
  int32_t token, residual = -1;
  if (r.temperature < kGreedyBelow) {
    token = greedy_token(r, w, V, s);
  } else {
    const int n_cand = to_probs(r, w, V, s);
    if (n_cand > 0 && ((r.top_k > 0 && r.top_k < V) || r.top_p < 1.0f)) apply_top_k_top_p(r, w, V, n_cand, s);
    if (r.spec_mode == kSpecDraft) {
      token = draft_from_q(r, w, V, n_cand, s);
    } else {
      token = n_cand == 0 ? fallback_token(r, V) : draw(r, w, V, s);
      if (r.spec_mode == kSpecVerify) {
        int accepted = 0;
        residual = verify_draft(r, w, V, n_cand, &accepted, s);
        if (threadIdx.x == 0) {
          p.spec_accepted[row] = accepted;
          p.spec_residual[row] = residual;
        }
        // residual is the draft when accepted: its logprob is what an accepted draft emits
      }
    }
  }
  if (threadIdx.x == 0) p.tokens[row] = token;
  if (p.logprobs || p.ranks || p.top_ids) write_logprobs(p, r, raw, token, residual, row, s);
}

template <typename... A>
void require(bool ok, const A&... what) {
  if (!ok) DI_THROW(InvalidArgument, "sample: ", what...);
}
}  // namespace

size_t sampling_workspace_bytes(int64_t batch, int64_t vocab) {
  return size_t(std::max<int64_t>(batch, 0)) * size_t(std::max<int64_t>(vocab, 0)) * sizeof(double);
}

void check_sampling_rows(std::span<const SamplingRowParams> rows, const SampleParams& p) {
  require(int64_t(rows.size()) == p.batch, "rows has ", rows.size(), " entries, batch is ", p.batch);
  auto range_ok = [](int32_t b, int32_t e, int64_t n) { return b >= 0 && b <= e && e <= n; };
  for (size_t i = 0; i < rows.size(); ++i) {
    const SamplingRowParams& r = rows[i];
    require(std::isfinite(r.temperature) && r.temperature >= 0, "row ", i, ": temperature ", r.temperature,
            " must be finite and >= 0");
    require(r.top_p > 0 && r.top_p <= 1, "row ", i, ": top_p ", r.top_p, " not in (0, 1]");
    require(r.min_p >= 0 && r.min_p <= 1, "row ", i, ": min_p ", r.min_p, " not in [0, 1]");
    require(r.top_k >= -1, "row ", i, ": top_k ", r.top_k, " must be -1, 0 (off) or positive");
    require(std::isfinite(r.repetition_penalty) && r.repetition_penalty > 0, "row ", i, ": repetition_penalty ",
            r.repetition_penalty, " must be finite and > 0");
    require(std::isfinite(r.presence_penalty) && std::isfinite(r.frequency_penalty), "row ", i,
            ": presence/frequency penalties must be finite");
    require(r.top_logprobs >= 0 && r.top_logprobs <= p.max_top_logprobs, "row ", i, ": top_logprobs ",
            r.top_logprobs, " not in [0, max_top_logprobs = ", p.max_top_logprobs, "]");
    require(r.eos_token_id < p.vocab, "row ", i, ": eos_token_id ", r.eos_token_id, " >= vocab ", p.vocab);
    require(!r.has_mask || p.allowed_mask, "row ", i, ": has_mask set but allowed_mask is null");
    require(range_ok(r.bias_begin, r.bias_end, p.num_bias), "row ", i, ": bias range [", r.bias_begin, ", ",
            r.bias_end, ") outside [0, num_bias = ", p.num_bias, "]");
    require(range_ok(r.banned_begin, r.banned_end, p.num_banned), "row ", i, ": banned range [", r.banned_begin,
            ", ", r.banned_end, ") outside [0, num_banned = ", p.num_banned, "]");
    require(range_ok(r.penalty_begin, r.penalty_end, p.num_penalty), "row ", i, ": penalty range [",
            r.penalty_begin, ", ", r.penalty_end, ") outside [0, num_penalty = ", p.num_penalty, "]");
    require(r.spec_mode == kSpecPlain || r.spec_mode == kSpecDraft || r.spec_mode == kSpecVerify, "row ", i,
            ": spec_mode ", r.spec_mode, " not 0 (plain), 1 (draft) or 2 (verify)");
    if (r.spec_mode != kSpecPlain) {
      require(r.temperature >= kGreedyBelow, "row ", i, ": spec_mode ", r.spec_mode,
              " on a greedy row (temperature ", r.temperature, "): greedy drafts are argmax picks");
      require(r.spec_q != nullptr, "row ", i, ": spec_mode ", r.spec_mode, " with a null spec_q");
    }
    if (r.spec_mode == kSpecVerify) {
      require(r.spec_draft >= 0 && r.spec_draft < p.vocab, "row ", i, ": spec_draft ", r.spec_draft,
              " not in [0, vocab = ", p.vocab, ")");
      require(p.spec_accepted && p.spec_residual, "row ", i, ": a verify row with null spec_accepted/spec_residual");
    }
  }
}

void make_penalty_entries(std::span<const int32_t> prompt, std::span<const int32_t> output, int64_t vocab,
                          std::vector<int32_t>& ids, std::vector<int32_t>& counts) {
  std::vector<std::pair<int32_t, int32_t>> e;  // (id, output count)
  for (int32_t t : prompt) if (t >= 0 && t < vocab) e.emplace_back(t, 0);
  for (int32_t t : output) if (t >= 0 && t < vocab) e.emplace_back(t, 1);
  std::sort(e.begin(), e.end());
  for (size_t i = 0; i < e.size();) {
    size_t j = i;
    int32_t c = 0;
    for (; j < e.size() && e[j].first == e[i].first; ++j) c += e[j].second;
    ids.push_back(e[i].first);
    counts.push_back(c);
    i = j;
  }
}

void sample(const SampleParams& p, cudaStream_t stream) {
  require(p.batch >= 0 && p.batch <= INT32_MAX, "batch ", p.batch, " not in [0, 2^31)");
  require(p.vocab >= 1 && p.vocab < INT32_MAX, "vocab ", p.vocab, " not in [1, 2^31 - 1)");
  require(p.logits && p.rows && p.tokens, "null logits, rows or tokens");
  require(p.logits_stride >= p.vocab, "logits_stride ", p.logits_stride, " < vocab ", p.vocab);
  require(p.workspace && p.workspace_bytes >= sampling_workspace_bytes(p.batch, p.vocab), "workspace of ",
          p.workspace_bytes, " bytes, need ", sampling_workspace_bytes(p.batch, p.vocab));
  require(reinterpret_cast<uintptr_t>(p.workspace) % alignof(double) == 0, "workspace not 8-byte aligned");
  require(p.num_bias >= 0 && (p.num_bias == 0 || (p.bias_ids && p.bias_values)), "num_bias ", p.num_bias,
          " with null bias_ids/bias_values");
  require(p.num_banned >= 0 && (p.num_banned == 0 || p.banned_ids), "num_banned ", p.num_banned,
          " with null banned_ids");
  require(p.num_penalty >= 0 && (p.num_penalty == 0 || (p.penalty_ids && p.penalty_counts)), "num_penalty ",
          p.num_penalty, " with null penalty_ids/penalty_counts");
  require(!p.allowed_mask || p.mask_stride >= (p.vocab + 31) / 32, "mask_stride ", p.mask_stride, " < ceil(vocab/32) = ",
          (p.vocab + 31) / 32);
  require(p.max_top_logprobs >= 0 && p.max_top_logprobs <= kSamplingMaxTopLogprobs, "max_top_logprobs ",
          p.max_top_logprobs, " not in [0, ", kSamplingMaxTopLogprobs, "]");
  require(p.max_top_logprobs == 0 || (p.top_ids && p.top_logprobs), "max_top_logprobs ", p.max_top_logprobs,
          " with null top_ids/top_logprobs");
  if (p.batch == 0) return;
  sample_kernel<<<unsigned(p.batch), kThreads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
