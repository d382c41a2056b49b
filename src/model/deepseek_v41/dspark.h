// DeepSeek-V4.1's DSpark block drafter on the host (CPU backend; MODEL-DEEPSEEK-V41.md §7, the
// reference's DSparkBlock / forward_spec; docs/MODEL-V41.md "DSpark drafter").
//
// Inputs per committed target position p: its taps (the stream means at the input of the
// dspark_target layers, which the V4.1 forward returns as its hidden rows). M(p) =
// main_norm(main_proj(taps)) is shared by the stages; each stage s keeps a ring of its keys
// kv_s(p) = FP8(rope_p(kv_norm(wkv_s M(p)))). A draft round at the last fed position n-1 with
// anchor a (the token at n) runs the block [a, z, ..., z] (block_size tokens at positions
// n..n+B-1) through the stages: single-pass mHC, attention of every block query over the last
// `window` ring positions plus all B block keys (bidirectional, with sinks), the stage MoE. Then
// base_i = head(norm(x_i)), the Markov head's bigram bias from the previous draft (the anchor for
// i = 0), draft d_{i+1} picked from base_i + bias_i, and the confidence c_i = w_c·[x_i; e_i]
// (sigma(c_i) estimates P(d_{i+1} accepted | earlier drafts accepted)).
//
// Rollback contract (causal_lm.h): each ring holds window + max_rollback positions (slot p mod
// capacity), so positions the target rolls back are simply fed again; the rings travel in slot
// snapshots (the model appends them). All math is f32: on the host with the trunk's CPU ops, or,
// when DSparkOptions::stages is set (the GPU model), behind DSparkStages (dspark_stages.h): the
// rings, stage weights and stage math on the device, this class keeping the slot bookkeeping and
// the snapshot framing (the same bytes either way).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/drafter.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/dspark_stages.h"

namespace deepinfer::model::v41 {

struct V41Weights;
struct DSparkWeights;  // dspark.cpp

// Host f32 [rows, row_elems] copy of tap rows a device backend left on the device only
// (HiddenRows::device; ForwardOptions::hidden_to_host false). Set by the GPU loader.
using HostTaps = std::function<Tensor(const HiddenRows&)>;

struct DSparkOptions {
  int64_t max_rollback = 0;  // ring slack (ModelLimits::max_rollback)
  bool qat = true;           // FP8 round trip of the ring / block keys (V41PlanOptions::qat)
  HostTaps host_taps;        // null: tap rows must come on the host (host stages only)
  DSparkStagesMaker stages;  // set: the stage forward runs there (tap rows host or device)
};

class DSparkDrafter final : public Drafter {
 public:
  // Reads the stages' weights (f32 copies) and the shared embedding / head from `w`. Throws
  // CheckpointError when the checkpoint has no DSpark stages.
  DSparkDrafter(const DeepseekV41Config& cfg, const V41Weights& w, const DSparkOptions& options);
  ~DSparkDrafter() override;

  std::string describe() const override;
  int64_t max_draft_tokens() const override { return block_size_; }
  // Feeds every sequence's committed positions (their ring rows) and drafts up to num_drafts (<=
  // block size) after the anchor. Confidences sigma(c_i) go into DraftProposal::confidence.
  std::vector<DraftProposal> propose(const DraftBatch& batch, Tensor* draft_logits = nullptr) override;

  // The confidence logits c_i of the last propose() (its drafts in order), before the sigmoid.
  const std::vector<float>& last_confidence_logits() const { return last_conf_; }

  // Slot lifecycle, called by the model with the target's.
  void reset_slot(int32_t slot);
  void rollback(int32_t slot, int64_t keep);  // positions >= keep are no longer committed
  // Appends the rings of positions [max(0, n - window), n) to `bytes` / takes them back off the end.
  void append_snapshot(int32_t slot, int64_t n, std::vector<uint8_t>& bytes) const;
  void take_snapshot(int32_t slot, std::vector<uint8_t>& bytes);

  int64_t block_size() const { return block_size_; }
  bool stages_on_device() const { return dev_ != nullptr; }
  int64_t ring_capacity() const { return window_ + max_rollback_; }

 private:
  struct SlotRings;
  SlotRings& slot(int32_t s);
  int64_t advance(const DraftSeq& s);  // ring bookkeeping of a feed; returns the first row written
  void feed(const DraftSeq& s, const HiddenRows& taps, size_t index);
  void run_block(const std::vector<const DraftSeq*>& seqs, std::vector<float>& xhat);
  int64_t ring_lo(const DraftSeq& s);  // first ring position a block of `s` reads
  // Markov head, picks and confidences from host base logits [S*B, V] / xhat [S*B, D].
  void host_tail(const DraftBatch& in, const std::vector<const DraftSeq*>& drafting, const std::vector<size_t>& index,
                 const std::vector<float>& xhat, std::vector<float>& base, std::vector<DraftProposal>& out,
                 std::vector<std::vector<float>>* kept);
  void device_propose(const DraftBatch& in, const std::vector<const DraftSeq*>& drafting,
                      const std::vector<size_t>& index, std::vector<DraftProposal>& out,
                      std::vector<std::vector<float>>* kept);

  DeepseekV41Config cfg_;
  std::unique_ptr<DSparkWeights> w_;
  int64_t block_size_ = 0, window_ = 0, max_rollback_ = 0;
  bool qat_ = true;
  HostTaps host_taps_;
  std::unique_ptr<DSparkStages> dev_;  // set: the stages run there (the host keeps no rings)
  std::vector<std::unique_ptr<SlotRings>> slots_;
  std::vector<float> last_conf_;
  static constexpr int64_t kSnapshotMagic = 0x4b52415053440001;  // "DSPARK" + format 1
};

}  // namespace deepinfer::model::v41
