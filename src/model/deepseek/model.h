// A DeepSeek-V4-family model (V4 today, V4.1 next) as the engine sees it (CausalLM): the family's
// architecture (dimensions + layer plans), one backend (CPU or CUDA) holding weights and cache, and
// the shared forward in between. Each step: validate the batch, plan it (general or the backend's
// fixed shape), let the backend run forward_step, return its outputs. The V4 MTP block is its
// drafter (mtp_drafter.h).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/causal_lm.h"
#include "model/deepseek/backend.h"
#include "model/deepseek/forward.h"
#include "model/drafter.h"

namespace deepinfer::model::ds {

struct ModelInfo {
  std::string architecture;     // "DeepseekV4ForCausalLM"
  std::string summary;          // layer schedule, widths (describe())
  int64_t max_model_len = 0;
  int64_t eos_token_id = 1, bos_token_id = 0;
};

class DeepseekModel : public CausalLM {
 public:
  DeepseekModel(ModelInfo info, Arch arch, std::vector<kv::LayerCacheSpec> specs, std::unique_ptr<ModelBackend> be,
                std::shared_ptr<void> keepalive = nullptr);
  ~DeepseekModel() override;

  int64_t vocab_size() const override { return arch_.dims.vocab; }
  int64_t max_model_len() const override { return info_.max_model_len; }
  int64_t eos_token_id() const override { return info_.eos_token_id; }
  int64_t bos_token_id() const override { return info_.bos_token_id; }
  std::string describe() const override;

  kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const override;
  void allocate_cache(const kv::CacheGeometry& geometry) override {
    be_->allocate_cache(geometry);
    slot_extent_.assign(size_t(be_->cache_geometry().num_slots), {});
  }
  // Tools/tests: `slots` slots and room for `max_tokens` tokens per slot.
  void allocate_cache_for(int64_t slots, int64_t max_tokens_per_slot);
  void reset_slot(int32_t slot) override;
  const kv::CacheGeometry& cache_geometry() const { return be_->cache_geometry(); }

  ForwardOutput run(const ForwardBatch& batch, const ForwardOptions& options) override;
  bool supports_device_logits() const override { return be_->logits_on_device(); }
  bool supports_device_inputs() const override { return be_->logits_on_device(); }
  void set_profiling(bool on) override { be_->set_profiling(on); }
  void mark_step_end() override { be_->mark_step_end(); }
  StepProfile take_profile() override { return be_->take_profile(); }
  void set_op_profiling(bool on) override { be_->set_op_profiling(on); }
  int64_t prefill_weight_pass_tokens() const override { return be_->prefill_weight_pass_tokens(); }
  std::vector<OpTiming> take_op_profile() override { return be_->take_op_profile(); }
  bool joins_collectives() const override { return be_->joins_collectives(); }
  void enable_expert_parallel(parallel::ProcessGroup& group, const ExpertParallelOptions& options) override;
  void synchronize() override { be_->synchronize(); }

  int64_t max_rollback() const override { return arch_.plan.max_rollback; }
  int64_t replay_keep() const override { return arch_.plan.replay_keep; }
  void rollback(int32_t slot, int64_t num_tokens, int64_t keep) override;
  // save_slot throws InvalidArgument unless can_save_slot (the slot may not hold that state).
  SlotSnapshot save_slot(int32_t slot, int64_t num_tokens) override;
  void restore_slot(int32_t slot, const SlotSnapshot& s) override;
  bool can_save_slot(int32_t slot, int64_t num_tokens) const override;
  std::unique_ptr<PendingSlotSaves> queue_save_slots(std::span<const SlotSave> saves) override;
  size_t paged_block_bytes() const override { return be_->paged_block_bytes(); }
  void copy_blocks_to_host(std::span<const HostBlockCopy> copies) override;
  void copy_blocks_from_host(std::span<const HostBlockCopy> copies) override;
  int device_ordinal() const override { return be_->device_ordinal(); }
  DeviceMemory allocate_device_memory(size_t bytes) override { return be_->allocate_device_memory(bytes); }
  void gather_blocks_to_device(std::span<const int32_t> blocks, void* dst, void* done) override {
    be_->gather_blocks_to_device(blocks, dst, done);
  }
  void scatter_blocks_from_device(std::span<const int32_t> blocks, const void* src, void* ready) override {
    be_->scatter_blocks_from_device(blocks, src, ready);
  }
  std::shared_ptr<uint8_t> allocate_host_memory(size_t bytes) override;
  Drafter* drafter() override { return drafter_.get(); }

  // One MTP step of block k over `batch` (tokens = the tokens that follow each target position,
  // whose hidden rows are the `rows` ranges (first row, count) of `target`, back to back, one row
  // per batch token; empty = all of `target`): logits of batch.logits_indices and the block's
  // output streams of batch.hidden_indices. Used by the drafter and the MTP tests.
  // options.logits_on_device leaves the logits in the backend (the drafter then reads greedy picks
  // through backend().greedy_rows). Steps the backend's fixed-shape path accepts take it unless
  // set_mtp_fixed_shapes(false).
  ForwardOutput run_mtp(const ForwardBatch& batch, const HiddenRows& target, int64_t k,
                        const ModelBackend::RowRanges& rows = {}, const ForwardOptions& options = {});
  int64_t num_mtp_blocks() const { return int64_t(arch_.plan.drafter.size()); }
  void set_mtp_fixed_shapes(bool on) { mtp_fixed_shapes_ = on; }

  const Arch& arch() const { return arch_; }
  ModelBackend& backend() { return *be_; }
  // The routed experts the loader prepared (ModelLoadOptions::expert_shard; empty = all):
  // enable_expert_parallel then needs the shard's placement, and EPLB a backend that moves expert
  // weights (ModelBackend::expert_weight_store).
  void set_expert_shard(std::optional<parallel::ExpertShard> shard) { shard_ = shard; }
  const std::optional<parallel::ExpertShard>& expert_shard() const { return shard_; }
  const std::vector<kv::LayerCacheSpec>& cache_specs() const { return specs_; }
  // Called by run() with every validated batch (an empty one too) before it runs (context-parallel
  // serving's leader hands split steps to its helpers: cp_serving.h). Empty: none.
  void set_step_hook(std::function<void(const ForwardBatch&)> hook) { step_hook_ = std::move(hook); }
  // Called by run() after every non-empty batch it ran to the end (not after one that threw):
  // the leader records what the step left in the blocks its helpers also wrote.
  void set_after_step_hook(std::function<void(const ForwardBatch&)> hook) { after_step_hook_ = std::move(hook); }

 private:
  StepPlan plan_step(const ForwardBatch& batch, bool allow_fixed) const;
  // run() after validation and the step hook: empty steps, bounded replay, run_planned.
  ForwardOutput run_checked(const ForwardBatch& batch, const ForwardOptions& options);
  // The validated batch on the backend: before_step, plan, forward, outputs.
  ForwardOutput run_planned(const ForwardBatch& batch, const ForwardOptions& options);
  // Bounded replay: the positions of `batch` before their sequences' tails as their own batch
  // (nullopt: none) and the rest into `tail` (left empty when nothing remains). Refuses logits,
  // hidden rows and device inputs before a tail.
  std::optional<ForwardBatch> split_replay(const ForwardBatch& batch, std::optional<ForwardBatch>& tail) const;
  // Whether some token's window reaches before its sequence's tail (the general plan then).
  bool needs_tail_windows(const ForwardBatch& batch) const;
  // Records what a batch writes into each slot (target or drafter rings).
  void note_writes(const ForwardBatch& batch, bool target);
  void check_blocks(std::span<const HostBlockCopy> copies, const char* what) const;
  void check_saveable(int32_t slot, int64_t num_tokens) const;  // InvalidArgument unless can_save_slot

 protected:
  // Host work of a family once a step's tokens are known, before it is planned (V4.1: Engram rows).
  virtual void before_step(const ForwardBatch& batch) {}

 private:

  // Per slot, what its fixed state holds (can_save_slot): `length` = positions of the target's
  // sequence (after rollbacks); `written_end` = one past the furthest position any ring (target
  // or drafter) was written since the slot was reset or restored.
  struct SlotExtent {
    int64_t length = 0, written_end = 0;
  };
  std::vector<SlotExtent> slot_extent_;  // [num_slots]
  std::optional<parallel::ExpertShard> shard_;
  std::function<void(const ForwardBatch&)> step_hook_;
  std::function<void(const ForwardBatch&)> after_step_hook_;

  ModelInfo info_;
  Arch arch_;
  std::vector<kv::LayerCacheSpec> specs_;
  std::unique_ptr<ModelBackend> be_;
  std::unique_ptr<Drafter> drafter_;
  bool mtp_fixed_shapes_ = true;
  std::shared_ptr<void> keepalive_;  // the mapped checkpoint, when a backend reads it in place
};

}  // namespace deepinfer::model::ds
