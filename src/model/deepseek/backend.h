// The ops the shared DeepSeek forward (forward.h) runs, behind one interface per backend: the CPU
// backend (fp32, ops::cpu, the reference that runs in CI) and the CUDA backend (ops::cuda and the
// model's glue kernels; general and fixed-shape steps). The forward owns the wiring (which op on
// which buffer, in which order); a backend owns storage (weights, cache pools, the step's
// buffers), dtypes and kernels. Every op is enqueued on the backend's step stream; none
// synchronises the host (the CUDA backend's exact-numerics MoE dispatch is the one documented
// exception). Shapes and index conventions follow the ops::cpu references they wrap.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "kv/kv_cache.h"
#include "model/causal_lm.h"
#include "model/deepseek/prepared.h"
#include "model/plan/layer_plan.h"
#include "model/plan/step_plan.h"

namespace deepinfer::model::ds {
class ExpertParallel;  // expert_parallel.h
class ContextParallel;  // context_parallel.h
class ExpertWeightStore;  // expert_weights.h


// Named activation buffers of one step (sizes: activations.h). "act" buffers are in the backend's
// activation dtype (Backend::act(): f32 on the CPU and in exact GPU numerics, else bf16); the rest
// are f32 or int32 as noted.
enum class Buf : uint8_t {
  kX, kX2,            // f32 [T, n, D] residual streams (ping-pong)
  kU,                 // f32 [T, D] collapsed block input
  kMix,               // f32 [T, (2+n)n] mHC site mixes
  kMix2,              // f32 [T, (2+n)n] single-pass mHC: the FFN site's mixes (its pre feeds the next site)
  kH,                 // act [T, D] normed block input
  kY,                 // f32 [T, D] block output
  kQa,                // f32 [T, r]
  kQaN,               // act [T, r] q_norm(qa)
  kQf,                // f32 [T, H*d]
  kQ,                 // act [T, H*d]
  kKvf,               // f32 [T, d]
  kKv,                // act [T, d]
  kO,                 // act [T, H*d] attention output
  kZo,                // act [T, G*R] grouped output projection
  kWin,               // act [win rows, d] staged window keys
  kAz, kStage, kEnt,  // f32 compressor: [T, 2c], [stage rows, 2c], [entries, d]
  kIaz, kIstage, kIent,  // f32 key compressor
  kEntAct,            // act [entries, d] entries as linear input (keys from the latent; act != f32 only)
  kQi,                // act [T, Hi*di] indexer queries
  kIw,                // f32 [T, Hi] indexer head weights
  kSelRows, kSelCount,// i32 [T, topk], [T] selected entries
  kCandBlocks,        // i32 [T, candidate_topk_blocks] the candidate source's blocks (two-level top-k)
  kEngramKv,          // f32 [T, (n+1)D] Engram rows through wkv (key n·D, value D)
  kRouterLogits,      // f32 [T, E]
  kIds, kWts,         // i32 / f32 [T, K] routing
  kShared,            // f32 [T, D] shared expert output
  kSel, kHu, kHh,     // head: f32 [R, n, D], f32 [R, D], act [R, D]
  kLogits,            // f32 [R, V]
  kHidden,            // f32 [Rh, n, D] hidden rows returned
  kHs,                // act [T, n, D] MTP: normed target streams
  kTaps,              // f32 [T, taps·D] DSpark taps (V4.1): stream means at the tap layers' inputs
  kCount
};

// The step plan's index lists as the backend's kernels read them (device copies on the GPU,
// the plan's own vectors on the CPU). Pointers follow StepPlan's fields.
struct KindIndex {
  const CompressPlan* host = nullptr;
  const int64_t *stage_src = nullptr, *entry_pos = nullptr, *entry_dst = nullptr;
  const int64_t *state_src = nullptr, *state_dst = nullptr, *cand_offset = nullptr;
  const int32_t *cand_rows = nullptr, *cand_count = nullptr;
  const int64_t *stage_dst = nullptr, *block = nullptr;  // fixed shape only
};
struct StepIndex {
  const int32_t* token_ids = nullptr;
  const int64_t *pos = nullptr, *embed_src = nullptr, *win_src = nullptr, *win_store_src = nullptr,
                *win_store_dst = nullptr, *sel_offset = nullptr, *logits_rows = nullptr, *hidden_rows = nullptr;
  const int32_t *win_begin = nullptr, *win_count = nullptr;
  const int32_t *tail_win_begin = nullptr, *tail_win_count = nullptr;  // null: the replay_tail layers use win_*
  const int64_t *win_dst = nullptr, *comb_rows = nullptr;  // fixed shape only
  std::vector<KindIndex> kinds;                             // parallel to StepPlan::kinds
};

// dst[dst_index[i]] = cast(src row i'), i' = src_index[i] (>= 0: row of src_a; < 0: row -i'-1 of
// src_b); null index = identity; dst_index[i] < 0 skips row i (fixed-shape pads).
struct GatherArgs {
  const void* src_a = nullptr;
  int64_t a_stride = 0;
  const void* src_b = nullptr;
  int64_t b_stride = 0;
  DType src_dtype = DType::kF32;
  const int64_t* src_index = nullptr;
  void* dst = nullptr;
  int64_t dst_stride = 0;
  DType dst_dtype = DType::kF32;
  const int64_t* dst_index = nullptr;
  int64_t rows = 0, width = 0;
};

// One product of Backend::linear_many: y[M, W.out] = x · Wᵀ, x and M shared by the call.
struct LinearJob {
  const LinearRef* W = nullptr;
  void* y = nullptr;              // [M, W.out] y_dtype, row stride ldy >= W.out
  DType y_dtype = DType::kF32;
  int64_t ldy = 0;
};

struct NormArgs {       // y = w ⊙ x / sqrt(mean(x²) + eps) per row (w null: unweighted)
  const void* x = nullptr;
  DType x_dtype = DType::kF32;
  int64_t x_stride = 0;
  const float* w = nullptr;
  void* y = nullptr;
  DType y_dtype = DType::kF32;
  int64_t y_stride = 0;
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
};

struct RopeArgs {       // rotates the trailing rope_dim of each head at its position (inverse: back)
  void* x = nullptr;
  DType dtype = DType::kF32;
  int64_t row_stride = 0, rows = 0, heads = 0, head_dim = 0, rope_dim = 0;
  const int64_t* pos = nullptr;
  const float* inv_freq = nullptr;
  bool inverse = false;
};

struct PoolArgs {       // one sequence's compressor blocks (ops::cpu::CompressorPoolArgs)
  const float* a = nullptr;
  const float* z = nullptr;
  int64_t row0 = 0, n_rows = 0, width = 0, row_stride = 0, ratio = 0;
  bool overlap = false;
  int64_t first_block = 0, n_blocks = 0;
  float* out = nullptr;
};

struct DecodePoolArgs { // fixed shape: one block per token at most, block index from `block`
  const float* stage = nullptr;
  int64_t ld = 0;
  const int64_t* block = nullptr;
  int64_t tokens = 0, rows_per_token = 0, width = 0, ratio = 0;
  bool overlap = false;
  float* out = nullptr;
};

struct IndexerArgs {    // ops::cpu::IndexerArgs over the backend's buffers
  const void* q = nullptr;
  const float* w = nullptr;
  const void* k_pool = nullptr;
  const int32_t* cand_rows = nullptr;
  const int64_t* cand_offset = nullptr;
  const int32_t* cand_count = nullptr;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;
  float qk_scale = 1.f, w_scale = 1.f;
  int64_t topk = 0, max_candidates = 0;
  int32_t* out_rows = nullptr;
  int32_t* out_count = nullptr;
  // Two-level top-k (V4.1; ops/cpu/indexer.h): entries per candidate block and blocks kept; the
  // candidate source publishes into out_blocks, a later index source consumes in_blocks.
  int64_t block_size = 0, topk_blocks = 0;
  int32_t* out_blocks = nullptr;
  const int32_t* in_blocks = nullptr;
};

struct AttentionArgs {  // ops::cpu::SparseAttnArgs over the backend's buffers
  const void* q = nullptr;
  int64_t q_stride = 0;
  const void* win_kv = nullptr;
  int64_t kv_stride = 0;
  const int32_t* win_begin = nullptr;
  const int32_t* win_count = nullptr;
  const void* cmp_kv = nullptr;
  const int32_t* cmp_rows = nullptr;
  const int64_t* cmp_offset = nullptr;
  const int32_t* cmp_count = nullptr;
  const float* sink = nullptr;
  float scale = 1.f;
  void* out = nullptr;
  int64_t out_stride = 0;
  int64_t num_tokens = 0, num_heads = 0, head_dim = 0;
  int64_t max_keys = 0;  // upper bound of window + compressed keys of a token (split-KV sizing)
};

struct HcSiteArgs {     // one mHC site: collapse X into u and the site's mixes
  const float* x = nullptr;  // [T, n, D]
  const HcRef* w = nullptr;
  float* u = nullptr;        // [T, D]; null (layer): the mixes only (single-pass wiring), the site's
                             // pre weights kept in `mix` for a later hc_collapse
  float* mix = nullptr;      // [T, (2+n)n] (layer; backend layout) or null (head)
  int64_t tokens = 0;
  bool head = false;         // the final collapse (hc_head: pre weights only)
  // The site's RMSNorm fused in (only where hc_site_norms(tokens)): h = rmsnorm(u, eps) · norm_w,
  // the same bits as rmsnorm on u. Null h: the caller norms u itself.
  const float* norm_w = nullptr;  // [D] f32
  void* h = nullptr;              // [T, D] h_dtype
  DType h_dtype = DType::kBF16;
  float norm_eps = 0.f;
};
struct HcPostArgs {     // X'_k = post_k y + Σ_j C[j,k] X_j
  const float* x = nullptr;
  const float* y = nullptr;
  const float* mix = nullptr;
  float* out = nullptr;
  int64_t tokens = 0;
};

// A layer's cache storage in backend memory (kv/kv_cache.h layouts; null where the layer owns none).
struct LayerCacheRef {
  void* window = nullptr;        // act [slots*ring_rows, d]
  void* entries = nullptr;       // act [blocks*epb, d]
  void* keys = nullptr;          // act [blocks*epb, index_dim]
  float* state = nullptr;        // f32 [slots*state_rows, 2c]
  float* index_state = nullptr;  // f32 [slots*index_state_rows, 2*index_width]
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DType act() const = 0;                       // activation storage dtype
  virtual void* buf(Buf b) const = 0;                  // this step's buffer
  template <typename T>
  T* at(Buf b) const { return static_cast<T*>(buf(b)); }
  virtual const StepPlan& plan() const = 0;
  virtual const StepIndex& index() const = 0;
  virtual LayerCacheRef cache(int64_t layer) = 0;  // main layers, then drafter blocks
  // The context-parallel group whose split steps the forward's attention core follows
  // (context_parallel.h); null: every step runs whole on this rank.
  virtual ContextParallel* context_parallel() const { return nullptr; }
  // A split step's all-gather of the attention output rows buf [T, row_bytes] (this step's buffer):
  // host buffers go to the group as they are (ContextParallel::gather_rows); a device backend
  // stages them through the host.
  virtual void gather_cp_rows(ContextParallel& cp, void* buf, int64_t T, int64_t row_bytes);

  virtual void gather(const GatherArgs& a) = 0;
  // y[M, out] = x[M, in] W^T (x in act(), fp32 accumulation, y in y_dtype).
  virtual void linear(const LinearRef& W, const void* x, int64_t ldx, int64_t M, void* y, DType y_dtype,
                      int64_t ldy) = 0;
  // Block-diagonal grouped projection (V4 wo_a): group g of x (columns [g*in, (g+1)*in)) through
  // rows [g*out_g, (g+1)*out_g) of W into columns [g*out_g, ...) of y (act()).
  virtual void linear_grouped(const LinearRef& W, int64_t groups, const void* x, int64_t ldx, int64_t M, void* y,
                              int64_t ldy) = 0;
  // Several linears that read the same x [M, in] (each job's W.in; V4: wq_a and wkv on the
  // attention-normed h): each job's y exactly as its own `linear` call gives it, so a backend may
  // only merge work that keeps every output's bits (the CUDA backend: FP8 weights whose gemm_fp8w
  // K splits agree run as one gemm_fp8w_multi launch). x and M in the signature, not per job: the
  // one case worth merging is a shared input, and the type then says so. Jobs run in span order
  // as far as anyone can observe (their outputs must not overlap each other or x).
  virtual void linear_many(const void* x, int64_t ldx, int64_t M, std::span<const LinearJob> jobs) {
    for (const LinearJob& j : jobs) linear(*j.W, x, ldx, M, j.y, j.y_dtype, j.ldy);
  }
  virtual void rmsnorm(const NormArgs& a) = 0;
  virtual void rope(const RopeArgs& a) = 0;
  // Rounds rows through a cache format in place (RowFormat::kPlain: nothing).
  virtual void round_trip(void* x, DType dtype, int64_t row_stride, int64_t rows, int64_t dim, RowFormat f) = 0;
  // z[t, e] += bias[pos[t] mod m, e] (compressor ape, f32).
  virtual void add_position_bias(float* z, int64_t z_stride, const float* bias, const int64_t* pos, int64_t m,
                                 int64_t rows, int64_t width) = 0;
  virtual void compressor_pool(const PoolArgs& a) = 0;
  virtual void decode_pool(const DecodePoolArgs& a) = 0;
  virtual void indexer_topk(const IndexerArgs& a) = 0;
  virtual void sparse_attention(const AttentionArgs& a) = 0;
  virtual void hc_site(const HcSiteArgs& a) = 0;
  // Whether hc_site norms u into h itself at this token count (HcSiteArgs::h): one launch less.
  virtual bool hc_site_norms(int64_t tokens, DType h_dtype) const { return false; }
  virtual void hc_post(const HcPostArgs& a) = 0;
  // Single-pass mHC (V4.1): u [T, D] = Σ_k pre_k X_k with the pre weights of the site whose mixes
  // are in `prev_mix` (an hc_site with u null), or u = X stream 0 when prev_mix is null.
  virtual void hc_collapse(const float* x, const float* prev_mix, float* u, int64_t tokens) = 0;
  // out[t * out_stride + c] = mean over the n streams of x[t, :, c] (DSpark taps, V4.1).
  virtual void stream_mean(const float* x, float* out, int64_t out_stride, int64_t tokens) {
    DI_THROW(InvalidArgument, "this backend does not compute DSpark taps yet");
  }
  // x[t, j, :] += v[t, :] for every stream j (the MTP block's embedding term).
  virtual void add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim) = 0;
  // V4.1 Engram: the step's table rows of main layer `layer`, [T, columns·head_dim] in act(), as
  // ModelBackend::stage_engram_rows staged them; and the gated injection X[t, k] += gate_k · value
  // (ops engram_inject) from kv [T, (n+1)D] f32 and w = q_weight ⊙ k_weight [n, D].
  virtual const void* engram_rows(int64_t layer) const {
    DI_THROW(InvalidArgument, "this backend does not run Engram layers yet (layer ", layer, ")");
  }
  virtual void engram_inject(float* x, const float* kv, const float* w, int64_t tokens) {
    DI_THROW(InvalidArgument, "this backend does not run Engram layers yet");
  }

  // ---- MoE seam: route -> dispatch -> experts -> combine (expert parallelism plugs into
  // dispatch/combine; a rank with no local tokens still calls every step) ----
  // ids/wts [T, K] from the router logits (the forward computed them with `linear`).
  virtual void moe_route(const MoeRef& M, const float* logits, int32_t* ids, float* wts) = 0;
  // Groups the step's (token, k) assignments by expert (local permutation; EP: all-to-all).
  virtual void moe_dispatch(const MoeRef& M) = 0;
  // Routed expert outputs of every dispatched assignment (backend scratch).
  virtual void moe_experts(const MoeRef& M) = 0;
  // The shared expert of h into shared [T, D] f32.
  virtual void moe_shared(const MoeRef& M) = 0;
  // y [T, D] f32 = Σ routed (fixed per-token order) + shared.
  virtual void moe_combine(const MoeRef& M) = 0;
};

// A backend as a model drives it: its prepared weights, its cache storage and the step lifecycle
// (plan -> launches -> outputs). DeepseekModel (model.h) is written against this only.
class ModelBackend : public Backend {
 public:
  virtual std::string describe() const = 0;           // "cpu fp32", "cuda bf16 (production) on H200", ...
  virtual const ModelRef& weights() const = 0;
  virtual bool logits_on_device() const { return false; }  // CausalLM::supports_device_logits
  // The forward takes part in collectives (expert parallelism): every rank must run every step,
  // also with an empty batch (CausalLM::joins_collectives).
  virtual bool joins_collectives() const { return false; }
  // Expert parallelism (expert_parallel.h); backends without it refuse, naming themselves.
  virtual void set_expert_parallel(std::shared_ptr<ExpertParallel> ep) {
    DI_THROW(InvalidArgument, describe(), ": expert parallelism is not implemented on this backend yet");
  }
  // Context parallelism for long prefills (context_parallel.h); backends without it refuse.
  virtual void set_context_parallel(std::shared_ptr<ContextParallel> cp) {
    DI_THROW(InvalidArgument, describe(), ": context parallelism is not implemented on this backend yet");
  }
  // The routed-expert weights as a store EPLB can move between ranks (expert_weights.h); null on a
  // backend that cannot move them (a sharded model then refuses EPLB).
  virtual ExpertWeightStore* expert_weight_store() { return nullptr; }
  virtual void synchronize() {}                              // waits for the step stream (timing)
  // V4.1 Engram rows of the next step, per main layer ([T, columns·head_dim] f32 host rows; empty
  // for layers without Engram), gathered by the model once the step's tokens are known.
  virtual void stage_engram_rows(std::vector<std::vector<float>> rows) {
    DI_THROW(InvalidArgument, describe(), ": Engram layers are not implemented on this backend yet");
  }
  // The same rows as table ids, for a backend that gathers and widens them itself (the CUDA
  // backend uploads the stored FP8 codes + E8M0 scales and widens them on the device): per main
  // layer, the table (null: no Engram there) and the step's row ids [T·columns], checked against
  // it. Returns false on a backend that does not (the model then widens on the host and calls
  // stage_engram_rows).
  struct EngramStepIds {
    const EngramRef* table = nullptr;
    std::vector<int64_t> ids;
  };
  virtual bool stage_engram_ids(const std::vector<EngramStepIds>& layers) { return false; }

  // Cache storage for the model's layer specs (fixed at construction).
  virtual kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const = 0;
  virtual void allocate_cache(const kv::CacheGeometry& geometry) = 0;
  virtual bool cache_allocated() const = 0;
  virtual const kv::CacheGeometry& cache_geometry() const = 0;
  virtual void reset_slot(int32_t slot) = 0;
  virtual SlotSnapshot save_slot(int32_t slot, int64_t num_tokens) = 0;
  virtual void restore_slot(int32_t slot, const SlotSnapshot& snapshot) = 0;
  // CausalLM::queue_save_slots (the model validated every save). Default: each save_slot now.
  virtual std::unique_ptr<PendingSlotSaves> queue_save_slots(std::span<const SlotSave> saves) {
    std::vector<SlotSnapshot> out;
    for (const SlotSave& s : saves) out.push_back(save_slot(s.slot, s.num_tokens));
    return std::make_unique<ReadySlotSaves>(std::move(out));
  }
  // Prefix caching's host tier (CausalLM::copy_blocks_*): every layer's rows of a paged block as
  // paged_block_bytes() bytes; copies are complete on return.
  virtual size_t paged_block_bytes() const = 0;
  virtual void copy_blocks_to_host(std::span<const HostBlockCopy> copies) = 0;
  virtual void copy_blocks_from_host(std::span<const HostBlockCopy> copies) = 0;
  // CausalLM's device staging of blocks (the model validated nothing: the cache checks ids).
  virtual int device_ordinal() const { return -1; }
  virtual DeviceMemory allocate_device_memory(size_t bytes) {
    DI_THROW(InternalError, describe(), ": no device memory (host cache)");
  }
  virtual void gather_blocks_to_device(std::span<const int32_t> blocks, void* dst, void* done) {
    DI_THROW(InternalError, describe(), ": device block copies are not supported");
  }
  virtual void scatter_blocks_from_device(std::span<const int32_t> blocks, const void* src, void* ready) {
    DI_THROW(InternalError, describe(), ": device block copies are not supported");
  }
  // Host memory the copies are fastest from (pinned on a device); null = plain memory.
  virtual std::shared_ptr<uint8_t> allocate_host_memory(size_t bytes) { return nullptr; }

  // The fixed-shape path for this batch, if the backend takes one (padded size, candidate caps).
  struct FixedShape {
    int64_t padded = 0;
    const std::vector<int64_t>* caps = nullptr;
  };
  virtual std::optional<FixedShape> fixed_shape(const ForwardBatch& batch) const { return std::nullopt; }
  // Tokens of the next begin_step's plan that come from device memory (ForwardBatch::
  // device_inputs; token indices are the plan's, which keeps the batch's token order): begin_step
  // writes them into the plan's token ids and embedding rows on the device. Backends without
  // device memory refuse a non-empty list.
  virtual void set_device_inputs(std::span<const DeviceInput> inputs, const int32_t* sampled_ids) = 0;
  // The ids of device inputs on the host: `sampled_ids` rows [0, n), read after the work that
  // writes them (the backend's stream order), so the call waits for the step that samples them.
  // For models that need a step's token ids on the host before it runs (V4.1's Engram rows are
  // hashed there). Backends without device memory refuse.
  virtual std::vector<int32_t> device_ids_to_host(const int32_t* sampled_ids, int64_t n) {
    DI_THROW(InvalidArgument, describe(), ": device input ids on a backend without device memory");
  }
  // Takes the step's plan: sizes the buffers, makes the index lists readable by the kernels.
  virtual void begin_step(StepPlan plan) = 0;
  // Runs `body` (the forward's launches for the current plan); a device backend may capture it
  // into a graph keyed by the plan's fixed shape and `graph` (which body: kTargetGraph for
  // forward_step, kMtpGraph + k for MTP block k) and replay it.
  static constexpr int32_t kTargetGraph = 0, kMtpGraph = 1;
  virtual void launch(const std::function<void()>& body, int32_t graph) = 0;
  // The step's outputs: `rows` logits rows (Buf::kLogits) and `hidden_rows` hidden rows
  // (Buf::kHidden), on the host unless asked to stay on the device.
  virtual ForwardOutput end_step(const ForwardOptions& options, int64_t rows, int64_t hidden_rows) = 0;
  // Copies the row ranges (first row, count) of hidden rows (host or device, as a previous step
  // returned them) back to back into backend memory the next step can read until it ends; returns
  // the backend pointer [sum counts, n*D] f32. With `padded_rows` > 0 (a fixed-shape step of that
  // many rows) the memory holds padded_rows rows, those after the staged ones zero, at an address
  // that does not change between steps (a graph captured it).
  using RowRanges = std::vector<std::pair<int64_t, int64_t>>;
  virtual const float* stage_hidden(const HiddenRows& rows, const RowRanges& ranges, int64_t padded_rows) = 0;
  // Greedy picks from the last step's first `rows` logits rows (Buf::kLogits): per row the argmax
  // (lowest id on ties) and its log-softmax value, on the host. The MTP drafter's device-side
  // greedy drafts (no logits copy); the CPU backend computes the same from its logits.
  virtual void greedy_rows(int64_t rows, int32_t* tokens, float* logprobs) = 0;
  // CausalLM's device timeline (benchmarks); host backends record nothing.
  virtual void set_profiling(bool on) {}
  virtual void mark_step_end() {}
  virtual CausalLM::StepProfile take_profile() { return {}; }
  virtual void set_op_profiling(bool on) {}                   // CausalLM::set_op_profiling
  virtual int64_t prefill_weight_pass_tokens() const { return 0; }  // CausalLM::prefill_weight_pass_tokens
  virtual std::vector<OpTiming> take_op_profile() { return {}; }
};

}  // namespace deepinfer::model::ds
