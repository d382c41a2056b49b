#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <mutex>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/hc.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/norm_row.cuh"

namespace deepinfer::ops::cuda {
namespace {
namespace cg = cooperative_groups;
using deepinfer::cuda::ceil_div;
using deepinfer::cuda::from_f32;
using deepinfer::cuda::kWarpSize;
using deepinfer::cuda::to_f32;
using deepinfer::cuda::warp_sum;

constexpr int kMaxMix = (2 + kHcMaxStreams) * kHcMaxStreams;  // 24
constexpr int kThreads = 256;
static_assert(kThreads == deepinfer::cuda::kNormThreads, "the fused norm runs on the finalize's block shape");
constexpr int kChunk = 1024;  // x̂ elements per partial-sum block (4 per thread)

// Tokens per partial-sum block: fn is read once per tile. The decode shape takes 4 tokens and
// every mix per block (the z split spreads few tokens over the GPU); from kWideTileFrom tokens the
// prefill shape takes 8 tokens and at most 8 mixes per block (3 blocks for V4's 24, adjacent in
// launch order so they share x through L2): fn traffic per token drops ~6x (CUDA.md: at 4,096
// tokens the 4-token tile re-read the 1.5 MB fn 1,024 times). Every (token, mix) partial is the
// same sequence of operations in both shapes, so they are bit-identical.
constexpr int kTokTile = 4, kWideTokTile = 8, kWideMix = 8;
constexpr int64_t kWideTileFrom = 256;

// The fused norm's per-token arrival counters, after the partial sums in the workspace.
__host__ __device__ inline int64_t hc_partials_floats(int64_t tokens, int num_chunks, int num_mix) {
  return tokens * num_chunks * (num_mix + 1);
}
__device__ inline unsigned* hc_counters(const HcPreParams& p, int num_chunks, int num_mix) {
  return reinterpret_cast<unsigned*>(p.workspace + hc_partials_floats(p.tokens, num_chunks, num_mix));
}

// partials[t][s][0..M) = fn[:, chunk s] · x̂_t[chunk s];  partials[t][s][M] = Σ x̂_t² over the chunk,
// for the TOK tokens of the block's tile (each fn element loaded once for all of them) and the
// mixes [group·mix_per, +mix_per) (Σ x̂² by group 0; NMIX >= mix_per accumulators). A mix's partial
// is the same sequence of operations whatever mix_per, TOK or the grid are (the other mixes' and
// tokens' accumulators are independent), so neither the split nor the tile changes a bit.
// kGroupFast: grid (groups, chunks, tiles), else (chunks, tiles, groups).
template <typename T, int TOK, int NMIX, bool kGroupFast>
__global__ void __launch_bounds__(kThreads) hc_partials_kernel(const __grid_constant__ HcPreParams p, int num_mix,
                                                               int num_chunks, int mix_per) {
  __shared__ float red[kThreads / kWarpSize][TOK][NMIX + 1];
  const int group = kGroupFast ? int(blockIdx.x) : int(blockIdx.z);
  const int64_t s = kGroupFast ? blockIdx.y : blockIdx.x;
  const int64_t t0 = int64_t(kGroupFast ? blockIdx.z : blockIdx.y) * TOK;
  const int j0 = group * mix_per, nj = j0 + mix_per < num_mix ? mix_per : num_mix - j0;  // mixes j0 .. j0+nj
  const bool sq = group == 0;  // this block also sums x̂²
  auto mine = [&](int jl) { return jl == NMIX ? sq : jl < nj; };  // block-uniform
  const int64_t K = int64_t(p.n) * p.dim;
  const T* x = static_cast<const T*>(p.x);
  // The fused norm's counters start at 0 for the finalize (stream order: it runs after this grid).
  if (p.h && s == 0 && group == 0 && threadIdx.x < TOK && t0 + threadIdx.x < p.tokens)
    hc_counters(p, num_chunks, num_mix)[t0 + threadIdx.x] = 0u;
  float acc[TOK][NMIX + 1];
#pragma unroll
  for (int u = 0; u < TOK; ++u)
#pragma unroll
    for (int j = 0; j <= NMIX; ++j) acc[u][j] = 0.f;
  for (int64_t k = s * kChunk + threadIdx.x; k < K && k < (s + 1) * kChunk; k += kThreads) {
    float v[TOK];
#pragma unroll
    for (int u = 0; u < TOK; ++u) {
      v[u] = t0 + u < p.tokens ? to_f32(x[(t0 + u) * p.x_stride + k]) : 0.f;
      acc[u][NMIX] += v[u] * v[u];
    }
#pragma unroll
    for (int jl = 0; jl < NMIX; ++jl) {
      if (jl < nj) {
        const float f = p.fn[int64_t(j0 + jl) * K + k];
#pragma unroll
        for (int u = 0; u < TOK; ++u) acc[u][jl] += f * v[u];
      }
    }
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
#pragma unroll
  for (int u = 0; u < TOK; ++u)
#pragma unroll
    for (int jl = 0; jl <= NMIX; ++jl) {
      if (!mine(jl)) continue;
      const float r = warp_sum(acc[u][jl]);
      if (lane == 0) red[warp][u][jl] = r;
    }
  __syncthreads();
  const int per_tok = num_mix + 1;
  static_assert(TOK * (NMIX + 1) <= kThreads, "one thread per (token, mix) of the tile");
  if (threadIdx.x < TOK * (NMIX + 1)) {
    const int u = threadIdx.x / (NMIX + 1), jl = threadIdx.x % (NMIX + 1);
    const int jj = jl == NMIX ? num_mix : j0 + jl;  // slot num_mix carries Σx²
    if (t0 + u < p.tokens && mine(jl)) {
      float sum = 0.f;
      for (int w = 0; w < kThreads / kWarpSize; ++w) sum += red[w][u][jl];
      p.workspace[((t0 + u) * num_chunks + s) * per_tok + jj] = sum;
    }
  }
}

__device__ __forceinline__ float sigmoidf_(float v) { return 1.0f / (1.0f + expf(-v)); }

// pre (and post in layer mode) from the RMS-scaled logits, in place (one thread).
__device__ void hc_split_pre_post(float* m, const HcPreParams& p) {
  const int n = p.n;
  for (int k = 0; k < n; ++k) m[k] = sigmoidf_(m[k] * p.scale[0] + p.base[k]) + p.hc_eps;
  if (p.mode == HcMode::kHead) return;
  for (int k = 0; k < n; ++k) m[n + k] = 2.0f * sigmoidf_(m[n + k] * p.scale[1] + p.base[n + k]);
}

// Butterfly sum over xor offsets first, 2·first, ..., last (powers of two).
__device__ __forceinline__ float group_sum(float v, int first, int last) {
  for (int o = first; o <= last; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float group_max(float v, int first, int last) {
  for (int o = first; o <= last; o <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sinkhorn on C = m[2n ..] by warp 0, lane = j·n + k holding C[j][k] (n a power of two, so a
// row is n consecutive lanes and a column is lanes k, k+n, ...). Rows: xor offsets 1..n/2;
// columns: xor offsets n..n²/2. Spec order: row softmax + eps, column norm, then
// (iters-1) × (row norm, column norm).
__device__ void hc_sinkhorn_warp(float* m, const HcPreParams& p) {
  const int n = p.n, nn = n * n, lane = threadIdx.x;
  const bool own = lane < nn;
  float c = own ? m[2 * n + lane] * p.scale[2] + p.base[2 * n + lane] : 0.f;
  const float mx = group_max(own ? c : -INFINITY, 1, n / 2);
  c = own ? expf(c - mx) : 0.f;
  c = c / group_sum(c, 1, n / 2) + p.hc_eps;
  if (!own) c = 0.f;
  c = c / (group_sum(c, n, nn / 2) + p.hc_eps);
  for (int it = 1; it < p.sinkhorn_iters; ++it) {
    c = c / (group_sum(c, 1, n / 2) + p.hc_eps);
    c = c / (group_sum(c, n, nn / 2) + p.hc_eps);
  }
  if (own) m[2 * n + lane] = c;
}

// Serial fallback for n not a power of two (3): same order as the spec, one thread. kAffine:
// C = m·scale[2] + base here; false: the caller stored that already (the same expression).
template <bool kAffine = true>
__device__ void hc_sinkhorn_serial(float* m, const HcPreParams& p) {
  const int n = p.n;
  float* C = m + 2 * n;  // C[j*n + k]: j source stream, k target stream
  for (int j = 0; j < n; ++j) {
    float mx = -INFINITY;
    for (int k = 0; k < n; ++k) {
      if (kAffine) C[j * n + k] = C[j * n + k] * p.scale[2] + p.base[2 * n + j * n + k];
      mx = fmaxf(mx, C[j * n + k]);
    }
    float sum = 0.f;
    for (int k = 0; k < n; ++k) sum += (C[j * n + k] = expf(C[j * n + k] - mx));
    for (int k = 0; k < n; ++k) C[j * n + k] = C[j * n + k] / sum + p.hc_eps;
  }
  auto col_norm = [&] {
    for (int k = 0; k < n; ++k) {
      float cs = 0.f;
      for (int j = 0; j < n; ++j) cs += C[j * n + k];
      for (int j = 0; j < n; ++j) C[j * n + k] /= cs + p.hc_eps;
    }
  };
  col_norm();
  for (int it = 1; it < p.sinkhorn_iters; ++it) {
    for (int j = 0; j < n; ++j) {
      float rs = 0.f;
      for (int k = 0; k < n; ++k) rs += C[j * n + k];
      for (int k = 0; k < n; ++k) C[j * n + k] /= rs + p.hc_eps;
    }
    col_norm();
  }
}

// One block per token: fold the partials (fixed order), split/Sinkhorn, then u = Σ_k pre_k X_k.
template <typename T>
__global__ void __launch_bounds__(kThreads) hc_finalize_kernel(const __grid_constant__ HcPreParams p, int num_mix,
                                                               int num_chunks) {
  __shared__ float m[kMaxMix + 1];
  const int64_t t = blockIdx.x;
  if (threadIdx.x <= num_mix) {
    float sum = 0.f;
    for (int s = 0; s < num_chunks; ++s) sum += p.workspace[(t * num_chunks + s) * (num_mix + 1) + threadIdx.x];
    m[threadIdx.x] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const float r = 1.0f / sqrtf(m[num_mix] / float(int64_t(p.n) * p.dim) + p.norm_eps);
    for (int j = 0; j < num_mix; ++j) m[j] *= r;
    hc_split_pre_post(m, p);
  }
  __syncthreads();
  if (p.mode == HcMode::kLayer) {
    const bool pow2 = (p.n & (p.n - 1)) == 0;
    if (pow2 && threadIdx.x < kWarpSize) hc_sinkhorn_warp(m, p);  // the whole warp 0 shuffles
    if (!pow2 && threadIdx.x == 0) hc_sinkhorn_serial(m, p);
    __syncthreads();
  }
  if (p.mix && threadIdx.x < num_mix) p.mix[t * num_mix + threadIdx.x] = m[threadIdx.x];
  if (!p.u) return;  // mixes only (single-pass wiring collapses with the previous site's weights)
  const T* x = static_cast<const T*>(p.x) + t * p.x_stride;
  T* u = static_cast<T*>(p.u) + t * p.u_stride;
  for (int64_t d = threadIdx.x; d < p.dim; d += kThreads) {
    float acc = 0.f;
    for (int k = 0; k < p.n; ++k) acc += m[k] * to_f32(x[k * p.dim + d]);
    u[d] = from_f32<T>(acc);
  }
}

// ---- the wide finalize (session 13): the same results bit for bit, in a few us at few tokens ----
//
// The legacy kernel above is latency bound at one token: the fold is 25 serial chains of 16 global
// loads, the pre/post transform one thread, the Sinkhorn 20 x 4 dependent shuffle rounds, and u one
// block walking the token's n*D inputs. Here every step keeps its operation order and only runs
// wider: the workspace slab is staged in shared memory (one coalesced read), each thread folds and
// transforms ONE mix (the same sequential sum and the same expressions), the Sinkhorn keeps a whole
// column per lane (the column sums become local adds in the butterfly's order, see below), and u is
// split over `gridDim.y` blocks per token, each recomputing the (cheap) mixes redundantly: every
// block's mixes are the same bits, so its slice of u is the legacy value.

constexpr int kFoldTile = 40;  // chunks staged per shared-memory pass (V4: 16 chunks, one pass)

// Sinkhorn with lane k (< n, a power of two) holding column k, c[j] = C[j][k]; lanes >= n hold a
// copy of column lane & (n-1) so every shuffle partner is valid. Bitwise the warp version: its row
// sum at lane (j,k) is (C[j][k] + C[j][k^1]) + (C[j][k^2] + C[j][k^3]), the same butterfly across
// lanes here; its column sum (C[j][k] + C[j^1][k]) + (C[j^2][k] + C[j^3][k]) equals, add by add
// (IEEE addition is commutative), the local (c0 + c1) + (c2 + c3). Row max is order-free.
// kAffine as for hc_sinkhorn_serial.
template <bool kAffine = true>
__device__ void hc_sinkhorn_cols(float* m, const HcPreParams& p) {
  const int n = p.n, k = threadIdx.x & (n - 1);
  float c[kHcMaxStreams];
#pragma unroll
  for (int j = 0; j < kHcMaxStreams; ++j)
    c[j] = j >= n ? 0.f : kAffine ? m[2 * n + j * n + k] * p.scale[2] + p.base[2 * n + j * n + k] : m[2 * n + j * n + k];
  auto row_sum = [&](float v) { return group_sum(v, 1, n / 2); };
  auto col_sum = [&] {
    if (n == 1) return c[0];
    if (n == 2) return c[0] + c[1];
    return (c[0] + c[1]) + (c[2] + c[3]);
  };
#pragma unroll
  for (int j = 0; j < kHcMaxStreams; ++j) {
    if (j >= n) break;
    const float mx = group_max(c[j], 1, n / 2);
    c[j] = expf(c[j] - mx);
    c[j] = c[j] / row_sum(c[j]) + p.hc_eps;
  }
  float cs = col_sum() + p.hc_eps;
#pragma unroll
  for (int j = 0; j < kHcMaxStreams; ++j) c[j] = c[j] / cs;
  for (int it = 1; it < p.sinkhorn_iters; ++it) {
    float rs[kHcMaxStreams];
#pragma unroll
    for (int j = 0; j < kHcMaxStreams; ++j) rs[j] = j < n ? row_sum(c[j]) : 1.f;
#pragma unroll
    for (int j = 0; j < kHcMaxStreams; ++j) c[j] = c[j] / (rs[j] + p.hc_eps);
    cs = col_sum() + p.hc_eps;
#pragma unroll
    for (int j = 0; j < kHcMaxStreams; ++j) c[j] = c[j] / cs;
  }
  // Lanes >= n read their column copy from m at the top; with n = 1 no shuffle orders those reads
  // before these writes (racecheck flagged it on the H200), so the warp meets first.
  __syncwarp();
  if (threadIdx.x < n)
#pragma unroll
    for (int j = 0; j < kHcMaxStreams; ++j)
      if (j < n) m[2 * n + j * n + k] = c[j];
}

// Grid (tokens, u blocks). Mixes: thread j folds and transforms mix j; block (t, 0) writes them.
// u: block y covers dims [y·per, (y+1)·per) of the token.
template <typename T>
__global__ void __launch_bounds__(kThreads) hc_finalize_wide_kernel(const __grid_constant__ HcPreParams p,
                                                                    int num_mix, int num_chunks, int64_t per) {
  __shared__ float m[kMaxMix + 1];
  __shared__ float stage[kFoldTile * (kMaxMix + 1)];
  const int64_t t = blockIdx.x;
  const int per_tok = num_mix + 1, j = threadIdx.x;
  const float* ws = p.workspace + t * num_chunks * per_tok;
  float sum = 0.f;
  for (int s0 = 0; s0 < num_chunks; s0 += kFoldTile) {
    const int s1 = min(num_chunks, s0 + kFoldTile);
    for (int e = threadIdx.x; e < (s1 - s0) * per_tok; e += kThreads) stage[e] = ws[s0 * per_tok + e];
    __syncthreads();
    if (j < per_tok)
      for (int s = 0; s < s1 - s0; ++s) sum += stage[s * per_tok + j];  // chunk order, as the legacy fold
    __syncthreads();
  }
  if (j == num_mix) m[num_mix] = sum;
  __syncthreads();
  if (j < num_mix) {
    const float r = 1.0f / sqrtf(m[num_mix] / float(int64_t(p.n) * p.dim) + p.norm_eps);
    float v = sum * r;  // hc_split_pre_post's expressions, one mix per thread
    if (j < p.n) v = sigmoidf_(v * p.scale[0] + p.base[j]) + p.hc_eps;
    else if (j < 2 * p.n) v = 2.0f * sigmoidf_(v * p.scale[1] + p.base[j]);
    m[j] = v;
  }
  __syncthreads();
  if (p.mode == HcMode::kLayer) {
    const bool pow2 = (p.n & (p.n - 1)) == 0;
    if (pow2 && threadIdx.x < kWarpSize) hc_sinkhorn_cols(m, p);
    if (!pow2 && threadIdx.x == 0) hc_sinkhorn_serial(m, p);
    __syncthreads();
  }
  if (blockIdx.y == 0 && p.mix && j < num_mix) p.mix[t * num_mix + j] = m[j];
  if (!p.u) return;
  const T* x = static_cast<const T*>(p.x) + t * p.x_stride;
  T* u = static_cast<T*>(p.u) + t * p.u_stride;
  float pre[kHcMaxStreams];
#pragma unroll
  for (int k = 0; k < kHcMaxStreams; ++k) pre[k] = k < p.n ? m[k] : 0.f;
  const int64_t d1 = min(p.dim, int64_t(blockIdx.y + 1) * per);
  for (int64_t d = int64_t(blockIdx.y) * per + threadIdx.x; d < d1; d += kThreads) {
    float xs[kHcMaxStreams];  // all n loads in flight before the sum
#pragma unroll
    for (int k = 0; k < kHcMaxStreams; ++k) xs[k] = k < p.n ? to_f32(x[k * p.dim + d]) : 0.f;
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < kHcMaxStreams; ++k)
      if (k < p.n) acc += pre[k] * xs[k];
    u[d] = from_f32<T>(acc);
  }
  if (!p.h) return;
  // The fused norm: the last of the token's gridDim.y blocks to arrive norms the whole u row. Each
  // thread's u stores are fenced before the block counts itself in; the last block fences again and
  // reads u through L2 (ld.cg), so it sees every block's slice.
  __shared__ float scratch[32];
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(hc_counters(p, num_chunks, num_mix) + t, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const T* ur = u;
  auto load = [ur](int64_t i) { return to_f32(__ldcg(ur + i)); };
  // Rows up to 4,096 in registers (16 per thread: V4's D), wider ones in two passes; the same bits.
  // Only these two widths: this tail runs once per token, so its code is kept small.
  auto norm = [&](auto* h) {
    if (p.dim <= 16 * kThreads) deepinfer::cuda::rmsnorm_row_regs<16>(load, p.h_w, h, p.dim, p.h_eps, scratch);
    else deepinfer::cuda::rmsnorm_row_loop(load, p.h_w, h, p.dim, p.h_eps, scratch);
  };
  if (p.h_dtype == DType::kF32) norm(static_cast<float*>(p.h) + t * p.h_stride);
  else norm(static_cast<__nv_bfloat16*>(p.h) + t * p.h_stride);
}

// ---- One launch per site at few tokens: a thread-block cluster per token (session 16) ----
// The two-kernel form pays a launch, the grid's drain and ramp, and four dependent global round
// trips in the finalize (its workspace slab, base/scale for the transform, base/scale again for
// the Sinkhorn, x for u) between the partial sums and u. Here one cluster of `cs` blocks owns a
// token: block r sums its chunks (r·cpb ..) for every mix, exactly as hc_partials_kernel does for
// that (token, chunk, mix), pushes the partial vector into the shared memory of every block of the
// cluster (distributed shared memory), and after one hardware cluster barrier each block folds
// the chunks in chunk order, transforms (the wide finalize's expressions) and writes its slice of
// u; block 0 also runs the Sinkhorn (u does not need C) and writes the mixes. base, scale and the
// block's x for u are loaded before the partial sums, so their latency hides behind fn's. No
// workspace, counter or fence: the barrier orders the pushes (release / acquire). Every value is
// the same sequence of operations as in the two-kernel path, so the results are bit-identical.
constexpr int kClusterMax = 16;       // non-portable cluster size (Hopper); 8 where 16 can't be placed
constexpr int kFusedMaxChunks = 64;   // chunks (1,024 inputs) per token: n·D <= 65,536
constexpr int64_t kFusedAutoTokens = 8;  // the automatic rule: one launch up to this many tokens
// Whether single_launch = 0 (the default, the engine's) takes it: off unless the environment has
// DEEPINFER_HC_SINGLE_LAUNCH=1, until a GPU has run the bit-identity tests and timed it (session 16
// got no device). single_launch = 1 forces it per call (the tests).
bool single_launch_auto() {
  static const bool on = [] {
    const char* v = std::getenv("DEEPINFER_HC_SINGLE_LAUNCH");
    if (!v || !*v || std::string_view(v) == "0") return false;
    if (std::string_view(v) == "1") return true;
    DI_THROW(ConfigError, "DEEPINFER_HC_SINGLE_LAUNCH=", v, ": expected 0 or 1");  // never silently off
  }();
  return on;
}
constexpr int kNormRowMax = deepinfer::cuda::kNormMaxPerThread * kThreads;  // the fused norm's widest row (4,096)

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

// warp_sum (xor butterfly 16, 8, 4, 2, 1) of 32 values at once: returns, at lane l, warp_sum(v[l]).
// At each offset o a lane keeps the half of its values whose index bit matches its own lane bit
// and sends the other half to lane l^o, which keeps that half: each kept value becomes
// own + partner for the same index and the same pair of lanes as in warp_sum (where lanes l and
// l^o hold the same bits after every step, IEEE addition being commutative), so every sum is
// warp_sum's tree add for add. 31 shuffles instead of 25 x 5.
template <int O>
__device__ __forceinline__ void scatter_step(float (&w)[kWarpSize], int lane) {
  const bool hi = lane & O;  // keep the indices with bit O set
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = hi ? w[i] : w[i + O], keep = hi ? w[i + O] : w[i];
    w[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}
__device__ __forceinline__ float warp_sum_scatter(const float (&v)[kMaxMix + 1]) {
  static_assert(kMaxMix + 1 <= kWarpSize && kWarpSize == 32, "one accumulator per lane");
  const int lane = threadIdx.x % kWarpSize;
  float w[kWarpSize];
#pragma unroll
  for (int i = 0; i < kWarpSize; ++i) w[i] = i <= kMaxMix ? v[i] : 0.f;
  scatter_step<16>(w, lane);
  scatter_step<8>(w, lane);
  scatter_step<4>(w, lane);
  scatter_step<2>(w, lane);
  scatter_step<1>(w, lane);
  return w[0];
}

// Grid (cs, tokens), cluster (cs, 1, 1); block rank r = blockIdx.x handles chunks
// [r·cpb, min((r+1)·cpb, chunks)) and u dims [r·per, min((r+1)·per, D)).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) hc_pre_cluster_kernel(const __grid_constant__ HcPreParams p,
                                                                     int num_mix, int num_chunks, int cpb,
                                                                     int64_t per) {
  __shared__ float parts[kFusedMaxChunks][kMaxMix + 1];  // [chunk][mix; Σx̂² at num_mix], every block a copy
  __shared__ float red[kThreads / kWarpSize][kMaxMix + 1];
  __shared__ float m[kMaxMix + 1];
  __shared__ float hrow[kNormRowMax];  // the fused norm's u row (rank norm_rank's copy is used)
  cg::cluster_group cl = cg::this_cluster();
  cluster_arrive_relaxed();  // "this block has started": remote stores may target it after the wait below
  const int rank = int(blockIdx.x), cs = int(gridDim.x), j = threadIdx.x;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t t = blockIdx.y, K = int64_t(p.n) * p.dim;
  const int per_tok = num_mix + 1;
  const T* x = static_cast<const T*>(p.x) + t * p.x_stride;
  // Loads that do not depend on the sums, issued first: the transform's scale / base, u's inputs.
  float sc = 0.f, bs = 0.f;
  if (j < num_mix) {
    sc = p.scale[j < p.n ? 0 : j < 2 * p.n ? 1 : 2];
    bs = p.base[j];
  }
  const int64_t d0 = int64_t(rank) * per + threadIdx.x, d1 = min(p.dim, int64_t(rank + 1) * per);
  float xs0[kHcMaxStreams];
#pragma unroll
  for (int k = 0; k < kHcMaxStreams; ++k) xs0[k] = p.u && k < p.n && d0 < d1 ? to_f32(x[k * p.dim + d0]) : 0.f;
  // The fused norm's weight row into L2 now (the norm block reads it last, on the critical path).
  if (p.h && p.h_w && rank == (cs > 1 ? 1 : 0) && threadIdx.x * 32 < p.dim)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p.h_w + threadIdx.x * 32));

  // The partial sums of the block's chunks: hc_partials_kernel's sequence for one token (the
  // accumulators of the other tokens of its tile never mix with this one's).
  const int s_end = min(num_chunks, (rank + 1) * cpb);
  for (int s = rank * cpb; s < s_end; ++s) {
    float acc[kMaxMix + 1];
#pragma unroll
    for (int jl = 0; jl <= kMaxMix; ++jl) acc[jl] = 0.f;
    // Every load of the chunk first (one memory round trip, not one per pass), then the FMAs in
    // hc_partials_kernel's order: pass i, then mix jl (each accumulator's own sequence).
    constexpr int kPass = kChunk / kThreads;
    float xv[kPass], fv[kPass][kMaxMix];
#pragma unroll
    for (int i = 0; i < kPass; ++i) {
      const int64_t k = int64_t(s) * kChunk + i * kThreads + threadIdx.x;
      xv[i] = k < K ? to_f32(x[k]) : 0.f;
#pragma unroll
      for (int jl = 0; jl < kMaxMix; ++jl) fv[i][jl] = k < K && jl < num_mix ? p.fn[int64_t(jl) * K + k] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kPass; ++i) {
      const int64_t k = int64_t(s) * kChunk + i * kThreads + threadIdx.x;
      if (k < K) {  // a pass past the end adds nothing, as the loop bound there
        const float v = xv[i];
        acc[kMaxMix] += v * v;
#pragma unroll
        for (int jl = 0; jl < kMaxMix; ++jl)
          if (jl < num_mix) acc[jl] += fv[i][jl] * v;
      }
    }
    // warp_sum of every accumulator as a reduce-scatter: 31 shuffles instead of 25 x 5 (lane l ends
    // with accumulator l's sum, the same bits: see warp_sum_scatter).
    const float r = warp_sum_scatter(acc);
    if (lane <= kMaxMix) red[warp][lane] = r;
    __syncthreads();
    if (s == rank * cpb) cluster_wait();  // every block of the cluster has started (pairs the arrive above)
    if (threadIdx.x < kMaxMix + 1) {
      const int jl = threadIdx.x;
      if (jl == kMaxMix || jl < num_mix) {
        float sum = 0.f;
        for (int w = 0; w < kThreads / kWarpSize; ++w) sum += red[w][jl];
        const int jj = jl == kMaxMix ? num_mix : jl;
        for (int r = 0; r < cs; ++r) cl.map_shared_rank(&parts[0][0], r)[s * (kMaxMix + 1) + jj] = sum;
      }
    }
    __syncthreads();  // red is reused by the next chunk
  }
  if (rank * cpb >= num_chunks) cluster_wait();  // a block without chunks still pairs its arrive
  cluster_arrive();  // release: this block's pushes
  cluster_wait();    // acquire: every block's pushes are in parts

  float sum = 0.f;
  if (j < per_tok)
    for (int s = 0; s < num_chunks; ++s) sum += parts[s][j];  // chunk order, as the two-kernel fold
  if (j == num_mix) m[num_mix] = sum;
  __syncthreads();
  if (j < num_mix) {
    const float r = 1.0f / sqrtf(m[num_mix] / float(int64_t(p.n) * p.dim) + p.norm_eps);
    float v = sum * r;  // hc_finalize_wide_kernel's expressions
    if (j < p.n) v = sigmoidf_(v * sc + bs) + p.hc_eps;
    else if (j < 2 * p.n) v = 2.0f * sigmoidf_(v * sc + bs);
    else v = v * sc + bs;  // the Sinkhorn's first expression, with the prefetched scale / base
    m[j] = v;
  }
  __syncthreads();
  // The fused norm (h): every block pushes its u values (as stored: rounded to T) into the norm
  // block's row, one more cluster barrier, and that block norms the whole row with rmsnorm's code
  // (ops/cuda/norm_row.cuh: the same bits as ops/cuda/rmsnorm on u). The norm block is rank 1, so
  // its block-wide reduction does not wait for rank 0's Sinkhorn (rank 0 when the cluster is 1).
  const int norm_rank = cs > 1 ? 1 : 0;
  float* row = p.h ? cl.map_shared_rank(&hrow[0], norm_rank) : nullptr;
  if (p.u) {
    T* u = static_cast<T*>(p.u) + t * p.u_stride;
    float pre[kHcMaxStreams];
#pragma unroll
    for (int k = 0; k < kHcMaxStreams; ++k) pre[k] = k < p.n ? m[k] : 0.f;
    for (int64_t d = d0; d < d1; d += kThreads) {
      float xs[kHcMaxStreams];
#pragma unroll
      for (int k = 0; k < kHcMaxStreams; ++k)
        xs[k] = d == d0 ? xs0[k] : k < p.n ? to_f32(x[k * p.dim + d]) : 0.f;
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < kHcMaxStreams; ++k)
        if (k < p.n) acc += pre[k] * xs[k];
      const T q = from_f32<T>(acc);
      u[d] = q;
      if (row) row[d] = to_f32(q);
    }
  }
  if (p.h) cluster_arrive();  // release: the pushes into the norm block's row
  if (rank == 0) {
    if (p.mode == HcMode::kLayer) {
      const bool pow2 = (p.n & (p.n - 1)) == 0;
      if (pow2 && threadIdx.x < kWarpSize) hc_sinkhorn_cols<false>(m, p);
      if (!pow2 && threadIdx.x == 0) hc_sinkhorn_serial<false>(m, p);
      __syncthreads();
    }
    if (p.mix && j < num_mix) p.mix[t * num_mix + j] = m[j];
  }
  if (!p.h) return;
  cluster_wait();  // acquire (every block waits: none leaves while its pushes may be in flight)
  if (rank != norm_rank) return;
  __shared__ float scratch[32];
  auto load = [](int64_t i) { return hrow[i]; };
  if (p.h_dtype == DType::kF32)
    deepinfer::cuda::rmsnorm_row_regs<kNormRowMax / kThreads>(load, p.h_w, static_cast<float*>(p.h) + t * p.h_stride,
                                                              p.dim, p.h_eps, scratch);
  else
    deepinfer::cuda::rmsnorm_row_regs<kNormRowMax / kThreads>(
        load, p.h_w, static_cast<__nv_bfloat16*>(p.h) + t * p.h_stride, p.dim, p.h_eps, scratch);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) hc_post_kernel(const __grid_constant__ HcPostParams p) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.tokens * p.dim) return;
  const int64_t t = idx / p.dim, d = idx % p.dim;
  const int n = p.n, num_mix = (2 + n) * n;
  const float* mix = p.mix + t * num_mix;
  const T* x = static_cast<const T*>(p.x) + t * p.x_stride + d;
  float xs[kHcMaxStreams];
#pragma unroll
  for (int j = 0; j < kHcMaxStreams; ++j) xs[j] = j < n ? to_f32(x[j * p.dim]) : 0.f;
  const float yv = to_f32(static_cast<const T*>(p.y)[t * p.y_stride + d]);
  T* out = static_cast<T*>(p.out) + t * p.out_stride + d;
#pragma unroll
  for (int k = 0; k < kHcMaxStreams; ++k) {
    if (k >= n) break;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < kHcMaxStreams; ++j)
      if (j < n) acc += mix[2 * n + j * n + k] * xs[j];
    out[k * p.dim] = from_f32<T>(mix[n + k] * yv + acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) hc_collapse_kernel(const __grid_constant__ HcCollapseParams p) {
  const int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= p.tokens * p.dim) return;
  const int64_t t = idx / p.dim, d = idx % p.dim;
  const T* x = static_cast<const T*>(p.x) + t * p.x_stride + d;
  T* u = static_cast<T*>(p.u) + t * p.u_stride + d;
  if (!p.w) {
    *u = x[0];
    return;
  }
  const float* w = p.w + t * p.w_stride;
  float acc = 0.f;
  for (int k = 0; k < p.n; ++k) acc += w[k] * to_f32(x[k * p.dim]);
  *u = from_f32<T>(acc);
}

// Mix groups that bring the partial-sum grid to about one block per SM, only while the grid holds
// fewer blocks than a quarter of the SMs: each group reads x again, and on the H200 (132 SMs) the
// split paid at 16 blocks (1 and 4 tokens: 39.8 -> 33.5 us) and cost at 64 (16 tokens: 40.3 ->
// 42.5 us; CudaTiming.HcPreMixSplit, 2026-12-03).
int num_sms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    DI_CUDA_CHECK(cudaGetDevice(&dev));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

int auto_mix_split(int64_t blocks, int num_mix) {
  const int sms = num_sms();
  if (blocks * 4 >= sms) return 1;
  return int(std::min<int64_t>(num_mix, std::max<int64_t>(1, ceil_div(int64_t(sms), blocks))));
}

// Dims of u per finalize block: u_split blocks per token (0: about two blocks per SM over the
// launch, none narrower than one pass of the block), rounded up to whole passes of kThreads.
int64_t u_slice(const HcPreParams& p) {
  const int64_t max_split = ceil_div(p.dim, kThreads);
  int64_t split = p.u_split;
  if (split == 0) split = ceil_div(2 * int64_t(num_sms()), p.tokens);
  split = std::max<int64_t>(1, std::min(split, max_split));
  return ceil_div(ceil_div(p.dim, split), kThreads) * kThreads;
}

// The single launch's cluster: blocks per token (<= cluster_max), chunks per block. 16-block
// clusters are non-portable: allowed per kernel, and used only where the GPU can place at least as
// many of them at once as the launch has tokens (else 8, the portable size). Queried once, on the
// first hc_pre call (usually a prefill, outside any graph capture), for both dtypes.
struct ClusterLimits {
  bool supported = false;  // cluster launch (sm_90 and up)
  int max16[2] = {0, 0};   // 16-block clusters the GPU places at once: f32, bf16 kernels
};
template <typename T>
int max_clusters16() {
  const auto fn = hc_pre_cluster_kernel<T>;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(kClusterMax, 1, 1);
  cfg.blockDim = dim3(kThreads, 1, 1);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kClusterMax;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, fn, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}
// Per device (a process may drive several; the function attribute is set in each one's context).
const ClusterLimits& cluster_limits() {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static ClusterLimits lim[kMaxDevices];
  int dev = 0;
  DI_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) DI_THROW(InvalidArgument, "hc_pre: device ", dev, " >= ", kMaxDevices);
  std::call_once(once[dev], [dev] {
    ClusterLimits& l = lim[dev];
    int v = 0;
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, dev));
    l.supported = v != 0;
    if (l.supported) {
      l.max16[0] = max_clusters16<float>();
      l.max16[1] = max_clusters16<__nv_bfloat16>();
    }
  });
  return lim[dev];
}

void check_common(int n, int64_t dim, int64_t tokens, const char* what) {
  if (n < 1 || n > kHcMaxStreams) DI_THROW(InvalidArgument, what, ": hc_mult ", n, " not in [1, ", kHcMaxStreams, "]");
  if (dim <= 0 || tokens < 0) DI_THROW(InvalidArgument, what, ": bad shape tokens=", tokens, " dim=", dim);
}
}  // namespace

int hc_num_mix(int n, HcMode mode) { return mode == HcMode::kLayer ? (2 + n) * n : n; }

size_t hc_pre_workspace_bytes(int64_t tokens, int n, int64_t dim, HcMode mode) {
  const int chunks = int(ceil_div(int64_t(n) * dim, kChunk));
  return size_t(hc_partials_floats(tokens, chunks, hc_num_mix(n, mode))) * sizeof(float) +
         size_t(tokens) * sizeof(unsigned);  // + the fused norm's counters
}

bool hc_pre_single_launch(int64_t tokens, int n, int64_t dim, HcMode mode, bool with_norm) {
  const int64_t chunks = ceil_div(int64_t(n) * dim, kChunk);
  (void)mode;
  return single_launch_auto() && tokens >= 1 && tokens <= kFusedAutoTokens && chunks <= kFusedMaxChunks &&
         (!with_norm || dim <= kNormRowMax) && cluster_limits().supported;
}

void hc_pre(const HcPreParams& p, cudaStream_t stream) {
  check_common(p.n, p.dim, p.tokens, "hc_pre");
  if (!p.x || !p.fn || !p.base || !p.scale || !p.workspace)
    DI_THROW(InvalidArgument, "hc_pre: null x, fn, base, scale or workspace");
  if (!p.u && p.mode == HcMode::kHead) DI_THROW(InvalidArgument, "hc_pre: head mode needs u");
  if (p.mode == HcMode::kLayer && !p.mix) DI_THROW(InvalidArgument, "hc_pre: layer mode needs the mix output");
  if (p.x_stride < p.n * p.dim || (p.u && p.u_stride < p.dim))
    DI_THROW(InvalidArgument, "hc_pre: strides x ", p.x_stride, " / u ", p.u_stride, " too small");
  if (p.sinkhorn_iters < 1) DI_THROW(InvalidArgument, "hc_pre: sinkhorn_iters must be >= 1");
  if (p.mix_split < 0) DI_THROW(InvalidArgument, "hc_pre: mix_split ", p.mix_split, " < 0");
  if (p.u_split < 0) DI_THROW(InvalidArgument, "hc_pre: u_split ", p.u_split, " < 0");
  if (p.cluster < 0 || p.cluster > kClusterMax)
    DI_THROW(InvalidArgument, "hc_pre: cluster ", p.cluster, " not in [0, ", kClusterMax, "]");
  if (p.token_tile != 0 && p.token_tile != kTokTile && p.token_tile != kWideTokTile)
    DI_THROW(InvalidArgument, "hc_pre: token_tile ", p.token_tile, " is not 0 (automatic), ", kTokTile, " or ",
             kWideTokTile);
  if (p.h) {
    if (!p.u) DI_THROW(InvalidArgument, "hc_pre: the fused norm (h) needs u");
    if (p.h_stride < p.dim) DI_THROW(InvalidArgument, "hc_pre: h stride ", p.h_stride, " < dim ", p.dim);
    if (p.h_dtype != DType::kF32 && p.h_dtype != DType::kBF16)
      DI_THROW(InvalidArgument, "hc_pre: h dtype ", dtype_name(p.h_dtype), " not supported (f32 or bf16)");
  }
  if (p.tokens == 0) return;
  if (p.tokens > 65535) DI_THROW(InvalidArgument, "hc_pre: ", p.tokens, " tokens > 65535 per launch; split the batch");
  const int num_mix = hc_num_mix(p.n, p.mode);
  const int chunks = int(ceil_div(int64_t(p.n) * p.dim, kChunk));
  const int tile = p.token_tile ? p.token_tile : p.tokens >= kWideTileFrom ? kWideTokTile : kTokTile;
  const ClusterLimits& lim = cluster_limits();
  const bool single = (p.single_launch > 0 || (single_launch_auto() && p.single_launch == 0 && p.tokens <= kFusedAutoTokens)) &&
                      chunks <= kFusedMaxChunks && !p.legacy_finalize && (!p.h || p.dim <= kNormRowMax) &&
                      lim.supported;
  DI_DISPATCH_FLOAT(p.dtype, T, "hc_pre x", [&] {
    if (single) {
      const int max16 = lim.max16[std::is_same_v<T, float> ? 0 : 1];
      const int cmax = p.cluster > 0 ? p.cluster : max16 >= p.tokens ? kClusterMax : 8;
      const int cpb = int(ceil_div(chunks, cmax)), cs = int(ceil_div(chunks, cpb));
      if (cs > 8 && max16 == 0) DI_THROW(InvalidArgument, "hc_pre: this GPU places no ", cs, "-block cluster");
      const int64_t per = ceil_div(p.dim, cs);
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(cs), unsigned(p.tokens), 1);
      cfg.blockDim = dim3(kThreads, 1, 1);
      cfg.stream = stream;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = unsigned(cs);
      attr[0].val.clusterDim.y = 1;
      attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      DI_CUDA_CHECK(cudaLaunchKernelEx(&cfg, hc_pre_cluster_kernel<T>, p, num_mix, chunks, cpb, per));
      return;
    }
    if (tile == kWideTokTile) {
      // At most kWideMix mixes per block (mix_split, when given, can only split them further).
      const int split = std::max(p.mix_split, int(ceil_div(int64_t(num_mix), int64_t(kWideMix))));
      const int mix_per = int(ceil_div(int64_t(num_mix), int64_t(std::min(split, num_mix))));
      const unsigned groups = unsigned(ceil_div(int64_t(num_mix), int64_t(mix_per)));
      const unsigned tiles = unsigned(ceil_div(p.tokens, kWideTokTile));
      hc_partials_kernel<T, kWideTokTile, kWideMix, true>
          <<<dim3(groups, chunks, tiles), kThreads, 0, stream>>>(p, num_mix, chunks, mix_per);
    } else {
      const unsigned tiles = unsigned(ceil_div(p.tokens, kTokTile));
      const int split = p.mix_split > 0 ? p.mix_split : auto_mix_split(int64_t(chunks) * tiles, num_mix);
      const int mix_per = int(ceil_div(int64_t(num_mix), int64_t(std::min(split, num_mix))));
      const unsigned groups = unsigned(ceil_div(int64_t(num_mix), int64_t(mix_per)));  // none empty
      hc_partials_kernel<T, kTokTile, kMaxMix, false>
          <<<dim3(chunks, tiles, groups), kThreads, 0, stream>>>(p, num_mix, chunks, mix_per);
    }
    DI_CUDA_CHECK_LAUNCH();
    if (p.legacy_finalize) {
      HcPreParams q = p;
      q.h = nullptr;  // the legacy path norms in a second launch (the unfused baseline)
      hc_finalize_kernel<T><<<unsigned(p.tokens), kThreads, 0, stream>>>(q, num_mix, chunks);
      DI_CUDA_CHECK_LAUNCH();
      if (p.h)
        rmsnorm({.x = p.u, .x_dtype = p.dtype, .x_stride = p.u_stride, .w = p.h_w, .w_dtype = DType::kF32, .y = p.h,
                 .y_dtype = p.h_dtype, .y_stride = p.h_stride, .rows = p.tokens, .dim = p.dim, .eps = p.h_eps},
                stream);
    } else {
      const int64_t per = u_slice(p);
      const unsigned ys = p.u ? unsigned(ceil_div(p.dim, per)) : 1u;
      hc_finalize_wide_kernel<T><<<dim3(unsigned(p.tokens), ys), kThreads, 0, stream>>>(p, num_mix, chunks, per);
    }
    DI_CUDA_CHECK_LAUNCH();
  });
}

void hc_collapse(const HcCollapseParams& p, cudaStream_t stream) {
  check_common(p.n, p.dim, p.tokens, "hc_collapse");
  if (!p.x || !p.u) DI_THROW(InvalidArgument, "hc_collapse: null x or u");
  if (p.x_stride < p.n * p.dim || p.u_stride < p.dim || (p.w && p.w_stride < p.n))
    DI_THROW(InvalidArgument, "hc_collapse: strides too small");
  const int64_t total = p.tokens * p.dim;
  if (total == 0) return;
  DI_DISPATCH_FLOAT(p.dtype, T, "hc_collapse x", [&] {
    hc_collapse_kernel<T><<<unsigned(ceil_div(total, kThreads)), kThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

void hc_post(const HcPostParams& p, cudaStream_t stream) {
  check_common(p.n, p.dim, p.tokens, "hc_post");
  if (!p.x || !p.y || !p.mix || !p.out) DI_THROW(InvalidArgument, "hc_post: null x, y, mix or out");
  if (p.x_stride < p.n * p.dim || p.out_stride < p.n * p.dim || p.y_stride < p.dim)
    DI_THROW(InvalidArgument, "hc_post: strides too small");
  const int64_t total = p.tokens * p.dim;
  if (total == 0) return;
  DI_DISPATCH_FLOAT(p.dtype, T, "hc_post x", [&] {
    hc_post_kernel<T><<<unsigned(ceil_div(total, kThreads)), kThreads, 0, stream>>>(p);
    DI_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace deepinfer::ops::cuda
