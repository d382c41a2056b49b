// DeepSeek-V4 (`DeepseekV4ForCausalLM`) on the CPU backend: the shared DeepSeek forward
// (model/deepseek) over V4's layer plans (plan.h), weights from V4's tensor table dequantised to
// f32 (the fp32 reference mode, identical to transformers to ~1e-6). One batched pass over every
// scheduled sequence's new tokens (varlen); a full forward, a chunked prefill with any chunk sizes
// and token-by-token decode give the same logits; a sequence's results do not depend on its batch
// neighbours. The GPU model is the same class over the CUDA backend (cuda/cuda_model.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "kv/kv_cache.h"
#include "model/causal_lm.h"
#include "model/deepseek/model.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer::model::v4 {

struct ModelOptions {
  bool load_mtp = true;       // prepare the MTP block(s) when the checkpoint has them
  bool progress = false;      // loader progress lines
  int64_t max_rollback = 0;   // ring slack for rollback (ModelLimits::max_rollback)
  bool batch_invariant = false;  // DEEPINFER_BATCH_INVARIANT: fixed-order products (ds::CpuBackendOptions)
  std::optional<parallel::ExpertShard> expert_shard;  // ModelLoadOptions::expert_shard
};

class DeepseekV4Model final : public ds::DeepseekModel {
 public:
  // Parses <dir>/config.json, maps the weights and prepares f32 copies (dequantising FP8/FP4).
  // Throws ConfigError / CheckpointError naming the file and tensor.
  static std::unique_ptr<DeepseekV4Model> load(const std::string& dir, const ModelOptions& options = {});

  const DeepseekV4Config& config() const { return cfg_; }
  bool has_mtp() const { return num_mtp_blocks() > 0; }
  kv::KvCache& cache();

  // MTP draft (§7) with block k. batch.token_ids[i] is the token that FOLLOWS main position i
  // (positions come from the batch's seqs); main_hidden [T, hc_mult, D] are the main model's final
  // streams at those positions. Uses its own window ring in the same slots. Returns logits
  // [batch.logits_indices.size(), vocab] predicting the token after that one.
  Tensor forward_mtp(const ForwardBatch& batch, const Tensor& main_hidden, int64_t k = 0);

 private:
  DeepseekV4Model(ds::ModelInfo info, ds::Arch arch, std::vector<kv::LayerCacheSpec> specs,
                  std::unique_ptr<ds::ModelBackend> be, std::shared_ptr<void> keepalive, DeepseekV4Config cfg)
      : DeepseekModel(std::move(info), std::move(arch), std::move(specs), std::move(be), std::move(keepalive)),
        cfg_(std::move(cfg)) {}
  DeepseekV4Config cfg_;
};

// The model info every V4 backend reports.
ds::ModelInfo v4_model_info(const DeepseekV4Config& cfg);

// Runs one sequence through `model` in chunks of the given sizes (they must sum to ids.size())
// in cache slot `slot` (reset first; blocks slot*per_slot.. of a cache from allocate_cache_for),
// returning logits for every position [T, vocab]. One chunk = full forward; all ones = decode.
Tensor run_sequence(DeepseekV4Model& model, const std::vector<int32_t>& ids, const std::vector<int64_t>& chunks,
                    int32_t slot = 0, bool need_hidden = false, Tensor* hidden = nullptr);

}  // namespace deepinfer::model::v4

namespace deepinfer::model {
namespace deepseek_v4 = v4;  // the engine spells the namespace out
}
