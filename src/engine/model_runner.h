// ModelRunner: turns a SchedulerOutput into one batched forward over every scheduled
// sequence (varlen packed tokens, per-sequence positions, block tables and slots), then
// samples. It keeps its own copy of each running sequence's tokens, updated from the
// scheduler's diffs and from its own samples, so it never calls back into the scheduler.
// The model (CPU or CUDA backend) is behind model::CausalLM; nothing here depends on which.
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/messages.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"

namespace deepinfer::engine {

class ModelRunner {
 public:
  explicit ModelRunner(model::CausalLM& model) : model_(model) {}

  ModelRunnerOutput execute(const SchedulerOutput& out);
  // The ForwardBatch execute() would run (after applying `out`'s state changes). Tests use it.
  model::ForwardBatch last_batch() const { return last_batch_; }

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

  model::CausalLM& model_;
  std::unordered_map<int64_t, SeqState> seqs_;
  model::ForwardBatch last_batch_;
};

}  // namespace deepinfer::engine
