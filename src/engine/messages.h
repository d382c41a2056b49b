// The typed messages that cross engine boundaries, built fresh every step and read-only to
// the receiver (STYLE.md "Data flows one way"):
//   Scheduler --SchedulerOutput--> ModelRunner --ModelRunnerOutput--> OutputProcessor::scan_stops
//     --StopEvent--> Scheduler::update --SeqUpdate--> OutputProcessor::process
// New (or resumed) sequences travel in full, running ones as diffs, so the runner can keep
// its own per-sequence state and, later, run step N while the scheduler plans step N+1.
//
// Multi-token steps: a scheduled sequence may carry L draft tokens after its committed tokens
// (ScheduledSeq::draft_tokens). The runner scores all 1 + L positions in one forward, verifies,
// and answers with the accepted tokens (>= 1: the accepted drafts, then the target's own token)
// plus the drafter's proposals for the next step; update() commits the accepted tokens one by
// one and rolls back the rest.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "deepinfer/sampling_params.h"
#include "engine/prefix_cache.h"
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
  // Prefix hit: the slot's state at num_computed_tokens (the runner restores it instead of
  // resetting the slot; block_ids starts with the shared cached blocks).
  std::shared_ptr<const model::SlotSnapshot> restore;
};

struct CachedSeqData {
  int64_t seq_id = 0;
  // The block table is first cut to its first `num_kept_blocks` entries (blocks a rolled-back
  // verify step no longer needs were released), then `new_block_ids` are appended.
  int32_t num_kept_blocks = 0;
  std::vector<int32_t> new_block_ids;
  int64_t num_computed_tokens = 0;
};

struct ScheduledSeq {
  int64_t seq_id = 0;
  int32_t num_tokens = 0;               // positions of this sequence in the step, drafts included
  bool samples = false;                 // the chunk reaches its last committed token
  // [L] drafts to verify, the last L of num_tokens (only when samples). Position i of the
  // sequence's sampling rows scores drafts[i]; row L gives the bonus token.
  std::vector<int32_t> draft_tokens;
  // Drafts to ask the drafter for after this step (each beyond the first costs a drafter pass);
  // -1: the runner's num_speculative_tokens. Varlen asks one more than it verified this step.
  int32_t num_drafts_next = -1;
  int32_t num_sample_rows() const { return samples ? 1 + int32_t(draft_tokens.size()) : 0; }
};

// Grammar bitmasks of one sampling sequence, one per sampling row: row i is the matcher's
// mask after accepting drafts[0, i) (row 0: after the committed tokens).
struct SeqGrammarMasks {
  int64_t seq_id = 0;
  std::vector<std::vector<uint32_t>> rows;  // [num_sample_rows][ceil(vocab/32)], bit t = token t allowed
};

struct SchedulerOutput {
  int64_t step_id = 0;                  // increasing; resources freed after step_id completes
  std::vector<NewSeqData> new_seqs;
  std::vector<CachedSeqData> cached_seqs;
  std::vector<ScheduledSeq> scheduled;  // batch order (= packing order of tokens)
  int64_t total_num_tokens = 0;
  std::vector<int64_t> finished_seq_ids;   // since the last step; the runner drops their state
  std::vector<int64_t> preempted_seq_ids;  // this step; the runner drops their state
  // Sampling sequences with a grammar. Not part of the plan: the engine fills it from
  // Scheduler::grammar_masks() after the previous step was applied, before the runner samples.
  std::vector<SeqGrammarMasks> grammar_masks;
  // Slot checkpoints to save after the step (prefix caching), for boundaries the step reaches.
  std::vector<CheckpointRequest> checkpoints;
  // Host tier (copied before the forward, spills first): device blocks whose hash left the
  // device cache go to host slots; host slots a prefix hit uses come back into fresh blocks.
  std::vector<BlockCopy> block_spills, block_loads;
  // Drafting configured: whether the drafter follows this step (the runner keeps the step's hidden
  // rows and feeds the drafter what it commits). False: a plain step (adaptive drafting: every
  // scheduled sequence stopped drafting, or a probe): no hidden rows, no drafter round, the plain
  // decode graph, and the engine overlaps it with the next step as it does without drafting.
  bool feeds_drafter = true;
  bool empty() const { return scheduled.empty(); }
};

// What one sampling sequence produced in a step: the drafts it accepted followed by the
// target's own token at the first rejected position (or the bonus token after all drafts).
struct SampledSeq {
  int64_t seq_id = 0;
  std::vector<int32_t> tokens;                 // [1 + accepted drafts]
  std::vector<TokenLogprobs> logprobs;         // [tokens.size()] when the request asks for logprobs
  int32_t num_drafts = 0;                      // drafts that were verified
};

// Drafts the model's drafter proposed after a sequence's last accepted token.
struct SeqDrafts {
  int64_t seq_id = 0;
  std::vector<int32_t> tokens;
  // [tokens.size()] log of the drafter's estimate that each is accepted (varlen's input): V4.1
  // DSpark's confidence head sigma(c_i), else (V4 MTP) the drafter's raw probability of the draft.
  std::vector<float> logprobs;
};

// Prompt logprobs of positions [first_position, first_position + entries.size()).
struct PromptLogprobsChunk {
  int64_t seq_id = 0;
  int64_t first_position = 0;
  std::vector<TokenLogprobs> entries;
};

struct ModelRunnerOutput {
  int64_t step_id = 0;                          // SchedulerOutput::step_id it answers
  std::vector<SampledSeq> sampled;
  std::vector<PromptLogprobsChunk> prompt_logprobs;
  std::vector<SeqDrafts> drafts;                // proposals for the next step
  std::vector<SavedCheckpoint> checkpoints;     // what the model could save of SchedulerOutput::checkpoints
  int64_t num_unsaveable_checkpoints = 0;       // committed boundaries it could not save
};

// The output processor found that token `token_index` of a sequence's step tokens
// (SampledSeq::tokens) ends it: a stop string completes there, or its text failed (error).
// update() commits the tokens up to and including that one and finishes the sequence.
struct StopEvent {
  int64_t seq_id = 0;
  int32_t token_index = 0;
  bool error = false;
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
  int32_t num_draft_tokens = 0;             // drafts verified this step
  int32_t num_accepted_drafts = 0;          // of which accepted
  int64_t num_cached_tokens = 0;            // with first_scheduled: prompt tokens a prefix hit served
};

}  // namespace deepinfer::engine
