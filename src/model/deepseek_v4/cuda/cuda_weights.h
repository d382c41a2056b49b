// DeepSeek-V4 weights on the GPU, in the formats the CUDA forward consumes:
//  * routed experts in their release format when device_expert_format (cuda_plan.h) says so:
//    FP4 e2m1 bytes [out, in/2] + e8m0 [out, in/32], or FP8 e4m3 bytes [out, in] + e8m0
//    [out, ceil(in/128)] (the 128x128 block scale repeated per row, so W1|W3 fuse by rows);
//  * dense FP8 linears (attention, indexer wq_b, shared expert; cuda_plan.h device_dense_fp8) in
//    the bf16 modes as stored: e4m3 bytes [out, in] + the e8m0 grid [ceil(out/scale_rows),
//    ceil(in/128)] (scale_rows 128; 16 for a stacked W1|W3 whose halves are not 128-row aligned),
//    read by ops/cuda/gemm_fp8w (f32 power-of-two checkpoint scales become e8m0 bytes);
//  * every other linear as bf16 [out, in], or f32 in exact numerics (FP8 block-scaled dense
//    linears that cannot stay FP8 are dequantised on the host at upload);
//  * compressor Wkv|Wgate fused [2c, D]; expert W1|W3 fused [2I, D] (one GEMM gives gate|up);
//  * f32: mHC fn/base/scale, router bias, sinks, ape, norm weights (bf16 in the checkpoint,
//    widened exactly), rope tables; hash-routing tables as i32.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/weights.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4::gpu {

struct DevLinear {          // dtype [out, in], contiguous
  cuda::DeviceBuffer w;
  cuda::DeviceBuffer scale;    // routed experts: e8m0 per row per 32 (FP4) / 128 (FP8) inputs;
                               // dense kF8E4M3: e8m0 grid per scale_rows rows x 128 inputs; else empty
  int64_t out = 0, in = 0;
  int64_t scale_rows = 128;    // dense kF8E4M3 only
  DType dtype = DType::kBF16;  // bf16, or f32 (exact numerics); kFP4E2M1: routed experts; kF8E4M3:
                               // routed experts (per-row scales) or dense linears (scale grid)
  const void* data() const { return w.data(); }
};
struct DevF32 {
  cuda::DeviceBuffer b;
  int64_t numel = 0;
  const float* data() const { return b.as<const float>(); }
};
struct GpuHc {
  DevF32 fn, base, scale;
};
struct GpuCompressor {
  int64_t ratio = 0, width = 0;  // m, c
  DevLinear wkv_gate;            // [2c, D]
  DevF32 ape;                    // [m, c]
  DevF32 norm;                   // [d]
};
struct GpuAttention {
  AttnKind kind = AttnKind::kSliding;
  int64_t ratio = 0;
  DevLinear wq_a, wq_b, wkv, wo_a, wo_b;
  DevF32 q_norm, kv_norm, sink;
  std::optional<GpuCompressor> comp, icomp;  // CSA/HCA; CSA indexer
  DevLinear index_wq_b, index_weights;       // CSA
  const float* inv_freq = nullptr;           // device rope table of this layer (owned by GpuWeights)
};
struct GpuExpert {
  DevLinear w13;  // [2I, D]
  DevLinear w2;   // [D, I]
};
struct GpuMoE {
  DevLinear gate;                // [E, D]
  DevF32 bias;                   // [E] (biased) or empty
  cuda::DeviceBuffer tid2eid;    // i32 [V, k] (hash) or empty
  int64_t tid2eid_rows = 0;
  std::vector<GpuExpert> experts;
  GpuExpert shared;
  // Device tables of the experts' weight (and e8m0 scale) pointers [E], read by routed id
  // (moe_decode, grouped_gemm); `format` is how every routed expert of the layer is stored.
  cuda::DeviceBuffer w13_ptrs, w2_ptrs, w13_scale_ptrs, w2_scale_ptrs;
  ops::cuda::ExpertFormat format = ops::cuda::ExpertFormat::kPlain;
  bool host_routed = false;  // ExpertPath::kHostRouted at upload (bf16 mode only; exact always is)
};
struct GpuLayer {
  DevF32 attn_norm, ffn_norm;
  GpuHc hc_attn, hc_ffn;
  GpuAttention attn;
  GpuMoE ffn;
};
struct GpuWeights {
  DevLinear embed, head;  // linear dtype [V, D]
  DevF32 norm;
  GpuHc hc_head;
  std::vector<GpuLayer> layers;
  DevF32 inv_freq_main, inv_freq_compress;
  size_t bytes = 0;       // uploaded in total
  size_t expert_bytes = 0;  // of which routed experts
  int64_t dense_fp8 = 0;    // dense linears kept FP8 (cuda_plan.h device_dense_fp8)
  int64_t dense_fp8_dequantised = 0;  // FP8 dense linears the mode wanted FP8 but had to dequantise
};

// Uploads the main model (MTP blocks are not run on the GPU yet), linears (and the embedding)
// as `linear_dtype` (bf16 or f32). Prints a progress bar to stderr when `progress`. Throws
// CudaError / OutOfMemory from the allocations.
// Counts of the most recent upload_weights in this process (tests/diagnostics: whether the FP8
// dense path was taken): {dense_fp8, dense_fp8_dequantised}.
std::pair<int64_t, int64_t> last_upload_dense_fp8();

GpuWeights upload_weights(const DeepseekV4Weights& w, const DeepseekV4Config& cfg, DType linear_dtype,
                          size_t planned_bytes, bool progress, cudaStream_t stream);

}  // namespace deepinfer::model::v4::gpu
