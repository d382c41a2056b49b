#include "model/deepseek_v41/family.h"

#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/plan.h"

namespace deepinfer::model::v41 {
namespace {
std::unique_ptr<CausalLM> load(const std::string& dir, const ModelLoadOptions& o) {
  if (o.env.accelerator == Accelerator::kNvidia) return load_cuda(dir, o);
  if (use_accelerator(o)) {  // auto with a GPU present: the GPU unless it lacks something asked for
    const std::string why = auto_gpu_refusal(dir, o);
    if (why.empty()) return load_cuda(dir, o);
    DI_INFO("deepseek_v41: ", dir, " stays on the CPU (DEEPINFER_ACCELERATOR=auto): ", why,
            "; DEEPINFER_ACCELERATOR=cpu silences this");
  }
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

#if !defined(DEEPINFER_HAVE_CUDA_BACKEND)
std::unique_ptr<CausalLM> load_cuda(const std::string& dir, const ModelLoadOptions&) {
  DI_THROW(InvalidArgument, "cannot load '", dir, "' on a GPU: this build has no CUDA backend; set "
           "DEEPINFER_ACCELERATOR=cpu");
}
std::string auto_gpu_refusal(const std::string&, const ModelLoadOptions&) { return "this build has no CUDA backend"; }
#endif

}  // namespace deepinfer::model::v41
