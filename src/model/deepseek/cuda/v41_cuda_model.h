// DeepSeek-V4.1 on one NVIDIA GPU: the V4.1 model (deepseek_v41/model.h: plans, Engram slots, the
// shared forward) over the CUDA backend (cuda_backend.h). The weights are prepared as for the CPU
// (v41_prepare_cpu: every table entry dequantised exactly to f32, parts stacked, Engram
// q_weight ⊙ k_weight) and uploaded from that ModelRef (upload_prepared): f32 in exact numerics,
// bf16 otherwise (FP8 32x32 / FP4 values are exact in bf16), into one device allocation; the
// Engram tables stay in host memory in their stored form (rows gathered per step on the host and
// staged: CudaBackend::stage_engram_rows). V4.1's cache formats (QAT) are model numerics and run
// in every mode, so kBf16 and kProduction are the same model here.
// Host memory: the f32 copies of every weight exist during the load (fine for the fixtures and
// a one-layer slice; a release checkpoint needs an upload from the stored FP8/FP4, not written).
// Refused on the GPU (ConfigError / InvalidArgument naming the reason): routing without top-k
// normalisation (the GPU router always normalises), expert shards, hc_mult > 4, head widths the
// kernels do not take. DSpark stages in the checkpoint are not loaded (no drafter on the GPU yet:
// warned). Decode graphs are off while the model has Engram layers (CudaBackend::fixed_shape).
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
// is refused there, DSpark is off.
std::unique_ptr<DeepseekV41Model> load_v41_cuda(const std::string& dir, const ds::cuda::CudaModelOptions& options,
                                                const ModelOptions& model = {});

}  // namespace deepinfer::model::v41

namespace deepinfer::model::ds::cuda {

// Device bytes upload_prepared takes for `host` (linears in `dt`, vectors f32, pointer tables).
size_t prepared_device_bytes(const ModelRef& host, DType dt);
// Uploads a host-prepared ModelRef (f32 linears, no panels; no MTP blocks, no hash routing) into
// one device allocation: linears converted to `dt` (f32 or bf16), vectors f32, per-layer expert
// pointer tables; the Engram tables are left pointing at host memory.
std::unique_ptr<GpuWeightStore> upload_prepared(const ModelRef& host, DType dt, const CudaModelOptions& o,
                                                cudaStream_t stream);

}  // namespace deepinfer::model::ds::cuda
