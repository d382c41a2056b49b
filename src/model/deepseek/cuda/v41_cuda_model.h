// DeepSeek-V4.1 on one NVIDIA GPU: the V4.1 model (deepseek_v41/model.h: plans, Engram slots, the
// shared forward) over the CUDA backend (cuda_backend.h). The weights go to the device through the
// uploader V4 uses (v4_device.h: DeviceUpload over v41_device_table, deepseek_v41/targets.h), one
// entry at a time from the mapped checkpoint, so the host never holds a copy of the whole model:
//  * exact numerics: every linear dequantised exactly to f32 (per entry);
//  * bf16 / production: dense FP8 linears as stored (e4m3 + the 32x32 E8M0 grid, read by
//    gemm_fp8w with scale_rows = scale_k = 32), routed experts as stored (packed FP4 + E8M0 per 32,
//    read by moe_decode / the grouped GEMM), plain linears bf16;
//  * the Engram tables stay in host memory in their stored form (rows gathered per step on the host
//    and staged: CudaBackend::stage_engram_rows); q_weight ⊙ k_weight is computed at upload.
// V4.1's cache formats (QAT) are model numerics and run in every mode, so kBf16 and kProduction
// are the same model here.
// Refused on the GPU (ConfigError / InvalidArgument naming the reason): routing without top-k
// normalisation (the GPU router always normalises), expert shards, hc_mult > 4, head widths the
// kernels do not take. DSpark stages in the checkpoint make the model's drafter (when
// `model.dspark`; the registry's load_cuda sets it only when DEEPINFER_USE_NEXTN_DECODE > 0): the
// taps are computed on the device (stream_mean) and the whole stage forward runs there too, in f32
// (v41_dspark_cuda.h, behind DSparkDrafter's DSparkStages): rings on the device, only draft ids,
// log-probabilities and confidences come back (logits too for a sampling picker or when asked).
// `model.dspark_host_stages` keeps the stages on the host as before (taps copied back each round,
// ModelOptions::dspark_host_taps): the A/B reference of the tests and timings.
#pragma once
#include <memory>
#include <string>

#include "model/deepseek/cuda/options.h"
#include "model/deepseek/cuda/v4_device.h"
#include "model/deepseek/prepared.h"
#include "model/deepseek_v41/model.h"
#include "model/registry.h"

namespace deepinfer::model::v41 {

// Loads <dir> onto device `options.device`. `model` carries the V4.1 options (replay keep; qat =
// false for tests only); rollback, batch invariance and progress come from `options`, expert_shard
// is refused there; DSpark as `model.dspark` says (its stages on the GPU unless dspark_host_stages).
std::unique_ptr<DeepseekV41Model> load_v41_cuda(const std::string& dir, const ds::cuda::CudaModelOptions& options,
                                                const ModelOptions& model = {});

}  // namespace deepinfer::model::v41

namespace deepinfer::model::v41 {

// What V4.1's checkpoint stores, for the device's storage choices (32x32 FP8 blocks, FP4 experts).
ds::cuda::DeviceFormats v41_device_formats(const DeepseekV41Config& cfg);
// Device bytes upload_v41 takes (the memory plan), from the config alone.
size_t v41_device_weight_bytes(const DeepseekV41Config& cfg, const ModelPlan& plan,
                               const ds::cuda::CudaModelOptions& o);
// Uploads the main model's tensors from the mapped views `w` (entry by entry, with a progress bar
// against `planned_bytes`); the Engram tables are left pointing at `w`'s host memory.
std::unique_ptr<ds::cuda::GpuWeightStore> upload_v41(const DeepseekV41Config& cfg, const ModelPlan& plan,
                                                     const V41Weights& w, const ds::cuda::CudaModelOptions& o,
                                                     size_t planned_bytes, cudaStream_t stream);

}  // namespace deepinfer::model::v41
