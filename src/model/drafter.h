// A model's own drafter for speculative decoding: DeepSeek-V4's MTP block (applied recursively)
// and DeepSeek-V4.1's DSpark block drafter (model/deepseek_v41/dspark.h). The engine drives it after each target step:
// the drafter first consumes the positions the target just committed (their final hidden rows and
// the token that follows each), which keeps its own per-slot state (the MTP window ring) in step
// with the target, then proposes up to `num_drafts` tokens after the last of them. A slot's feeds
// may skip positions: adaptive drafting runs steps no drafter follows while every request has
// stopped drafting (engine/spec_adaptive.h); the drafter's state for skipped positions is then
// stale, which may lower acceptance (drafts are verified exactly) but must not fail.
// The drafter's per-slot state follows the target's rollback contract (causal_lm.h): its rings hold
// the target's max_rollback() extra positions, so rejected drafts need no undo.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/causal_lm.h"

namespace deepinfer::model {

struct DraftSeq {
  int32_t cache_slot = -1;
  std::vector<int32_t> block_table;
  // Positions [first_position, first_position + num_positions) were just computed by the target;
  // next_tokens[i] is the token at position first_position + i + 1 (the last one is the token the
  // target step sampled: the anchor the drafts continue).
  int64_t first_position = 0;
  int32_t num_positions = 0;
  std::vector<int32_t> next_tokens;  // [num_positions]
  int32_t num_drafts = 0;            // drafts to propose after the anchor (0: only feed the state)
  // Row of DraftBatch::target_hidden holding position first_position; the sequence's positions
  // are rows [first_hidden_row, first_hidden_row + num_positions). The rows are the target
  // step's own hidden rows (no copy), so rows of rejected drafts may lie between sequences.
  int64_t first_hidden_row = 0;
};

// Chooses each draft from the drafter's logits the way the engine will verify it: the engine
// implements it with the request's own sampling processing (temperature, top-k/p, min-p,
// penalties over the history with the earlier drafts) and records the distribution it drew from
// for rejection sampling. Without a picker a drafter drafts greedily (lowest id on ties).
class DraftPicker {
 public:
  virtual ~DraftPicker() = default;
  // Draft `index` (0: the position after the anchor) of DraftBatch::seqs[seq] from its host
  // logits [vocab] f32. Called in draft order for each sequence.
  virtual int32_t pick(size_t seq, int32_t index, const float* logits, int64_t vocab) = 0;
  // Whether every pick for DraftBatch::seqs[seq] is the argmax (lowest id on ties): a drafter may
  // then choose on its device and skip pick() (no logits copy).
  virtual bool greedy(size_t seq) const { return false; }
  // Whether pick_on_device() can take every pick of this batch: the drafter may then leave its
  // logits on the device (no [rows, vocab] copy; only ids and logprobs come back).
  virtual bool device_picks() const { return false; }
  // The next draft of DraftBatch::seqs[seqs[j]] for every j, from row j of the drafter's device
  // logits, chosen by the same rule as pick() (on the device): tokens[j] and its log-probability
  // under the row's raw softmax, logprobs[j]. Waits for the picks.
  virtual void pick_on_device(const DeviceLogits& logits, std::span<const size_t> seqs, int32_t* tokens,
                              float* logprobs) {
    (void)logits, (void)seqs, (void)tokens, (void)logprobs;
  }
};

struct DraftBatch {
  std::vector<DraftSeq> seqs;
  // The target step's hidden rows (V4: final streams [rows, n, D]; V4.1 DSpark: taps
  // [rows, taps*D], Dims::hidden_elems), holding every fed position at its
  // sequence's first_hidden_row (host tensor for host backends; device pointer for device ones).
  HiddenRows target_hidden;
  DraftPicker* picker = nullptr;  // null: greedy drafts
};

struct DraftProposal {
  std::vector<int32_t> tokens;        // [<= num_drafts] drafts for positions anchor+1, ...
  // [tokens.size()] log-probability of each draft under the drafter's raw softmax (temperature
  // 1, no processing): its confidence, which variable-length verification reads.
  std::vector<float> logprobs;
  // [tokens.size()] or empty: the drafter's own estimate that each draft is accepted given the
  // earlier ones were (V4.1 DSpark: sigma(c_i) of its confidence head). V4's MTP has none.
  std::vector<float> confidence;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string describe() const = 0;
  // Most drafts one round can propose (V4 MTP: any, capped by the engine; DSpark: its block size).
  virtual int64_t max_draft_tokens() const = 0;
  // Feeds every sequence's committed positions and proposes its drafts. Host logits of every
  // proposed position are returned through `draft_logits` when non-null ([sum tokens, vocab] f32,
  // sequences in order) for rejection sampling.
  virtual std::vector<DraftProposal> propose(const DraftBatch& batch, Tensor* draft_logits = nullptr) = 0;
};

}  // namespace deepinfer::model
