// DeepSeek-V4 forward pass on one NVIDIA GPU (model::CausalLM), with the same ForwardBatch
// semantics as the CPU model (src/model/deepseek_v4/model.h): varlen packed tokens, paged
// compressed entries / indexer keys through each sequence's block table, per-slot window ring
// and compressor partials — here all in device memory (cuda_cache.h).
// Numerics (gpu::Numerics): kExact runs fp32 everywhere (f32 weights dequantised at upload,
// f32 activations and caches, fp32 GEMMs without TF32) for parity with transformers' fp32
// logits; kBf16 stores weights, activations between kernels and the kv cache in bf16 with fp32
// accumulation, keeping residual streams, mHC mixing, router logits and compressor pooling in
// fp32; kProduction (serving) adds the reference's FP8 KV and FP4 indexer round trips
// (ops/cuda/quant.h).
// Not yet: MTP drafting on the GPU, CUDA graphs, native FP8/FP4 GEMMs (weights are dequantised
// to bf16 at upload), multi-GPU.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "model/causal_lm.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/cuda/cuda_plan.h"

namespace deepinfer::model::v4 {

struct CudaModelOptions {
  gpu::Numerics numerics = gpu::Numerics::kExact;  // tests; the engine loads kProduction
  bool progress = true;               // weight upload progress bar on stderr
  int64_t max_batch_tokens = 8192;    // memory plan: largest step (new tokens)
  int64_t max_seqs = 64;              // memory plan: sequences per step
  int64_t max_context = 65536;        // memory plan: longest context (indexer scores)
  double utilization = 0.92;          // share of the card the engine may take
  int device = 0;
};

// What loading would put on the device, from the config alone (no GPU needed).
struct CudaHostPlan {
  size_t weight_bytes = 0;
  size_t activation_bytes = 0;
  std::vector<kv::LayerCacheSpec> cache_specs;
  size_t bytes_per_slot = 0, bytes_per_block = 0;
  int64_t block_tokens = 0;
  static CudaHostPlan make(const DeepseekV4Config& cfg, const CudaModelOptions& o);
};

// Engine policy: DEEPINFER_ACCELERATOR=nvidia -> GPU (errors if none); auto -> GPU when one is
// present; cpu -> CPU reference.
bool use_cuda_model(const EnvConfig& env);

class DeepseekV4CudaModel final : public CausalLM {
 public:
  // Parses config.json, plans device memory (OutOfMemory naming each term when it does not
  // fit), maps the checkpoint and uploads the weights.
  static std::unique_ptr<DeepseekV4CudaModel> load(const std::string& dir, const CudaModelOptions& options = {});
  // Engine entry point: production numerics (serving default).
  static std::unique_ptr<DeepseekV4CudaModel> load(const std::string& dir, const EnvConfig& env);
  ~DeepseekV4CudaModel() override;

  const DeepseekV4Config& config() const { return cfg_; }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int64_t max_model_len() const override { return cfg_.max_position_embeddings; }
  int64_t eos_token_id() const override { return cfg_.eos_token_id; }
  int64_t bos_token_id() const override { return cfg_.bos_token_id; }
  std::string describe() const override;

  // The budget is capped by what the device memory plan left for the cache.
  kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const override;
  void allocate_cache(const kv::CacheGeometry& geometry) override;
  void allocate_cache_for(int64_t slots, int64_t max_tokens_per_slot);  // tools/tests
  void reset_slot(int32_t slot) override;
  const kv::CacheGeometry& cache_geometry() const;

  // f32 host logits [logits_indices.size(), vocab]; with need_hidden, last_hidden() holds the
  // final streams [rows, hc_mult, D] (f32, host).
  Tensor forward(const ForwardBatch& batch) override;
  const Tensor& last_hidden() const { return last_hidden_; }

 private:
  struct State;
  DeepseekV4CudaModel();
  DeepseekV4Config cfg_;
  CudaModelOptions opts_;
  std::unique_ptr<State> st_;
  Tensor last_hidden_;
};

}  // namespace deepinfer::model::v4
