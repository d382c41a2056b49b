// The typed messages that cross engine boundaries, built fresh every step and read-only to
// the receiver (STYLE.md "Data flows one way"):
//   Scheduler --SchedulerOutput--> ModelRunner --ModelRunnerOutput--> Scheduler::update
//   Scheduler::update --EngineCoreOutput--> OutputProcessor
// New (or resumed) sequences travel in full, running ones as diffs, so the runner can keep
// its own per-sequence state and, later, run step N while the scheduler plans step N+1.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "deepinfer/sampling_params.h"
#include "engine/sampler.h"

namespace deepinfer::engine {

struct NewSeqData {
  int64_t seq_id = 0;
  std::shared_ptr<const std::vector<int32_t>> prompt_ids;
  std::vector<int32_t> output_ids;      // non-empty when resuming after preemption (recompute)
  std::shared_ptr<const SamplingParams> params;
  uint64_t seed = 0;
  uint32_t sample_index = 0;
  int64_t eos_token_id = -1;
  int32_t cache_slot = -1;              // fresh slot: the runner resets it
  std::vector<int32_t> block_ids;
  int64_t num_computed_tokens = 0;
};

struct CachedSeqData {
  int64_t seq_id = 0;
  std::vector<int32_t> new_block_ids;   // appended to its block table
  int64_t num_computed_tokens = 0;
};

struct ScheduledSeq {
  int64_t seq_id = 0;
  int32_t num_tokens = 0;               // tokens of this sequence in the step
  bool samples = false;                 // the chunk reaches its last known token
};

struct SchedulerOutput {
  std::vector<NewSeqData> new_seqs;
  std::vector<CachedSeqData> cached_seqs;
  std::vector<ScheduledSeq> scheduled;  // batch order (= packing order of tokens)
  int64_t total_num_tokens = 0;
  std::vector<int64_t> finished_seq_ids;   // since the last step; the runner drops their state
  std::vector<int64_t> preempted_seq_ids;  // this step; the runner drops their state
  // Grammar masks of sampling sequences, [ceil(vocab/32)] each, parallel to `grammar_seq_ids`.
  std::vector<int64_t> grammar_seq_ids;
  std::vector<std::vector<uint32_t>> grammar_masks;
  bool empty() const { return scheduled.empty(); }
};

struct SampledToken {
  int64_t seq_id = 0;
  int32_t token = -1;
  std::optional<TokenLogprobs> logprobs;
};

// Prompt logprobs of positions [first_position, first_position + entries.size()).
struct PromptLogprobsChunk {
  int64_t seq_id = 0;
  int64_t first_position = 0;
  std::vector<TokenLogprobs> entries;
};

struct ModelRunnerOutput {
  std::vector<SampledToken> sampled;
  std::vector<PromptLogprobsChunk> prompt_logprobs;
};

// What one step produced for one sequence, for the OutputProcessor.
struct SeqUpdate {
  int64_t seq_id = 0;
  std::vector<int32_t> new_token_ids;
  std::vector<TokenLogprobs> new_logprobs;  // parallel to new_token_ids when requested
  std::vector<PromptLogprobsChunk> prompt_logprobs;
  bool finished = false;
  int finish_reason = 0;                    // FinishReason
  int32_t stop_token_id = -1;
  int64_t num_preemptions = 0;
  bool first_scheduled = false;
};

}  // namespace deepinfer::engine
