#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/router.h"

namespace deepinfer::ops::cuda {
namespace {
using deepinfer::cuda::kWarpSize;

constexpr int kMaxExperts = 1024;

__device__ __forceinline__ float sqrt_softplus(float v) {
  // torch.nn.functional.softplus(beta=1, threshold=20)
  const float sp = v > 20.f ? v : log1pf(expf(v));
  return sqrtf(sp);
}

// Block-wide argmax of (key, -index): largest key, ties to the lower index.
__device__ __forceinline__ void argmax_pair(float& key, int& idx) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
    const float k2 = __shfl_xor_sync(0xffffffffu, key, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (k2 > key || (k2 == key && i2 < idx)) {
      key = k2;
      idx = i2;
    }
  }
}

// One block per token, one thread per expert (blockDim = num_experts rounded up to a warp).
__global__ void router_kernel(const __grid_constant__ RouterParams p) {
  __shared__ float s_score[kMaxExperts];
  __shared__ float w_key[32];
  __shared__ int w_idx[32];
  __shared__ int chosen[kRouterMaxTopk];
  const int64_t t = blockIdx.x;
  const int e = threadIdx.x;
  const bool valid = e < p.num_experts;
  float logit = valid ? p.logits[t * p.logits_stride + e] : 0.f;
  if (p.gate_temp != 1.0f) logit = __fdiv_rn(logit, p.gate_temp);  // IEEE division, as the CPU twin
  const float s = valid ? sqrt_softplus(logit) : 0.f;
  if (valid) s_score[e] = s;
  const bool hash = p.tid2eid != nullptr;
  if (!hash) {
    float key = valid ? s + p.bias[e] : -INFINITY;
    const int lane = e % kWarpSize, warp = e / kWarpSize, num_warps = blockDim.x / kWarpSize;
    for (int k = 0; k < p.topk; ++k) {
      float bk = key;
      int bi = valid ? e : INT32_MAX;
      argmax_pair(bk, bi);
      if (lane == 0) {
        w_key[warp] = bk;
        w_idx[warp] = bi;
      }
      __syncthreads();
      if (warp == 0) {
        float k2 = lane < num_warps ? w_key[lane] : -INFINITY;
        int i2 = lane < num_warps ? w_idx[lane] : INT32_MAX;
        argmax_pair(k2, i2);
        if (lane == 0) chosen[k] = i2;
      }
      __syncthreads();
      if (e == chosen[k]) key = -INFINITY;  // remove the winner
    }
  } else if (e < p.topk) {
    const int32_t tok = p.token_ids[t];
    int64_t id = -1;
    if (tok >= 0 && tok < p.vocab) {
      id = p.tid2eid_dtype == DType::kI64 ? static_cast<const int64_t*>(p.tid2eid)[int64_t(tok) * p.topk + e]
                                          : static_cast<const int32_t*>(p.tid2eid)[int64_t(tok) * p.topk + e];
    }
    if (id < 0 || id >= p.num_experts) {
      if (p.error_flag) atomicExch(p.error_flag, 1);
      id = 0;  // keep going with a valid index; the flag reports the bad input
    }
    chosen[e] = int(id);
  }
  __syncthreads();
  if (e == 0) {
    float sum = 0.f;
    for (int k = 0; k < p.topk; ++k) sum += s_score[chosen[k]];
    sum += 1e-20f;  // as the CPU reference / HF (guards an all-zero row)
    for (int k = 0; k < p.topk; ++k) {
      p.expert_ids[t * p.topk + k] = chosen[k];
      p.weights[t * p.topk + k] = s_score[chosen[k]] / sum * p.route_scale;
    }
  }
}
}  // namespace

void router(const RouterParams& p, cudaStream_t stream) {
  if (p.num_experts < 1 || p.num_experts > kMaxExperts)
    DI_THROW(InvalidArgument, "router: num_experts ", p.num_experts, " not in [1, ", kMaxExperts, "]");
  if (p.topk < 1 || p.topk > kRouterMaxTopk || p.topk > p.num_experts)
    DI_THROW(InvalidArgument, "router: topk ", p.topk, " not in [1, min(", kRouterMaxTopk, ", num_experts)]");
  if (!p.logits || !p.expert_ids || !p.weights) DI_THROW(InvalidArgument, "router: null logits or outputs");
  if (!(p.gate_temp > 0.f) || !std::isfinite(p.gate_temp))
    DI_THROW(InvalidArgument, "router: gate_temp ", p.gate_temp, " must be finite and > 0");
  if (p.logits_stride < p.num_experts) DI_THROW(InvalidArgument, "router: logits_stride < num_experts");
  const bool hash = p.tid2eid != nullptr;
  if (hash == (p.bias != nullptr)) DI_THROW(InvalidArgument, "router: give exactly one of bias or tid2eid");
  if (hash && (!p.token_ids || p.vocab <= 0)) DI_THROW(InvalidArgument, "router: hash mode needs token_ids and vocab");
  if (hash && p.tid2eid_dtype != DType::kI32 && p.tid2eid_dtype != DType::kI64)
    DI_THROW(InvalidArgument, "router: tid2eid dtype must be i32 or i64");
  if (p.tokens < 0 || p.tokens > INT32_MAX) DI_THROW(InvalidArgument, "router: bad token count ", p.tokens);
  if (p.tokens == 0) return;
  const int threads = int(deepinfer::cuda::ceil_div(p.num_experts, kWarpSize) * kWarpSize);
  router_kernel<<<unsigned(p.tokens), threads, 0, stream>>>(p);
  DI_CUDA_CHECK_LAUNCH();
}

}  // namespace deepinfer::ops::cuda
