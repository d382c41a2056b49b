// Small kernels the CUDA backend needs beyond src/ops/cuda: row gathers/scatters with dtype casts
// (embedding lookup, window staging, paged-cache writes, MoE permutation), the compressor's
// positional gate bias, the fixed-order MoE combine, fixed-shape block pooling and the MTP
// stream broadcast. Their specs are the host ops of ops/cpu/rows.h, whose argument structs they
// take (with device pointers); tests/cpp/cuda_model checks each against it. Launchers validate
// (InvalidArgument naming the field, before any CUDA call) and launch on the given stream; zero
// rows is a no-op.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cpu/rows.h"

namespace deepinfer::model::ds::cuda {

void gather_rows(const ops::cpu::GatherRowsArgs& p, cudaStream_t stream);
void add_position_bias(const ops::cpu::PositionBiasArgs& p, cudaStream_t stream);
void moe_combine(const ops::cpu::MoeCombineArgs& p, cudaStream_t stream);
void decode_pool(const ops::cpu::DecodePoolArgs& p, cudaStream_t stream);
// x[t, j, :] += v[t, :] for every stream j (f32).
void add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim, cudaStream_t stream);
// DSpark taps (V4.1): out[t * out_stride + c] = (x[t,0,c] + ... + x[t,n-1,c]) / n, f32, summed in
// stream order and divided once (the CPU backend's stream_mean, bit for bit).
void stream_mean(const float* x, float* out, int64_t out_stride, int64_t tokens, int64_t streams, int64_t dim,
                 cudaStream_t stream);
// Per row of logits [rows, row_stride] f32 (device): the argmax over the first `vocab` entries
// (lowest id on ties) and its log-softmax value, into device tokens[rows] / logprobs[rows].
void greedy_rows(const float* logits, int64_t row_stride, int64_t rows, int64_t vocab, int32_t* tokens,
                 float* logprobs, cudaStream_t stream);
// Sampled ids into a step's device token list and embedding rows (ops::cpu::patch_input_tokens).
void patch_input_tokens(const ops::cpu::InputPatchArgs& p, cudaStream_t stream);

}  // namespace deepinfer::model::ds::cuda
