// DeepSeek-V4.1 (`DeepseekV41ForCausalLM`) on the shared DeepSeek core: V4.1's config -> layer plans
// (plan.h) -> weights from either layout (weights.h) -> the CPU backend (fp32 reference, the QAT
// round trips included) -> ds::DeepseekModel running the one shared forward. What V4.1 adds beyond
// the plans is host state per slot: the Engram history (engram_slots.h), whose rows are gathered
// for a step's tokens before the step runs and staged into the backend. With DSpark stages in the
// checkpoint the model's drafter is the DSpark block drafter (dspark.h): the forward returns the
// tap rows as its hidden rows, and the drafter's rings follow the slot lifecycle below.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/deepseek/model.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/dspark.h"
#include "model/deepseek_v41/engram.h"
#include "model/deepseek_v41/engram_slots.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer::model::ds {
struct CpuWeightStore;
}  // namespace deepinfer::model::ds

namespace deepinfer::model::v41 {

struct ModelOptions {
  bool progress = false;
  int64_t max_rollback = 0;  // ring slack for rollback (ModelLimits::max_rollback)
  bool qat = true;           // tests only: false drops the QAT roundings (V41PlanOptions::qat)
  bool batch_invariant = false;  // DEEPINFER_BATCH_INVARIANT: fixed-order products (ds::CpuBackendOptions)
  int64_t replay_keep = 0;       // bounded replay's keep length, 0 = full prefill (V41PlanOptions)
  std::optional<parallel::ExpertShard> expert_shard = std::nullopt;  // ModelLoadOptions::expert_shard (v41_prepare_cpu)
  bool dspark = true;  // false: DSpark stages in the checkpoint are not loaded (no drafter, no taps)
  HostTaps dspark_host_taps{};  // a device backend's tap rows to the host (DSparkOptions::host_taps)
  DSparkStagesMaker dspark_stages{};  // set: the DSpark stages run there (DSparkOptions::stages)
  bool dspark_host_stages = false;  // device loaders: keep the stages on the host (A/B tests, timing)
};

// Makes the backend a model runs on from the mapped checkpoint (load with a maker: no CPU
// preparation runs). The GPU loader (deepseek/cuda/v41_cuda_model.h) uploads the stored tensors one
// entry at a time; the Engram tables stay in host memory (the mapping `weights` keeps alive).
using BackendMaker = std::function<std::unique_ptr<ds::ModelBackend>(
    const DeepseekV41Config& cfg, const ds::Arch& arch, const std::vector<kv::LayerCacheSpec>& specs,
    const V41Weights& weights)>;

class DeepseekV41Model final : public ds::DeepseekModel {
 public:
  // Parses <dir>/config.json, maps the weights (release or transformers names), prepares f32 copies
  // (CPU backend) and, with Engram layers, loads <dir>/engram_sidecar.json. Throws ConfigError /
  // CheckpointError.
  static std::unique_ptr<DeepseekV41Model> load(const std::string& dir, const ModelOptions& options = {});
  // The same over the backend `make` builds (the GPU's); `make` may throw (memory, device).
  static std::unique_ptr<DeepseekV41Model> load(const std::string& dir, const ModelOptions& options,
                                                const BackendMaker& make);
  ~DeepseekV41Model() override;

  const DeepseekV41Config& config() const { return cfg_; }

  void reset_slot(int32_t slot) override;
  void rollback(int32_t slot, int64_t num_tokens, int64_t keep) override;
  SlotSnapshot save_slot(int32_t slot, int64_t num_tokens) override;
  // Its snapshots carry the Engram history too: each save_slot now (not the backend's queue).
  std::unique_ptr<PendingSlotSaves> queue_save_slots(std::span<const SlotSave> saves) override {
    return CausalLM::queue_save_slots(saves);
  }
  void restore_slot(int32_t slot, const SlotSnapshot& snapshot) override;
  Drafter* drafter() override { return dspark_.get(); }
  DSparkDrafter* dspark() { return dspark_.get(); }

 protected:
  void before_step(const ForwardBatch& batch) override;

 private:
  DeepseekV41Model(ds::ModelInfo info, ds::Arch arch, std::vector<kv::LayerCacheSpec> specs,
                   std::unique_ptr<ds::ModelBackend> be, std::shared_ptr<void> keepalive, DeepseekV41Config cfg,
                   std::optional<EngramHasher> hasher, std::unique_ptr<DSparkDrafter> dspark);
  DeepseekV41Config cfg_;
  std::optional<EngramHasher> hasher_;     // present when the config has Engram layers
  std::unique_ptr<EngramSlots> engram_;    // over hasher_
  std::vector<const ds::EngramRef*> tables_;  // hasher order
  std::unique_ptr<DSparkDrafter> dspark_;     // when the checkpoint has the DSpark stages
};

ds::ModelInfo v41_model_info(const DeepseekV41Config& cfg);

}  // namespace deepinfer::model::v41
