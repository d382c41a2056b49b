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
// Steps in three calls (asynchronous scheduling, engine.h): launch(out) applies out's state
// changes, builds the batch and starts the forward; sample(out) starts drawing its rows (after
// the previous step was collected, so penalties, min_tokens and grammar masks see its tokens);
// collect(out) waits for the draws, verifies and commits them. Step N+1 may be launched before
// step N is collected (not before it is sampled): a sequence whose next input is the token N
// draws gets it from N's draws on the host, or, when N sampled on the device, the model reads it
// from the device sampler's token buffer (ForwardBatch::device_inputs). Results of sequences
// dropped meanwhile (finished, preempted, aborted) are not reported. The CPU backend finishes each
// call before returning, so the same calls simply run in order. execute() = all three.
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
#include <chrono>
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
  // Sampled drafts and their rejection-sampling verify on the model's device (DeviceSampler
  // kDraft / kVerify rows: only ids, decisions and logprobs come back), when device sampling is
  // on; off: both on the host from copied logits (the same rules, spec_verify.h).
  bool device_draft_sampling = true;
  // Tokens per paged block (the cache geometry's): drafts are capped to the positions the
  // sequence's blocks cover (0: no cap).
  int64_t block_tokens = 0;
  int64_t host_blocks = 0;             // host-tier slots (prefix caching), paged_block_bytes() each
  // Slot checkpoints through CausalLM::queue_save_slots: those of step N taken at N+1's launch are
  // copied stream-ordered (a device backend does not wait for N there) and collected with N's
  // results. Off (the default until an H200 run verified it): save_slot each, at once.
  bool async_checkpoints = false;
};

class ModelRunner {
 public:
  struct Stats {
    int64_t device_steps = 0, host_steps = 0;  // steps sampled on the device / on the host
    int64_t rollbacks = 0;                     // CausalLM::rollback calls (rejected drafts)
    int64_t draft_calls = 0;                   // Drafter::propose calls
    int64_t overlapped_launches = 0;           // steps launched while the previous one was in flight
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

  // `out` must stay alive and unchanged (but for grammar_masks, read by sample()) until collected.
  void launch(const SchedulerOutput& out);
  void sample(const SchedulerOutput& out);
  ModelRunnerOutput collect(const SchedulerOutput& out);
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
    int64_t num_computed = 0;             // positions launched (a step's are added at launch)
    // Tokens that launched, not yet collected steps draw for it (at most two: step N is collected
    // after N+1 was launched); the first is position known_tokens(). pending_step / pending_row:
    // the latest such step and its sampling row (the next step's input).
    int32_t pending_samples = 0;
    int64_t pending_step = -1, pending_row = -1;
    // The drafter's last proposal (what the scheduler may schedule next step, a prefix of it) and
    // the distribution each draft was drawn from ([vocab] weights; empty: greedy draft).
    std::vector<int32_t> pending_drafts;
    std::vector<std::vector<float>> pending_q;
    // [pending_drafts] row of the draft sampler's pool holding q on the device (-1: none; the
    // host q above, or a greedy draft).
    std::vector<int64_t> pending_q_row;
    int64_t known_tokens() const { return int64_t(prompt_ids->size() + output_ids.size()); }
    int64_t num_tokens() const { return known_tokens() + pending_samples; }
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
  };

  // A launched step until it is collected.
  struct Step {
    const SchedulerOutput* out = nullptr;
    std::vector<SeqSlice> slices;
    std::vector<int64_t> sample_logits_rows;  // [sampling rows] row of the forward's logits
    std::vector<PromptRows> prompt_rows;
    bool on_device = false;                   // logits stay on the device, the device sampler draws
    bool verifies = false;                    // some sequence has drafts (stats: verify steps, time)
    std::chrono::steady_clock::time_point launched_at;
    int64_t num_logits_rows = 0;              // of the forward (prompt rows + sampling rows)
    model::ForwardOutput forward;
    bool sampled = false;                     // sample() ran (host: drawn is filled)
    SampleSet set;
    std::vector<SampleResult> drawn;
    ModelRunnerOutput result;                 // prompt logprobs (and saved checkpoints) so far
    bool checkpoints_saved = false;           // save_checkpoints ran (at the next launch or at collect)
    // async_checkpoints: the queued saves and the requests they answer (in out->checkpoints).
    std::unique_ptr<model::PendingSlotSaves> pending_saves;
    std::vector<const CheckpointRequest*> saving;
  };

  void apply_state_changes(const SchedulerOutput& out);
  model::ForwardBatch build_batch(const SchedulerOutput& out, Step& step);
  // The id of position p of `s` for the step being built (ForwardBatch index i); a token the
  // previous step drew on the device becomes a device input.
  int32_t input_token(const SeqState& s, int64_t p, model::ForwardBatch& b, int64_t i) const;
  SampleSet sampling_rows(const SchedulerOutput& out, std::vector<SeqSlice>& slices,
                          const std::vector<int64_t>& sample_logits_rows) const;
  void sample_on_host(Step& step);
  Step& find_step(const SchedulerOutput& out);
  // Verifies and commits every sampling sequence's rows; rolls the model back where drafts failed.
  void commit(const std::vector<SeqSlice>& slices, const SampleSet& set, std::vector<SampleResult>& drawn,
              ModelRunnerOutput& result);
  // The first drafts of the sequence (as scheduled) whose q lies in the draft pool: all of its
  // sampled drafts (verified on the device), or none.
  bool drafts_on_device(const ScheduledSeq& sch) const;
  // Host copies of the pool rows of the sequence's scheduled drafts (a host-sampled verify step).
  void download_draft_q(const ScheduledSeq& sch);
  // The step's SpecRow per sampling row (kVerify for device-held sampled drafts); empty if none.
  std::vector<SpecRow> verify_rows(const std::vector<SeqSlice>& slices, size_t rows) const;
  void propose_drafts(const std::vector<SeqSlice>& slices, const model::HiddenRows& hidden, ModelRunnerOutput& result);
  // Whether the sequence's scheduled drafts were sampled (verified from host probabilities).
  bool has_sampled_drafts(const ScheduledSeq& sch) const;
  // Saves the slot checkpoints `out` asks for that the step committed and the model can save.
  // Right after the step: at the next step's launch (before it writes any slot; a device backend
  // waits for the step) or, with none launched, at collect.
  void save_checkpoints(const SchedulerOutput& out, Step& step, ModelRunnerOutput& result);
  // The checkpoints queued for `step` (async_checkpoints), waited for, into `result`.
  void take_checkpoints(Step& step, ModelRunnerOutput& result);
  // The host tier's copies of a step: spills (device -> host) first, then loads.
  void copy_host_tier(const SchedulerOutput& out);

  model::CausalLM& model_;
  RunnerOptions options_;
  model::Drafter* drafter_ = nullptr;  // the model's, when drafting is on
  std::unique_ptr<DeviceSampler> device_sampler_;
  // Sampled draft picks on the device: its pool holds each sequence's q rows (slot * drafts + i).
  std::unique_ptr<DeviceSampler> draft_sampler_;
  std::unordered_map<int64_t, SeqState> seqs_;
  std::deque<Step> steps_;  // launched, not collected (at most two), in step order
  std::shared_ptr<uint8_t> host_pool_;  // [host_blocks, paged_block_bytes()], allocated at first use
  model::ForwardBatch last_batch_;
  Stats stats_;
};

}  // namespace deepinfer::engine
