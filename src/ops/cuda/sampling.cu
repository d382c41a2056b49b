// Device sampler (see sampling.h for the semantics and the exactness policy).
//
// Split: each row runs on a thread-block cluster of sampling_blocks_per_row(vocab) blocks
// (<= 8, the portable cluster size): thread i of block r owns ids r·512 + i + k·(512·blocks).
// Every reduction over the row is two-level and fixed-order: a CUB block reduction (the same
// thread-to-value mapping every run), then the blocks' partials, read from each block's shared
// memory through DSMEM, folded in rank order. The split depends on the vocabulary only, never on
// the batch, so a row's tokens and logprobs are the same bits alone or in any batch (tested).
// Why a cluster and not partial buffers + a second kernel: the sampled path is ~20-40 dependent
// row-wide reductions (radix passes, sums, scans); with a cluster each is a barrier inside one
// launch rather than a kernel boundary, and the row's state stays in one launch (measured:
// docs/PERFORMANCE.md "Device sampler", session 15). The row's processed logits,
// then its probabilities, live in the fp64 workspace row (global memory; a cluster barrier
// orders the blocks' global writes and reads: barrier.cluster is release/acquire).
// Rows without sparse edits (no bias, banned ids or effective penalties) never build the
// workspace for the logits: greedy reads the raw logits (masked on the fly) once.
// All fp32 arithmetic uses explicit _rn intrinsics so nvcc cannot contract it into FMAs the
// CPU twin (plain x86-64 SSE, no FMA) does not do.
#include <cooperative_groups.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>

#include "engine/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/sampling.h"

namespace deepinfer::ops::cuda {
namespace {
namespace cg = cooperative_groups;
using deepinfer::cuda::kWarpSize;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kMaxBlocksPerRow = 8;         // portable cluster size
constexpr int64_t kIdsPerBlock = 4096;      // a block per 4,096 ids, up to kMaxBlocksPerRow
constexpr int kDigitBits = 4;  // radix digit of the selects: 16 buckets kept in registers
constexpr int kBuckets = 1 << kDigitBits;
constexpr int kCountBits = 8;  // digit of the count-only selects (top-k, top-N): 256 buckets in smem
constexpr int kCountBuckets = 1 << kCountBits;
constexpr float kGreedyBelow = 1e-5f;  // SamplingParams::greedy()

struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const { return a < b ? b : a; }
};
struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(const T& a, const T& b) const { return a + b; }
};

// What a block publishes to its cluster for one reduction (read by the others through DSMEM).
struct Xch {
  int cnt[kBuckets];      // radix pass: the block's bucket counts
  double mass[kBuckets];  // radix pass: the block's bucket masses (top-p)
  int cnt8[kCountBuckets];  // count-only pass: the block's bucket counts
  double d;
  float f;
  int i;
  unsigned long long u;
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
  Xch xch[2];                      // double-buffered by Ctx::phase: one cluster barrier per reduction
  int tot_cnt[kBuckets];           // a radix pass's row-wide bucket counts / masses
  double tot_mass[kBuckets];
  double gather_d[kMaxBlocksPerRow];  // the cluster's partials, local copies
  float gather_f[kMaxBlocksPerRow];
  int gather_i[kMaxBlocksPerRow];
  unsigned long long gather_u[kMaxBlocksPerRow];
  int digit, digit_count;          // the pass's chosen bucket (-1: rounding fallback)
  int digit_rem;                   // count_select: rank still to skip inside the chosen bucket
  int hist[kCountBuckets];         // count_select: this block's bucket counts (shared atomics)
  int tot8[kCountBuckets];         // count_select: the row's bucket counts
  unsigned long long top_keys[kSamplingMaxTopLogprobs];  // this block's top-N keys
  int top_n;
  int top_off[kMaxBlocksPerRow + 1];                     // rank 0: where each block's keys go
  unsigned long long all_keys[kSamplingMaxTopLogprobs];  // rank 0: the row's top-N keys
};

// One thread's view of its row: the block's rank in the row's cluster and the thread's index
// among the row's threads. `phase` flips after each reduction (identically in every thread of
// the cluster: all reductions are row-uniform), selecting the Xch buffer.
struct Ctx {
  Smem& s;
  int rank, blocks;
  int64_t tid, nthreads;  // rank * kThreads + threadIdx.x, blocks * kThreads
  int phase = 0;
  __device__ Xch& mine() { return s.xch[phase]; }
  __device__ Xch& of(int q) { return *cg::this_cluster().map_shared_rank(&s.xch[phase], q); }
  __device__ bool leader() const { return rank == 0 && threadIdx.x == 0; }
};

__device__ __forceinline__ void cluster_sync() { cg::this_cluster().sync(); }

// The thread's ids t = tid + k·nthreads < n in increasing order (the order every per-thread sum
// follows), kUnroll at a time: the kUnroll `load(t)`s are issued before their `use(t, value)`s,
// so each thread has kUnroll loads in flight instead of one (the passes are latency-bound: ~32
// ids per thread at V = 129280 over 8 blocks).
constexpr int kUnroll = 4;
template <int U = kUnroll, class Load, class Use>
__device__ __forceinline__ void row_loop(const Ctx& c, int64_t n, const Load& load, const Use& use) {
  using T = decltype(load(int64_t(0)));
  for (int64_t t0 = c.tid; t0 < n; t0 += U * c.nthreads) {
    T v[U];
#pragma unroll
    for (int j = 0; j < U; ++j)
      if (t0 + j * c.nthreads < n) v[j] = load(t0 + j * c.nthreads);
#pragma unroll
    for (int j = 0; j < U; ++j)
      if (t0 + j * c.nthreads < n) use(t0 + j * c.nthreads, v[j]);
  }
}
// An element of a select: its key and weight, and whether it takes part.
struct Elem {
  uint64_t key;
  double w;
  bool ok;
};

template <typename T> __device__ T& xch_slot(Xch& x) {
  if constexpr (std::is_same_v<T, double>) return x.d;
  else if constexpr (std::is_same_v<T, float>) return x.f;
  else if constexpr (std::is_same_v<T, int>) return x.i;
  else return x.u;
}
template <typename T> __device__ T* gather_of(Smem& s) {
  if constexpr (std::is_same_v<T, double>) return s.gather_d;
  else if constexpr (std::is_same_v<T, float>) return s.gather_f;
  else if constexpr (std::is_same_v<T, int>) return s.gather_i;
  else return s.gather_u;
}
template <typename T> __device__ T block_reduce(T v, Smem& s, auto op) {
  if constexpr (std::is_same_v<T, double>) return cub::BlockReduce<double, kThreads>(s.tmp.red_d).Reduce(v, op);
  else if constexpr (std::is_same_v<T, float>) return cub::BlockReduce<float, kThreads>(s.tmp.red_f).Reduce(v, op);
  else if constexpr (std::is_same_v<T, int>) return cub::BlockReduce<int, kThreads>(s.tmp.red_i).Reduce(v, op);
  else return cub::BlockReduce<unsigned long long, kThreads>(s.tmp.red_u).Reduce(v, op);
}

// ---- fixed-order row reductions: CUB block reduction, then the blocks in rank order; every
// thread of the row gets the result. One cluster barrier (the Xch buffer alternates: a block
// rewrites buffer k only after the next reduction's barrier, i.e. after every reader of k). ----
template <typename T, class Op>
__device__ __forceinline__ T row_reduce(T v, Op op, Ctx& c) {
  const T r = block_reduce<T>(v, c.s, op);
  if (threadIdx.x == 0) xch_slot<T>(c.mine()) = r;
  cluster_sync();
  T* g = gather_of<T>(c.s);
  if (int(threadIdx.x) < c.blocks) g[threadIdx.x] = xch_slot<T>(c.of(int(threadIdx.x)));
  __syncthreads();
  T acc = g[0];  // every thread folds the same values in the same order (g is rewritten only
  for (int q = 1; q < c.blocks; ++q) acc = op(acc, g[q]);  // after the next reduction's barrier)
  c.phase ^= 1;
  return acc;
}
__device__ __forceinline__ double row_sum(double v, Ctx& c) { return row_reduce(v, SumOp{}, c); }
__device__ __forceinline__ int row_sum(int v, Ctx& c) { return row_reduce(v, SumOp{}, c); }
__device__ __forceinline__ int row_max(int v, Ctx& c) { return row_reduce(v, MaxOp{}, c); }
__device__ __forceinline__ float row_max(float v, Ctx& c) { return row_reduce(v, MaxOp{}, c); }
__device__ __forceinline__ uint64_t row_max(uint64_t v, Ctx& c) { return row_reduce((unsigned long long)v, MaxOp{}, c); }

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
__device__ __forceinline__ uint64_t min_matching_key(int64_t n, const Elems& elems, uint64_t prefix, uint64_t mask, Ctx& c) {
  uint64_t best = 0;  // max of ~key
  row_loop(c, n, [&](int64_t t) { Elem e; e.ok = elems(t, e.key, e.w); return e; },
           [&](int64_t, const Elem& e) {
             if (e.ok && (e.key & mask) == prefix) best = best > ~e.key ? best : ~e.key;
           });
  return ~row_max(best, c);
}

// Radix select over unique keys, kDigitBits per pass, most significant first.
//  kMass = false: the k-th largest key (1 <= k <= #elements).
//  kMass = true:  the first key, best first, at which the running mass reaches `target`
//                 (top-p); when rounding leaves it unreached, the smallest key of the bucket.
// Stops early once the chosen bucket's smallest key is the answer. Bucket sums are fixed-order
// (lanes by shuffle tree, warps in order, blocks in rank order).
template <bool kMass, class Elems>
__device__ __forceinline__ uint64_t radix_select(int64_t n, const Elems& elems, int64_t k, double target, Ctx& c) {
  Smem& s = c.s;
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
    row_loop(c, n, [&](int64_t t) { Elem e; e.ok = elems(t, e.key, e.w); return e; },
             [&](int64_t, const Elem& e) {
               if (!e.ok || (e.key & mask) != prefix) return;
               const int d = int(e.key >> shift) & (kBuckets - 1);
#pragma unroll
               for (int b = 0; b < kBuckets; ++b) {
                 cnt[b] += d == b;
                 if constexpr (kMass) mass[b] += d == b ? e.w : 0.0;
               }
             });
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
    if (int(threadIdx.x) < kBuckets) {  // the block's bucket totals, warps in order
      const int b = int(threadIdx.x);
      int cb = 0;
      double mb = 0.0;
      for (int w = 0; w < kWarps; ++w) {
        cb += s.cnt[w][b];
        mb += s.mass[w][b];
      }
      c.mine().cnt[b] = cb;
      c.mine().mass[b] = mb;
    }
    cluster_sync();
    if (int(threadIdx.x) < kBuckets) {  // the row's bucket totals, blocks in rank order
      const int b = int(threadIdx.x);
      int cb = 0;
      double mb = 0.0;
      int qc[kMaxBlocksPerRow];  // the remote loads first, then the sums in rank order
      double qm[kMaxBlocksPerRow];
#pragma unroll
      for (int q = 0; q < kMaxBlocksPerRow; ++q)
        if (q < c.blocks) qc[q] = c.of(q).cnt[b], qm[q] = c.of(q).mass[b];
#pragma unroll
      for (int q = 0; q < kMaxBlocksPerRow; ++q)
        if (q < c.blocks) cb += qc[q], mb += qm[q];
      s.tot_cnt[b] = cb;
      s.tot_mass[b] = mb;
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // every block's thread 0 makes the same choice
      int chosen = -1, chosen_count = 0;
      for (int b = kBuckets - 1; b >= 0 && chosen < 0; --b) {
        const int cb = s.tot_cnt[b];
        const double m = s.tot_mass[b];
        if (cb == 0) continue;
        if (kMass ? above + m >= target : cb >= rem) {
          chosen = b;
          chosen_count = kMass ? cb : (cb == rem ? 1 : cb);  // 1: the bucket's smallest is the answer
        } else if (kMass) {
          above += m;
        } else {
          rem -= cb;
        }
      }
      s.digit = chosen;
      s.digit_count = chosen_count;
    }
    __syncthreads();
    c.phase ^= 1;
    const int d = s.digit, dc = s.digit_count;
    if (d < 0) return min_matching_key(n, elems, prefix, mask, c);  // top-p rounding fallback
    prefix |= uint64_t(d) << shift;
    mask |= uint64_t(kBuckets - 1) << shift;
    if (dc == 1 || shift == 0) return shift == 0 ? prefix : min_matching_key(n, elems, prefix, mask, c);
  }
  return prefix;  // not reached
}

// The k-th largest key (1 <= k <= #elements), as radix_select<false> but kCountBits per pass
// (half the passes over V): counts are integers, so warp-aggregated shared atomics cannot change
// them (the result is the same exact key).
template <class Elems>
__device__ __forceinline__ uint64_t count_select(int64_t n, const Elems& elems, int64_t k, Ctx& c) {
  Smem& s = c.s;
  uint64_t prefix = 0, mask = 0;
  int rem = int(k);  // every thread's copy: rank still to skip
  const int lane = int(threadIdx.x) % kWarpSize;
  for (int shift = 64 - kCountBits; shift >= 0; shift -= kCountBits) {
    for (int b = int(threadIdx.x); b < kCountBuckets; b += kThreads) s.hist[b] = 0;
    __syncthreads();
    row_loop(c, n, [&](int64_t t) { Elem e; e.ok = elems(t, e.key, e.w); return e; },
             [&](int64_t, const Elem& e) {
               const int b = e.ok && (e.key & mask) == prefix ? int(e.key >> shift) & (kCountBuckets - 1) : -1;
               const unsigned peers = __match_any_sync(__activemask(), b);  // lanes with the same bucket
               if (b >= 0 && lane == __ffs(peers) - 1) atomicAdd(&s.hist[b], __popc(peers));
             });
    __syncthreads();
    for (int b = int(threadIdx.x); b < kCountBuckets; b += kThreads) c.mine().cnt8[b] = s.hist[b];
    cluster_sync();
    for (int b = int(threadIdx.x); b < kCountBuckets; b += kThreads) {
      int qc[kMaxBlocksPerRow], cb = 0;
#pragma unroll
      for (int q = 0; q < kMaxBlocksPerRow; ++q)
        if (q < c.blocks) qc[q] = c.of(q).cnt8[b];
#pragma unroll
      for (int q = 0; q < kMaxBlocksPerRow; ++q)
        if (q < c.blocks) cb += qc[q];
      s.tot8[b] = cb;
    }
    __syncthreads();
    if (threadIdx.x < kWarpSize) {  // warp 0: lane l owns buckets [8l, 8l + 8); best = highest bucket
      constexpr int kPer = kCountBuckets / kWarpSize;
      int cnt[kPer], mine = 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) mine += cnt[j] = s.tot8[lane * kPer + j];
      int at_or_above = mine;  // keys in the buckets of lanes >= this one
      for (int o = 1; o < kWarpSize; o <<= 1) {
        const int v = __shfl_down_sync(0xffffffffu, at_or_above, o);
        if (lane + o < kWarpSize) at_or_above += v;
      }
      const int above = at_or_above - mine;
      if (above < rem && rem <= at_or_above) {  // exactly one lane
        int acc = above;
        for (int j = kPer - 1; j >= 0; --j) {
          if (acc + cnt[j] >= rem) {
            s.digit = lane * kPer + j;
            s.digit_count = cnt[j];
            s.digit_rem = rem - acc;
            break;
          }
          acc += cnt[j];
        }
      }
    }
    __syncthreads();
    c.phase ^= 1;
    const int d = s.digit, dc = s.digit_count;
    rem = s.digit_rem;
    prefix |= uint64_t(d) << shift;
    mask |= uint64_t(kCountBuckets - 1) << shift;
    if (shift == 0) return prefix;
    if (dc == rem) return min_matching_key(n, elems, prefix, mask, c);  // the bucket's smallest key
  }
  return prefix;  // not reached
}

// The row's processed logit at t (engine::processed_logits): from the workspace when the row
// has sparse edits (build_logits wrote it), else the raw logit, -inf where the mask forbids it.
struct Processed {
  const float* raw;     // [vocab]
  const uint32_t* m;    // [ceil(vocab/32)] or null
  const double* w;      // [vocab] or null (no sparse edits)
  __device__ __forceinline__ float operator()(int64_t t) const {
    if (w) return float(w[t]);
    if (m && !((m[t >> 5] >> (t & 31)) & 1u)) return -INFINITY;
    return raw[t];
  }
};

// True when bias, banned ids or penalties change some logit of the row.
__device__ bool has_sparse_edits(const SampleParams& p, const SamplingRowParams& r) {
  const bool pen = r.repetition_penalty != 1.0f || r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f;
  return std::min<int64_t>(r.bias_end, p.num_bias) > r.bias_begin ||
         std::min<int64_t>(r.banned_end, p.num_banned) > r.banned_begin ||
         (pen && std::min<int64_t>(r.penalty_end, p.num_penalty) > r.penalty_begin);
}

// fp32 processed logits of the row into w (stored as doubles): mask, bias, banned, penalties, as
// in engine::processed_logits (bias before mask there; a masked id ends at -inf either way, so the
// mask is applied first and the bias skips masked ids).
__device__ __forceinline__ void build_logits(const SampleParams& p, const SamplingRowParams& r, const float* raw,
                             const uint32_t* m, double* w, Ctx& c) {
  const int64_t V = p.vocab;
  const Processed in{raw, m, nullptr};
  row_loop(c, V, in, [&](int64_t t, float v) { w[t] = double(v); });
  cluster_sync();
  const int64_t bias_end = std::min<int64_t>(r.bias_end, p.num_bias);
  if (bias_end > r.bias_begin) {
    if (c.leader()) {  // one thread: repeated ids add in entry order
      for (int64_t i = std::max<int64_t>(r.bias_begin, 0); i < bias_end; ++i) {
        const int32_t id = p.bias_ids[i];
        if (id >= 0 && id < V && !(m && !((m[id >> 5] >> (id & 31)) & 1u)))
          w[id] = double(__fadd_rn(float(w[id]), p.bias_values[i]));
      }
    }
    cluster_sync();
  }
  const int64_t ban_end = std::min<int64_t>(r.banned_end, p.num_banned);
  if (ban_end > r.banned_begin) {
    for (int64_t i = std::max<int64_t>(r.banned_begin, 0) + c.tid; i < ban_end; i += c.nthreads) {
      const int32_t id = p.banned_ids[i];
      if (id >= 0 && id < V) w[id] = -INFINITY;
    }
    cluster_sync();
  }
  const bool rep = r.repetition_penalty != 1.0f;
  const bool additive = r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f;
  const int64_t pen_end = std::min<int64_t>(r.penalty_end, p.num_penalty);
  if ((rep || additive) && pen_end > r.penalty_begin) {
    for (int64_t i = std::max<int64_t>(r.penalty_begin, 0) + c.tid; i < pen_end; i += c.nthreads) {
      const int32_t id = p.penalty_ids[i], count = p.penalty_counts[i];
      if (id < 0 || id >= V) continue;
      float v = float(w[id]);
      if (rep) v = v > 0 ? __fdiv_rn(v, r.repetition_penalty) : __fmul_rn(v, r.repetition_penalty);
      if (additive && count > 0)
        v = __fsub_rn(v, __fadd_rn(__fmul_rn(r.frequency_penalty, float(count)), r.presence_penalty));
      w[id] = double(v);
    }
    cluster_sync();
  }
}

__device__ int32_t fallback_token(const SamplingRowParams& r, int64_t V) {
  return int32_t(std::min<int64_t>(std::max<int32_t>(r.eos_token_id, 0), V - 1));
}

// Greedy: argmax of the processed logits, ties to the lowest id.
__device__ __forceinline__ int32_t greedy_token(const SamplingRowParams& r, const Processed& in, int64_t V, Ctx& c) {
  uint64_t best = 0;
  row_loop(c, V, in, [&](int64_t t, float v) {
    const uint64_t key = make_key(v, t);
    best = best > key ? best : key;
  });
  best = row_max(best, c);
  return uint32_t(best >> 32) == order_bits(-INFINITY) ? fallback_token(r, V) : key_id(best);
}

// Processed logits -> probabilities in w after temperature, min-p (returns #candidates), as in
// engine::processed_probs; 0 when nothing is allowed.
__device__ __forceinline__ int to_probs(const SamplingRowParams& r, const Processed& in, double* w, int64_t V, Ctx& c) {
  float mx = -INFINITY;
  row_loop(c, V, in, [&](int64_t t, float x) {
    const float v = __fdiv_rn(x, r.temperature);
    w[t] = double(v);
    mx = fmaxf(mx, v);
  });
  mx = row_max(mx, c);  // its barrier also orders every block's w writes before the reads below
  if (mx == -INFINITY) return 0;
  double part = 0.0;
  auto load_w = [&](int64_t t) { return w[t]; };
  row_loop(c, V, load_w, [&](int64_t t, double x) {
    const double e = exp(x - double(mx));
    w[t] = e;
    part += e;
  });
  const double sum = row_sum(part, c);
  const double thr = double(r.min_p) * (1.0 / sum);
  int n = 0;
  row_loop(c, V, load_w, [&](int64_t t, double x) {
    double q = x / sum;
    if (r.min_p > 0 && q < thr) q = 0.0;
    w[t] = q;
    n += q > 0;
  });
  return row_sum(n, c);
}

// Top-k then top-p over the candidates of w (zeroes the rest).
__device__ __forceinline__ void apply_top_k_top_p(const SamplingRowParams& r, double* w, int64_t V, int n_cand, Ctx& c) {
  int64_t keep = n_cand;
  if (r.top_k > 0) keep = std::min<int64_t>(keep, r.top_k);
  uint64_t cut = 0;
  if (keep < n_cand) cut = count_select(V, ProbElems{w, 0}, keep, c);
  if (r.top_p < 1.0f) {
    double part = 0.0;
    const ProbElems kept{w, cut};
    row_loop(c, V, [&](int64_t t) { Elem e; e.ok = kept(t, e.key, e.w); return e; },
             [&](int64_t, const Elem& e) { part += e.ok ? e.w : 0.0; });
    const double mass = row_sum(part, c);
    cut = radix_select<true>(V, ProbElems{w, cut}, 0, double(r.top_p) * mass, c);
  }
  const ProbElems kept{w, cut};
  row_loop(c, V, [&](int64_t t) { Elem e; e.ok = kept(t, e.key, e.w); return e; },
           [&](int64_t t, const Elem& e) { if (e.w > 0 && !e.ok) w[t] = 0.0; });
  cluster_sync();
}

// Inverse CDF in id order over non-negative values f(t): the first t with f(t) > 0 and
// target < sum_{s<=t} f(s) (the host's left-to-right rule), else the last t with f(t) > 0
// (rounding left the target past the end), else -1. Each thread of the row owns a contiguous id
// range; chunk sums are combined by a CUB exclusive scan in the block, then the lower blocks'
// totals in rank order (fixed order).
template <class F>
__device__ __forceinline__ int32_t inverse_cdf(const F& f, int64_t V, double target, Ctx& c) {
  Smem& s = c.s;
  const int64_t chunk = (V + c.nthreads - 1) / c.nthreads;
  const int64_t lo = std::min<int64_t>(V, c.tid * chunk), hi = std::min<int64_t>(V, lo + chunk);
  double local = 0.0;
#pragma unroll 4
  for (int64_t t = lo; t < hi; ++t) local += f(t);
  double acc, block_total;
  cub::BlockScan<double, kThreads>(s.tmp.scan_d).ExclusiveSum(local, acc, block_total);
  if (threadIdx.x == 0) c.mine().d = block_total;
  cluster_sync();
  if (int(threadIdx.x) < c.blocks) s.gather_d[threadIdx.x] = c.of(int(threadIdx.x)).d;
  __syncthreads();
  double below = 0.0;  // the lower-ranked blocks' mass
  for (int q = 0; q < c.rank; ++q) below += s.gather_d[q];
  acc = below + acc;
  c.phase ^= 1;
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
  found = row_max(found >= 0 ? -found : INT_MIN, c);
  if (found != INT_MIN) return -found;
  return row_max(last, c);
}

__device__ __forceinline__ double kept_total(const double* w, int64_t V, Ctx& c) {
  double part = 0.0;
  row_loop(c, V, [&](int64_t t) { return w[t]; }, [&](int64_t, double x) { part += x; });
  return row_sum(part, c);
}

// Plain sampling's draw: the first kept t with u < sum_{s<=t} p_s / total.
__device__ __forceinline__ int32_t draw(const SamplingRowParams& r, const double* w, int64_t V, Ctx& c) {
  const double total = kept_total(w, V, c);
  const double u = philox_uniform(r.seed, r.sample_index, r.position);
  const int32_t t = inverse_cdf([&](int64_t i) { return w[i] / total; }, V, u, c);
  return t >= 0 ? t : fallback_token(r, V);
}

// Sum of the positive float weights q (fp64, fixed order).
__device__ __forceinline__ double weight_sum(const float* q, int64_t V, Ctx& c) {
  double part = 0.0;
  row_loop(c, V, [&](int64_t t) { return q[t]; }, [&](int64_t, float x) { part += x > 0 ? double(x) : 0.0; });
  return row_sum(part, c);
}

// kSpecDraft: q = float(p) into r.spec_q (one-hot at the fallback when nothing is kept), then the
// draw over q's weights (engine::draw_weighted). n_cand == 0: nothing allowed.
__device__ __forceinline__ int32_t draft_from_q(const SamplingRowParams& r, const double* w, int64_t V, int n_cand, Ctx& c) {
  float* q = r.spec_q;
  const int32_t fb = fallback_token(r, V);
  const double total = n_cand > 0 ? kept_total(w, V, c) : 0.0;
  for (int64_t t = c.tid; t < V; t += c.nthreads)
    q[t] = n_cand > 0 ? float(w[t] / total) : (t == fb ? 1.0f : 0.0f);
  cluster_sync();  // every block's q writes are visible to the row after the cluster barrier
  const double qsum = weight_sum(q, V, c);
  if (!(qsum > 0)) {  // every kept p rounded to float 0: the host picker's one-hot fallback too
    for (int64_t t = c.tid; t < V; t += c.nthreads) q[t] = t == fb ? 1.0f : 0.0f;
    return fb;
  }
  const double u = philox_uniform(r.seed, r.sample_index, r.position, engine::DrawStream::kSpecDraft);
  const int32_t t = inverse_cdf([&](int64_t i) { return q[i] > 0 ? double(q[i]) : 0.0; }, V, u * qsum, c);
  return t >= 0 ? t : fb;
}

// kSpecVerify: accept or resample r.spec_draft against p = w / total (engine::rejection_sample).
// Writes *accepted (1, 0, -2 when q(draft) = 0) and returns the residual token (the draft when
// accepted). n_cand == 0 (p empty): rejected, the fallback token.
__device__ __forceinline__ int32_t verify_draft(const SamplingRowParams& r, const double* w, int64_t V, int n_cand, int* accepted,
                                Ctx& c) {
  const float* q = r.spec_q;
  const int32_t d = r.spec_draft;
  const double qsum = weight_sum(q, V, c);
  const double qd = q[d] > 0 && qsum > 0 ? double(q[d]) / qsum : 0.0;
  if (!(qd > 0)) {
    *accepted = -2;
    return fallback_token(r, V);
  }
  if (n_cand == 0) {
    *accepted = 0;
    return fallback_token(r, V);
  }
  const double total = kept_total(w, V, c);
  const double pd = w[d] / total;
  const double u_a = philox_uniform(r.seed, r.sample_index, r.position, engine::DrawStream::kSpecAccept);
  if (u_a * qd < pd) {  // row-uniform: every thread computed the same values
    *accepted = 1;
    return d;
  }
  *accepted = 0;
  const double u_r = philox_uniform(r.seed, r.sample_index, r.position, engine::DrawStream::kSpecResidual);
  auto residual = [&](int64_t t) { return fmax(0.0, w[t] / total - (q[t] > 0 ? double(q[t]) / qsum : 0.0)); };
  double part = 0.0;
  row_loop(c, V, residual, [&](int64_t, double x) { part += x; });
  const double rtotal = row_sum(part, c);
  if (rtotal > 0) {
    const int32_t t = inverse_cdf(residual, V, u_r * rtotal, c);
    if (t >= 0) return t;
  }
  // p <= q everywhere (p == q up to rounding): draw from p itself.
  const int32_t t = inverse_cdf([&](int64_t i) { return w[i] / total; }, V, u_r, c);
  return t >= 0 ? t : fallback_token(r, V);
}

// Raw-logit logprob, rank and top-N of the chosen token (engine::compute_logprobs).
// `extra` >= 0: also the logprob and rank of that token (a verify row's residual draw).
__device__ __forceinline__ void write_logprobs(const SampleParams& p, const SamplingRowParams& r, const float* raw, int32_t token,
                               int32_t extra, int64_t row, Ctx& c) {
  Smem& s = c.s;
  const int64_t V = p.vocab;
  float mx = -INFINITY;
  auto load_raw = [&](int64_t t) { return raw[t]; };
  row_loop(c, V, load_raw, [&](int64_t, float x) { mx = fmaxf(mx, x); });
  mx = row_max(mx, c);
  double part = 0.0;
  int greater = 0, greater_extra = 0;
  const float tok_logit = raw[token], extra_logit = extra >= 0 ? raw[extra] : 0.0f;
  row_loop(c, V, load_raw, [&](int64_t, float x) {
    part += exp(double(x) - double(mx));
    greater += x > tok_logit;
    greater_extra += extra >= 0 && x > extra_logit;
  });
  const double lse = double(mx) + log(row_sum(part, c));
  greater = row_sum(greater, c);
  if (extra >= 0) greater_extra = row_sum(greater_extra, c);
  if (c.leader()) {
    if (p.logprobs) p.logprobs[row] = float(double(tok_logit) - lse);
    if (p.ranks) p.ranks[row] = 1 + greater;
    if (extra >= 0 && p.spec_residual_logprob) p.spec_residual_logprob[row] = float(double(extra_logit) - lse);
    if (extra >= 0 && p.spec_residual_rank) p.spec_residual_rank[row] = 1 + greater_extra;
  }
  if (p.max_top_logprobs == 0 || !p.top_ids) return;
  const int n = int(std::min<int64_t>(std::clamp(r.top_logprobs, 0, p.max_top_logprobs), V));
  int32_t* ids = p.top_ids + row * p.max_top_logprobs;
  float* lps = p.top_logprobs + row * p.max_top_logprobs;
  for (int64_t i = n + c.tid; i < p.max_top_logprobs; i += c.nthreads) {
    ids[i] = -1;
    lps[i] = -INFINITY;
  }
  if (n == 0) return;
  const uint64_t cut = count_select(V, RawElems{raw}, n, c);
  if (threadIdx.x == 0) s.top_n = 0;
  __syncthreads();
  row_loop(c, V, load_raw, [&](int64_t t, float x) {
    const uint64_t key = make_key(x, t);
    if (key >= cut) s.top_keys[atomicAdd(&s.top_n, 1)] = key;  // exactly n in the row; sorted below
  });
  cluster_sync();
  if (c.rank != 0) return;  // rank 0 gathers the blocks' keys (the kernel's last barrier keeps them alive)
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) {
    s.top_off[0] = 0;
    for (int q = 0; q < c.blocks; ++q) s.top_off[q + 1] = s.top_off[q] + cl.map_shared_rank(&s.top_n, q)[0];
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < c.blocks * kSamplingMaxTopLogprobs; i += kThreads) {
    const int q = i / kSamplingMaxTopLogprobs, j = i % kSamplingMaxTopLogprobs;
    if (s.top_off[q] + j < s.top_off[q + 1]) s.all_keys[s.top_off[q] + j] = cl.map_shared_rank(s.top_keys, q)[j];
  }
  __syncthreads();
  if (int(threadIdx.x) < n) {
    const uint64_t key = s.all_keys[threadIdx.x];
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += s.all_keys[j] > key;
    const int32_t id = key_id(key);
    ids[rank] = id;
    lps[rank] = float(double(raw[id]) - lse);
  }
}

// grid (batch · blocks), cluster (blocks): the row's blocks are one cluster.
__global__ void __launch_bounds__(kThreads) sample_kernel(const __grid_constant__ SampleParams p) {
  __shared__ Smem s;
  cg::cluster_group cl = cg::this_cluster();
  const int blocks = int(cl.num_blocks()), rank = int(cl.block_rank());
  Ctx c{s, rank, blocks, int64_t(rank) * kThreads + threadIdx.x, int64_t(blocks) * kThreads};
  const int64_t row = blockIdx.x / blocks, V = p.vocab;
  const SamplingRowParams r = p.rows[row];
  const float* raw = p.logits + row * p.logits_stride;
  const uint32_t* m = r.has_mask && p.allowed_mask ? p.allowed_mask + row * p.mask_stride : nullptr;
  double* w = static_cast<double*>(p.workspace) + row * V;
  const bool edits = has_sparse_edits(p, r);
  if (edits) build_logits(p, r, raw, m, w, c);
  const Processed in{raw, m, edits ? w : nullptr};
  int32_t token, residual = -1;
  if (r.temperature < kGreedyBelow) {
    token = greedy_token(r, in, V, c);
  } else {
    const int n_cand = to_probs(r, in, w, V, c);
    if (n_cand > 0 && ((r.top_k > 0 && r.top_k < V) || r.top_p < 1.0f)) apply_top_k_top_p(r, w, V, n_cand, c);
    if (r.spec_mode == kSpecDraft) {
      token = draft_from_q(r, w, V, n_cand, c);
    } else {
      token = n_cand == 0 ? fallback_token(r, V) : draw(r, w, V, c);
      if (r.spec_mode == kSpecVerify) {
        int accepted = 0;
        residual = verify_draft(r, w, V, n_cand, &accepted, c);
        if (c.leader()) {
          p.spec_accepted[row] = accepted;
          p.spec_residual[row] = residual;
        }
        // residual is the draft when accepted: its logprob is what an accepted draft emits
      }
    }
  }
  if (c.leader()) p.tokens[row] = token;
  if (p.logprobs || p.ranks || p.top_ids) write_logprobs(p, r, raw, token, residual, row, c);
  cluster_sync();  // no block leaves while another still reads its shared memory
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

int sampling_blocks_per_row(int64_t vocab) {
  return int(std::clamp<int64_t>((std::max<int64_t>(vocab, 1) + kIdsPerBlock - 1) / kIdsPerBlock, 1,
                                 kMaxBlocksPerRow));
}

void sample(const SampleParams& p, cudaStream_t stream) { sample(p, stream, 0); }

void sample(const SampleParams& p, cudaStream_t stream, int blocks_per_row) {
  require(blocks_per_row >= 0 && blocks_per_row <= kMaxBlocksPerRow, "blocks_per_row ", blocks_per_row,
          " not in [0 (by vocab), ", kMaxBlocksPerRow, "]");
  require(p.batch >= 0 && p.batch <= INT32_MAX / kMaxBlocksPerRow, "batch ", p.batch, " not in [0, 2^28)");
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
  const int blocks = blocks_per_row > 0 ? blocks_per_row : sampling_blocks_per_row(p.vocab);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(p.batch * blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(blocks);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, sample_kernel, p));
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
