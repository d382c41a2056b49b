#include "model/deepseek_v4/cuda/cuda_model.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/deepseek_v4/cuda/cuda_internal.h"
#include "model/deepseek_v4/cuda/glue_kernels.h"
#include "model/deepseek_v4/weights.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/norm.h"

namespace deepinfer::model::v4 {
using namespace gpu;

CudaHostPlan CudaHostPlan::make(const DeepseekV4Config& cfg, const CudaModelOptions& o) {
  CudaHostPlan p;
  p.cache_specs = cache_specs_for(cfg, 0);  // MTP blocks do not run on the GPU yet
  const size_t e = storage_bytes(o.numerics);
  p.weight_bytes = gpu_weight_bytes(cfg, false, e);
  p.activation_bytes = gpu_activation_bytes(cfg, o.max_batch_tokens, o.max_seqs, o.max_context, e);
  p.block_tokens = kv::KvCache::default_block_tokens(p.cache_specs);
  p.bytes_per_slot = gpu_slot_bytes(p.cache_specs, e);
  p.bytes_per_block = gpu_block_bytes(p.cache_specs, p.block_tokens, e);
  return p;
}

bool use_cuda_model(const EnvConfig& env) {
  switch (env.accelerator) {
    case Accelerator::kNvidia: return true;
    case Accelerator::kAuto: return cuda::cuda_device_count() > 0;
    default: return false;
  }
}

struct DeepseekV4CudaModel::State {
  cuda::Stream stream;
  ops::cuda::CublasLt blas;
  GpuWeights w;
  GpuCache cache;
  std::vector<kv::LayerCacheSpec> specs;
  cuda::MemoryPlan mem;
  cuda::DeviceInfo info;
  cuda::DeviceBuffer arena, meta;
  std::vector<char> meta_h;
  MoeHost moe;
};

DeepseekV4CudaModel::DeepseekV4CudaModel() = default;
DeepseekV4CudaModel::~DeepseekV4CudaModel() = default;

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
}  // namespace

std::unique_ptr<DeepseekV4CudaModel> DeepseekV4CudaModel::load(const std::string& dir, const CudaModelOptions& o) {
  std::unique_ptr<DeepseekV4CudaModel> m(new DeepseekV4CudaModel());
  m->cfg_ = DeepseekV4Config::from_file(dir);
  m->opts_ = o;
  check_supported(m->cfg_);
  if (cuda::cuda_device_count() == 0)
    throw CudaError("DeepseekV4CudaModel: no usable GPU (" + cuda::cuda_unavailable_reason() +
                        "); set DEEPINFER_ACCELERATOR=cpu for the CPU model",
                    int(cudaErrorNoDevice));
  DI_CUDA_CHECK(cudaSetDevice(o.device));
  const CudaHostPlan plan = CudaHostPlan::make(m->cfg_, o);
  cuda::DeviceInfo info = cuda::device_info(o.device);
  cuda::MemoryPlanRequest req{.weight_bytes = plan.weight_bytes, .activation_bytes = plan.activation_bytes,
                              .graph_pool_bytes = 0, .min_cache_bytes = plan.bytes_per_slot + plan.bytes_per_block * 16,
                              .utilization = o.utilization};
  cuda::MemoryPlan mem = cuda::plan_device_memory(req, info.total_bytes, info.free_bytes);  // OutOfMemory if not
  DeepseekV4Weights w = DeepseekV4Weights::load(dir, m->cfg_, LoadOptions{.progress = o.progress});
  m->st_ = std::make_unique<State>();
  State& s = *m->st_;
  s.info = info;
  s.mem = mem;
  s.specs = plan.cache_specs;
  s.w = upload_weights(w, m->cfg_, storage_dtype(o.numerics), plan.weight_bytes, o.progress, s.stream.get());
  DI_INFO("deepseek_v4 cuda: ", s.w.bytes >> 20, " MiB of weights on ", info.name, " (planned ", plan.weight_bytes >> 20,
          " MiB); cache budget ", mem.cache_bytes >> 20, " MiB");
  return m;
}

std::unique_ptr<DeepseekV4CudaModel> DeepseekV4CudaModel::load(const std::string& dir, const EnvConfig& /*env*/) {
  CudaModelOptions o;
  o.numerics = Numerics::kProduction;
  return load(dir, o);
}

std::string DeepseekV4CudaModel::describe() const {
  std::ostringstream os;
  os << cfg_.architecture << ": " << cfg_.num_layers << " layers [" << cfg_.schedule_str() << "], D=" << cfg_.hidden_size
     << ", H=" << cfg_.num_heads << "x" << cfg_.head_dim << ", experts " << cfg_.n_routed_experts << " top-"
     << cfg_.num_experts_per_tok << ", backend cuda "
     << (opts_.numerics == Numerics::kExact ? "f32 (exact)"
         : opts_.numerics == Numerics::kBf16 ? "bf16"
                                              : "bf16 (production: FP8 kv, FP4 indexer)")
     << " on " << (st_ ? st_->info.name : "?");
  return os.str();
}

kv::CacheGeometry DeepseekV4CudaModel::plan_cache(size_t budget_bytes, int64_t max_slots) const {
  return plan_gpu_cache(st_->specs, std::min(budget_bytes, st_->mem.cache_bytes), max_slots,
                        storage_bytes(opts_.numerics));
}

void DeepseekV4CudaModel::allocate_cache(const kv::CacheGeometry& geometry) {
  st_->cache = GpuCache();  // free the old pools first
  st_->cache = GpuCache(st_->specs, geometry, storage_dtype(opts_.numerics), st_->stream.get());
}

void DeepseekV4CudaModel::allocate_cache_for(int64_t slots, int64_t max_tokens_per_slot) {
  kv::CacheGeometry g;
  g.block_tokens = kv::KvCache::default_block_tokens(st_->specs);
  g.num_slots = slots;
  g.num_blocks = slots * std::max<int64_t>(1, (max_tokens_per_slot + g.block_tokens - 1) / g.block_tokens);
  g.bytes_per_block = gpu_block_bytes(st_->specs, g.block_tokens, storage_bytes(opts_.numerics));
  g.bytes_per_slot = gpu_slot_bytes(st_->specs, storage_bytes(opts_.numerics));
  allocate_cache(g);
}

void DeepseekV4CudaModel::reset_slot(int32_t slot) { st_->cache.reset_slot(slot, st_->stream.get()); }

const kv::CacheGeometry& DeepseekV4CudaModel::cache_geometry() const { return st_->cache.geometry(); }

namespace {
// Packs the step's index lists into one host buffer (256-byte aligned pieces) for one upload.
struct Packer {
  std::vector<char>& buf;
  template <typename T>
  size_t add(const std::vector<T>& v) {
    const size_t off = (buf.size() + 255) / 256 * 256;
    buf.resize(off + std::max<size_t>(v.size(), 1) * sizeof(T), 0);
    if (!v.empty()) std::memcpy(buf.data() + off, v.data(), v.size() * sizeof(T));
    return off;
  }
};

void ensure(cuda::DeviceBuffer& b, size_t bytes) {
  if (b.size_bytes() >= bytes) return;
  b = cuda::DeviceBuffer();  // release before growing (peak = the new size)
  b = cuda::DeviceBuffer(bytes + bytes / 4);
}
}  // namespace

Tensor DeepseekV4CudaModel::forward(const ForwardBatch& batch) {
  State& s = *st_;
  validate_batch(cfg_, s.cache.geometry(), s.cache.allocated(), batch);
  const int64_t T = batch.num_tokens(), R = int64_t(batch.logits_indices.size());
  const int64_t D = cfg_.hidden_size, n = cfg_.hc_mult, V = cfg_.vocab_size;
  if (T == 0) return Tensor::empty({0, V}, DType::kF32);
  const cudaStream_t st = s.stream.get();
  const StepMeta meta = build_step_meta(cfg_, s.cache.geometry(), batch);

  // ---- upload the index lists (one copy) ----
  s.meta_h.clear();
  Packer pk{s.meta_h};
  const size_t o_tok = pk.add(meta.token_ids), o_pos = pk.add(meta.pos), o_emb = pk.add(meta.embed_src);
  const size_t o_ws = pk.add(meta.win_src), o_wb = pk.add(meta.win_begin), o_wc = pk.add(meta.win_count);
  const size_t o_wss = pk.add(meta.win_store_src), o_wsd = pk.add(meta.win_store_dst);
  const size_t o_sel = pk.add(meta.sel_offset), o_lr = pk.add(meta.logits_rows);
  struct KindOff { size_t stage, epos, edst, ssrc, sdst, crows, coff, ccount; };
  std::vector<KindOff> ko;
  for (const auto& k : meta.kinds)
    ko.push_back({pk.add(k.stage_src), pk.add(k.entry_pos), pk.add(k.entry_dst), pk.add(k.state_src),
                  pk.add(k.state_dst), pk.add(k.cand_rows), pk.add(k.cand_offset), pk.add(k.cand_count)});
  ensure(s.meta, s.meta_h.size());
  cuda::copy_h2d(s.meta.data(), s.meta_h.data(), s.meta_h.size(), st, false);
  const char* mb = s.meta.as<const char>();
  auto P = [mb](size_t off) { return reinterpret_cast<const void*>(mb + off); };
  DevMeta dm;
  dm.token_ids = static_cast<const int32_t*>(P(o_tok));
  dm.pos = static_cast<const int64_t*>(P(o_pos));
  dm.embed_src = static_cast<const int64_t*>(P(o_emb));
  dm.win_src = static_cast<const int64_t*>(P(o_ws));
  dm.win_begin = static_cast<const int32_t*>(P(o_wb));
  dm.win_count = static_cast<const int32_t*>(P(o_wc));
  dm.win_store_src = static_cast<const int64_t*>(P(o_wss));
  dm.win_store_dst = static_cast<const int64_t*>(P(o_wsd));
  dm.sel_offset = static_cast<const int64_t*>(P(o_sel));
  dm.logits_rows = static_cast<const int64_t*>(P(o_lr));
  for (size_t i = 0; i < meta.kinds.size(); ++i) {
    const KindOff& k = ko[i];
    dm.kinds.push_back({.host = &meta.kinds[i], .stage_src = static_cast<const int64_t*>(P(k.stage)),
                        .entry_pos = static_cast<const int64_t*>(P(k.epos)),
                        .entry_dst = static_cast<const int64_t*>(P(k.edst)),
                        .state_src = static_cast<const int64_t*>(P(k.ssrc)),
                        .state_dst = static_cast<const int64_t*>(P(k.sdst)),
                        .cand_offset = static_cast<const int64_t*>(P(k.coff)),
                        .cand_rows = static_cast<const int32_t*>(P(k.crows)),
                        .cand_count = static_cast<const int32_t*>(P(k.ccount))});
  }

  // ---- workspace ----
  ArenaSizes sz{.T = T, .win_rows = int64_t(meta.win_src.size()), .R = R, .act_bytes = storage_bytes(opts_.numerics)};
  int64_t max_cmp = 0;
  for (const auto& k : meta.kinds) {
    sz.stage_rows = std::max<int64_t>(sz.stage_rows, int64_t(k.stage_src.size()));
    sz.entries = std::max<int64_t>(sz.entries, int64_t(k.entry_pos.size()));
    sz.max_cand = std::max(sz.max_cand, k.max_count);
    max_cmp = std::max(max_cmp, k.overlap ? std::min<int64_t>(k.max_count, cfg_.index_topk) : k.max_count);
  }
  StepCtx c;
  c.split = ops::cuda::choose_attention_split(T, cfg_.num_heads, meta.max_window + max_cmp, s.info.num_sms);
  sz.attn_splits = std::max(1, c.split.num_splits);
  c.L = layout_arena(cfg_, sz);
  ensure(s.arena, c.L.total);
  c.cfg = &cfg_;
  c.numerics = opts_.numerics;
  c.act = storage_dtype(opts_.numerics);
  c.act_bytes = storage_bytes(opts_.numerics);
  c.meta = &meta;
  c.dmeta = &dm;
  c.arena = s.arena.as<char>();
  c.num_sms = s.info.num_sms;
  c.stream = st;
  c.blas = &s.blas;
  c.moe = &s.moe;

  // ---- embedding, layers ----
  gather_rows({.src_a = s.w.embed.data(), .a_stride = D, .src_dtype = s.w.embed.dtype, .src_index = dm.embed_src,
               .dst = c.at<float>(c.L.X), .dst_stride = D, .dst_dtype = DType::kF32, .rows = T * n, .width = D},
              st);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) decoder_layer(c, s.w.layers[size_t(l)], s.cache.layer(l));

  // ---- head for the requested rows ----
  Tensor out = Tensor::empty({R, V}, DType::kF32);
  if (R == 0) {
    if (batch.need_hidden) last_hidden_ = Tensor::empty({0, n, D}, DType::kF32);
    DI_CUDA_CHECK(cudaStreamSynchronize(st));
    return out;
  }
  float* sel = c.at<float>(c.L.sel);
  gather_rows({.src_a = c.at<float>(c.L.X), .a_stride = n * D, .src_dtype = DType::kF32, .src_index = dm.logits_rows,
               .dst = sel, .dst_stride = n * D, .dst_dtype = DType::kF32, .rows = R, .width = n * D},
              st);
  if (batch.need_hidden) {
    last_hidden_ = Tensor::empty({R, n, D}, DType::kF32);
    cuda::copy_d2h(last_hidden_.raw_data(), sel, last_hidden_.nbytes(), st, false);
  }
  ops::cuda::hc_pre({.x = sel, .dtype = DType::kF32, .x_stride = n * D, .fn = s.w.hc_head.fn.data(),
                     .base = s.w.hc_head.base.data(), .scale = s.w.hc_head.scale.data(), .u = c.at<float>(c.L.hu),
                     .u_stride = D, .mix = nullptr, .workspace = c.at<float>(c.L.head_ws), .tokens = R, .n = int(n),
                     .dim = D, .mode = ops::cuda::HcMode::kHead, .sinkhorn_iters = int(cfg_.hc_sinkhorn_iters),
                     .norm_eps = float(cfg_.rms_norm_eps), .hc_eps = float(cfg_.hc_eps)},
                    st);
  ops::cuda::rmsnorm({.x = c.at<float>(c.L.hu), .x_dtype = DType::kF32, .x_stride = D, .w = s.w.norm.data(),
                      .w_dtype = DType::kF32, .y = c.at<void>(c.L.hh), .y_dtype = c.act, .y_stride = D,
                      .rows = R, .dim = D, .eps = float(cfg_.rms_norm_eps)},
                     st);
  linear(c, s.w.head, c.at<void>(c.L.hh), D, R, c.at<float>(c.L.logits), DType::kF32, V);
  cuda::copy_d2h(out.raw_data(), c.at<float>(c.L.logits), out.nbytes(), st, true);
  return out;
}

}  // namespace deepinfer::model::v4
