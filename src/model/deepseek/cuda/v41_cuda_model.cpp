#include "model/deepseek/cuda/v41_cuda_model.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/check.h"
#include "core/logging.h"
#include "core/numeric.h"
#include "deepinfer/error.h"
#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek/cuda/arena.h"
#include "model/deepseek/cuda/cuda_backend.h"
#include "model/deepseek/cuda/cuda_model.h"
#include "model/deepseek/cuda/v41_dspark_cuda.h"
#include "model/deepseek_v41/family.h"
#include "model/deepseek_v41/plan.h"
#include "model/deepseek_v41/prepare.h"
#include "model/deepseek_v41/targets.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/router.h"
#include "ops/cuda/sampling.h"

namespace deepinfer::model::v41 {
namespace dc = deepinfer::cuda;
using namespace ds::cuda;

ds::cuda::DeviceFormats v41_device_formats(const DeepseekV41Config& c) {
  auto fmt = [](WeightFormat f) {
    return f == WeightFormat::kFP8Block ? v4::WeightFormat::kFP8Block
           : f == WeightFormat::kFP4    ? v4::WeightFormat::kFP4
                                        : v4::WeightFormat::kBF16;
  };
  DI_CHECK(c.fp8_block_out == c.fp8_block_in, "non-square fp8 blocks");
  return {.dense = fmt(c.dense_format), .experts = fmt(c.expert_format), .fp8_block = c.fp8_block_in,
          .fp4_block = c.fp4_block, .hidden = c.hidden_size, .moe_inter = c.moe_intermediate_size,
          .n_experts = c.n_routed_experts, .rope_dim = c.rope_head_dim, .family = "deepseek_v41"};
}

size_t v41_device_weight_bytes(const DeepseekV41Config& c, const ModelPlan& plan, const CudaModelOptions& o) {
  size_t engram_w = 0;  // q_weight ⊙ k_weight per Engram layer ([n, D] f32; not a table entry)
  for (const LayerPlan& p : plan.layers)
    if (p.engram) engram_w += size_t(c.hc_mult * c.hidden_size) * sizeof(float);
  return device_weight_bytes(v41_device_formats(c), v41_device_table(c, plan, nullptr, nullptr), o) + engram_w;
}

std::unique_ptr<GpuWeightStore> upload_v41(const DeepseekV41Config& c, const ModelPlan& plan, const V41Weights& w,
                                           const CudaModelOptions& o, size_t planned_bytes, cudaStream_t stream) {
  auto st = std::make_unique<GpuWeightStore>();
  ds::ModelRef& m = st->refs;
  m.layers.assign(size_t(plan.num_layers()), ds::LayerRef{});
  DeviceUpload up(v41_device_formats(c), o, planned_bytes, stream, *st);
  const v4::TensorTable table = v41_device_table(c, plan, &w, &m);
  std::vector<ds::MoeRef*> moes;
  for (ds::LayerRef& L : m.layers) moes.push_back(&L.ffn);
  up.entries(table, [&](int32_t layer) -> ds::MoeRef& { return m.layers.at(size_t(layer)).ffn; }, moes);
  // What the table does not hold: the Engram tables (host memory, read by row each step) and
  // q_weight ⊙ k_weight (the reference only uses the product; computed here, uploaded f32).
  Tensor q;
  for (size_t i = 0; i < w.table.entries.size(); ++i) {
    const V41Target t = v41_target(c, plan, w.table.entries[i], m);
    if (t.kind == V41Target::kEngramTable) v41_engram_table_ref(w.parts[i][0], *t.engram);
    if (t.kind == V41Target::kEngramQ) q = w.entry_f32(i, c);
    if (t.kind != V41Target::kEngramK) continue;
    const Tensor k = w.entry_f32(i, c);
    DI_CHECK(q.defined() && q.numel() == k.numel(), "engram.k_weight before engram.q_weight");
    std::vector<float> prod(size_t(k.numel()));
    for (size_t j = 0; j < prod.size(); ++j) prod[j] = q.data<float>()[j] * k.data<float>()[j];
    t.engram->w = up.floats(prod.data(), int64_t(prod.size()));
    q = Tensor();
  }
  const std::vector<float> main = v41_inv_freq(c.rope, c.rope_head_dim);
  const std::vector<float> comp = v41_inv_freq(c.compress_rope, c.rope_head_dim);
  m.inv_freq_main = up.floats(main.data(), int64_t(main.size()));
  m.inv_freq_compress = up.floats(comp.data(), int64_t(comp.size()));
  for (const LayerPlan& p : plan.layers)
    m.layers[size_t(p.index)].attn.inv_freq = p.rope == RopeKind::kMain ? m.inv_freq_main.p : m.inv_freq_compress.p;
  up.finish();
  return st;
}

}  // namespace deepinfer::model::v41

namespace deepinfer::model::v41 {
namespace dc = deepinfer::cuda;
using namespace ds::cuda;

namespace {
// What the CUDA kernels take (the config validation has refused the rest already).
void check_supported_on_gpu(const DeepseekV41Config& c, const CudaModelOptions& o) {
  if (!c.routing_normalized())
    DI_THROW(ConfigError, c.origin, ": the GPU router always normalises the top-k weights (norm_topk_prob true and "
             "num_experts_per_tok > 1); this config needs the CPU backend (DEEPINFER_ACCELERATOR=cpu)");
  if (c.hc_mult > ops::cuda::kHcMaxStreams)
    DI_THROW(ConfigError, c.origin, ": hc_mult ", c.hc_mult, " > ", ops::cuda::kHcMaxStreams, " on the GPU");
  if (c.head_dim % 32 != 0 || c.head_dim > 512)
    DI_THROW(ConfigError, c.origin, ": head_dim ", c.head_dim, " must be a multiple of 32 and <= 512 on the GPU");
  if (c.index_head_dim % 32 != 0 || c.index_head_dim > 256 || c.index_n_heads > 128)
    DI_THROW(ConfigError, c.origin, ": index_head_dim ", c.index_head_dim, " (multiple of 32, <= 256) / index_n_heads ",
             c.index_n_heads, " (<= 128) out of the GPU indexer's range");
  if (c.moe_intermediate_size % 8 != 0 || c.hidden_size % 8 != 0)
    DI_THROW(ConfigError, c.origin, ": hidden/moe widths must be multiples of 8 (16-byte GEMM rows)");
  if (c.n_routed_experts > 1024 || c.num_experts_per_tok > ops::cuda::kRouterMaxTopk)
    DI_THROW(ConfigError, c.origin, ": ", c.n_routed_experts, " experts top-", c.num_experts_per_tok,
             " exceed the GPU router (1024, top-", ops::cuda::kRouterMaxTopk, ")");
  if (o.expert_shard)
    DI_THROW(InvalidArgument, c.origin, ": expert parallelism for DeepSeek-V4.1 runs on the CPU backend only");
}

// The per-step workspace bound (as V4's): the arena of a worst-case step, the split-KV partials
// and the engine's device sampler workspace.
size_t activation_bytes(const DeepseekV41Config& c, const ds::Dims& dims, const v4::TensorTable& table,
                        const CudaModelOptions& o) {
  StepBound b{.act_bytes = storage_bytes(o.storage_numerics()), .max_tokens = o.max_batch_tokens, .max_seqs = o.max_seqs,
              .max_context = o.max_context, .sliding_window = c.sliding_window, .num_heads = c.num_heads,
              .head_dim = c.head_dim, .vocab = c.vocab_size, .compress_ratios = &c.compress_ratios};
  device_fp8_workspace(v41_device_formats(c), table, o, o.max_batch_tokens, &b.fp8_ws_bytes, &b.wdq_bytes);
  return step_workspace_bound(dims, b);
}
}  // namespace

std::unique_ptr<DeepseekV41Model> load_v41_cuda(const std::string& dir, const CudaModelOptions& o,
                                                const ModelOptions& mo) {
  const DeepseekV41Config probe = DeepseekV41Config::from_file(dir);
  check_supported_on_gpu(probe, o);
  if (dc::cuda_device_count() == 0)
    throw CudaError("DeepseekV41 cuda: no usable GPU (" + dc::cuda_unavailable_reason() +
                        "); set DEEPINFER_ACCELERATOR=cpu for the CPU model",
                    int(cudaErrorNoDevice));
  if (o.device < 0 || o.device >= dc::cuda_device_count())
    DI_THROW(InvalidArgument, "device ", o.device, " requested, ", dc::cuda_device_count(), " visible");
  DI_CUDA_CHECK(cudaSetDevice(o.device));
  if (probe.dspark.num_stages > 0 && mo.dspark)
    DI_INFO("deepseek_v41 cuda: ", dir, ": the DSpark drafter's ", probe.dspark.num_stages, " stages run ",
            mo.dspark_host_stages ? "on the host (f32; taps copied back each round)"
            : o.numerics == ds::cuda::Numerics::kExact ? "on the GPU (f32 weights)"
                                                       : "on the GPU (stage weights in their stored FP8 / FP4)");
  else if (probe.dspark.num_stages > 0)
    DI_INFO("deepseek_v41 cuda: ", dir, ": the ", probe.dspark.num_stages, " DSpark stages are not loaded (no "
            "drafts on the GPU yet; the CPU backend drafts with them)");
  ModelOptions m = mo;
  m.progress = o.progress;
  m.max_rollback = o.max_rollback;
  m.qat = mo.qat;  // tests only (conformance without the QAT roundings)
  m.batch_invariant = o.batch_invariant;
  m.expert_shard.reset();
  // The host drafter reads tap rows a device step left on the device (the engine asks for none
  // on the host when it samples on the device): one copy of the step's rows per round.
  // The stages on the device (v41_dspark_cuda.h), reading the taps where the step left them.
  // Draft rounds on CUDA graphs when the trunk decodes on graphs (the one graphs switch).
  // Stage weights in their stored formats (FP8 dense, FP4 experts) unless the trunk is kExact (f32
  // everywhere, the reference the tests hold the stages to).
  if (!mo.dspark_host_stages)
    m.dspark_stages =
        cuda_dspark_stages(o.device, o.decode == DecodePath::kGraph, o.numerics != ds::cuda::Numerics::kExact);
  m.dspark_host_taps = [](const HiddenRows& h) {
    Tensor t = Tensor::empty({h.rows, h.row_elems}, DType::kF32);
    DI_CUDA_CHECK(cudaSetDevice(h.device_index));
    dc::copy_d2h(t.raw_data(), h.device, t.nbytes(), static_cast<cudaStream_t>(h.stream), /*sync=*/true);
    return t;
  };
  BackendMaker make = [&o](const DeepseekV41Config& cfg, const ds::Arch& arch,
                           const std::vector<kv::LayerCacheSpec>& specs,
                           const V41Weights& w) -> std::unique_ptr<ds::ModelBackend> {
    const size_t weight_bytes = v41_device_weight_bytes(cfg, arch.plan, o);
    // Shapes only (no views): the dense-FP8 workspace sizes for any step length.
    auto shapes = std::make_shared<v4::TensorTable>(v41_device_table(cfg, arch.plan, nullptr, nullptr));
    const size_t e = storage_bytes(o.storage_numerics());
    const int64_t block_tokens = kv::default_block_tokens(specs);
    const dc::DeviceInfo info = dc::device_info(o.device);
    const dc::MemoryPlanRequest req{
        .weight_bytes = weight_bytes, .activation_bytes = activation_bytes(cfg, arch.dims, *shapes, o),
        .graph_pool_bytes = 0,
        .min_cache_bytes = kv::cache_slot_bytes(specs, e) + kv::cache_block_bytes(specs, block_tokens, e) * 16,
        .utilization = o.utilization};
    const dc::MemoryPlan mem = dc::plan_device_memory(req, info.total_bytes, info.free_bytes);  // OutOfMemory if not
    dc::Stream stream;
    auto store = upload_v41(cfg, arch.plan, w, o, weight_bytes, stream.get());
    DI_INFO("deepseek_v41 cuda: ", store->bytes >> 20, " MiB of weights on ", info.name, " (planned ",
            weight_bytes >> 20, " MiB; ", store->dense_fp8, " dense linears FP8, ", store->expert_bytes >> 20,
            " MiB routed experts); cache budget ", mem.cache_bytes >> 20, " MiB");
    const DeviceFormats f = v41_device_formats(cfg);
    Fp8Workspace fp8 = [f, shapes, o](int64_t tokens, size_t* ws, size_t* wdq) {
      device_fp8_workspace(f, *shapes, o, tokens, ws, wdq);
    };
    return std::make_unique<CudaBackend>(arch, specs, std::move(store), o, mem, std::move(fp8), std::move(stream));
  };
  return DeepseekV41Model::load(dir, m, make);
}

std::string auto_gpu_refusal(const std::string& dir, const ModelLoadOptions& l) {
  const DeepseekV41Config c = DeepseekV41Config::from_file(dir);
  try {
    check_supported_on_gpu(c, v4::engine_cuda_options(l));
  } catch (const std::exception& e) {
    return e.what();
  }
  // DSpark drafts are taken on the GPU too: the engine-level identity holds there since the
  // Engram rows hash the step's real input ids (docs/MODEL-V41.md, "DSpark on the GPU").
  return "";
}

std::unique_ptr<CausalLM> load_cuda(const std::string& dir, const ModelLoadOptions& l) {
  // Decode and verify steps through fixed shapes and CUDA graphs unless DEEPINFER_CUDA_GRAPHS=0
  // (engine_cuda_options), as for V4: the Engram rows are staged before the captured launches.
  CudaModelOptions o = v4::engine_cuda_options(l);
  const bool compact = l.env.yoco_truncation_mode.value_or("full") == "compact";
  const int64_t keep = compact ? l.env.yoco_keep_tokens.value_or(int(kDefaultReplayKeep)) : 0;
  // DSpark only when drafting is asked for explicitly: its stages' weights stay in their stored
  // formats on the GPU outside kExact (v41_dspark_cuda.h), but the load still dequantises every stage
  // tensor to f32 on the host once (DSparkWeights::load; ~54 GB at the release's shapes), so a GPU
  // model does not take them on by default as the CPU model does.
  const bool draft = l.env.use_nextn_decode.value_or(0) > 0;
  return load_v41_cuda(dir, o, {.replay_keep = keep, .dspark = draft});
}

}  // namespace deepinfer::model::v41
