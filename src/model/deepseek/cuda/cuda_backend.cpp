#include "model/deepseek/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/check.h"
#include "deepinfer/error.h"
#include "model/deepseek/context_parallel.h"
#include "model/deepseek/cuda/glue_kernels.h"
#include "model/deepseek/cuda/moe_decode.h"
#include "ops/cuda/compressor.h"
#include "ops/cuda/gemm_fp8w.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/grouped_gemm_cost.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/moe_route.h"
#include "ops/cuda/qat.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/quant.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/router.h"
#include "ops/cuda/swiglu.h"

namespace deepinfer::model::ds::cuda {
namespace dc = deepinfer::cuda;
namespace oc = ops::cuda;

CudaBackend::CudaBackend(const Arch& arch, std::vector<kv::LayerCacheSpec> specs,
                         std::unique_ptr<GpuWeightStore> weights, const CudaModelOptions& options, dc::MemoryPlan memory,
                         Fp8Workspace fp8_workspace, dc::Stream stream)
    : arch_(arch), specs_(std::move(specs)), weights_(std::move(weights)), opts_(options), mem_(memory),
      fp8_workspace_(std::move(fp8_workspace)), stream_(std::move(stream)), blas_(size_t(32) << 20, options.device),
      info_(dc::device_info(options.device)), act_(storage_dtype(options.storage_numerics())) {
  cand_caps_ = fixed_candidate_caps(specs_, opts_.max_context);
  if (opts_.batch_invariant) {
    const Dims& g = arch_.dims;
    if (act_ != DType::kBF16)
      DI_THROW(InvalidArgument, "DEEPINFER_BATCH_INVARIANT=1 needs bf16 or production numerics on the GPU (exact "
                                "numerics' fp32 cuBLASLt products pick their order by batch size)");
    if (opts_.experts == ExpertPath::kHostRouted || g.moe_inter % 32 || g.hidden % 32)
      DI_THROW(InvalidArgument, "DEEPINFER_BATCH_INVARIANT=1 needs the grouped expert GEMM (hidden ", g.hidden,
               " and moe_intermediate_size ", g.moe_inter, " multiples of 32, experts not host-routed)");
  }
}

CudaBackend::~CudaBackend() = default;

std::string CudaBackend::describe() const {
  std::ostringstream os;
  os << "cuda "
     << (opts_.numerics == Numerics::kExact ? "f32 (exact)"
         : opts_.numerics == Numerics::kBf16 ? "bf16"
         : opts_.f32_storage                 ? "f32 storage with production round trips"
                                             : "bf16 (production: the model's cache formats)")
     << ", decode "
     << (opts_.decode == DecodePath::kGraph ? "graphs" : opts_.decode == DecodePath::kFixed ? "fixed" : "general")
     << (opts_.batch_invariant ? ", batch-invariant" : "") << " on " << info_.name << " (cuda:" << opts_.device << ")";
  return os.str();
}

kv::CacheGeometry CudaBackend::plan_cache(size_t budget_bytes, int64_t max_slots) const {
  return kv::plan_cache_geometry(specs_, std::min(budget_bytes, mem_.cache_bytes), max_slots,
                                 storage_bytes(opts_.storage_numerics()), "GPU kv cache");
}

void CudaBackend::allocate_cache(const kv::CacheGeometry& g) {
  graphs_.clear();  // graphs captured the old pools' addresses (recaptured lazily)
  warmed_.clear();
  cache_ = GpuCache();  // free the old pools first
  cache_ = GpuCache(specs_, g, act_, opts_.device, stream_.get());
}

SlotSnapshot CudaBackend::save_slot(int32_t slot, int64_t num_tokens) {
  return {.num_tokens = num_tokens, .bytes = cache_.save_slot(slot, stream_.get())};
}

namespace {
// Snapshots copied into pinned staging by queue_save_slots, cut out once the event has passed.
class CudaSlotSaves final : public PendingSlotSaves {
 public:
  CudaSlotSaves(std::shared_ptr<uint8_t> pool, std::shared_ptr<deepinfer::cuda::Event> done,
                std::shared_ptr<uint64_t> owner, uint64_t id, std::vector<SlotSave> saves, size_t each)
      : pool_(std::move(pool)), done_(std::move(done)), owner_(std::move(owner)), id_(id), saves_(std::move(saves)),
        each_(each) {}
  ~CudaSlotSaves() override {
    if (waited_) return;
    cudaEventSynchronize(done_->get());  // the staging must be idle before it is reused
    release();
  }
  std::vector<SlotSnapshot> wait() override {
    DI_CHECK(!waited_, "queued slot saves waited for twice");
    done_->synchronize();
    waited_ = true;
    std::vector<SlotSnapshot> out;
    out.reserve(saves_.size());
    for (size_t i = 0; i < saves_.size(); ++i) {
      const uint8_t* p = pool_.get() + i * each_;
      out.push_back({.num_tokens = saves_[i].num_tokens, .bytes = std::vector<uint8_t>(p, p + each_)});
    }
    release();  // copied out: the staging is free for the next queue_save_slots
    return out;
  }

 private:
  void release() {
    if (*owner_ == id_) *owner_ = 0;
  }
  std::shared_ptr<uint8_t> pool_;
  std::shared_ptr<deepinfer::cuda::Event> done_;
  std::shared_ptr<uint64_t> owner_;
  uint64_t id_ = 0;
  std::vector<SlotSave> saves_;
  size_t each_ = 0;
  bool waited_ = false;
};
}  // namespace

std::unique_ptr<PendingSlotSaves> CudaBackend::queue_save_slots(std::span<const SlotSave> saves) {
  if (saves.empty()) return std::make_unique<ReadySlotSaves>(std::vector<SlotSnapshot>{});
  DI_CHECK(*save_owner_ == 0, "queue_save_slots: the previous saves were neither waited for nor dropped");
  const size_t each = cache_.slot_bytes(), need = each * saves.size();
  if (need > save_pool_bytes_) {
    save_pool_bytes_ = need + need / 4;
    save_pool_ = allocate_host_memory(save_pool_bytes_);
  }
  if (!save_done_) save_done_ = std::make_shared<deepinfer::cuda::Event>();
  for (size_t i = 0; i < saves.size(); ++i) cache_.queue_save_slot(saves[i].slot, save_pool_.get() + i * each, stream_.get());
  save_done_->record(stream_.get());
  *save_owner_ = ++save_handles_;
  return std::make_unique<CudaSlotSaves>(save_pool_, save_done_, save_owner_, *save_owner_,
                                         std::vector<SlotSave>(saves.begin(), saves.end()), each);
}

void CudaBackend::restore_slot(int32_t slot, const SlotSnapshot& s) { cache_.restore_slot(slot, s.bytes, stream_.get()); }

void CudaBackend::copy_blocks_to_host(std::span<const HostBlockCopy> copies) {
  cache_.copy_blocks(copies, /*to_host=*/true, stream_.get());
}

void CudaBackend::copy_blocks_from_host(std::span<const HostBlockCopy> copies) {
  cache_.copy_blocks(copies, /*to_host=*/false, stream_.get());
}

std::shared_ptr<uint8_t> CudaBackend::allocate_host_memory(size_t bytes) {
  auto pinned = std::make_shared<deepinfer::cuda::PinnedBuffer>(bytes ? bytes : 1);
  return std::shared_ptr<uint8_t>(pinned, pinned->as<uint8_t>());  // aliasing: frees with the buffer
}

DeviceMemory CudaBackend::allocate_device_memory(size_t bytes) {
  auto buf = std::make_shared<deepinfer::cuda::DeviceBuffer>(bytes ? bytes : 1, opts_.device);
  return {.owner = buf, .data = buf->data(), .bytes = bytes, .device = opts_.device};
}

void CudaBackend::gather_blocks_to_device(std::span<const int32_t> blocks, void* dst, void* done) {
  cache_.gather_blocks(blocks, dst, stream_.get());
  if (done) DI_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(done), stream_.get()));
  else DI_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

void CudaBackend::scatter_blocks_from_device(std::span<const int32_t> blocks, const void* src, void* ready) {
  if (ready) DI_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), static_cast<cudaEvent_t>(ready), 0));
  cache_.scatter_blocks(blocks, src, stream_.get());
  DI_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));  // the caller may reuse `src` on return
}

LayerCacheRef CudaBackend::cache(int64_t layer) {
  GpuLayerCache& c = cache_.layer(layer);
  return {.window = c.window.data(), .entries = c.comp.data(), .keys = c.index_keys.data(),
          .state = c.comp_state.as<float>(), .index_state = c.index_state.as<float>()};
}

// Fixed-shape steps above moe_decode's size run the routed experts through the device
// permutation and grouped GEMMs (no host sync either); without them (exact numerics, host-routed
// experts) the fixed path stops at kMoeDecodeMaxTokens.
bool CudaBackend::grouped_moe() const {
  const Dims& g = arch_.dims;
  return act_ == DType::kBF16 && opts_.experts != ExpertPath::kHostRouted && g.moe_inter % 32 == 0 &&
         g.hidden % 32 == 0;
}

FixedLimits CudaBackend::fixed_limits() const {
  return {.max_tokens = grouped_moe() ? kFixedTokenBuckets[std::size(kFixedTokenBuckets) - 1] : kMoeDecodeMaxTokens,
          .max_tokens_per_seq = 1 + arch_.plan.max_rollback};
}

std::optional<ModelBackend::FixedShape> CudaBackend::fixed_shape(const ForwardBatch& b) const {
  // Expert parallelism exchanges host-sized messages every MoE layer: no fixed shapes, no graphs.
  // V4.1's Engram rows are gathered on the host before the step and staged into fixed buffers
  // outside the captured launches (stage_engram_rows), so they do not stop fixed shapes.
  if (ep_ || opts_.decode == DecodePath::kGeneral ||
      !fixed_eligible(specs_, b, cand_caps_, fixed_limits()))
    return std::nullopt;
  return FixedShape{.padded = fixed_token_bucket(b.num_tokens()), .caps = &cand_caps_};
}

// ---- step lifecycle ----

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

// Byte offsets of the packed lists. In fixed-shape plans every list but the candidate pool (packed
// last) has a length fixed by the padded size, so the offsets (and the device pointers a graph
// captured) do not change between steps.
struct MetaOffsets {
  size_t tok, pos, emb, ws, wb, wc, wss, wsd, sel, lr, hr, wdst, comb, twb, twc, pool;
  struct Kind { size_t stage, epos, edst, ssrc, sdst, crows, coff, ccount, stdst, block; };
  std::vector<Kind> kinds;
};

MetaOffsets pack_meta(const StepPlan& m, std::vector<char>& buf) {
  buf.clear();
  Packer pk{buf};
  MetaOffsets o;
  o.tok = pk.add(m.token_ids), o.pos = pk.add(m.pos), o.emb = pk.add(m.embed_src);
  o.ws = pk.add(m.win_src), o.wb = pk.add(m.win_begin), o.wc = pk.add(m.win_count);
  o.wss = pk.add(m.win_store_src), o.wsd = pk.add(m.win_store_dst);
  o.sel = pk.add(m.sel_offset), o.lr = pk.add(m.logits_rows), o.hr = pk.add(m.hidden_rows);
  o.wdst = pk.add(m.win_dst), o.comb = pk.add(m.comb_rows);
  o.twb = pk.add(m.tail_win_begin), o.twc = pk.add(m.tail_win_count);  // empty in fixed plans
  for (const auto& k : m.kinds)
    o.kinds.push_back({pk.add(k.stage_src), pk.add(k.entry_pos), pk.add(k.entry_dst), pk.add(k.state_src),
                       pk.add(k.state_dst), pk.add(k.cand_rows), pk.add(k.cand_offset), pk.add(k.cand_count),
                       pk.add(k.stage_dst), pk.add(k.block)});
  o.pool = pk.add(m.cand_pool);  // last: its length varies
  return o;
}

StepIndex device_index(const StepPlan& m, const MetaOffsets& o, const char* mb) {
  auto P64 = [mb](size_t off) { return reinterpret_cast<const int64_t*>(mb + off); };
  auto P32 = [mb](size_t off) { return reinterpret_cast<const int32_t*>(mb + off); };
  StepIndex d;
  d.token_ids = P32(o.tok);
  d.pos = P64(o.pos);
  d.embed_src = P64(o.emb);
  d.win_src = P64(o.ws);
  d.win_begin = P32(o.wb);
  d.win_count = P32(o.wc);
  if (!m.tail_win_begin.empty()) {
    d.tail_win_begin = P32(o.twb);
    d.tail_win_count = P32(o.twc);
  }
  d.win_store_src = P64(o.wss);
  d.win_store_dst = P64(o.wsd);
  d.sel_offset = P64(o.sel);
  d.logits_rows = P64(o.lr);
  d.hidden_rows = P64(o.hr);
  if (m.fixed) {
    d.win_dst = P64(o.wdst);
    d.comb_rows = P64(o.comb);
  }
  for (size_t i = 0; i < m.kinds.size(); ++i) {
    const MetaOffsets::Kind& k = o.kinds[i];
    KindIndex x{.host = &m.kinds[i], .stage_src = P64(k.stage), .entry_pos = P64(k.epos), .entry_dst = P64(k.edst),
                .state_src = P64(k.ssrc), .state_dst = P64(k.sdst), .cand_offset = P64(k.coff),
                .cand_rows = P32(k.crows), .cand_count = P32(k.ccount)};
    if (m.fixed) {
      x.cand_rows = P32(o.pool);  // cand_offset indexes the shared pool
      x.stage_dst = P64(k.stdst);
      x.block = P64(k.block);
    }
    d.kinds.push_back(x);
  }
  return d;
}

}  // namespace

void ensure(dc::DeviceBuffer& b, size_t bytes, int device) {
  if (b.size_bytes() >= bytes) return;
  b = dc::DeviceBuffer();  // release before growing (peak = the new size)
  b = dc::DeviceBuffer(bytes + bytes / 4, device);
}

ArenaSizes CudaBackend::arena_sizes(const StepPlan& p, oc::AttnSplit* split) const {
  const Dims& g = arch_.dims;
  ArenaSizes sz{.step = step_sizes(p), .act_bytes = storage_bytes(opts_.storage_numerics())};
  int64_t max_cmp = 0;
  for (const auto& k : p.kinds) {
    sz.max_cand = std::max(sz.max_cand, k.max_count);
    max_cmp = std::max(max_cmp, k.overlap ? std::min<int64_t>(k.max_count, g.index_topk) : k.max_count);
  }
  const int64_t max_keys = p.max_window + max_cmp;
  if (opts_.batch_invariant) {  // splits of a fixed key count, whatever the batch
    const int64_t splits = (max_keys + kInvariantSplitKeys - 1) / kInvariantSplitKeys;
    *split = splits > 1 ? oc::AttnSplit{int(splits), kInvariantSplitKeys} : oc::AttnSplit{};
    sz.attn_tokens = std::max<int64_t>(1, kInvariantSplitPartials / std::max<int64_t>(splits, 1));
  } else {
    *split = oc::choose_attention_split(p.T, g.heads, g.head_dim, act_, max_keys, info_.num_sms);
  }
  sz.attn_splits = std::max(1, split->num_splits);
  if (act_ == DType::kBF16 && fp8_workspace_) {
    // Dense linears run over T rows, and the MTP block's h_proj over T x streams rows: size for both.
    size_t ws = 0, wdq = 0;
    fp8_workspace_(p.T, &sz.fp8_ws_bytes, &sz.wdq_bytes);
    fp8_workspace_(p.T * g.streams, &ws, &wdq);
    sz.fp8_ws_bytes = std::max(sz.fp8_ws_bytes, ws);
    sz.wdq_bytes = std::max(sz.wdq_bytes, wdq);
  }
  return sz;
}

// Fixed buffers of the fixed-shape path, sized once for the largest padded batch.
void CudaBackend::ensure_fixed_buffers() {
  if (fixed_arena_.size_bytes() > 0) return;
  size_t arena = 0, meta = 0;
  const StepPlanDims dims{.n_streams = arch_.dims.streams, .index_topk = arch_.dims.index_topk,
                          .topk_experts = arch_.dims.topk};
  for (int64_t P : kFixedTokenBuckets) {
    if (P > fixed_limits().max_tokens) break;
    StepPlan m = build_fixed_step_plan(specs_, dims, cache_.geometry(), ForwardBatch{}, P, cand_caps_);
    m.hidden_rows.assign(size_t(P), 0);  // sized for hidden rows too (a superset of the plain step)
    oc::AttnSplit split;
    arena = std::max(arena, layout_arena(arch_.dims, arena_sizes(m, &split)).total);
    std::vector<char> buf;
    const MetaOffsets o = pack_meta(m, buf);
    size_t pool = 0;
    for (int64_t cap : cand_caps_) pool += size_t(P * cap) * sizeof(int32_t);
    // + the device-input patch list, packed after the pool: at most one entry per token.
    meta = std::max(meta, o.pool + pool + 256 + size_t(P) * 8 + 256);
  }
  fixed_arena_ = dc::DeviceBuffer(arena, opts_.device);
  fixed_meta_ = dc::DeviceBuffer(meta, opts_.device);
}

void CudaBackend::set_device_inputs(std::span<const DeviceInput> inputs, const int32_t* sampled_ids) {
  DI_CHECK(inputs.empty() || sampled_ids, "device inputs without sampled ids");
  input_patch_.clear();
  for (const DeviceInput& d : inputs) {
    input_patch_.push_back(d.token_index);
    input_patch_.push_back(d.sample_row);
  }
  sampled_ids_ = sampled_ids;
}

// On this stream: the device sampler draws on the logits' stream, which is this one.
std::vector<int32_t> CudaBackend::device_ids_to_host(const int32_t* sampled_ids, int64_t n) {
  DI_CHECK(sampled_ids && n >= 0, "device ids: ", n, " rows of ", static_cast<const void*>(sampled_ids));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  if (n > 0) dc::copy_d2h(ids.data(), sampled_ids, size_t(n) * sizeof(int32_t), stream_.get(), /*sync=*/true);
  return ids;
}

void CudaBackend::begin_step(StepPlan plan) {
  plan_ = std::move(plan);
  if (cp_) cp_->begin_step(plan_);  // every rank of the group decides the split alike
  const cudaStream_t st = stream_.get();
  const MetaOffsets mo = pack_meta(plan_, meta_pack_);
  const size_t patch_off = Packer{meta_pack_}.add(input_patch_);
  dc::DeviceBuffer* meta = &meta_;
  if (plan_.fixed) {
    ensure_fixed_buffers();
    DI_CHECK(meta_pack_.size() <= fixed_meta_.size_bytes(), "fixed decode metadata ", meta_pack_.size(), " > buffer ",
             fixed_meta_.size_bytes());
    meta = &fixed_meta_;
  } else {
    ensure(meta_, meta_pack_.size(), opts_.device);
  }
  // The one H2D copy of the step (stream-ordered after the previous step's reads), from pinned
  // memory so that it never waits for the stream.
  if (profiling_) {
    if (!profile_open_) profile_.emplace_back(dc::Event(true), dc::Event(true));
    profile_.back().first.record(st);
    profile_open_ = true;
  }
  const int turn = meta_turn_;
  meta_turn_ ^= 1;
  meta_copied_[turn].synchronize();  // the copy out of this buffer two steps ago has run
  if (meta_h_[turn].size_bytes() < meta_pack_.size()) {
    meta_h_[turn] = dc::PinnedBuffer();
    meta_h_[turn] = dc::PinnedBuffer(meta_pack_.size() + meta_pack_.size() / 4);
  }
  std::memcpy(meta_h_[turn].data(), meta_pack_.data(), meta_pack_.size());
  dc::copy_h2d(meta->data(), meta_h_[turn].data(), meta_pack_.size(), st, false);
  meta_copied_[turn].record(st);
  index_ = device_index(plan_, mo, meta->as<const char>());
  if (!input_patch_.empty()) {  // the previous step's sampled ids, on the device (asynchronous scheduling)
    cuda::patch_input_tokens({.patch = reinterpret_cast<const int32_t*>(meta->as<const char>() + patch_off),
                              .count = int64_t(input_patch_.size() / 2), .sampled = sampled_ids_,
                              .token_ids = const_cast<int32_t*>(index_.token_ids),
                              .embed_src = const_cast<int64_t*>(index_.embed_src), .n_streams = plan_.n_streams},
                             st);
    input_patch_.clear();
    sampled_ids_ = nullptr;
  }
  L_ = layout_arena(arch_.dims, arena_sizes(plan_, &split_));
  if (plan_.fixed) {
    DI_CHECK(L_.total <= fixed_arena_.size_bytes(), "fixed decode arena ", L_.total, " > ", fixed_arena_.size_bytes());
    arena_base_ = fixed_arena_.as<char>();
  } else {
    ensure(arena_, L_.total, opts_.device);
    arena_base_ = arena_.as<char>();
  }
}

void CudaBackend::launch(const std::function<void()>& body, int32_t graph) {
  if (!plan_.fixed || opts_.decode != DecodePath::kGraph || op_timer_.on()) {  // op timing needs eager launches
    body();
    return;
  }
  const cudaStream_t st = stream_.get();
  const GraphKey key{plan_.T, !plan_.hidden_rows.empty(), graph};
  dc::CudaGraph& g = graphs_[key];
  if (g.ready()) {
    g.replay(st);
  } else if (!warmed_[key]) {
    // First step at this shape runs eagerly: lazy one-time work (cuBLASLt heuristics, kernel
    // attributes) happens outside the capture.
    body();
    warmed_[key] = true;
  } else {
    g.begin_capture(st);
    try {
      body();
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(st, &broken);  // leave the stream usable, then report
      if (broken) cudaGraphDestroy(broken);
      throw;
    }
    g.end_capture();
    g.replay(st);
  }
}

ForwardOutput CudaBackend::end_step(const ForwardOptions& options, int64_t rows, int64_t hidden_rows) {
  const Dims& g = arch_.dims;
  const cudaStream_t st = stream_.get();
  ForwardOutput out;
  if (hidden_rows > 0) {
    out.hidden.device = at<float>(L_.buf[size_t(Buf::kHidden)]);
    out.hidden.rows = hidden_rows;
    out.hidden.row_elems = g.hidden_elems();
    out.hidden.stream = st;
    out.hidden.device_index = opts_.device;
    if (options.hidden_to_host) {
      out.hidden.host = g.taps > 0 ? Tensor::empty({hidden_rows, g.hidden_elems()}, DType::kF32)
                                   : Tensor::empty({hidden_rows, g.streams, g.hidden}, DType::kF32);
      dc::copy_d2h(out.hidden.host.raw_data(), out.hidden.device, out.hidden.host.nbytes(), st, false);
    }
  }
  if (options.logits_on_device) {
    out.device_logits = {.data = rows > 0 ? at<float>(L_.buf[size_t(Buf::kLogits)]) : nullptr, .rows = rows,
                         .row_stride = g.vocab, .stream = st, .device = opts_.device};
    if (out.hidden.host.defined()) DI_CUDA_CHECK(cudaStreamSynchronize(st));
    return out;
  }
  out.logits = Tensor::empty({rows, g.vocab}, DType::kF32);
  if (rows > 0) dc::copy_d2h(out.logits.raw_data(), buf(Buf::kLogits), out.logits.nbytes(), st, false);
  DI_CUDA_CHECK(cudaStreamSynchronize(st));
  return out;
}

const float* CudaBackend::stage_hidden(const HiddenRows& rows, const RowRanges& ranges, int64_t padded_rows) {
  const int64_t e = rows.row_elems;
  int64_t total = 0;
  for (const auto& [first, count] : ranges) {
    DI_CHECK(first >= 0 && count >= 0 && first + count <= rows.rows, "stage_hidden: rows [", first, ", ", first + count,
             ") of ", rows.rows);
    total += count;
  }
  dc::DeviceBuffer* staged = &staged_hidden_;
  if (padded_rows > 0) {
    const int64_t most = fixed_limits().max_tokens;
    DI_CHECK(total <= padded_rows && padded_rows <= most, "stage_hidden: ", total, " rows for a fixed step of ",
             padded_rows, " (at most ", most, ")");
    if (fixed_staged_hidden_.size_bytes() == 0)
      fixed_staged_hidden_ = dc::DeviceBuffer(size_t(most * e) * sizeof(float), opts_.device);
    staged = &fixed_staged_hidden_;
    // The padded rows run through the block too: zeros keep them finite.
    if (padded_rows > total)
      DI_CUDA_CHECK(cudaMemsetAsync(staged->as<float>() + total * e, 0, size_t((padded_rows - total) * e) * sizeof(float),
                                    stream_.get()));
  } else {
    ensure(staged_hidden_, std::max<size_t>(size_t(total * e) * sizeof(float), 16), opts_.device);
  }
  const Tensor h = rows.device ? Tensor() : rows.host.contiguous();
  DI_CHECK(rows.device || h.defined(), "stage_hidden: rows in neither host nor device memory");
  int64_t at = 0;
  for (const auto& [first, count] : ranges) {
    const size_t bytes = size_t(count * e) * sizeof(float);
    float* dst = staged->as<float>() + at * e;
    if (rows.device)
      DI_CUDA_CHECK(cudaMemcpyAsync(dst, rows.device + first * e, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
    else
      dc::copy_h2d(dst, h.data<float>() + first * e, bytes, stream_.get(), false);
    at += count;
  }
  if (!rows.device) DI_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));  // the host tensor may go away
  return staged->as<const float>();
}

void CudaBackend::greedy_rows(int64_t rows, int32_t* tokens, float* logprobs) {
  const OpTimer::Scope op_scope_ = op_scope("greedy_rows");
  DI_CHECK(rows >= 0 && rows <= plan_.T, "greedy_rows: ", rows, " rows of a ", plan_.T, "-token step");
  if (rows == 0) return;
  const size_t bytes = size_t(rows) * (sizeof(int32_t) + sizeof(float));
  ensure(greedy_out_, bytes, opts_.device);
  int32_t* d_tok = greedy_out_.as<int32_t>();
  float* d_lp = reinterpret_cast<float*>(d_tok + rows);
  const cudaStream_t st = stream_.get();
  cuda::greedy_rows(at<float>(L_.buf[size_t(Buf::kLogits)]), arch_.dims.vocab, rows, arch_.dims.vocab, d_tok,
                        d_lp, st);
  greedy_h_.resize(bytes);
  dc::copy_d2h(greedy_h_.data(), d_tok, bytes, st, false);
  DI_CUDA_CHECK(cudaStreamSynchronize(st));
  std::memcpy(tokens, greedy_h_.data(), size_t(rows) * sizeof(int32_t));
  std::memcpy(logprobs, greedy_h_.data() + size_t(rows) * sizeof(int32_t), size_t(rows) * sizeof(float));
}

void CudaBackend::set_profiling(bool on) {
  profiling_ = on;
  if (!on) {
    profile_.clear();
    profile_open_ = false;
  }
}

void CudaBackend::mark_step_end() {
  if (!profiling_ || !profile_open_) return;
  profile_.back().second.record(stream_.get());
  profile_open_ = false;
}

CausalLM::StepProfile CudaBackend::take_profile() {
  CausalLM::StepProfile p;
  if (profile_open_) profile_.pop_back();  // never ended
  profile_open_ = false;
  stream_.synchronize();
  for (size_t i = 0; i < profile_.size(); ++i) {
    p.busy_ms.push_back(profile_[i].second.elapsed_ms_since(profile_[i].first));
    p.idle_ms.push_back(i == 0 ? 0.0 : profile_[i].first.elapsed_ms_since(profile_[i - 1].second));
  }
  profile_.clear();
  return p;
}

// One weight pass against the tokens' arithmetic at the bf16 peak (790 TFLOP/s, ANCHORS.md). The
// pass is what a step costs whatever its length: the dense weights at the copy rate (4.3 TB/s) and
// the routed experts at the rate the grouped GEMM actually streams them at few rows per expert
// (grouped_gemm_cost.h: ~1.15 TB/s for FP4, its dequantisation bound). Session 13 used 4.3 TB/s for
// the experts too, which put the break-even at 1,333 tokens on the V4-Flash stack where the kernel's
// own fit puts it near 5,000 (docs/PERFORMANCE.md, session 14).
int64_t CudaBackend::prefill_weight_pass_tokens() const {
  constexpr double kBandwidth = 4.3e12, kFlops = 790e12, kShortPassS = 1e-3;
  const Dims& g = arch_.dims;
  if (!weights_) return 0;
  double expert_s = 0.0;
  int64_t expert_bytes = 0;
  for (const LayerRef& l : weights_->refs.layers) {
    const MoeRef& m = l.ffn;
    if (m.experts.empty() || !m.tables.w13) continue;
    const oc::ExpertFormat f = expert_format(m.tables.dtype);
    const int64_t b = int64_t(m.experts.size()) * (oc::expert_matrix_bytes(f, 2 * g.moe_inter, g.hidden) +
                                                   oc::expert_matrix_bytes(f, g.hidden, g.moe_inter));
    expert_bytes += b;
    expert_s += double(b) / oc::grouped_gemm_pass_bytes_per_s(f);
  }
  const double dense = std::max(0.0, double(weights_->bytes) - double(expert_bytes));
  const double pass_s = dense / kBandwidth + expert_s;
  if (pass_s < kShortPassS) return 0;
  // Multiply-adds per token per layer: q/kv/o projections and the routed + one shared expert.
  const double D = double(g.hidden), Hd = double(g.heads * g.head_dim);
  const double attn = double(g.q_lora) * D + Hd * double(g.q_lora) + double(g.head_dim) * D + Hd * double(g.o_lora) +
                      D * double(g.o_groups * g.o_lora);
  const double moe = double(g.topk + 1) * 3.0 * double(g.moe_inter) * D;
  const double flops = 2.0 * double(arch_.plan.num_layers()) * (attn + moe);
  return flops > 0 ? int64_t(std::ceil(pass_s / (flops / kFlops))) : 0;
}

void CudaBackend::set_op_profiling(bool on) {
  stream_.synchronize();  // events of an earlier take are not in flight
  op_timer_.enable(on);
}

std::vector<OpTiming> CudaBackend::take_op_profile() { return op_timer_.take(stream_.get()); }

OpTimer::Scope CudaBackend::op_scope(const char* name) {
  return op_timer_.scope(stream_.get(), [name] { return std::string(name); });
}

OpTimer::Scope CudaBackend::linear_scope(const char* op, const LinearRef& W) {
  return op_timer_.scope(stream_.get(), [&] {
    const char* fmt = W.dtype == DType::kF8E4M3 ? "fp8" : W.dtype == DType::kBF16 ? "bf16" : "f32";
    return std::string(op) + " " + fmt + " " + std::to_string(W.out) + "x" + std::to_string(W.in);
  });
}

void CudaBackend::set_decode_path(DecodePath p) {
  opts_.decode = p;
  graphs_.clear();
  warmed_.clear();
}

int64_t CudaBackend::graphs_captured() const {
  int64_t k = 0;
  for (const auto& [key, g] : graphs_) k += g.ready() ? 1 : 0;
  return k;
}

// ---- ops ----

void CudaBackend::gather(const GatherArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("gather");
  cuda::gather_rows({.src_a = a.src_a, .a_stride = a.a_stride, .src_b = a.src_b, .b_stride = a.b_stride,
                     .src_dtype = a.src_dtype, .src_index = a.src_index, .dst = a.dst, .dst_stride = a.dst_stride,
                     .dst_dtype = a.dst_dtype, .dst_index = a.dst_index, .rows = a.rows, .width = a.width},
                    stream_.get());
}

// Dense FP8 weight (e4m3 + e8m0 grid), `batch` row groups of [n, k] (wo_a: groups): up to
// kDenseFp8PrefillM tokens the weight-only GEMM reads the bytes as stored; above, one
// dequantisation to the arena's bf16 scratch and the cuBLASLt GEMM.
void CudaBackend::linear_fp8(const LinearRef& W, const void* x, int64_t ldx, int64_t bsx, int64_t M, void* y,
                             DType y_dtype, int64_t ldy, int64_t bsy, int64_t n, int64_t k, int64_t batch) {
  DI_CHECK(act_ == DType::kBF16, "linear: FP8 weights need bf16 activations");
  const cudaStream_t st = stream_.get();
  if (!fp8_weight_only(W, M)) {
    void* wd = at<void>(L_.wdq);
    oc::dequant_fp8w_bf16({.w = static_cast<const uint8_t*>(W.w), .scale = static_cast<const uint8_t*>(W.scale),
                           .out = wd, .N = W.out, .K = W.in, .scale_rows = W.scale_rows, .scale_k = W.scale_cols},
                          st);
    blas_.gemm({.x = x, .ldx = ldx, .w = wd, .ldw = k, .y = y, .ldy = ldy, .in_dtype = DType::kBF16,
                .out_dtype = y_dtype, .M = M, .N = n, .K = k, .batch = batch, .batch_stride_x = bsx,
                .batch_stride_w = n * k, .batch_stride_y = bsy},
               st);
    return;
  }
  oc::gemm_fp8w({.x = x, .ldx = ldx, .w = static_cast<const uint8_t*>(W.w),
                 .scale = static_cast<const uint8_t*>(W.scale), .scale_rows = W.scale_rows, .scale_k = W.scale_cols,
                 .y = y, .ldy = ldy,
                 .out_dtype = y_dtype, .M = M, .N = n, .K = k, .batch = batch, .batch_stride_x = bsx,
                 .batch_stride_y = bsy, .workspace = at<float>(L_.fp8_ws), .workspace_bytes = L_.fp8_ws_bytes,
                 .num_sms = info_.num_sms},
                st);
}

bool CudaBackend::fp8_weight_only(const LinearRef& W, int64_t M) const {
  return M <= kDenseFp8PrefillM || opts_.batch_invariant || L_.wdq_bytes < size_t(W.out * W.in) * 2;
}

// FP8 jobs that linear_fp8 runs through gemm_fp8w (batch 1) and that agree on K, the scale grid
// and the output dtype go to gemm_fp8w_multi, up to kFp8wMaxParts per call; it launches them as
// one kernel when their K splits agree and one each otherwise, every y bit-identical to its own
// gemm_fp8w (tests/cpp/cuda/gemm_fp8w_test.cc, the Multi tests). Every other job: `linear`.
void CudaBackend::linear_many(const void* x, int64_t ldx, int64_t M, std::span<const LinearJob> jobs) {
  if (M == 0) return;
  auto multi = [&](const LinearJob& j) {
    DI_CHECK(j.W && j.W->w != nullptr && j.W->out > 0 && j.W->in > 0, "linear_many: weight not uploaded");
    return opts_.multi_linear && j.W->dtype == DType::kF8E4M3 && fp8_weight_only(*j.W, M);
  };
  auto same_launch = [](const LinearJob& a, const LinearJob& b) {
    return a.W->in == b.W->in && a.W->scale_rows == b.W->scale_rows && a.W->scale_cols == b.W->scale_cols &&
           a.y_dtype == b.y_dtype;
  };
  std::vector<char> done(jobs.size(), 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (done[i]) continue;
    const LinearJob& a = jobs[i];
    std::array<oc::Fp8wPart, oc::kFp8wMaxParts> parts;
    int n = 0;
    if (multi(a)) {
      for (size_t j = i; j < jobs.size() && n < oc::kFp8wMaxParts; ++j) {
        const LinearJob& b = jobs[j];
        if (done[j] || !multi(b) || !same_launch(a, b)) continue;
        parts[size_t(n++)] = {.w = static_cast<const uint8_t*>(b.W->w),
                              .scale = static_cast<const uint8_t*>(b.W->scale), .y = b.y, .ldy = b.ldy, .N = b.W->out};
        done[j] = 1;
      }
    }
    if (n < 2) {  // nothing to share a launch with
      done[i] = 1;
      linear(*a.W, x, ldx, M, a.y, a.y_dtype, a.ldy);
      continue;
    }
    DI_CHECK(act_ == DType::kBF16, "linear_many: FP8 weights need bf16 activations");
    const OpTimer::Scope op_scope_ = op_timer_.scope(stream_.get(), [&] {
      std::string name = "linear_many fp8";
      for (int k = 0; k < n; ++k)
        name += (k ? "+" : " ") + std::to_string(parts[size_t(k)].N) + "x" + std::to_string(a.W->in);
      return name;
    });
    const oc::Fp8wMultiParams mp{.x = x, .ldx = ldx, .M = M, .K = a.W->in, .parts = parts.data(), .num_parts = n,
                                 .scale_rows = a.W->scale_rows, .scale_k = a.W->scale_cols, .out_dtype = a.y_dtype,
                                 .num_sms = info_.num_sms};
    if (oc::gemm_fp8w_multi_fuses(mp)) ++multi_linear_launches_;
    oc::gemm_fp8w_multi(mp, stream_.get());
  }
}

void CudaBackend::linear(const LinearRef& W, const void* x, int64_t ldx, int64_t M, void* y, DType y_dtype,
                         int64_t ldy) {
  const OpTimer::Scope op_scope_ = linear_scope("linear", W);
  if (M == 0) return;
  DI_CHECK(W.w != nullptr && W.out > 0 && W.in > 0, "linear: weight not uploaded");
  if (W.dtype == DType::kF8E4M3) {
    linear_fp8(W, x, ldx, 0, M, y, y_dtype, ldy, 0, W.out, W.in, 1);
    return;
  }
  DI_CHECK(W.dtype == DType::kBF16 || y_dtype == DType::kF32, "linear: f32 weights need an f32 output");
  if (opts_.batch_invariant) {
    linear_bf16_fixed(W.w, x, ldx, 0, M, y, y_dtype, ldy, 0, W.out, W.in, 1);
    return;
  }
  blas_.gemm({.x = x, .ldx = ldx, .w = W.w, .ldw = W.in, .y = y, .ldy = ldy, .in_dtype = W.dtype,
              .out_dtype = y_dtype, .M = M, .N = W.out, .K = W.in},
             stream_.get());
}

// Batch-invariant bf16 product: gemm_fp8w's bf16-weight path (K split fixed by the shape, each row
// reduced alone) instead of cuBLASLt, whose algorithm and split depend on M.
void CudaBackend::linear_bf16_fixed(const void* w, const void* x, int64_t ldx, int64_t bsx, int64_t M, void* y,
                                    DType y_dtype, int64_t ldy, int64_t bsy, int64_t n, int64_t k, int64_t batch) {
  oc::gemm_fp8w({.x = x, .ldx = ldx, .w_bf16 = w, .y = y, .ldy = ldy, .out_dtype = y_dtype, .M = M, .N = n, .K = k,
                 .batch = batch, .batch_stride_x = bsx, .batch_stride_y = bsy, .workspace = at<float>(L_.fp8_ws),
                 .workspace_bytes = L_.fp8_ws_bytes, .num_sms = info_.num_sms},
                stream_.get());
}

void CudaBackend::linear_grouped(const LinearRef& W, int64_t groups, const void* x, int64_t ldx, int64_t M, void* y,
                                 int64_t ldy) {
  const OpTimer::Scope op_scope_ = linear_scope("linear_grouped", W);
  if (M == 0) return;
  const int64_t R = W.out / groups, gin = W.in;
  if (W.dtype == DType::kF8E4M3) {
    linear_fp8(W, x, ldx, gin, M, y, act_, ldy, R, R, gin, groups);
    return;
  }
  if (opts_.batch_invariant) {
    linear_bf16_fixed(W.w, x, ldx, gin, M, y, act_, ldy, R, R, gin, groups);
    return;
  }
  blas_.gemm({.x = x, .ldx = ldx, .w = W.w, .ldw = gin, .y = y, .ldy = ldy, .in_dtype = W.dtype, .out_dtype = act_,
              .M = M, .N = R, .K = gin, .batch = groups, .batch_stride_x = gin, .batch_stride_w = R * gin,
              .batch_stride_y = R},
             stream_.get());
}

void CudaBackend::rmsnorm(const NormArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("rmsnorm");
  if (a.rows == 0) return;
  oc::rmsnorm({.x = a.x, .x_dtype = a.x_dtype, .x_stride = a.x_stride, .w = a.w, .w_dtype = DType::kF32, .y = a.y,
               .y_dtype = a.y_dtype, .y_stride = a.y_stride, .rows = a.rows, .dim = a.dim, .eps = a.eps},
              stream_.get());
}

void CudaBackend::rope(const RopeArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("rope");
  if (a.rows == 0) return;
  oc::rope({.x = a.x, .dtype = a.dtype, .row_stride = a.row_stride, .head_stride = a.head_dim, .rows = a.rows,
            .heads = a.heads, .head_dim = a.head_dim, .rope_dim = a.rope_dim, .pos = a.pos, .inv_freq = a.inv_freq,
            .inverse = a.inverse},
           stream_.get());
}

// The cache formats of V4's production numerics; rounding is skipped where the geometry does not
// allow it (as the reference does).
void CudaBackend::round_trip(void* x, DType dtype, int64_t row_stride, int64_t rows, int64_t dim, RowFormat f) {
  const OpTimer::Scope op_scope_ = op_scope("round_trip");
  if (rows == 0 || f == RowFormat::kPlain) return;
  switch (f) {
    case RowFormat::kFp8Nope64: {
      const int64_t qd = dim - arch_.dims.rope_dim;
      if (qd <= 0 || qd % 64 != 0) return;
      oc::fp8_round_trip({.x = x, .dtype = dtype, .row_stride = row_stride, .rows = rows, .quant_dims = qd, .block = 64,
                          .pow2_scale = true},
                         stream_.get());
      return;
    }
    case RowFormat::kFp4Hadamard32:
      if (dim % 32 != 0) return;
      oc::fp4_round_trip({.x = x, .dtype = dtype, .row_stride = row_stride, .rows = rows, .dim = dim,
                          .hadamard = dim == 128},
                         stream_.get());
      return;
    case RowFormat::kFp8Block32: case RowFormat::kFp4E4m3Block16: case RowFormat::kFp4Ue8m0Block32: {
      const oc::QatFormat q = f == RowFormat::kFp8Block32       ? oc::QatFormat::kFp8Ue8m0Block32
                              : f == RowFormat::kFp4E4m3Block16 ? oc::QatFormat::kFp4E4m3Block16
                                                                : oc::QatFormat::kFp4Ue8m0Block32;
      oc::qat_round_trip({.x = x, .dtype = dtype, .format = q, .rows = rows, .n = dim, .ld = row_stride},
                         stream_.get());
      return;
    }
    default:
      DI_THROW(InternalError, "cuda backend: cache format ", row_format_name(f), " is not implemented");
  }
}

void CudaBackend::add_position_bias(float* z, int64_t z_stride, const float* bias, const int64_t* pos, int64_t m,
                                    int64_t rows, int64_t width) {
  const OpTimer::Scope op_scope_ = op_scope("add_position_bias");
  cuda::add_position_bias({.z = z, .z_stride = z_stride, .bias = bias, .pos = pos, .m = m, .rows = rows, .width = width},
                          stream_.get());
}

void CudaBackend::compressor_pool(const PoolArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("compressor_pool");
  oc::compressor_pool({.a = a.a, .z = a.z, .row0 = a.row0, .n_rows = a.n_rows, .width = a.width,
                       .row_stride = a.row_stride, .ratio = a.ratio, .overlap = a.overlap,
                       .first_block = a.first_block, .n_blocks = a.n_blocks, .out = a.out},
                      stream_.get());
}

void CudaBackend::decode_pool(const DecodePoolArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("decode_pool");
  cuda::decode_pool({.stage = a.stage, .ld = a.ld, .block = a.block, .tokens = a.tokens,
                     .rows_per_token = a.rows_per_token, .width = a.width, .ratio = a.ratio, .overlap = a.overlap,
                     .out = a.out},
                    stream_.get());
}

void CudaBackend::indexer_topk(const IndexerArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("indexer_topk");
  // Two-level top-k (V4.1): the publisher's per-block maxima live in the arena's block_scores
  // (sized from the step's candidates and Dims::candidate_block_size). Run by V4.1 on the H200.
  oc::indexer_topk({.q = a.q, .w = a.w, .k_pool = a.k_pool, .dtype = act_, .cand_rows = a.cand_rows,
                    .cand_offset = a.cand_offset, .cand_count = a.cand_count, .num_tokens = a.num_tokens,
                    .num_heads = a.num_heads, .head_dim = a.head_dim, .qk_scale = a.qk_scale, .w_scale = a.w_scale,
                    .topk = a.topk, .max_candidates = a.max_candidates, .scores = at<float>(L_.scores),
                    .out_rows = a.out_rows, .out_count = a.out_count, .block_size = a.block_size,
                    .topk_blocks = a.topk_blocks, .out_blocks = a.out_blocks, .in_blocks = a.in_blocks,
                    .block_scores = a.out_blocks ? at<float>(L_.block_scores) : nullptr},
                   stream_.get());
}

void CudaBackend::sparse_attention(const AttentionArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("sparse_attention");
  oc::SparseAttnParams sp{.q = a.q, .q_stride = a.q_stride, .win_kv = a.win_kv, .cmp_kv = a.cmp_kv,
                          .kv_stride = a.kv_stride, .dtype = act_, .win_begin = a.win_begin, .win_count = a.win_count,
                          .cmp_rows = a.cmp_rows, .cmp_offset = a.cmp_offset, .cmp_count = a.cmp_count,
                          .sink = a.sink, .scale = a.scale, .out = a.out, .out_stride = a.out_stride,
                          .num_tokens = a.num_tokens, .num_heads = a.num_heads, .head_dim = a.head_dim};
  if (split_.num_splits > 1) {
    sp.num_splits = split_.num_splits;
    sp.split_keys = split_.split_keys;
    sp.workspace = at<float>(L_.attn_ws);
  }
  if (!opts_.batch_invariant || split_.num_splits <= 1) {
    oc::sparse_attention(sp, stream_.get());
    return;
  }
  // Batch-invariant splits: launches of at most kInvariantSplitPartials (token x split) partials
  // reuse one workspace; a token's result does not depend on which launch computes it.
  const int64_t chunk = std::max<int64_t>(1, kInvariantSplitPartials / split_.num_splits);
  const size_t elem = act_ == DType::kF32 ? 4 : 2;
  for (int64_t t0 = 0; t0 < a.num_tokens; t0 += chunk) {
    oc::SparseAttnParams c = sp;
    c.num_tokens = std::min(chunk, a.num_tokens - t0);
    c.q = static_cast<const char*>(a.q) + t0 * a.q_stride * int64_t(elem);
    c.out = static_cast<char*>(a.out) + t0 * a.out_stride * int64_t(elem);
    c.win_begin = a.win_begin + t0;
    c.win_count = a.win_count + t0;
    if (a.cmp_count) {
      c.cmp_offset = a.cmp_offset + t0;
      c.cmp_count = a.cmp_count + t0;
    }
    oc::sparse_attention(c, stream_.get());
  }
}

void CudaBackend::hc_site(const HcSiteArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("hc_site");
  const Dims& g = arch_.dims;
  oc::hc_pre({.x = a.x, .dtype = DType::kF32, .x_stride = g.streams * g.hidden, .fn = a.w->fn.p, .base = a.w->base.p,
              .scale = a.w->scale.p, .u = a.u, .u_stride = g.hidden, .mix = a.mix,
              .workspace = at<float>(a.head ? L_.head_ws : L_.hc_ws), .tokens = a.tokens, .n = int(g.streams),
              .dim = g.hidden, .mode = a.head ? oc::HcMode::kHead : oc::HcMode::kLayer,
              .sinkhorn_iters = int(g.sinkhorn_iters), .norm_eps = g.eps, .hc_eps = g.hc_eps, .h = a.h,
              .h_dtype = a.h_dtype, .h_stride = g.hidden, .h_w = a.norm_w, .h_eps = a.norm_eps},
             stream_.get());
}

// The site's norm goes into hc_pre's single launch (a second cluster barrier, then one block norms
// the row: the same bits as rmsnorm) where that launch is taken: decode steps of 1..8 tokens.
bool CudaBackend::hc_site_norms(int64_t tokens, DType h_dtype) const {
  const Dims& g = arch_.dims;
  return (h_dtype == DType::kBF16 || h_dtype == DType::kF32) &&
         oc::hc_pre_single_launch(tokens, int(g.streams), g.hidden, oc::HcMode::kLayer, true);
}

void CudaBackend::hc_post(const HcPostArgs& a) {
  const OpTimer::Scope op_scope_ = op_scope("hc_post");
  const Dims& g = arch_.dims;
  const int64_t nD = g.streams * g.hidden;
  oc::hc_post({.x = a.x, .x_stride = nD, .y = a.y, .y_stride = g.hidden, .mix = a.mix, .out = a.out, .out_stride = nD,
               .dtype = DType::kF32, .tokens = a.tokens, .n = int(g.streams), .dim = g.hidden},
              stream_.get());
}

void CudaBackend::hc_collapse(const float* x, const float* prev_mix, float* u, int64_t tokens) {
  const OpTimer::Scope op_scope_ = op_scope("hc_collapse");
  const Dims& g = arch_.dims;
  const int64_t nD = g.streams * g.hidden;
  oc::hc_collapse({.x = x, .x_stride = nD, .w = prev_mix, .w_stride = g.mix_dim(), .u = u, .u_stride = g.hidden,
                   .dtype = DType::kF32, .tokens = tokens, .n = int(g.streams), .dim = g.hidden},
                  stream_.get());
}

void CudaBackend::stream_mean(const float* x, float* out, int64_t out_stride, int64_t tokens) {
  const OpTimer::Scope op_scope_ = op_scope("stream_mean");
  cuda::stream_mean(x, out, out_stride, tokens, arch_.dims.streams, arch_.dims.hidden, stream_.get());
}

void CudaBackend::add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim) {
  const OpTimer::Scope op_scope_ = op_scope("add_streams");
  cuda::add_streams(x, v, tokens, streams, dim, stream_.get());
}

// ---- MoE: the local implementation of the seam ----

oc::ExpertFormat expert_format(DType d) {
  return d == DType::kFP4E2M1 ? oc::ExpertFormat::kFP4 : d == DType::kF8E4M3 ? oc::ExpertFormat::kFP8
                                                                              : oc::ExpertFormat::kPlain;
}

CudaBackend::MoePath CudaBackend::moe_path(const MoeRef& M) const {
  const Dims& g = arch_.dims;
  // Fixed plans: moe_decode up to its size, above it the grouped path (fixed_limits() allows
  // larger fixed steps only when that path exists). Batch-invariant: decode's experts go through
  // the grouped GEMM as prefill's do (moe_decode sums in another order), so a token's result does
  // not depend on the step's path.
  if (plan_.fixed && !opts_.batch_invariant) {
    if (plan_.T <= kMoeDecodeGroupedMaxTokens && moe_decode_grouped_supported(act_, g.hidden, g.moe_inter))
      return MoePath::kFixedGrouped;
    if (plan_.T <= kMoeDecodeMaxTokens) return MoePath::kFixed;
  }
  if (act_ == DType::kBF16 && !M.host_routed && g.moe_inter % 32 == 0 && g.hidden % 32 == 0) return MoePath::kGrouped;
  DI_CHECK(!plan_.fixed, "fixed-shape step of ", plan_.T, " tokens without the grouped MoE path");
  return MoePath::kHostRouted;
}

void CudaBackend::moe_route(const MoeRef& M, const float* logits, int32_t* ids, float* wts) {
  const OpTimer::Scope op_scope_ = op_scope("moe_route");
  const Dims& g = arch_.dims;
  const bool hash = M.tid2eid != nullptr;
  oc::router({.logits = logits, .logits_stride = g.experts, .bias = hash ? nullptr : M.bias.p,
              .tid2eid = hash ? M.tid2eid : nullptr, .tid2eid_dtype = DType::kI32, .token_ids = index_.token_ids,
              .vocab = hash ? M.tid2eid_rows : 0, .expert_ids = ids, .weights = wts, .tokens = plan_.T,
              .num_experts = int(g.experts), .topk = int(g.topk), .route_scale = g.routed_scale,
              .gate_temp = g.gate_temp},
             stream_.get());
}

void CudaBackend::moe_dispatch(const MoeRef& M) {
  const OpTimer::Scope op_scope_ = op_scope("moe_dispatch");
  ep_step_ = ep_ && M.ep_layer >= 0;
  if (ep_step_) return ep_dispatch(M);
  const Dims& g = arch_.dims;
  const int64_t T = plan_.T, D = g.hidden, E = g.experts, K = g.topk;
  const cudaStream_t st = stream_.get();
  switch (moe_path(M)) {
    case MoePath::kFixed: return;  // moe_decode reads the device-side ids directly
    case MoePath::kFixedGrouped:   // the permutation by expert on the device, no host sync
    case MoePath::kGrouped: {
      const int tile_m = moe_path(M) == MoePath::kGrouped ? oc::kGroupedTileM : kMoeDecodeTileM;
      oc::moe_route({.ids = at<int32_t>(L_.buf[size_t(Buf::kIds)]), .weights = at<float>(L_.buf[size_t(Buf::kWts)]),
                     .tokens = T, .topk = K, .experts = E, .tile_m = tile_m,
                     .seg = at<int32_t>(L_.moe_seg), .perm_src = at<int64_t>(L_.perm_src),
                     .perm_w = at<float>(L_.perm_w), .comb = at<int64_t>(L_.comb_rows),
                     .tiles = at<int32_t>(L_.moe_tiles), .num_tiles = at<int32_t>(L_.moe_ntiles),
                     .max_tiles = oc::moe_route_max_tiles(T * K, E, tile_m)},
                    st);
      return;
    }
    case MoePath::kHostRouted: break;
  }
  // Exact numerics (f32, the parity path): per-expert cuBLASLt fp32 GEMMs, whose shapes come from
  // the per-expert row counts: read the routing back (one sync per layer) and sort the (token, k)
  // assignments by expert (stable: tokens ascending within an expert).
  moe_ids_.resize(size_t(T * K));
  moe_wts_.resize(size_t(T * K));
  dc::copy_d2h(moe_ids_.data(), buf(Buf::kIds), size_t(T * K) * 4, st, false);
  dc::copy_d2h(moe_wts_.data(), buf(Buf::kWts), size_t(T * K) * 4, st, true);
  moe_offset_.assign(size_t(E + 1), 0);
  for (int64_t i = 0; i < T * K; ++i) {
    const int32_t e = moe_ids_[size_t(i)];
    if (e < 0 || e >= E)
      DI_THROW(InvalidArgument, "moe: router gave expert id ", e, " for token ", i / K, " (experts: ", E,
               "); is a hash table entry out of range?");
    moe_offset_[size_t(e + 1)]++;
  }
  for (int64_t e = 0; e < E; ++e) moe_offset_[size_t(e + 1)] += moe_offset_[size_t(e)];
  std::vector<int64_t> next(moe_offset_.begin(), moe_offset_.end() - 1);
  moe_perm_src_.resize(size_t(T * K));
  moe_perm_w_.resize(size_t(T * K));
  moe_comb_.resize(size_t(T * K));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t a = next[size_t(moe_ids_[size_t(t * K + k)])]++;
      moe_perm_src_[size_t(a)] = t;
      moe_perm_w_[size_t(a)] = moe_wts_[size_t(t * K + k)];
      moe_comb_[size_t(t * K + k)] = a;
    }
  dc::copy_h2d(at<int64_t>(L_.perm_src), moe_perm_src_.data(), size_t(T * K) * 8, st, false);
  dc::copy_h2d(at<float>(L_.perm_w), moe_perm_w_.data(), size_t(T * K) * 4, st, false);
  dc::copy_h2d(at<int64_t>(L_.comb_rows), moe_comb_.data(), size_t(T * K) * 8, st, false);
  cuda::gather_rows({.src_a = buf(Buf::kH), .a_stride = D, .src_dtype = act_, .src_index = at<int64_t>(L_.perm_src),
                     .dst = at<char>(L_.xe), .dst_stride = D, .dst_dtype = act_, .rows = T * K, .width = D},
                    st);
}

// SwiGLU over `rows` rows of gu [rows, 2I] (gate | up) into act [rows, I], both act_.
void CudaBackend::swiglu_rows(void* gu, void* act, const float* row_weight, int64_t rows) {
  if (rows == 0) return;
  const int64_t I = arch_.dims.moe_inter;
  oc::swiglu({.gate = gu, .gate_stride = 2 * I, .up = static_cast<char*>(gu) + I * int64_t((dtype_bits(act_) / 8)),
              .up_stride = 2 * I, .in_dtype = act_, .row_weight = row_weight, .out = act, .out_stride = I,
              .out_dtype = act_, .rows = rows, .inter = I, .limit = arch_.dims.swiglu_limit},
             stream_.get());
}

void CudaBackend::moe_experts(const MoeRef& M) {
  const OpTimer::Scope op_scope_ = op_scope("moe_experts");
  if (ep_step_) return ep_experts(M);
  const Dims& g = arch_.dims;
  const int64_t T = plan_.T, D = g.hidden, E = g.experts, K = g.topk, I = g.moe_inter;
  const int64_t ab = int64_t((dtype_bits(act_) / 8));
  const cudaStream_t st = stream_.get();
  switch (moe_path(M)) {
    case MoePath::kFixed:  // routed experts from device-side ids (moe_decode.h, no host sync)
      moe_decode({.x = buf(Buf::kH), .expert_ids = at<int32_t>(L_.buf[size_t(Buf::kIds)]),
                  .weights = at<float>(L_.buf[size_t(Buf::kWts)]), .w13 = M.tables.w13, .w2 = M.tables.w2,
                  .format = expert_format(M.tables.dtype), .w13_scale = M.tables.w13_scale,
                  .w2_scale = M.tables.w2_scale, .act = at<void>(L_.act), .ye = at<float>(L_.ye), .tokens = T,
                  .topk = K, .num_experts = E, .dim = D, .inter = I, .dtype = act_, .limit = g.swiglu_limit},
                 st);
      return;
    case MoePath::kFixedGrouped:  // each touched expert read once for all its tokens (moe_decode.h)
      moe_decode_grouped({.x = buf(Buf::kH), .seg = at<int32_t>(L_.moe_seg), .perm_src = at<int64_t>(L_.perm_src),
                          .perm_w = at<float>(L_.perm_w), .tiles = at<int32_t>(L_.moe_tiles),
                          .num_tiles = at<int32_t>(L_.moe_ntiles),
                          .max_tiles = oc::moe_route_max_tiles(T * K, E, kMoeDecodeTileM), .w13 = M.tables.w13,
                          .w2 = M.tables.w2, .format = expert_format(M.tables.dtype), .w13_scale = M.tables.w13_scale,
                          .w2_scale = M.tables.w2_scale, .act = at<void>(L_.act), .ye = at<float>(L_.ye), .tokens = T,
                          .topk = K, .num_experts = E, .dim = D, .inter = I, .limit = g.swiglu_limit},
                         st);
      return;
    case MoePath::kGrouped: {
      // Grouped GEMMs over the expert segments reading the weights as stored (bf16, FP4 or FP8);
      // the up GEMM gathers h rows through perm_src; its output is rounded to bf16 as cuBLASLt's was.
      const int64_t max_tiles = oc::moe_route_max_tiles(T * K, E, oc::kGroupedTileM);
      oc::GroupedGemmParams gp{.x = buf(Buf::kH), .ldx = D, .x_rows = at<int64_t>(L_.perm_src), .w = M.tables.w13,
                               .scale = M.tables.w13_scale, .format = expert_format(M.tables.dtype),
                               .seg = at<int32_t>(L_.moe_seg), .tiles = at<int32_t>(L_.moe_tiles),
                               .num_tiles = at<int32_t>(L_.moe_ntiles), .max_tiles = max_tiles, .experts = E,
                               .N = 2 * I, .K = D, .y = at<void>(L_.gu), .ldy = 2 * I, .y_dtype = act_};
      oc::grouped_gemm(gp, st);
      // Routed weight applied before W2, as the reference does. Rows of invalid ids (past seg[E])
      // hold stale values here; the combine skips them (comb = -1).
      swiglu_rows(at<void>(L_.gu), at<void>(L_.act), at<float>(L_.perm_w), T * K);
      gp.x = at<void>(L_.act);
      gp.ldx = I;
      gp.x_rows = nullptr;
      gp.w = M.tables.w2;
      gp.scale = M.tables.w2_scale;
      gp.N = D;
      gp.K = I;
      gp.y = at<float>(L_.ye);
      gp.ldy = D;
      gp.y_dtype = DType::kF32;
      oc::grouped_gemm(gp, st);
      return;
    }
    case MoePath::kHostRouted: break;
  }
  char* xe = at<char>(L_.xe);
  char* gu = at<char>(L_.gu);
  char* act = at<char>(L_.act);
  float* ye = at<float>(L_.ye);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a0 = moe_offset_[size_t(e)], n = moe_offset_[size_t(e + 1)] - a0;
    if (n > 0) linear(M.experts[size_t(e)].w13, xe + a0 * D * ab, D, n, gu + a0 * 2 * I * ab, act_, 2 * I);
  }
  swiglu_rows(gu, act, at<float>(L_.perm_w), T * K);  // routed weight before W2, as the reference does
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a0 = moe_offset_[size_t(e)], n = moe_offset_[size_t(e + 1)] - a0;
    if (n > 0) linear(M.experts[size_t(e)].w2, act + a0 * I * ab, I, n, ye + a0 * D, DType::kF32, D);
  }
}

// Shared expert: h [T, D] -> shared [T, D] f32 (gu/act reused: same stream, routed work queued before).
void CudaBackend::moe_shared(const MoeRef& M) {
  const OpTimer::Scope op_scope_ = op_scope("moe_shared");
  const Dims& g = arch_.dims;
  const int64_t T = plan_.T, D = g.hidden, I = g.moe_inter;
  linear(M.shared.w13, buf(Buf::kH), D, T, at<void>(L_.gu), act_, 2 * I);
  swiglu_rows(at<void>(L_.gu), at<void>(L_.act), nullptr, T);
  linear(M.shared.w2, at<void>(L_.act), I, T, buf(Buf::kShared), DType::kF32, D);
}

void CudaBackend::moe_combine(const MoeRef& M) {
  const OpTimer::Scope op_scope_ = op_scope("moe_combine");
  if (ep_step_) return ep_combine();
  const Dims& g = arch_.dims;
  const int64_t* rows = moe_path(M) == MoePath::kFixed ? index_.comb_rows : at<int64_t>(L_.comb_rows);
  cuda::moe_combine({.ye = at<float>(L_.ye), .rows = rows, .shared = at<float>(L_.buf[size_t(Buf::kShared)]),
                     .out = at<float>(L_.buf[size_t(Buf::kY)]), .tokens = plan_.T, .topk = g.topk, .dim = g.hidden},
                    stream_.get());
}

}  // namespace deepinfer::model::ds::cuda
