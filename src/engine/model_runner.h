// ModelRunner: turns a SchedulerOutput into one batched forward over every scheduled
// sequence (varlen packed tokens, per-sequence positions, block tables and slots), then
// samples. It keeps its own copy of each running sequence's tokens, updated from the
// scheduler's diffs and from its own samples, so it never calls back into the scheduler.
// The model (CPU or CUDA backend) is behind model::CausalLM; nothing here depends on which.
//
// Verify steps: a sequence scheduled with L drafts gets 1 + L sampling rows (its last committed
// token and each draft). Row i is sampled as plain decoding would sample that position after
// drafts[0, i) (history, grammar mask, Philox position), then spec_verify decides the accepted
// run. The runner commits it to its own copy (the scheduler does the same in update()) and
// calls CausalLM::rollback for the rejected positions. With drafting on (a model drafter and
// num_speculative_tokens > 0) it then feeds the drafter every position the target committed
// this step and returns its proposals, which the scheduler schedules next step. A draft is
// chosen as the request samples (a DraftPicker over the drafter's logits): greedy requests and
// requests with a grammar draft greedily, other sampling requests draw their draft from their
// processed distribution q and are verified by rejection sampling (spec_verify.h), which needs
// the target's probabilities on the host: such steps take the host sampling path.
//
// Prefix caching: a new sequence with NewSeqData::restore starts from that slot checkpoint
// (its first blocks are shared cached ones); after the step the runner saves the checkpoints
// SchedulerOutput::checkpoints asks for, where the step committed the boundary and
// CausalLM::can_save_slot allows, and returns them.
//
// Sampling: when the model leaves its logits on a device (CausalLM::supports_device_logits)
// and device sampling is on, the runner samples there (DeviceSampler) and only ids and the
// asked-for logprobs come back. Grammar bitmasks are uploaded and applied on the device. A step
// takes the host path (host logits + sample_rows) when some sequence wants prompt logprobs
// (they need whole logits rows) or some row is beyond the device sampler (supports()).
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/device_sampler.h"
#include "engine/messages.h"
#include "model/causal_lm.h"
#include "model/drafter.h"
#include "model/forward_batch.h"

namespace deepinfer::engine {

struct RunnerOptions {
  bool device_sampling = true;       // sample on the model's device when it keeps logits there
  int32_t num_speculative_tokens = 0;  // drafts to ask the model's drafter for (0: no drafting)
  // A sampling request without a grammar drafts from its own processed distribution over the
  // drafter's logits and is verified by rejection sampling (spec_verify.h); off: every request
  // drafts greedily and its output is token-identical to plain decoding (lower acceptance).
  bool sampled_drafts = true;
  // Tokens per paged block (the cache geometry's): drafts are capped to the positions the
  // sequence's blocks cover (0: no cap).
  int64_t block_tokens = 0;
  int64_t host_blocks = 0;             // host-tier slots (prefix caching), paged_block_bytes() each
};

class ModelRunner {
 public:
  struct Stats {
    int64_t device_steps = 0, host_steps = 0;  // steps sampled on the device / on the host
    int64_t rollbacks = 0;                     // CausalLM::rollback calls (rejected drafts)
    int64_t draft_calls = 0;                   // Drafter::propose calls
    int64_t verify_steps = 0;                  // steps with at least one draft to verify
    double draft_time_s = 0;                   // in Drafter::propose
    double verify_time_s = 0;                  // forward + sampling + verification of verify steps
    int64_t restores = 0;                      // slots started from a prefix checkpoint
    int64_t checkpoints_saved = 0;             // CausalLM::save_slot calls for prefix caching
    int64_t blocks_to_host = 0, blocks_from_host = 0;  // host-tier block copies
  };

  // num_speculative_tokens > 0 needs model.drafter() and model.max_rollback() >= it.
  explicit ModelRunner(model::CausalLM& model, const RunnerOptions& options = {});
  ~ModelRunner();

  ModelRunnerOutput execute(const SchedulerOutput& out);
  // The ForwardBatch execute() would run (after applying `out`'s state changes). Tests use it.
  model::ForwardBatch last_batch() const { return last_batch_; }
  const Stats& stats() const { return stats_; }
  // Null when the step sampling runs on the host only.
  const DeviceSampler* device_sampler() const { return device_sampler_.get(); }
  bool drafting() const { return drafter_ != nullptr; }

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
    // The drafter's last proposal (what the scheduler may schedule next step, a prefix of it) and
    // the distribution each draft was drawn from ([vocab] weights; empty: greedy draft).
    std::vector<int32_t> pending_drafts;
    std::vector<std::vector<float>> pending_q;
    int64_t num_tokens() const { return int64_t(prompt_ids->size() + output_ids.size()); }
    int32_t token_at(int64_t p) const {
      int64_t np = int64_t(prompt_ids->size());
      return p < np ? (*prompt_ids)[size_t(p)] : output_ids[size_t(p - np)];
    }
  };
  // Where one scheduled sequence sits in this step's batch.
  struct SeqSlice {
    const ScheduledSeq* sched = nullptr;
    int64_t first_token = 0;       // index into ForwardBatch::token_ids
    int64_t first_position = 0;    // num_computed before the step
    int64_t first_sample = -1;     // index into the sampling rows, -1 = does not sample
  };
  struct PromptRows {        // logits rows giving prompt logprobs for one sequence
    int64_t seq_id, first_position;
    int64_t first_row, num_rows;
  };
  // The step's sampling rows and what keeps their pointers valid.
  struct SampleSet {
    std::vector<SamplingRow> rows;
    std::vector<int64_t> logits_rows;            // [rows] row of the forward's logits
    std::deque<std::vector<int32_t>> histories;  // output ids + drafts prefix, per draft row
    Tensor host_logits;  // what rows[].logits point into (host path): kept for rejection sampling in commit
  };

  void apply_state_changes(const SchedulerOutput& out);
  model::ForwardBatch build_batch(const SchedulerOutput& out, std::vector<SeqSlice>& slices,
                                  std::vector<int64_t>& sample_logits_rows, std::vector<PromptRows>& prompt_rows);
  SampleSet sampling_rows(const SchedulerOutput& out, std::vector<SeqSlice>& slices,
                          const std::vector<int64_t>& sample_logits_rows) const;
  std::vector<SampleResult> sample_on_device(const model::ForwardBatch& batch, std::span<const SamplingRow> rows,
                                             model::HiddenRows& hidden);
  std::vector<SampleResult> sample_on_host(const model::ForwardBatch& batch, SampleSet& set,
                                           const std::vector<PromptRows>& prompt_rows, ModelRunnerOutput& result,
                                           model::HiddenRows& hidden);
  // Verifies and commits every sampling sequence's rows; rolls the model back where drafts failed.
  void commit(const std::vector<SeqSlice>& slices, const SampleSet& set, std::vector<SampleResult>& drawn,
              ModelRunnerOutput& result);
  void propose_drafts(const std::vector<SeqSlice>& slices, const model::HiddenRows& hidden, ModelRunnerOutput& result);
  // Whether the sequence's scheduled drafts were sampled (verified from host probabilities).
  bool has_sampled_drafts(const ScheduledSeq& sch) const;
  // Saves the slot checkpoints `out` asks for that the step committed and the model can save.
  void save_checkpoints(const SchedulerOutput& out, ModelRunnerOutput& result);
  // The host tier's copies of a step: spills (device -> host) first, then loads.
  void copy_host_tier(const SchedulerOutput& out);

  model::CausalLM& model_;
  RunnerOptions options_;
  model::Drafter* drafter_ = nullptr;  // the model's, when drafting is on
  std::unique_ptr<DeviceSampler> device_sampler_;
  std::unordered_map<int64_t, SeqState> seqs_;
  std::shared_ptr<uint8_t> host_pool_;  // [host_blocks, paged_block_bytes()], allocated at first use
  model::ForwardBatch last_batch_;
  Stats stats_;
};

}  // namespace deepinfer::engine
