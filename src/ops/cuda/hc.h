// mHC (manifold-constrained hyper-connections) on the GPU, spec §2. All mixing math in fp32.
//
// hc_pre, per token t with streams X[t] = [n, D] (flattened x̂ of n*D, stream-major):
//   r = 1/sqrt(mean(x̂²) + norm_eps);  m = r · (fn @ x̂)            fn [M, n*D] f32
//   layer mode (M = (2+n)·n): pre_k = sigmoid(m_k·s0 + b_k) + hc_eps; post_k = 2·sigmoid(m_{n+k}·s1 + b_{n+k});
//     C[j][k] = m_{2n+jn+k}·s2 + b_{...}; C = rowsoftmax(C) + hc_eps; C /= colsum + hc_eps;
//     (iters-1) × { C /= rowsum + hc_eps; C /= colsum + hc_eps }
//   head mode (M = n, the final hc_head): pre_k = sigmoid(m_k·s0 + b_k) + hc_eps only.
//   u[t] = Σ_k pre_k · X_k   (fp32, k in order, cast to u's dtype)
// hc_post:  X'_k = post_k · y + Σ_j C[j][k] · X_j   (fp32, j in order, cast).
// The reduction over n*D is split across blocks into fixed-order partial sums in `workspace`
// (deterministic, batch invariant); size it with hc_pre_workspace_bytes (it also holds the fused
// norm's per-token counters).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

enum class HcMode { kLayer, kHead };
constexpr int kHcMaxStreams = 4;

struct HcPreParams {
  const void* x = nullptr;       // [tokens, n, D] dtype, token stride x_stride (elements), streams contiguous
  DType dtype = DType::kBF16;    // of x and u
  int64_t x_stride = 0;
  const float* fn = nullptr;     // [M, n*D] f32
  const float* base = nullptr;   // [M] f32
  const float* scale = nullptr;  // [3] (layer) or [1] (head) f32
  void* u = nullptr;             // [tokens, D] dtype, row stride u_stride; null: mixes only (layer mode)
  int64_t u_stride = 0;
  float* mix = nullptr;          // [tokens, M] f32 out: pre[n], post[n], C[n][n] (layer); pre[n] (head); may be null in head mode
  float* workspace = nullptr;    // hc_pre_workspace_bytes(...)
  int64_t tokens = 0;
  int n = 4;                     // hc_mult (<= kHcMaxStreams)
  int64_t dim = 0;               // D
  HcMode mode = HcMode::kLayer;
  int sinkhorn_iters = 20;
  float norm_eps = 1e-6f;        // inside the RMS
  float hc_eps = 1e-6f;
  // Partial-sum blocks per (chunk, token tile) over the M mixes: 0 = enough to fill the GPU (few
  // tokens: 16 chunks x 1 tile would use 16 SMs), 1 = all M in one block. The sums are the same
  // bit for bit for every value (each mix's partial is computed by one block in a fixed order).
  int mix_split = 0;
  // Finalize blocks per token that share the u output (each recomputes the token's mixes, the same
  // bits): 0 = enough to fill the GPU at few tokens (1 from ~2 tokens per SM up), else at most
  // ceil(D / 256). u and the mixes are bit-identical for every value.
  int u_split = 0;
  // The one-block-per-token finalize of sessions <= 12 (serial fold, one-thread transform, the
  // warp Sinkhorn): bit-identical, kept as the timing baseline (CudaTiming.HcPreFinalize).
  bool legacy_finalize = false;
  // Tokens per partial-sum block: 0 = automatic (8, with at most 8 mixes per block, from 256
  // tokens: prefill; else 4), or 4 / 8 forced (tests, timing). Bit-identical for every value.
  int token_tile = 0;
  // One launch per site (session 16): a thread-block cluster per token sums the partials, folds
  // them over distributed shared memory after one cluster barrier and writes u and the mixes;
  // no workspace traffic, bit-identical to the two-kernel path by construction. 0 = automatic (up to
  // 8 tokens once enabled: only with DEEPINFER_HC_SINGLE_LAUNCH=1 in the environment until a GPU
  // has run the bit-identity tests and the timing; else 0 means the two kernels), 1 = forced (tests,
  // timing), -1 = never. Falls back to the two kernels where it can't run (n·D > 65,536, no cluster
  // launch, legacy_finalize, h with D > 4,096).
  int single_launch = 0;
  // Blocks per token's cluster for the single launch: 0 = automatic (16 where the GPU can place
  // such clusters, else 8), or 1..16 forced (timing). Each block sums ceil(chunks / blocks) chunks.
  int cluster = 0;
  // The site's RMSNorm fused in: h[t] = rmsnorm(u[t]) (· h_w), the same bits as ops/cuda/rmsnorm on
  // u (ops/cuda/norm_row.cuh's order). In the single launch (D <= 4,096): every block pushes its u
  // slice into one block's shared memory, a cluster barrier, that block norms the row; the engine
  // uses it there (decode at 1..8 tokens: CudaBackend::hc_site_norms). In the two-kernel path
  // (session 15): the last of a token's u blocks to finish (a counter per token in the workspace,
  // zeroed by the partial-sum kernel) re-reads the row from L2 and norms it; measured not to pay
  // there (CudaTiming.HcSiteFusedNorm, docs/PERFORMANCE.md), so the engine does not ask for it
  // beyond 8 tokens. Null: no norm. Needs u.
  void* h = nullptr;             // [tokens, D] h_dtype, row stride h_stride
  DType h_dtype = DType::kBF16;
  int64_t h_stride = 0;
  const float* h_w = nullptr;    // [D] f32, or null (unweighted)
  float h_eps = 1e-6f;
};

struct HcPostParams {
  const void* x = nullptr;       // [tokens, n, D] residual streams, token stride x_stride
  int64_t x_stride = 0;
  const void* y = nullptr;       // [tokens, D] block output, row stride y_stride
  int64_t y_stride = 0;
  const float* mix = nullptr;    // [tokens, (2+n)·n] from hc_pre (layer mode)
  void* out = nullptr;           // [tokens, n, D], token stride out_stride; may alias x
  int64_t out_stride = 0;
  DType dtype = DType::kBF16;    // of x, y, out
  int64_t tokens = 0;
  int n = 4;
  int64_t dim = 0;
};

// Single-pass wiring (V4.1): a site collapses with the PREVIOUS site's pre weights. hc_pre then
// runs for the mixes only (u may be null: no collapse), and hc_collapse forms
//   u[t] = Σ_k w[t, k] · X[t, k]   (fp32, k in order; w [tokens, n] at row stride w_stride, e.g. the
// previous site's mix rows), or u[t] = X[t, 0] exactly when w is null (the one-hot start).
// CPU twin: ops/cpu/hc.h hc_collapse.
struct HcCollapseParams {
  const void* x = nullptr;       // [tokens, n, D] dtype, token stride x_stride
  int64_t x_stride = 0;
  const float* w = nullptr;      // [tokens, n] f32 at row stride w_stride, or null (stream 0)
  int64_t w_stride = 0;
  void* u = nullptr;             // [tokens, D] dtype, row stride u_stride
  int64_t u_stride = 0;
  DType dtype = DType::kBF16;    // of x and u
  int64_t tokens = 0;
  int n = 4;
  int64_t dim = 0;
};
void hc_collapse(const HcCollapseParams& p, cudaStream_t stream);

int hc_num_mix(int n, HcMode mode);
size_t hc_pre_workspace_bytes(int64_t tokens, int n, int64_t dim, HcMode mode);
void hc_pre(const HcPreParams& p, cudaStream_t stream);
// Whether hc_pre takes the single launch automatically (single_launch = 0) at this shape on the
// current GPU, with the fused norm (h) when `with_norm`: where the norm fused in costs less than
// a separate rmsnorm launch (the engine asks before passing h).
bool hc_pre_single_launch(int64_t tokens, int n, int64_t dim, HcMode mode, bool with_norm);
void hc_post(const HcPostParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
