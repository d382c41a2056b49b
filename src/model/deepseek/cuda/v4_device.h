// DeepSeek-V4 on the CUDA backend: which formats its weights take on the device, the upload of its
// tensor table into one ModelRef, and the device memory plan, all from the same table
// (deepseek_v4/tensors.h) so the plan and the upload cannot disagree.
//  * routed experts in their release format when the mode allows (FP4 e2m1 bytes [out, in/2] +
//    e8m0 [out, in/32], or FP8 e4m3 bytes [out, in] + e8m0 [out, ceil(in/128)] — the 128x128 block
//    scale repeated per row so W1|W3 fuse by rows); all experts of a layer in one allocation;
//  * dense FP8 linears (attention, indexer wq_b, shared expert, MTP projections) in the bf16 modes
//    as stored: e4m3 bytes [out, in] + the e8m0 grid [ceil(out/scale_rows), ceil(in/128)]
//    (scale_rows 128; 16 for a stacked W1|W3 whose halves are not 128-row aligned), read by
//    ops/cuda/gemm_fp8w (f32 power-of-two checkpoint scales become e8m0 bytes);
//  * every other linear as bf16 [out, in], or f32 in exact numerics (FP8/FP4 that cannot stay as
//    stored are dequantised on the host at upload, with a warning naming them);
//  * compressor Wkv|Wgate fused [2c, D]; expert W1|W3 fused [2I, D] (one GEMM gives gate|up);
//  * f32: mHC, router bias, sinks, ape, norm weights, rope tables; hash tables as i32.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/deepseek/cuda/options.h"
#include "model/deepseek/prepared.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/tensors.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {

// How routed experts are stored on the device: kFP4 / kFP8Block as released when the checkpoint
// has them, the mode is not kExact, widths are multiples of 32 and `experts` is kNative; else
// dequantised (kBF16 here meaning "the storage dtype").
v4::WeightFormat v4_expert_format(const v4::DeepseekV4Config& cfg, Numerics numerics, ExpertPath experts);
// Whether dense FP8 linears stay FP8 (128x128 blocks, not kExact, `dense` kNative).
bool v4_dense_fp8(const v4::DeepseekV4Config& cfg, Numerics numerics, DensePath dense);
// Bytes of one routed-expert matrix [n, k] in `f` (kFP4: n*k/2 + n*k/32 scale bytes; kFP8Block:
// n*k + n*ceil(k/128); else n*k*elem_bytes).
int64_t expert_matrix_bytes(v4::WeightFormat f, int64_t n, int64_t k, int64_t elem_bytes);

// Device storage behind a ModelRef.
struct GpuWeightStore {
  std::vector<deepinfer::cuda::DeviceBuffer> buffers;
  ModelRef refs;
  size_t bytes = 0;         // uploaded in total
  size_t expert_bytes = 0;  // of which routed experts
  int64_t dense_fp8 = 0;    // dense linears kept FP8
  int64_t dense_fp8_dequantised = 0;  // FP8 dense linears the mode wanted FP8 but had to dequantise
};

// What the upload of `table` will take on the device (the memory plan), from the config alone.
size_t v4_device_weight_bytes(const v4::DeepseekV4Config& cfg, const v4::TensorTable& table, const CudaModelOptions& o);
// The largest dense-FP8 workspace a step of `tokens` tokens needs (K-split f32 workspace at or
// below kDenseFp8PrefillM tokens, bf16 dequantisation scratch above), 0 when no linear stays FP8.
void v4_fp8_workspace(const v4::DeepseekV4Config& cfg, const v4::TensorTable& table, const CudaModelOptions& o,
                      int64_t tokens, size_t* fp8_ws_bytes, size_t* wdq_bytes);

// Uploads every tensor of the table of (cfg, plan) from the loaded views `canon` to the device,
// with a progress bar against `planned_bytes`. Throws CudaError / OutOfMemory from the allocations.
std::unique_ptr<GpuWeightStore> upload_v4(const v4::DeepseekV4Config& cfg, const ModelPlan& plan,
                                          const v4::DeepseekV4Weights& canon, const CudaModelOptions& o,
                                          size_t planned_bytes, cudaStream_t stream);

}  // namespace deepinfer::model::ds::cuda
