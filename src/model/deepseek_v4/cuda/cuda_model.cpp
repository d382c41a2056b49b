#include "model/deepseek_v4/cuda/cuda_model.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <iterator>
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
  const size_t e = storage_bytes(o.storage_numerics());
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
  // Fixed-shape decode (DecodePath): buffers sized once, one graph per padded size.
  std::vector<int64_t> cand_caps;
  cuda::DeviceBuffer fixed_arena, fixed_meta;
  std::array<cuda::CudaGraph, std::size(kDecodeBuckets)> graphs;
  std::array<bool, std::size(kDecodeBuckets)> warmed{};
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
  if (const char* g = std::getenv("DEEPINFER_CUDA_GRAPHS"); g && *g) {  // read once, at load
    const std::string v(g);
    if (v != "0" && v != "1")
      DI_THROW(InvalidArgument, "DEEPINFER_CUDA_GRAPHS must be 0 or 1, got '", v, "'");
    m->opts_.decode = v == "1" ? DecodePath::kGraph : DecodePath::kGeneral;
  }
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
  s.cand_caps = decode_cand_caps(m->cfg_, o.max_context);
  s.w = upload_weights(w, m->cfg_, storage_dtype(o.storage_numerics()), plan.weight_bytes, o.progress,
                       s.stream.get());
  DI_INFO("deepseek_v4 cuda: ", s.w.bytes >> 20, " MiB of weights on ", info.name, " (planned ", plan.weight_bytes >> 20,
          " MiB); cache budget ", mem.cache_bytes >> 20, " MiB");
  return m;
}

std::unique_ptr<DeepseekV4CudaModel> DeepseekV4CudaModel::load(const std::string& dir, const EnvConfig& /*env*/) {
  CudaModelOptions o;
  o.numerics = Numerics::kProduction;
  o.decode = kEngineDecodePath;  // DEEPINFER_CUDA_GRAPHS=0 still selects the general path
  return load(dir, o);
}

std::string DeepseekV4CudaModel::describe() const {
  std::ostringstream os;
  os << cfg_.architecture << ": " << cfg_.num_layers << " layers [" << cfg_.schedule_str() << "], D=" << cfg_.hidden_size
     << ", H=" << cfg_.num_heads << "x" << cfg_.head_dim << ", experts " << cfg_.n_routed_experts << " top-"
     << cfg_.num_experts_per_tok << ", backend cuda "
     << (opts_.numerics == Numerics::kExact ? "f32 (exact)"
         : opts_.numerics == Numerics::kBf16 ? "bf16"
         : opts_.f32_storage                 ? "f32 storage with production round trips (FP8 kv, FP4 indexer)"
                                             : "bf16 (production: FP8 kv, FP4 indexer)")
     << ", decode "
     << (opts_.decode == DecodePath::kGraph ? "graphs" : opts_.decode == DecodePath::kFixed ? "fixed" : "general")
     << " on " << (st_ ? st_->info.name : "?");
  return os.str();
}

kv::CacheGeometry DeepseekV4CudaModel::plan_cache(size_t budget_bytes, int64_t max_slots) const {
  return plan_gpu_cache(st_->specs, std::min(budget_bytes, st_->mem.cache_bytes), max_slots,
                        storage_bytes(opts_.storage_numerics()));
}

void DeepseekV4CudaModel::allocate_cache(const kv::CacheGeometry& geometry) {
  // Graphs captured the old pools' addresses: drop them (recaptured lazily).
  for (auto& g : st_->graphs) g = cuda::CudaGraph();
  st_->warmed.fill(false);
  st_->cache = GpuCache();  // free the old pools first
  st_->cache = GpuCache(st_->specs, geometry, storage_dtype(opts_.storage_numerics()), st_->stream.get());
}

void DeepseekV4CudaModel::allocate_cache_for(int64_t slots, int64_t max_tokens_per_slot) {
  kv::CacheGeometry g;
  g.block_tokens = kv::KvCache::default_block_tokens(st_->specs);
  g.num_slots = slots;
  g.num_blocks = slots * std::max<int64_t>(1, (max_tokens_per_slot + g.block_tokens - 1) / g.block_tokens);
  g.bytes_per_block = gpu_block_bytes(st_->specs, g.block_tokens, storage_bytes(opts_.storage_numerics()));
  g.bytes_per_slot = gpu_slot_bytes(st_->specs, storage_bytes(opts_.storage_numerics()));
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

// Byte offsets of the packed lists. In fixed-shape metadata every list but the candidate pool
// (packed last) has a length fixed by the padded size, so the offsets (and the device pointers a
// graph captured) do not change between steps.
struct MetaOffsets {
  size_t tok, pos, emb, ws, wb, wc, wss, wsd, sel, lr, wdst, comb, pool;
  struct Kind { size_t stage, epos, edst, ssrc, sdst, crows, coff, ccount, stdst, block; };
  std::vector<Kind> kinds;
};

MetaOffsets pack_meta(const StepMeta& meta, std::vector<char>& buf) {
  buf.clear();
  Packer pk{buf};
  MetaOffsets o;
  o.tok = pk.add(meta.token_ids), o.pos = pk.add(meta.pos), o.emb = pk.add(meta.embed_src);
  o.ws = pk.add(meta.win_src), o.wb = pk.add(meta.win_begin), o.wc = pk.add(meta.win_count);
  o.wss = pk.add(meta.win_store_src), o.wsd = pk.add(meta.win_store_dst);
  o.sel = pk.add(meta.sel_offset), o.lr = pk.add(meta.logits_rows);
  o.wdst = pk.add(meta.win_dst), o.comb = pk.add(meta.comb_rows);
  for (const auto& k : meta.kinds)
    o.kinds.push_back({pk.add(k.stage_src), pk.add(k.entry_pos), pk.add(k.entry_dst), pk.add(k.state_src),
                       pk.add(k.state_dst), pk.add(k.cand_rows), pk.add(k.cand_offset), pk.add(k.cand_count),
                       pk.add(k.stage_dst), pk.add(k.block)});
  o.pool = pk.add(meta.cand_pool);  // last: its length varies
  return o;
}

DevMeta dev_meta(const StepMeta& meta, const MetaOffsets& o, const char* mb) {
  auto P64 = [mb](size_t off) { return reinterpret_cast<const int64_t*>(mb + off); };
  auto P32 = [mb](size_t off) { return reinterpret_cast<const int32_t*>(mb + off); };
  DevMeta dm;
  dm.token_ids = P32(o.tok);
  dm.pos = P64(o.pos);
  dm.embed_src = P64(o.emb);
  dm.win_src = P64(o.ws);
  dm.win_begin = P32(o.wb);
  dm.win_count = P32(o.wc);
  dm.win_store_src = P64(o.wss);
  dm.win_store_dst = P64(o.wsd);
  dm.sel_offset = P64(o.sel);
  dm.logits_rows = P64(o.lr);
  if (meta.fixed) {
    dm.win_dst = P64(o.wdst);
    dm.comb_rows = P64(o.comb);
  }
  for (size_t i = 0; i < meta.kinds.size(); ++i) {
    const MetaOffsets::Kind& k = o.kinds[i];
    DevKind d{.host = &meta.kinds[i], .stage_src = P64(k.stage), .entry_pos = P64(k.epos),
              .entry_dst = P64(k.edst), .state_src = P64(k.ssrc), .state_dst = P64(k.sdst),
              .cand_offset = P64(k.coff), .cand_rows = P32(k.crows), .cand_count = P32(k.ccount)};
    if (meta.fixed) {
      d.cand_rows = P32(o.pool);  // cand_offset indexes the shared pool
      d.stage_dst = P64(k.stdst);
      d.block = P64(k.block);
    }
    dm.kinds.push_back(d);
  }
  return dm;
}

// Workspace sizes of a step (general or fixed-shape); the attention split is stored in *split.
ArenaSizes arena_sizes(const DeepseekV4Config& cfg, const StepMeta& meta, int64_t R, size_t act_bytes, int num_sms,
                       ops::cuda::AttnSplit* split) {
  ArenaSizes sz{.T = meta.T, .win_rows = int64_t(meta.win_src.size()), .R = R, .act_bytes = act_bytes};
  int64_t max_cmp = 0;
  for (const auto& k : meta.kinds) {
    sz.stage_rows = std::max<int64_t>(sz.stage_rows, int64_t(k.stage_src.size()));
    sz.entries = std::max<int64_t>(sz.entries, int64_t(k.entry_pos.size()));
    sz.max_cand = std::max(sz.max_cand, k.max_count);
    max_cmp = std::max(max_cmp, k.overlap ? std::min<int64_t>(k.max_count, cfg.index_topk) : k.max_count);
  }
  *split = ops::cuda::choose_attention_split(meta.T, cfg.num_heads, meta.max_window + max_cmp, num_sms);
  sz.attn_splits = std::max(1, split->num_splits);
  return sz;
}
}  // namespace

namespace {
// Every launch of one step, from the embedding to the logits of R rows (arena L.logits). No host
// sync and no allocation: in fixed-shape mode this is what a CUDA graph captures.
void launch_step(const StepCtx& c, const GpuWeights& w, GpuCache& cache, int64_t R) {
  const DeepseekV4Config& cfg = *c.cfg;
  const int64_t T = c.meta->T, D = cfg.hidden_size, n = cfg.hc_mult, V = cfg.vocab_size;
  const cudaStream_t st = c.stream;
  gather_rows({.src_a = w.embed.data(), .a_stride = D, .src_dtype = w.embed.dtype, .src_index = c.dmeta->embed_src,
               .dst = c.at<float>(c.L.X), .dst_stride = D, .dst_dtype = DType::kF32, .rows = T * n, .width = D},
              st);
  for (int64_t l = 0; l < cfg.num_layers; ++l) decoder_layer(c, w.layers[size_t(l)], cache.layer(l));
  if (R == 0) return;
  float* sel = c.at<float>(c.L.sel);
  gather_rows({.src_a = c.at<float>(c.L.X), .a_stride = n * D, .src_dtype = DType::kF32, .src_index = c.dmeta->logits_rows,
               .dst = sel, .dst_stride = n * D, .dst_dtype = DType::kF32, .rows = R, .width = n * D},
              st);
  ops::cuda::hc_pre({.x = sel, .dtype = DType::kF32, .x_stride = n * D, .fn = w.hc_head.fn.data(),
                     .base = w.hc_head.base.data(), .scale = w.hc_head.scale.data(), .u = c.at<float>(c.L.hu),
                     .u_stride = D, .mix = nullptr, .workspace = c.at<float>(c.L.head_ws), .tokens = R, .n = int(n),
                     .dim = D, .mode = ops::cuda::HcMode::kHead, .sinkhorn_iters = int(cfg.hc_sinkhorn_iters),
                     .norm_eps = float(cfg.rms_norm_eps), .hc_eps = float(cfg.hc_eps)},
                    st);
  ops::cuda::rmsnorm({.x = c.at<float>(c.L.hu), .x_dtype = DType::kF32, .x_stride = D, .w = w.norm.data(),
                      .w_dtype = DType::kF32, .y = c.at<void>(c.L.hh), .y_dtype = c.act, .y_stride = D,
                      .rows = R, .dim = D, .eps = float(cfg.rms_norm_eps)},
                     st);
  linear(c, w.head, c.at<void>(c.L.hh), D, R, c.at<float>(c.L.logits), DType::kF32, V);
}

StepCtx make_ctx(const DeepseekV4Config& cfg, const CudaModelOptions& o, const StepMeta& meta, const DevMeta& dm,
                 char* arena, const ArenaLayout& L, const ops::cuda::AttnSplit& split, int num_sms, cudaStream_t st,
                 ops::cuda::CublasLt* blas, MoeHost* moe) {
  StepCtx c;
  c.cfg = &cfg;
  c.numerics = o.numerics;  // decides the round trips
  c.act = storage_dtype(o.storage_numerics());
  c.act_bytes = storage_bytes(o.storage_numerics());
  c.meta = &meta;
  c.dmeta = &dm;
  c.arena = arena;
  c.L = L;
  c.num_sms = num_sms;
  c.stream = st;
  c.blas = blas;
  c.split = split;
  c.moe = moe;
  return c;
}
}  // namespace

ForwardOutput DeepseekV4CudaModel::run(const ForwardBatch& batch, const ForwardOptions& options) {
  ForwardOutput out;
  const int64_t V = cfg_.vocab_size;
  const DeviceLogits d = run_step(batch, batch.hidden_indices.empty() ? nullptr : &out.hidden);
  const cudaStream_t st = st_->stream.get();
  if (out.hidden.rows > 0 && options.hidden_to_host) {
    out.hidden.host = Tensor::empty({out.hidden.rows, cfg_.hc_mult, cfg_.hidden_size}, DType::kF32);
    cuda::copy_d2h(out.hidden.host.raw_data(), out.hidden.device, out.hidden.host.nbytes(), st, false);
  }
  if (options.logits_on_device) {
    out.device_logits = d;
    if (out.hidden.host.defined()) DI_CUDA_CHECK(cudaStreamSynchronize(st));
    return out;
  }
  out.logits = Tensor::empty({d.rows, V}, DType::kF32);
  if (d.rows > 0) cuda::copy_d2h(out.logits.raw_data(), d.data, out.logits.nbytes(), st, false);
  DI_CUDA_CHECK(cudaStreamSynchronize(st));
  return out;
}

namespace {
// Interim (until the shared forward): the hidden rows are the head's gathered logits rows.
void head_hidden(const ForwardBatch& batch, const float* sel, int64_t row_elems, cudaStream_t st, HiddenRows* hidden,
                 int device) {
  if (batch.hidden_indices != batch.logits_indices)
    DI_THROW(InvalidArgument, "forward: the GPU model returns hidden rows only for the logits rows");
  hidden->device = sel;
  hidden->rows = int64_t(batch.hidden_indices.size());
  hidden->row_elems = row_elems;
  hidden->stream = st;
  hidden->device_index = device;
}
}  // namespace

DeviceLogits DeepseekV4CudaModel::run_step(const ForwardBatch& batch, HiddenRows* hidden) {
  State& s = *st_;
  validate_batch(cfg_, s.cache.geometry(), s.cache.allocated(), batch);
  const int64_t T = batch.num_tokens(), R = int64_t(batch.logits_indices.size());
  const int64_t D = cfg_.hidden_size, n = cfg_.hc_mult, V = cfg_.vocab_size;
  const cudaStream_t st = s.stream.get();
  DeviceLogits none{.data = nullptr, .rows = 0, .row_stride = V, .stream = st, .device = opts_.device};
  if (T == 0) return none;
  if (opts_.decode != DecodePath::kGeneral && decode_eligible(cfg_, batch, s.cand_caps))
    return forward_fixed(batch, hidden);
  const StepMeta meta = build_step_meta(cfg_, s.cache.geometry(), batch);
  const MetaOffsets mo = pack_meta(meta, s.meta_h);
  ensure(s.meta, s.meta_h.size());
  cuda::copy_h2d(s.meta.data(), s.meta_h.data(), s.meta_h.size(), st, false);
  const DevMeta dm = dev_meta(meta, mo, s.meta.as<const char>());
  ops::cuda::AttnSplit split;
  const ArenaLayout L =
      layout_arena(cfg_, arena_sizes(cfg_, meta, R, storage_bytes(opts_.storage_numerics()), s.info.num_sms,
                                     &split));
  ensure(s.arena, L.total);
  const StepCtx c = make_ctx(cfg_, opts_, meta, dm, s.arena.as<char>(), L, split, s.info.num_sms, st,
                             &s.blas, &s.moe);
  launch_step(c, s.w, s.cache, R);
  if (hidden) head_hidden(batch, c.at<float>(L.sel), n * D, st, hidden, opts_.device);
  if (R == 0) return none;
  return {.data = c.at<float>(L.logits), .rows = R, .row_stride = V, .stream = st, .device = opts_.device};
}

// Fixed buffers of the fixed-shape path, sized once for the largest padded batch: graphs
// capture their addresses, so they are never reallocated (the general path has its own).
void DeepseekV4CudaModel::ensure_fixed_buffers() {
  State& s = *st_;
  if (s.fixed_arena.size_bytes() > 0) return;
  size_t arena = 0, meta = 0;
  for (int64_t P : kDecodeBuckets) {
    const StepMeta m = build_decode_meta(cfg_, s.cache.geometry(), ForwardBatch{}, P, s.cand_caps);
    ops::cuda::AttnSplit split;
    arena = std::max(arena, layout_arena(cfg_, arena_sizes(cfg_, m, P, storage_bytes(opts_.storage_numerics()),
                                                           s.info.num_sms, &split)).total);
    std::vector<char> buf;
    const MetaOffsets o = pack_meta(m, buf);
    size_t pool = 0;
    for (int64_t cap : s.cand_caps) pool += size_t(P * cap) * sizeof(int32_t);
    meta = std::max(meta, o.pool + pool + 256);
  }
  s.fixed_arena = cuda::DeviceBuffer(arena);
  s.fixed_meta = cuda::DeviceBuffer(meta);
}

DeviceLogits DeepseekV4CudaModel::forward_fixed(const ForwardBatch& batch, HiddenRows* hidden) {
  State& s = *st_;
  const int64_t B = batch.num_tokens(), R = int64_t(batch.logits_indices.size());
  const int64_t D = cfg_.hidden_size, n = cfg_.hc_mult, V = cfg_.vocab_size;
  const int64_t P = decode_bucket(B);
  const cudaStream_t st = s.stream.get();
  ensure_fixed_buffers();
  const StepMeta meta = build_decode_meta(cfg_, s.cache.geometry(), batch, P, s.cand_caps);
  const MetaOffsets mo = pack_meta(meta, s.meta_h);
  DI_CHECK(s.meta_h.size() <= s.fixed_meta.size_bytes(), "fixed decode metadata ", s.meta_h.size(), " > buffer ",
           s.fixed_meta.size_bytes());
  // The one H2D copy of the step (stream-ordered after the previous step's reads).
  cuda::copy_h2d(s.fixed_meta.data(), s.meta_h.data(), s.meta_h.size(), st, false);
  const DevMeta dm = dev_meta(meta, mo, s.fixed_meta.as<const char>());
  ops::cuda::AttnSplit split;
  const ArenaLayout L =
      layout_arena(cfg_, arena_sizes(cfg_, meta, P, storage_bytes(opts_.storage_numerics()), s.info.num_sms,
                                     &split));
  DI_CHECK(L.total <= s.fixed_arena.size_bytes(), "fixed decode arena ", L.total, " > ", s.fixed_arena.size_bytes());
  const StepCtx c = make_ctx(cfg_, opts_, meta, dm, s.fixed_arena.as<char>(), L, split, s.info.num_sms, st,
                             &s.blas, nullptr);
  size_t gi = 0;
  while (kDecodeBuckets[gi] != P) ++gi;
  cuda::CudaGraph& g = s.graphs[gi];
  if (opts_.decode != DecodePath::kGraph) {
    launch_step(c, s.w, s.cache, P);
  } else if (g.ready()) {
    g.replay(st);
  } else if (!s.warmed[gi]) {
    // First step at this size runs eagerly: lazy one-time work (cuBLASLt heuristics, kernel
    // attributes) happens outside the capture.
    launch_step(c, s.w, s.cache, P);
    s.warmed[gi] = true;
  } else {
    g.begin_capture(st);
    try {
      launch_step(c, s.w, s.cache, P);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(st, &broken);  // leave the stream usable, then report
      if (broken) cudaGraphDestroy(broken);
      throw;
    }
    g.end_capture();
    g.replay(st);
  }
  if (hidden) head_hidden(batch, c.at<float>(L.sel), n * D, st, hidden, opts_.device);
  // logits_rows lists logits_indices first: rows 0..R-1 of the padded head output.
  return {.data = R > 0 ? c.at<float>(L.logits) : nullptr, .rows = R, .row_stride = V, .stream = st,
          .device = opts_.device};
}

void DeepseekV4CudaModel::set_decode_path(DecodePath p) {
  opts_.decode = p;
  for (auto& g : st_->graphs) g = cuda::CudaGraph();
  st_->warmed.fill(false);
}

int64_t DeepseekV4CudaModel::graphs_captured() const {
  int64_t k = 0;
  for (const auto& g : st_->graphs) k += g.ready() ? 1 : 0;
  return k;
}

}  // namespace deepinfer::model::v4
