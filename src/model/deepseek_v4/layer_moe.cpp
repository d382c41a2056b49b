// MoE block (MODEL-DEEPSEEK-V4.md §5) and the decoder layer that wraps attention and MoE in
// their two mHC sites (§2).
#include <algorithm>
#include <cstring>

#include "model/deepseek_v4/model_internal.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/moe.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/router.h"

namespace deepinfer::model::v4 {
using namespace ops::cpu;

ops::cpu::HcSpec hc_spec(const DeepseekV4Config& cfg) {
  return {.n = cfg.hc_mult, .dim = cfg.hidden_size, .sinkhorn_iters = cfg.hc_sinkhorn_iters,
          .rms_eps = float(cfg.rms_norm_eps), .hc_eps = float(cfg.hc_eps)};
}

void moe_block(const CpuMoE& M, const DeepseekV4Config& cfg, const BatchPlan& plan, const float* x, float* out,
               Workspace& ws) {
  const int64_t T = plan.T, D = cfg.hidden_size, E = cfg.n_routed_experts, K = cfg.num_experts_per_tok;
  const int64_t I = cfg.moe_intermediate_size;
  float* logits = grow(ws.logits, size_t(T * E));
  linear(x, T, D, M.gate.data(), E, logits);  // fp32 router logits
  int32_t* ids = grow(ws.ids, size_t(T * K));
  float* wts = grow(ws.ids_w, size_t(T * K));
  const bool hash = !M.tid2eid.empty();
  route({.logits = logits, .num_tokens = T, .num_experts = E, .topk = K,
         .bias = M.bias.defined() ? M.bias.data<float>() : nullptr,
         .tid2eid = hash ? M.tid2eid.data() : nullptr, .token_ids = plan.token_ids,
         .vocab_size = hash ? int64_t(M.tid2eid.size()) / K : 0, .normalize = cfg.norm_topk_prob,
         .routed_scale = float(cfg.routed_scaling_factor), .out_ids = ids, .out_weights = wts});
  std::vector<ExpertF32> ex(M.experts.size());  // E pointers, negligible
  for (size_t e = 0; e < ex.size(); ++e)
    ex[e] = {M.experts[e].w1.data(), M.experts[e].w3.data(), M.experts[e].w2.data()};
  std::fill(out, out + T * D, 0.f);
  const float L = float(cfg.swiglu_limit);
  moe_experts(x, T, D, I, ex.data(), E, ids, wts, K, L, out);
  swiglu_mlp(x, T, D, M.shared.w1.out, {M.shared.w1.data(), M.shared.w3.data(), M.shared.w2.data()}, L, out, true);
}

void decoder_layer(const CpuLayer& L, const DeepseekV4Config& cfg, kv::LayerCache& cache, const BatchPlan& plan,
                   float* X, Workspace& ws) {
  const HcSpec s = hc_spec(cfg);
  const int64_t T = plan.T, D = cfg.hidden_size, n = s.n;
  const float eps = float(cfg.rms_norm_eps);
  float* X2 = grow(ws.X2, size_t(T * n * D));
  float* u = grow(ws.u, size_t(T * D));
  float* post = grow(ws.post, size_t(T * n));
  float* comb = grow(ws.comb, size_t(T * n * n));
  float* h = grow(ws.h, size_t(T * D));
  float* y = grow(ws.y, size_t(T * D));

  hc_pre(X, T, s, L.hc_attn.fn.data<float>(), L.hc_attn.base.data<float>(), L.hc_attn.scale.data<float>(), u, post,
         comb);
  rmsnorm(u, D, L.attn_norm.data<float>(), h, D, T, D, eps);
  attention_block(L.attn, cfg, cache, plan, h, y, ws);
  hc_post(X, y, post, comb, T, s, X2);

  hc_pre(X2, T, s, L.hc_ffn.fn.data<float>(), L.hc_ffn.base.data<float>(), L.hc_ffn.scale.data<float>(), u, post,
         comb);
  rmsnorm(u, D, L.ffn_norm.data<float>(), h, D, T, D, eps);
  moe_block(L.ffn, cfg, plan, h, y, ws);
  hc_post(X2, y, post, comb, T, s, X);
}

}  // namespace deepinfer::model::v4
