#include "model/deepseek_v4/family.h"

#include "deepinfer/error.h"
#include "model/deepseek_v4/model.h"

namespace deepinfer::model::v4 {
namespace {
std::unique_ptr<CausalLM> load(const std::string& dir, const ModelLoadOptions& o) {
  if (use_accelerator(o)) return load_cuda(dir, o);
  if (o.env.accelerator == Accelerator::kAscend)
    DI_THROW(InvalidArgument, "DEEPINFER_ACCELERATOR=ascend is reserved; this build runs on nvidia or cpu");
  return DeepseekV4Model::load(dir, {.load_mtp = true, .progress = o.progress, .max_rollback = o.limits.max_rollback,
                                     .batch_invariant = o.env.batch_invariant, .expert_shard = o.expert_shard});
}
}  // namespace

ModelFamily family() { return {"DeepSeek-V4", {"DeepseekV4ForCausalLM"}, load}; }

#if !defined(DEEPINFER_HAVE_CUDA_BACKEND)
std::unique_ptr<CausalLM> load_cuda(const std::string& dir, const ModelLoadOptions&) {
  DI_THROW(InvalidArgument, "cannot load '", dir, "' on a GPU: this build has no CUDA backend; set DEEPINFER_ACCELERATOR=cpu");
}
}  // namespace deepinfer::model::v4
namespace deepinfer::model {
int accelerator_count() { return 0; }
std::string accelerator_unavailable_reason() { return "this build has no CUDA backend"; }
}  // namespace deepinfer::model
namespace deepinfer::model::v4 {
#endif

}  // namespace deepinfer::model::v4
