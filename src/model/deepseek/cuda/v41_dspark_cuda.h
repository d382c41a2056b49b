// DeepSeek-V4.1's DSpark stages on one NVIDIA GPU (issue #11 item 5): DSparkStages
// (deepseek_v41/dspark_stages.h) over the CUDA ops, for the GPU V4.1 model's drafter.
//
// Weights: `stored_formats` (the GPU model's default outside kExact) keeps what the checkpoint
// stores FP8 / FP4 in that format: dense FP8 linears (wq_a, wq_b, wkv, wo_a, wo_b, shared expert)
// as e4m3 bytes + e8m0 block scales through ops/cuda/gemm_fp8w, FP4 routed experts as packed
// nibbles + per-32 scales through moe_decode kFP4 (the release's 3 stages x 128 experts: ~54 GB in
// f32). The activations stay f32 everywhere except the FP8 GEMM's input, which that kernel takes in
// bf16 (rounded once per linear): the experts' GEMV takes f32 input with exactly dequantised FP4, so
// the routed experts equal the f32 path up to summation order. Still f32: norms, mHC, the router
// gate (bf16 in the release), main_proj, the Markov / confidence heads, the trunk's embedding and
// head copies, and FP8-stored experts (moe_decode's FP8 takes one scale per 128 inputs, V4.1's are
// 32x32). Numerics of the f32 path (stored_formats off: the reference), as the host drafter
// (dspark.cpp): the linears are cuBLASLt f32 GEMMs (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32), the ring / block keys take
// the same QAT FP8 round trip (ops/cuda/qat.h, bit-equal to the CPU's), attention is the f32
// CUDA-core sparse_attention over a gathered key list per sequence ([ring lo..last, block keys],
// the host drafter's list), the stage MoE is router + moe_decode (plain f32 experts) +
// moe_combine, and the greedy Markov tail is dspark_kernels.h. The results differ from the host
// drafter only by summation order (~1e-6 relative on logits / confidence logits).
//
// Launches: a round is ~115 small kernels (launch-bound on the test fixture: 0.8 ms a round eager at
// batch 1 vs 0.2 ms for the host stages), hence the graphs (docs/PERFORMANCE.md, issue #11). The
// feed (ring writes) stays eager: its row count varies with the accepted drafts.
//
// State: every slot's rings in one device buffer [slots, stages, capacity, head_dim] (grown by
// doubling, contents kept), position p in row p mod capacity. Work runs on the stages' own
// stream, ordered after the target step through an event on HiddenRows::stream; block() and
// read_ring() wait for their results (the ids or rows come back to the host). The weights are
// uploaded when the drafter is made, before the trunk's memory plan, which therefore sees them as
// memory in use (plan_device_memory reads the free memory).
#pragma once
#include <memory>

#include "model/deepseek_v41/dspark_stages.h"

namespace deepinfer::model::v41 {

// A maker for DSparkOptions::stages on device `device` (the current device when the drafter is
// made). `graphs`: a greedy or sampled round's launches (every stage, the head, the tail) replay as
// one CUDA graph per padded batch (model::decode_bucket), the inputs written into fixed device
// buffers first; off: the same padded launches run eagerly (bit-identical results, the A/B switch;
// the V4.1 GPU loader turns graphs on with DecodePath::kGraph). Throws ConfigError for shapes the kernels do not take (routing without top-k
// normalisation, head_dim not a multiple of 32, widths not multiples of 8, > 1024 experts).
// `stored_formats` (default on): the stage linears the checkpoint stores FP8 stay FP8 on the device
// (ops/cuda/gemm_fp8w, 1 byte a weight + e8m0 scales) and FP4 routed experts stay FP4 (moe_decode
// kFP4): the release's stages fit in their stored size instead of ~4x-8x that in f32. Off, or for
// tensors the kernels cannot take as stored (bf16 / f32 in the checkpoint, FP8 experts, scale
// exponents past kFp8wMaxScaleExp): the f32 copies, the reference path.
DSparkStagesMaker cuda_dspark_stages(int device, bool graphs, bool stored_formats = true);

}  // namespace deepinfer::model::v41
