// Sparse attention of DeepSeek-V4 on the GPU (spec §3.2), varlen: each query token t attends
// with one softmax per head over
//   (a) win_count[t] consecutive rows of win_kv from row win_begin[t] (its sliding window),
//   (b) cmp_count[t] rows of cmp_kv listed at cmp_rows[cmp_offset[t] ...] (selected compressed
//       entries; negative ids are skipped),
// plus a per-head sink logit in the denominator only:
//   o_h = Σ_j e^{s_hj} K_j / (Σ_j e^{s_hj} + e^{sink_h}),  s_hj = scale · q_h·K_j  (K = V).
// Tokens with no keys get o = 0. fp32 scores, online softmax, fp32 accumulation.
// CPU twin: ops/cpu/attention.h sparse_attention (same argument meaning).
//
// Two kernels behind one launcher: bf16 with head_dim 512 and heads in groups of 64 (the V4
// shapes) run on tensor cores (attention_mma.h: 64 heads per block, mma.sync); everything else
// (f32, other widths or head counts) on the CUDA-core kernel (one warp per head, 8 heads per
// block sharing key tiles staged in shared memory). Decode has few tokens, so the key list can be
// split across blocks (flash-decoding): each split keeps an unnormalised (max, sum, acc) triple
// in `workspace`, a second kernel merges the splits in a fixed order and adds the sink. A token's
// output depends only on its own keys and split_keys (never on the batch around it).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace deepinfer::ops::cuda {

// Which kernel runs: kAuto picks tensor cores where they apply (the engine's choice); the others
// pin one for A/B tests and timings (a tensor-core pin on shapes it does not cover is an error).
// kTensorCores picks its key tile (64 where split_keys allows, else 32); the Tile pins fix it.
enum class AttnKernel { kAuto, kCudaCores, kTensorCores, kTensorCoresTile32, kTensorCoresTile64 };

struct SparseAttnParams {
  const void* q = nullptr;             // [T, H, d] dtype, token stride q_stride (heads contiguous)
  int64_t q_stride = 0;
  const void* win_kv = nullptr;        // [rows, d] dtype, row stride kv_stride
  const void* cmp_kv = nullptr;        // [rows, d] dtype, row stride kv_stride (null when no cmp keys)
  int64_t kv_stride = 0;               // elements; rows and base pointers 16-byte aligned
  DType dtype = DType::kBF16;          // of q, kv, out
  const int32_t* win_begin = nullptr;  // [T]
  const int32_t* win_count = nullptr;  // [T]
  const int32_t* cmp_rows = nullptr;   // per-token lists of row ids into cmp_kv
  const int64_t* cmp_offset = nullptr; // [T]
  const int32_t* cmp_count = nullptr;  // [T] or null (no compressed keys)
  const float* sink = nullptr;         // [H] f32
  float scale = 1.0f;
  void* out = nullptr;                 // [T, H, d] dtype, token stride out_stride
  int64_t out_stride = 0;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;  // head_dim: multiple of 32, <= 512
  // Split-KV (optional): key j of a token goes to split j / split_keys; num_splits splits must
  // cover the longest key list (win_count + cmp_count). num_splits <= 1: one pass, no workspace.
  int num_splits = 1;
  int split_keys = 0;
  float* workspace = nullptr;  // sparse_attention_workspace_bytes(...)
  AttnKernel kernel = AttnKernel::kAuto;
};

// Splits that give about four blocks per multiprocessor for this batch, and keys per split
// (a multiple of the 16-key tile); {1, 0} when one pass already fills the GPU.
struct AttnSplit {
  int num_splits = 1;
  int split_keys = 0;
};
// This form sizes for the CUDA-core kernel; the one with head_dim and dtype sizes for the kernel
// sparse_attention will actually run (tensor cores: about one block per multiprocessor, keys per
// split a multiple of 32). Both depend on num_tokens: batch-invariant callers pass a fixed
// split_keys instead (a multiple of 32 keeps the tensor-core kernel).
AttnSplit choose_attention_split(int64_t num_tokens, int64_t num_heads, int64_t max_keys_per_token, int num_sms);
AttnSplit choose_attention_split(int64_t num_tokens, int64_t num_heads, int64_t head_dim, DType dtype,
                                 int64_t max_keys_per_token, int num_sms);
// True when sparse_attention runs these shapes on the tensor-core kernel (given split_keys % 32 == 0).
bool sparse_attention_uses_tensor_cores(int64_t num_heads, int64_t head_dim, DType dtype);
size_t sparse_attention_workspace_bytes(int64_t num_tokens, int64_t num_heads, int64_t head_dim, int num_splits);

void sparse_attention(const SparseAttnParams& p, cudaStream_t stream);

}  // namespace deepinfer::ops::cuda
