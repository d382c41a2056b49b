// Device-side routed MoE for decode-sized steps (T <= kMoeDecodeMaxTokens tokens): no host
// sync, so the whole forward can be captured in a CUDA graph.
//
// Why a hand-written kernel and not cuBLASLt: the grouped path (cuda_layers.cpp) reads the
// routing back to the host to size one GEMM per expert; cuBLASLt takes its shapes and operand
// pointers from the host, so it cannot consume device-side expert ids without that sync. At
// decode sizes the routed experts are memory-bound GEMVs anyway: each (token, slot) pair reads
// its expert's weight rows once with 16-byte loads and accumulates in fp32, which is what a
// GEMM would do at M = 1 per expert.
//
//   up:   act[a, i] = w_a · swiglu(round(x_t·W1[e]_i), round(x_t·W3[e]_i))   a = t*K + k, e = ids[a]
//         (round = the storage dtype, as the grouped path's GEMM output; clamp as ops/cuda/swiglu)
//   down: ye[a, j] = act[a] · W2[e]_j   (f32)
// Weights in the release formats (ops/cuda/grouped_gemm.h ExpertFormat): FP4 rows are read as
// 16-byte vectors of 32 e2m1 values (exactly one e8m0 scale each), FP8 rows as 16 e4m3 values
// (scale per 128 inputs); each vector's products are summed in fp32 and multiplied by its
// power-of-two scale (exact), so the result equals the dequantised weights up to summation order.
// The combine (glue_kernels moe_combine) then sums k in order and the shared expert: every
// token's result is independent of its batch neighbours. An expert id outside [0, E) (a bad
// hash table entry) contributes zeros here; the grouped path raises it on the host.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/grouped_gemm.h"

namespace deepinfer::model::ds::cuda {

constexpr int64_t kMoeDecodeMaxTokens = 64;

struct MoeDecodeParams {
  const void* x = nullptr;            // [tokens, dim] dtype (the normed hidden h), contiguous
  const int32_t* expert_ids = nullptr;  // [tokens, topk] device
  const float* weights = nullptr;     // [tokens, topk] routed weights (f32)
  const void* const* w13 = nullptr;   // [num_experts] device pointers to [2*inter, dim] (gate | up rows)
  const void* const* w2 = nullptr;    // [num_experts] device pointers to [dim, inter]
  ops::cuda::ExpertFormat format = ops::cuda::ExpertFormat::kPlain;  // plain: dtype elements
  const uint8_t* const* w13_scale = nullptr;  // [num_experts] e8m0 [2*inter, dim/blk] (FP4/FP8)
  const uint8_t* const* w2_scale = nullptr;   // [num_experts] e8m0 [dim, inter/blk]
  void* act = nullptr;                // [tokens*topk, inter] dtype workspace
  float* ye = nullptr;                // [tokens*topk, dim] f32 out (weighted)
  int64_t tokens = 0, topk = 0, num_experts = 0, dim = 0, inter = 0;  // multiples of 8 (32 for FP4/FP8)
  DType dtype = DType::kBF16;         // of x, act (and plain weights): f32 | bf16
  float limit = 0.f;                  // swiglu clamp (<= 0: none)
};
void moe_decode(const MoeDecodeParams& p, cudaStream_t stream);

// Host twin (host pointers; bf16 as raw uint16 bits; host pointer tables), fp32
// accumulation in a plain order (the kernel sums in a different fixed order).
void moe_decode_host(const MoeDecodeParams& p);

}  // namespace deepinfer::model::ds::cuda
