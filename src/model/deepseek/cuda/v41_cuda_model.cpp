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
#include "model/deepseek_v41/family.h"
#include "model/deepseek_v41/plan.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/router.h"
#include "ops/cuda/sampling.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;

namespace {
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Every weight field of a prepared ModelRef, in one fixed order: `lin` for linears, `vec` for f32
// vectors (the Engram tables themselves are not visited: they stay in host memory).
template <typename Lin, typename Vec>
void walk(ModelRef& m, Lin&& lin, Vec&& vec) {
  auto hc = [&](HcRef& h) {
    vec(h.fn);
    vec(h.base);
    vec(h.scale);
  };
  lin(m.embed);
  lin(m.head);
  vec(m.norm);
  hc(m.hc_head);
  for (LayerRef& L : m.layers) {
    vec(L.attn_norm);
    vec(L.ffn_norm);
    hc(L.hc_attn);
    hc(L.hc_ffn);
    AttentionRef& A = L.attn;
    lin(A.wq_a);
    lin(A.wq_b);
    lin(A.wkv);
    lin(A.wo_a);
    lin(A.wo_b);
    vec(A.q_norm);
    vec(A.kv_norm);
    vec(A.sink);
    for (std::optional<CompressorRef>* c : {&A.comp, &A.icomp}) {
      if (!*c) continue;
      lin((*c)->wkv_gate);
      vec((*c)->ape);
      vec((*c)->norm);
    }
    lin(A.index_wq_b);
    lin(A.index_weights);
    lin(A.index_wk);
    vec(A.index_k_norm);
    MoeRef& M = L.ffn;
    lin(M.gate);
    vec(M.bias);
    for (ExpertRef& e : M.experts) {
      lin(e.w13);
      lin(e.w2);
    }
    lin(M.shared.w13);
    lin(M.shared.w2);
    lin(L.engram.wkv);
    vec(L.engram.w);
  }
  vec(m.inv_freq_main);
  vec(m.inv_freq_compress);
}

void check_prepared(const ModelRef& host) {
  DI_CHECK(host.mtp.empty(), "upload_prepared: MTP blocks are not uploaded by this path");
  for (const LayerRef& L : host.layers) DI_CHECK(L.ffn.tid2eid == nullptr, "upload_prepared: hash routing");
}

size_t linear_bytes(const LinearRef& r, DType dt) {
  if (!r.defined()) return 0;
  DI_CHECK(!r.panels && r.dtype == DType::kF32 && r.w, "upload_prepared: linears must be plain f32 (no panels)");
  return align256(size_t(r.out * r.in) * (dt == DType::kF32 ? 4 : 2));
}
size_t vec_bytes(const VecRef& v) { return v.defined() ? align256(size_t(v.n) * 4) : 0; }
size_t table_bytes(const ModelRef& m) {
  size_t b = 0;
  for (const LayerRef& L : m.layers)
    if (!L.ffn.experts.empty()) b += 4 * align256(L.ffn.experts.size() * sizeof(void*));
  return b;
}
}  // namespace

size_t prepared_device_bytes(const ModelRef& host, DType dt) {
  check_prepared(host);
  ModelRef m = host;
  size_t bytes = 0;
  walk(m, [&](LinearRef& r) { bytes += linear_bytes(r, dt); }, [&](VecRef& v) { bytes += vec_bytes(v); });
  return bytes + table_bytes(host);
}

std::unique_ptr<GpuWeightStore> upload_prepared(const ModelRef& host, DType dt, const CudaModelOptions& o,
                                                cudaStream_t stream) {
  DI_CHECK(dt == DType::kF32 || dt == DType::kBF16, "upload_prepared: storage ", dtype_name(dt));
  const size_t total = prepared_device_bytes(host, dt);
  auto st = std::make_unique<GpuWeightStore>();
  st->buffers.emplace_back(std::max<size_t>(total, 256), o.device);
  char* base = st->buffers.back().as<char>();
  size_t off = 0;
  auto put = [&](const void* src, size_t n) -> void* {
    void* dst = base + off;
    if (n) dc::copy_h2d(dst, src, n, stream, /*sync=*/true);
    off += align256(n);
    return dst;
  };
  st->refs = host;
  std::vector<uint16_t> bf;
  walk(
      st->refs,
      [&](LinearRef& r) {
        if (!r.defined()) return;
        const size_t n = size_t(r.out * r.in);
        const float* src = static_cast<const float*>(r.w);
        if (dt == DType::kF32) {
          r.w = put(src, n * 4);
        } else {
          bf.resize(n);
          for (size_t i = 0; i < n; ++i) bf[i] = f32_to_bf16(src[i]);
          r.w = put(bf.data(), n * 2);
        }
        r.dtype = dt;
        r.scale = nullptr;
      },
      [&](VecRef& v) {
        if (v.defined()) v.p = static_cast<const float*>(put(v.p, size_t(v.n) * 4));
      });
  // Rope tables per layer: the host pointers named one of the two tables.
  for (size_t l = 0; l < st->refs.layers.size(); ++l) {
    const float* h = host.layers[l].attn.inv_freq;
    st->refs.layers[l].attn.inv_freq = h == host.inv_freq_main.p       ? st->refs.inv_freq_main.p
                                       : h == host.inv_freq_compress.p ? st->refs.inv_freq_compress.p
                                                                       : nullptr;
    DI_CHECK(h == nullptr || st->refs.layers[l].attn.inv_freq != nullptr, "upload_prepared: layer ", l,
             " rope table is neither the main nor the compress one");
  }
  // Per-layer expert pointer tables (moe_decode, grouped GEMM); experts plain in `dt`.
  for (LayerRef& L : st->refs.layers) {
    MoeRef& M = L.ffn;
    M.host_routed = o.experts == ExpertPath::kHostRouted;
    if (M.experts.empty()) continue;
    std::vector<const void*> w13, w2, none(M.experts.size(), nullptr);
    for (const ExpertRef& e : M.experts) {
      w13.push_back(e.w13.w);
      w2.push_back(e.w2.w);
    }
    const size_t b = M.experts.size() * sizeof(void*);
    M.tables.w13 = static_cast<const void* const*>(put(w13.data(), b));
    M.tables.w2 = static_cast<const void* const*>(put(w2.data(), b));
    M.tables.w13_scale = static_cast<const uint8_t* const*>(put(none.data(), b));
    M.tables.w2_scale = static_cast<const uint8_t* const*>(put(none.data(), b));
    M.tables.dtype = dt;
  }
  DI_CHECK(off <= total, "upload_prepared: ", off, " bytes placed, ", total, " planned");
  st->bytes = off;
  return st;
}

}  // namespace deepinfer::model::ds::cuda

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
size_t activation_bytes(const DeepseekV41Config& c, const ds::Dims& dims, const CudaModelOptions& o) {
  const int64_t max_tokens = o.max_batch_tokens, max_seqs = o.max_seqs;
  ArenaSizes s;
  s.act_bytes = storage_bytes(o.storage_numerics());
  s.step.T = max_tokens;
  s.step.win_rows = max_tokens + max_seqs * (c.sliding_window - 1);
  int64_t min_ratio = 0;
  for (int64_t m : c.compress_ratios)
    if (m > 0) min_ratio = min_ratio ? std::min(min_ratio, m) : m;
  s.step.stage_rows = max_tokens + max_seqs * 2 * std::max<int64_t>(min_ratio, 128);
  s.step.entries = min_ratio ? max_tokens / min_ratio + max_seqs : 0;
  s.max_cand = min_ratio ? o.max_context / min_ratio : 0;
  s.step.R = std::min<int64_t>(max_tokens, 1024);
  s.step.Rh = 0;
  s.attn_splits = 1;
  return layout_arena(dims, s).total + size_t(2048) * size_t(c.num_heads) * size_t(c.head_dim + 2) * sizeof(float) +
         ops::cuda::sampling_workspace_bytes(max_seqs, c.vocab_size);
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
  if (probe.dspark.num_stages > 0)
    DI_WARN("deepseek_v41 cuda: ", dir, ": the DSpark drafter runs on the CPU backend only; its ",
            probe.dspark.num_stages, " stages are not loaded (no speculative drafts from this model)");
  ModelOptions m = mo;
  m.progress = o.progress;
  m.max_rollback = o.max_rollback;
  m.qat = mo.qat;  // tests only (conformance without the QAT roundings)
  m.batch_invariant = o.batch_invariant;
  m.expert_shard.reset();
  m.dspark = false;
  BackendMaker make = [&o](const DeepseekV41Config& cfg, const ds::Arch& arch,
                           const std::vector<kv::LayerCacheSpec>& specs,
                           std::unique_ptr<ds::CpuWeightStore> prepared) -> std::unique_ptr<ds::ModelBackend> {
    const DType dt = storage_dtype(o.storage_numerics());
    const size_t weight_bytes = prepared_device_bytes(prepared->refs, dt);
    const size_t e = storage_bytes(o.storage_numerics());
    const int64_t block_tokens = kv::default_block_tokens(specs);
    const dc::DeviceInfo info = dc::device_info(o.device);
    const dc::MemoryPlanRequest req{
        .weight_bytes = weight_bytes, .activation_bytes = activation_bytes(cfg, arch.dims, o), .graph_pool_bytes = 0,
        .min_cache_bytes = kv::cache_slot_bytes(specs, e) + kv::cache_block_bytes(specs, block_tokens, e) * 16,
        .utilization = o.utilization};
    const dc::MemoryPlan mem = dc::plan_device_memory(req, info.total_bytes, info.free_bytes);  // OutOfMemory if not
    dc::Stream stream;
    auto store = upload_prepared(prepared->refs, dt, o, stream.get());
    prepared.reset();  // the f32 host copies (the Engram tables live in the mapped checkpoint)
    DI_INFO("deepseek_v41 cuda: ", store->bytes >> 20, " MiB of weights on ", info.name, "; cache budget ",
            mem.cache_bytes >> 20, " MiB");
    return std::make_unique<CudaBackend>(arch, specs, std::move(store), o, mem, Fp8Workspace{}, std::move(stream));
  };
  return DeepseekV41Model::load(dir, m, make);
}

std::unique_ptr<CausalLM> load_cuda(const std::string& dir, const ModelLoadOptions& l) {
  CudaModelOptions o = v4::engine_cuda_options(l);
  // Fixed-shape decode and graphs are not yet checked for V4.1 (and off with Engram layers anyway).
  o.decode = DecodePath::kGeneral;
  const bool compact = l.env.yoco_truncation_mode.value_or("full") == "compact";
  const int64_t keep = compact ? l.env.yoco_keep_tokens.value_or(int(kDefaultReplayKeep)) : 0;
  return load_v41_cuda(dir, o, {.replay_keep = keep});
}

}  // namespace deepinfer::model::v41
