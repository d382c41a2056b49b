// Tensor-core sparse attention decode (issue #13), internal to ops/cuda: sparse_attention()
// (attention.h) calls it for the shapes it covers and keeps the CUDA-core kernel for the rest.
//
// One block per (token, group of 64 heads, split): Q [64 x 512] bf16 stays in shared memory, the
// token's keys are gathered 64 rows at a time (2 stages; 32 x 3 when split_keys is an odd multiple
// of 32), their row ids read a tile ahead, by cp.async, and go through
//   S = Q K^T   (mma.sync m16n8k16 bf16, f32 accumulate; 8 warps as 4 row groups x 2 key halves)
//   online softmax in the log2 domain (row max exchanged through shared memory)
//   O += P V    (P rounded to bf16; each warp owns 64 of the 512 output columns for all 64 rows)
// K = V (MQA over the 512-wide latent, as the CPU twin). Without splits it writes the normalised
// output with the sink in the denominator; with splits it writes the same unnormalised
// (m, l, acc[d]) partials as the CUDA-core kernel, which attention.cu's combine merges in a fixed
// order. A token's result depends only on its own keys and split_keys, never on the batch.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/cuda/attention.h"

namespace deepinfer::ops::cuda::detail {

// True when the tensor-core kernel handles p: bf16, head_dim 512, num_heads a multiple of 64,
// split_keys (when splitting) a multiple of 32 (of 64 under the kTensorCoresTile64 pin).
bool sparse_attention_mma_supports(const SparseAttnParams& p);
bool sparse_attention_mma_supports_shape(int64_t num_heads, int64_t head_dim, DType dtype);
// Launches the tensor-core pass (partials when p.num_splits > 1; the caller runs the combine).
// Preconditions: sparse_attention's checks passed and sparse_attention_mma_supports(p).
void sparse_attention_mma(const SparseAttnParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda::detail
