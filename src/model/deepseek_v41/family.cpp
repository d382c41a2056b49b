#include "model/deepseek_v41/family.h"

#include "deepinfer/error.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/plan.h"

namespace deepinfer::model::v41 {
namespace {
std::unique_ptr<CausalLM> load(const std::string& dir, const ModelLoadOptions& o) {
  // The CUDA backend has V4.1's ops (ops/cuda) but not yet its Engram staging and candidate-block
  // workspace: refuse rather than run half of the model on the GPU. Auto picks the CPU.
  if (o.env.accelerator == Accelerator::kNvidia)
    DI_THROW(InvalidArgument, dir, ": DeepSeek-V4.1 runs on the CPU backend only in this build; set "
             "DEEPINFER_ACCELERATOR=cpu");
  if (o.env.accelerator == Accelerator::kAscend)
    DI_THROW(InvalidArgument, "DEEPINFER_ACCELERATOR=ascend is reserved; this build runs on nvidia or cpu");
  // Bounded replay: compact mode keeps DEEPINFER_YOCO_PREFILL_KEEP_TOKENS (default 140) tokens.
  const bool compact = o.env.yoco_truncation_mode.value_or("full") == "compact";
  const int64_t keep = compact ? o.env.yoco_keep_tokens.value_or(int(kDefaultReplayKeep)) : 0;
  return DeepseekV41Model::load(dir, {.progress = o.progress, .max_rollback = o.limits.max_rollback,
                                      .batch_invariant = o.env.batch_invariant, .replay_keep = keep,
                                      .expert_shard = o.expert_shard});
}
}  // namespace

ModelFamily family() { return {"DeepSeek-V4.1", {"DeepseekV41ForCausalLM"}, load}; }

}  // namespace deepinfer::model::v41
