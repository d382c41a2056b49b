// DeepSeek-V4 on one NVIDIA GPU: the shared DeepSeek model (model/deepseek/model.h) over the CUDA
// backend (cuda_backend.h), with the same ForwardBatch semantics as the CPU model. Numerics
// (options.h): kExact runs fp32 everywhere for parity with transformers' fp32 logits; kBf16 stores
// weights, activations between kernels and the cache in bf16 with fp32 accumulation, keeping
// residual streams, mHC mixing, router logits and compressor pooling in fp32; kProduction (serving)
// adds V4's cache formats (FP8 KV and FP4 indexer round trips, the layer plans' RowFormats).
// Routed experts stay in their release format on the device outside exact numerics; the MoE routes
// on the device in every path. Decode steps take the fixed-shape path (graphs) when asked.
// In bf16 and production numerics the fixed path's device MoE rounds the gate/up activations to
// bf16 after a different fp32 summation order than the general path's grouped expert GEMM, so decode
// logits differ from the prefill/general path by bf16 roundings (the random tiny fixtures amplify
// that to rel 0.03-0.16); the golden path-identity checks therefore run kGeneral.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek/cuda/cuda_backend.h"
#include "model/deepseek/cuda/options.h"
#include "model/deepseek/model.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer::model::v4 {

namespace gpu = ds::cuda;  // tests and tools spell the GPU pieces gpu::
using gpu::CudaModelOptions;
using gpu::DecodePath;

// What loading would put on the device, from the config alone (no GPU needed).
struct CudaHostPlan {
  size_t weight_bytes = 0;
  size_t activation_bytes = 0;
  std::vector<kv::LayerCacheSpec> cache_specs;
  size_t bytes_per_slot = 0, bytes_per_block = 0;
  int64_t block_tokens = 0;
  ModelPlan plan;
  static CudaHostPlan make(const DeepseekV4Config& cfg, const CudaModelOptions& o, int64_t num_mtp = 0);
};

class DeepseekV4CudaModel final : public ds::DeepseekModel {
 public:
  // Parses config.json, maps the checkpoint, plans device memory (OutOfMemory naming each term
  // when it does not fit) and uploads the weights.
  static std::unique_ptr<DeepseekV4CudaModel> load(const std::string& dir, const CudaModelOptions& options = {});

  const DeepseekV4Config& config() const { return cfg_; }
  gpu::CudaBackend& cuda() { return static_cast<gpu::CudaBackend&>(backend()); }
  // Switches the decode path (drops captured graphs); tests and benchmarks.
  void set_decode_path(DecodePath p) { cuda().set_decode_path(p); }
  DecodePath decode_path() { return cuda().decode_path(); }
  int64_t graphs_captured() { return cuda().graphs_captured(); }
  // Dense linears kept FP8 / wanted FP8 but dequantised at upload (diagnostics, tests).
  std::pair<int64_t, int64_t> dense_fp8_counts() {
    return {cuda().weight_store().dense_fp8, cuda().weight_store().dense_fp8_dequantised};
  }

 private:
  DeepseekV4CudaModel(ds::ModelInfo info, ds::Arch arch, std::vector<kv::LayerCacheSpec> specs,
                      std::unique_ptr<ds::ModelBackend> be, std::shared_ptr<void> keepalive, DeepseekV4Config cfg)
      : DeepseekModel(std::move(info), std::move(arch), std::move(specs), std::move(be), std::move(keepalive)),
        cfg_(std::move(cfg)) {}
  DeepseekV4Config cfg_;
};

// Options the engine loads with: production numerics, graph-replayed decode unless the environment
// turns graphs off, memory plan from the engine's limits.
CudaModelOptions engine_cuda_options(const ModelLoadOptions& o);

}  // namespace deepinfer::model::v4
