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
// The combine (glue_kernels moe_combine) then sums k in order and the shared expert: every
// token's result is independent of its batch neighbours. An expert id outside [0, E) (a bad
// hash table entry) contributes zeros here; the grouped path raises it on the host.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::model::v4::gpu {

constexpr int64_t kMoeDecodeMaxTokens = 64;

struct MoeDecodeParams {
  const void* x = nullptr;            // [tokens, dim] dtype (the normed hidden h), contiguous
  const int32_t* expert_ids = nullptr;  // [tokens, topk] device
  const float* weights = nullptr;     // [tokens, topk] routed weights (f32)
  const void* const* w13 = nullptr;   // [num_experts] device pointers to dtype [2*inter, dim] (gate | up rows)
  const void* const* w2 = nullptr;    // [num_experts] device pointers to dtype [dim, inter]
  void* act = nullptr;                // [tokens*topk, inter] dtype workspace
  float* ye = nullptr;                // [tokens*topk, dim] f32 out (weighted)
  int64_t tokens = 0, topk = 0, num_experts = 0, dim = 0, inter = 0;  // dim, inter multiples of 8
  DType dtype = DType::kBF16;         // of x, weights, act: f32 | bf16
  float limit = 0.f;                  // swiglu clamp (<= 0: none)
};
void moe_decode(const MoeDecodeParams& p, cudaStream_t stream);

// Host twin (host pointers; bf16 as raw uint16 bits; w13/w2 host pointer tables), fp32
// accumulation in a plain order (the kernel sums in a different fixed order).
void moe_decode_host(const MoeDecodeParams& p);

}  // namespace deepinfer::model::v4::gpu
