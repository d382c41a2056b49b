// ModelRunner: turns a SchedulerOutput into one batched forward over every scheduled
// sequence (varlen packed tokens, per-sequence positions, block tables and slots), then
// samples. It keeps its own copy of each running sequence's tokens, updated from the
// scheduler's diffs and from its own samples, so it never calls back into the scheduler.
// The model (CPU or CUDA backend) is behind model::CausalLM; nothing here depends on which.
// Sampling: when the model leaves its logits on a device (CausalLM::supports_device_logits)
// and device sampling is on, the runner samples there (DeviceSampler) and only ids and the
// asked-for logprobs come back. Grammar bitmasks are uploaded and applied on the device. A step
// takes the host path (host logits + sample_rows) when some sequence wants prompt logprobs
// (they need whole logits rows) or some row is beyond the device sampler (supports()).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/device_sampler.h"
#include "engine/messages.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"

namespace deepinfer::engine {

struct RunnerOptions {
  bool device_sampling = true;  // sample on the model's device when it keeps logits there
};

class ModelRunner {
 public:
  struct Stats {
    int64_t device_steps = 0, host_steps = 0;  // steps sampled on the device / on the host
  };

  explicit ModelRunner(model::CausalLM& model, const RunnerOptions& options = {});
  ~ModelRunner();

  ModelRunnerOutput execute(const SchedulerOutput& out);
  // The ForwardBatch execute() would run (after applying `out`'s state changes). Tests use it.
  model::ForwardBatch last_batch() const { return last_batch_; }
  const Stats& stats() const { return stats_; }
  // Null when the step sampling runs on the host only.
  const DeviceSampler* device_sampler() const { return device_sampler_.get(); }

 private:
  struct SeqState {
    std::shared_ptr<const std::vector<int32_t>> prompt_ids;
    std::vector<int32_t> output_ids;
    std::shared_ptr<const SamplingParams> params;
    uint64_t seed = 0;
    uint32_t sample_index = 0;
    int64_t eos_token_id = -1;
    int32_t slot = -1;
    std::vector<int32_t> block_table;
    int64_t num_computed = 0;
    int64_t num_tokens() const { return int64_t(prompt_ids->size() + output_ids.size()); }
    int32_t token_at(int64_t p) const {
      int64_t np = int64_t(prompt_ids->size());
      return p < np ? (*prompt_ids)[size_t(p)] : output_ids[size_t(p - np)];
    }
  };
  struct PromptRows {        // logits rows giving prompt logprobs for one sequence
    int64_t seq_id, first_position;
    int64_t first_row, num_rows;
  };

  void apply_state_changes(const SchedulerOutput& out);
  model::ForwardBatch build_batch(const SchedulerOutput& out, std::vector<int64_t>& sample_rows,
                                  std::vector<PromptRows>& prompt_rows);

  // Sampling rows of the scheduled sequences that sample (logits pointers not yet set).
  std::vector<SamplingRow> sampling_rows(const SchedulerOutput& out, const std::vector<int64_t>& sample_rows,
                                         std::vector<int64_t>& row_seq) const;
  std::vector<SampleResult> sample_on_device(const model::ForwardBatch& batch, std::span<const SamplingRow> rows);
  std::vector<SampleResult> sample_on_host(const model::ForwardBatch& batch, std::vector<SamplingRow>& rows,
                                           const std::vector<int64_t>& sample_rows,
                                           const std::vector<PromptRows>& prompt_rows, ModelRunnerOutput& result);

  model::CausalLM& model_;
  std::unique_ptr<DeviceSampler> device_sampler_;
  std::unordered_map<int64_t, SeqState> seqs_;
  model::ForwardBatch last_batch_;
  Stats stats_;
};

}  // namespace deepinfer::engine
