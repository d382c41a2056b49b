// Manifold-constrained hyper-connections (mHC), MODEL-DEEPSEEK-V4.md §2. The residual of each
// token is n streams X [n, D]; every HC site turns them into a block input u and, after the
// block, mixes the block output back into n streams.
#pragma once
#include <cstdint>

#include "ops/cpu/gemm.h"

namespace deepinfer::ops::cpu {

struct HcSpec {
  int64_t n = 4;                // hc_mult (streams)
  int64_t dim = 0;              // D (hidden size)
  int64_t sinkhorn_iters = 20;  // hc_sinkhorn_iters
  float rms_eps = 1e-6f;        // eps of the unweighted RMS over n*D
  float hc_eps = 1e-6f;
  GemmKind gemm = GemmKind::kFast;  // kernel of the mix logits' product (kFixedOrder: batch-invariant)
  // The site's fn repacked (pack_weight of fn), or null: with kFast the mix logits run on the
  // packed kernel (linear_packed) instead of gemm().
  const PackedWeight* fn_packed = nullptr;
};

// Site pre-step for T tokens.
//  X    [T, n, D]          input streams
//  fn   [(2+n)n, n*D], base [(2+n)n], scale [3]  site parameters (f32)
//  u    [T, D]             out: Σ_k pre_k X_k (block input, before the block's RMSNorm)
//  post [T, n]             out: 2·sigmoid(...) placement weights
//  comb [T, n, n]          out: comb[t][j][k], j = source stream, k = target; Sinkhorn-normalised
// Order: row softmax (+eps), column norm, then (iters-1)×(row norm, column norm).
void hc_pre(const float* X, int64_t T, const HcSpec& spec, const float* fn, const float* base, const float* scale,
            float* u, float* post, float* comb);

// Site post-step: X_out[t,k,:] = post[t,k]·y[t,:] + Σ_j comb[t,j,k]·X[t,j,:].  y [T, D].
// X_out must not alias X.
void hc_post(const float* X, const float* y, const float* post, const float* comb, int64_t T, const HcSpec& spec,
             float* X_out);

// Single-pass wiring (V4.1, MODEL-DEEPSEEK-V41.md §4): a site's mixes are computed from its input
// but its input is collapsed with the PREVIOUS site's pre weights. hc_mix computes the site's
// pre [T, n], post [T, n] and comb [T, n, n] exactly as hc_pre does (same order), without the
// collapse; hc_collapse is u[t] = Σ_k w[t,k]·X[t,k] with w [T, n], or stream 0 (the reference's
// one-hot start weights, 1·X_0 + 0·X_k) when w is null.
void hc_mix(const float* X, int64_t T, const HcSpec& spec, const float* fn, const float* base, const float* scale,
            float* pre, float* post, float* comb);
void hc_collapse(const float* X, int64_t T, const HcSpec& spec, const float* w, float* u);

// Final collapse: h[t] = Σ_k (sigmoid(m_k·scale + base_k) + hc_eps)·X[t,k], m = RMS-scaled fn @ X.
// fn [n, n*D], base [n], scale [1]; h [T, D].
void hc_head(const float* X, int64_t T, const HcSpec& spec, const float* fn, const float* base, const float* scale,
             float* h);

}  // namespace deepinfer::ops::cpu
