// The one DSpark-specific kernel of the device drafter (v41_dspark_cuda.h): the greedy Markov
// tail of a draft round. Everything else of the stage forward reuses ops/cuda (cuBLASLt f32
// linears, rmsnorm, rope, QAT, mHC, router, sparse attention with sinks) and the glue kernels
// (row gathers for the ring / key lists, moe_decode, moe_combine).
//
// Per drafting sequence j (one block), drafts i = 0 .. num_drafts[j]-1 in order, row t = j*B + i:
//   e      = mk_embed[prev]                 (prev = anchor[j] for i = 0, else draft i-1)
//   row[v] = logits[t, v] + Σ_k mk_head[v, k] · e[k]   (f32, k ascending; written back in place)
//   tok    = argmax_v row[v] (lowest id on ties);  logprob = -log Σ_v exp(row[v] - row[tok]) (fp64 sum)
//   c      = Σ_k conf[k] · xhat[t, k] + Σ_k conf[D + k] · e[k]   (fp64: the D terms, then the Rk terms)
// The host drafter (dspark.cpp host_tail) computes the same; the sums here are fixed-order block
// reductions, so logits agree to f32 rounding, c and the logprob to ~1e-12 relative.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer::model::ds::cuda {

struct DSparkTailParams {
  float* logits = nullptr;           // [seqs * block, vocab] in: head logits; out: + Markov bias (drafted rows)
  const float* xhat = nullptr;       // [seqs * block, dim] the collapsed stream before the final norm
  const float* mk_embed = nullptr;   // [vocab, rank]
  const float* mk_head = nullptr;    // [vocab, rank]
  const float* conf = nullptr;       // [dim + rank]
  const int32_t* anchor = nullptr;   // [seqs]
  const int32_t* num_drafts = nullptr;  // [seqs], each in [0, block]
  int32_t* tokens = nullptr;         // [seqs * block] out (drafted rows)
  float* logprobs = nullptr;         // [seqs * block] out
  float* conf_logits = nullptr;      // [seqs * block] out: c
  int64_t seqs = 0, block = 0, vocab = 0, dim = 0, rank = 0;
};

// Validates (InvalidArgument naming the field), launches one block per sequence on `stream`.
void dspark_tail(const DSparkTailParams& p, cudaStream_t stream);
// Host twin on host pointers (plain left-to-right sums).
void dspark_tail_host(const DSparkTailParams& p);

}  // namespace deepinfer::model::ds::cuda
