#include "model/deepseek/cuda/cuda_model.h"

#include <algorithm>

#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/deepseek/activations.h"
#include "model/deepseek_v4/family.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v4/plan.h"
#include "model/deepseek_v4/weights.h"
#include "model/plan/cache_specs.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/sampling.h"

namespace deepinfer::model {
int accelerator_count() { return deepinfer::cuda::cuda_device_count(); }
std::string accelerator_unavailable_reason() {
  return accelerator_count() > 0 ? std::string() : "no usable GPU: " + deepinfer::cuda::cuda_unavailable_reason();
}
}  // namespace deepinfer::model

namespace deepinfer::model::v4 {
namespace dc = deepinfer::cuda;
using namespace ds::cuda;

namespace {
void check_supported(const DeepseekV4Config& c) {
  if (c.num_kv_heads != 1) DI_THROW(ConfigError, c.origin, ": num_key_value_heads must be 1, got ", c.num_kv_heads);
  if (!c.norm_topk_prob) DI_THROW(ConfigError, c.origin, ": the GPU router always normalises top-k weights");
  if (c.hc_mult > ops::cuda::kHcMaxStreams) DI_THROW(ConfigError, c.origin, ": hc_mult ", c.hc_mult, " > 4");
  if (c.head_dim % 32 != 0 || c.head_dim > 512)
    DI_THROW(ConfigError, c.origin, ": head_dim ", c.head_dim, " must be a multiple of 32 and <= 512 on the GPU");
  if (c.rope.attention_factor != 1.0 || c.compress_rope.attention_factor != 1.0)
    DI_THROW(ConfigError, c.origin, ": rope attention_factor != 1 is not supported by DeepSeek-V4");
  if (c.moe_intermediate_size % 8 != 0 || c.hidden_size % 8 != 0)
    DI_THROW(ConfigError, c.origin, ": hidden/moe widths must be multiples of 8 (16-byte GEMM rows)");
  if (c.n_shared_experts != 1) DI_THROW(ConfigError, c.origin, ": n_shared_experts must be 1, got ", c.n_shared_experts);
}

V4PlanOptions plan_options(const CudaModelOptions& o, int64_t num_mtp) {
  return {.formats = o.numerics == Numerics::kProduction ? V4Formats::kProduction : V4Formats::kPlain,
          .num_mtp = num_mtp, .max_rollback = o.max_rollback};
}

// Upper bound of the per-step workspace for `max_tokens` new tokens in a batch of up to `max_seqs`
// sequences with contexts up to `max_context` tokens: the arena of a worst-case step, the split-KV
// partials, and the engine's device sampler workspace.
size_t activation_bytes(const DeepseekV4Config& c, const ds::Dims& dims, const TensorTable& table,
                        const CudaModelOptions& o) {
  StepBound b{.act_bytes = storage_bytes(o.storage_numerics()), .max_tokens = o.max_batch_tokens, .max_seqs = o.max_seqs,
              .max_context = o.max_context, .sliding_window = c.sliding_window, .num_heads = c.num_heads,
              .head_dim = c.head_dim, .vocab = c.vocab_size, .compress_ratios = &c.compress_ratio};
  v4_fp8_workspace(c, table, o, o.max_batch_tokens, &b.fp8_ws_bytes, &b.wdq_bytes);
  return step_workspace_bound(dims, b);
}
}  // namespace

CudaHostPlan CudaHostPlan::make(const DeepseekV4Config& cfg, const CudaModelOptions& o, int64_t num_mtp) {
  CudaHostPlan p;
  p.plan = v4_plan(cfg, plan_options(o, num_mtp));
  p.cache_specs = model::cache_specs(p.plan, {.head_dim = cfg.head_dim, .index_head_dim = cfg.index_head_dim});
  TensorTable table = v4_tensor_table(cfg, p.plan, nullptr, nullptr);
  if (o.expert_shard)
    keep_expert_shard(table, *o.expert_shard, int32_t(cfg.n_routed_experts), int64_t(p.plan.layers.size()));
  const size_t e = storage_bytes(o.storage_numerics());
  p.weight_bytes = v4_device_weight_bytes(cfg, table, o);
  p.activation_bytes = v4::activation_bytes(cfg, v4_dims(cfg), table, o);
  p.block_tokens = kv::default_block_tokens(p.cache_specs);
  p.bytes_per_slot = kv::cache_slot_bytes(p.cache_specs, e);
  p.bytes_per_block = kv::cache_block_bytes(p.cache_specs, p.block_tokens, e);
  return p;
}

std::unique_ptr<DeepseekV4CudaModel> DeepseekV4CudaModel::load(const std::string& dir, const CudaModelOptions& o) {
  DeepseekV4Config cfg = DeepseekV4Config::from_file(dir);
  check_supported(cfg);
  if (dc::cuda_device_count() == 0)
    throw CudaError("DeepseekV4CudaModel: no usable GPU (" + dc::cuda_unavailable_reason() +
                        "); set DEEPINFER_ACCELERATOR=cpu for the CPU model",
                    int(cudaErrorNoDevice));
  if (o.device < 0 || o.device >= dc::cuda_device_count())
    DI_THROW(InvalidArgument, "device ", o.device, " requested, ", dc::cuda_device_count(), " visible");
  DI_CUDA_CHECK(cudaSetDevice(o.device));
  DeepseekV4Weights w = DeepseekV4Weights::load(dir, cfg, LoadOptions{.progress = o.progress});
  const int64_t num_mtp = o.load_mtp ? int64_t(w.mtp.size()) : 0;
  const CudaHostPlan plan = CudaHostPlan::make(cfg, o, num_mtp);
  const dc::DeviceInfo info = dc::device_info(o.device);
  const dc::MemoryPlanRequest req{.weight_bytes = plan.weight_bytes, .activation_bytes = plan.activation_bytes,
                                  .graph_pool_bytes = 0,
                                  .min_cache_bytes = plan.bytes_per_slot + plan.bytes_per_block * 16,
                                  .utilization = o.utilization};
  const dc::MemoryPlan mem = dc::plan_device_memory(req, info.total_bytes, info.free_bytes);  // OutOfMemory if not
  dc::Stream stream;
  auto store = upload_v4(cfg, plan.plan, w, o, plan.weight_bytes, stream.get());
  DI_INFO("deepseek_v4 cuda: ", store->bytes >> 20, " MiB of weights on ", info.name, " (planned ",
          plan.weight_bytes >> 20, " MiB); cache budget ", mem.cache_bytes >> 20, " MiB");
  ds::Arch arch{v4_dims(cfg), plan.plan};
  auto table = std::make_shared<TensorTable>(v4_tensor_table(cfg, plan.plan, nullptr, nullptr));
  Fp8Workspace fp8 = [cfg, table, o](int64_t tokens, size_t* ws, size_t* wdq) {
    v4_fp8_workspace(cfg, *table, o, tokens, ws, wdq);
  };
  auto be = std::make_unique<CudaBackend>(arch, plan.cache_specs, std::move(store), o, mem, std::move(fp8),
                                          std::move(stream));
  ds::ModelInfo model_info = v4_model_info(cfg);  // before cfg moves into the model
  auto m = std::unique_ptr<DeepseekV4CudaModel>(new DeepseekV4CudaModel(
      std::move(model_info), std::move(arch), plan.cache_specs, std::move(be), w.keepalive, std::move(cfg)));
  m->set_expert_shard(o.expert_shard);
  return m;
}

CudaModelOptions engine_cuda_options(const ModelLoadOptions& l) {
  CudaModelOptions o;
  o.numerics = Numerics::kProduction;
  o.decode = l.env.cuda_graphs ? DecodePath::kGraph : DecodePath::kGeneral;
  o.progress = l.progress;
  const int visible = dc::cuda_device_count();
  o.device = visible > 0 ? l.device % visible : l.device;  // ranks beyond the devices share them
  o.max_seqs = l.limits.max_num_seqs;
  o.max_batch_tokens = l.limits.max_num_batched_tokens;
  if (l.limits.max_model_len > 0) o.max_context = l.limits.max_model_len;
  o.max_rollback = l.limits.max_rollback;
  o.batch_invariant = l.env.batch_invariant;
  o.ep_exchange = l.env.ep_exchange;
  o.expert_shard = l.expert_shard;
  return o;
}

std::unique_ptr<CausalLM> load_cuda(const std::string& dir, const ModelLoadOptions& o) {
  return DeepseekV4CudaModel::load(dir, engine_cuda_options(o));
}

}  // namespace deepinfer::model::v4
