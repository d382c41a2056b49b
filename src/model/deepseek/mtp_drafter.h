// DeepSeek-V4's MTP block as the model's Drafter (MODEL-DEEPSEEK-V4.md §7): the block runs over
// every position the target committed (keeping its window ring in step), then is applied to its
// own output streams once per further draft (vLLM's recursion). Each draft is the batch's
// DraftPicker's choice from the block's logits (the request's sampling), greedy without one.
#pragma once
#include "model/drafter.h"

namespace deepinfer::model::ds {

class DeepseekModel;

class MtpDrafter final : public Drafter {
 public:
  explicit MtpDrafter(DeepseekModel& model) : model_(model) {}
  std::string describe() const override;
  // One block applied recursively: any length (the engine caps it by its rollback slack).
  int64_t max_draft_tokens() const override;
  std::vector<DraftProposal> propose(const DraftBatch& batch, Tensor* draft_logits = nullptr) override;

 private:
  DeepseekModel& model_;
};

}  // namespace deepinfer::model::ds
