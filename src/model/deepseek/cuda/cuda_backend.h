// The CUDA backend of the shared DeepSeek forward (backend.h): kernels from src/ops/cuda and the
// glue kernels beside this file, weights as the family's upload left them (v4_device.h), the cache
// in device memory (cuda_cache.h), one stream, one cuBLASLt handle. A step's index lists are packed
// into one host buffer and uploaded once; its buffers are carved from one arena (arena.h).
// Decode steps (one token per sequence, <= 64 sequences) may take the fixed-shape path (padded to
// 1, 2, 4, ..., 64 tokens, metadata and arena in fixed buffers, device-side MoE, no host sync),
// launched eagerly (DecodePath::kFixed) or replayed from one CUDA graph per padded size and
// hidden-row request (kGraph). In exact numerics the general path's MoE reads the routing back
// (one sync per layer: per-expert fp32 GEMMs need host shapes); every other path syncs only when
// its outputs are copied to the host.
#pragma once
#include <array>
#include <map>
#include <tuple>
#include <memory>
#include <vector>

#include "model/deepseek/backend.h"
#include "model/deepseek/expert_weights.h"
#include "model/deepseek/cuda/arena.h"
#include "model/deepseek/cuda/cuda_cache.h"
#include "model/deepseek/cuda/device_expert_exchange.h"
#include "model/deepseek/cuda/op_timer.h"
#include "model/deepseek/cuda/options.h"
#include "model/deepseek/cuda/v4_device.h"
#include "model/deepseek/forward.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {

// The grouped GEMM's format of an expert table's dtype (FP4, FP8 or plain bf16).
ops::cuda::ExpertFormat expert_format(DType d);
// Grows `b` to at least `bytes` (+25% slack), releasing the old buffer first; never shrinks.
void ensure(deepinfer::cuda::DeviceBuffer& b, size_t bytes, int device);

// Sizes the backend's workspace for a step (the family's dense-FP8 needs).
using Fp8Workspace = std::function<void(int64_t tokens, size_t* fp8_ws_bytes, size_t* wdq_bytes)>;

class CudaBackend final : public ModelBackend, public ExpertWeightStore {
 public:
  CudaBackend(const Arch& arch, std::vector<kv::LayerCacheSpec> specs, std::unique_ptr<GpuWeightStore> weights,
              const CudaModelOptions& options, deepinfer::cuda::MemoryPlan memory, Fp8Workspace fp8_workspace,
              deepinfer::cuda::Stream stream);
  ~CudaBackend() override;

  // ---- ModelBackend ----
  std::string describe() const override;
  const ModelRef& weights() const override { return weights_->refs; }
  bool logits_on_device() const override { return true; }
  void synchronize() override { DI_CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }
  kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const override;
  void allocate_cache(const kv::CacheGeometry& geometry) override;
  bool cache_allocated() const override { return cache_.allocated(); }
  const kv::CacheGeometry& cache_geometry() const override { return cache_.geometry(); }
  void reset_slot(int32_t slot) override { cache_.reset_slot(slot, stream_.get()); }
  SlotSnapshot save_slot(int32_t slot, int64_t num_tokens) override;
  // Stream-ordered copies into one pinned staging buffer (grown as needed), an event after them;
  // the handle's wait() synchronises on the event and cuts the snapshots out.
  std::unique_ptr<PendingSlotSaves> queue_save_slots(std::span<const SlotSave> saves) override;
  void restore_slot(int32_t slot, const SlotSnapshot& snapshot) override;
  size_t paged_block_bytes() const override { return cache_.block_bytes(); }
  void copy_blocks_to_host(std::span<const HostBlockCopy> copies) override;
  void copy_blocks_from_host(std::span<const HostBlockCopy> copies) override;
  std::shared_ptr<uint8_t> allocate_host_memory(size_t bytes) override;
  int device_ordinal() const override { return opts_.device; }
  DeviceMemory allocate_device_memory(size_t bytes) override;
  void gather_blocks_to_device(std::span<const int32_t> blocks, void* dst, void* done) override;
  void scatter_blocks_from_device(std::span<const int32_t> blocks, const void* src, void* ready) override;
  std::optional<FixedShape> fixed_shape(const ForwardBatch& batch) const override;
  void set_device_inputs(std::span<const DeviceInput> inputs, const int32_t* sampled_ids) override;
  std::vector<int32_t> device_ids_to_host(const int32_t* sampled_ids, int64_t n) override;
  // Expert parallelism (cuda_expert_parallel.cpp): host-staged through the group, or the device
  // exchange when the ExpertParallel carries one (device_expert_exchange.h).
  bool joins_collectives() const override { return ep_ != nullptr; }
  void set_expert_parallel(std::shared_ptr<ExpertParallel> ep) override;
  // EPLB on a sharded model moves routed experts between ranks (cuda_expert_store.cpp).
  ExpertWeightStore* expert_weight_store() override { return this; }
  bool holds_expert(int64_t layer, int32_t expert) const override;
  int64_t expert_bytes(int64_t layer) const override;
  void pack_expert(int64_t layer, int32_t expert, std::span<std::byte> dst) const override;
  void adopt_expert(int64_t layer, int32_t expert, std::span<const std::byte> src) override;
  void release_expert(int64_t layer, int32_t expert) override;
  // Context parallelism (cuda_context_parallel.cpp): the split step's attention rows through the
  // host group; not together with expert parallelism on this backend (refused).
  void set_context_parallel(std::shared_ptr<ContextParallel> cp) override;
  ContextParallel* context_parallel() const override { return cp_.get(); }
  void gather_cp_rows(ContextParallel& cp, void* buf, int64_t T, int64_t row_bytes) override;
  void begin_step(StepPlan plan) override;
  void launch(const std::function<void()>& body, int32_t graph) override;
  ForwardOutput end_step(const ForwardOptions& options, int64_t rows, int64_t hidden_rows) override;
  const float* stage_hidden(const HiddenRows& rows, const RowRanges& ranges, int64_t padded_rows) override;
  // One kernel over the logits buffer, then one small copy back (4 + 4 bytes per row).
  void greedy_rows(int64_t rows, int32_t* tokens, float* logprobs) override;
  void set_profiling(bool on) override;
  void mark_step_end() override;
  CausalLM::StepProfile take_profile() override;
  void set_op_profiling(bool on) override;
  int64_t prefill_weight_pass_tokens() const override;
  std::vector<OpTiming> take_op_profile() override;

  // What the fixed-shape path takes: up to 384 tokens (decode and verify steps) when the grouped
  // MoE path exists, else moe_decode's 64.
  FixedLimits fixed_limits() const;

  // Tests and benchmarks.
  void set_decode_path(DecodePath p);
  DecodePath decode_path() const { return opts_.decode; }
  int64_t graphs_captured() const;
  // linear_many calls that ran several FP8 products as one gemm_fp8w_multi kernel (host count of
  // enqueued calls: a replayed graph adds nothing).
  int64_t multi_linear_launches() const { return multi_linear_launches_; }
  const GpuWeightStore& weight_store() const { return *weights_; }
  const CudaModelOptions& options() const { return opts_; }
  const deepinfer::cuda::MemoryPlan& memory_plan() const { return mem_; }
  cudaStream_t stream() const { return stream_.get(); }

  // ---- Backend ----
  DType act() const override { return act_; }
  void* buf(Buf b) const override { return arena_base_ + L_.buf[size_t(b)]; }
  const StepPlan& plan() const override { return plan_; }
  const StepIndex& index() const override { return index_; }
  LayerCacheRef cache(int64_t layer) override;
  void gather(const GatherArgs& a) override;
  void linear(const LinearRef& W, const void* x, int64_t ldx, int64_t M, void* y, DType y_dtype, int64_t ldy) override;
  void linear_grouped(const LinearRef& W, int64_t groups, const void* x, int64_t ldx, int64_t M, void* y,
                      int64_t ldy) override;
  void linear_many(const void* x, int64_t ldx, int64_t M, std::span<const LinearJob> jobs) override;
  void rmsnorm(const NormArgs& a) override;
  void rope(const RopeArgs& a) override;
  void round_trip(void* x, DType dtype, int64_t row_stride, int64_t rows, int64_t dim, RowFormat f) override;
  void add_position_bias(float* z, int64_t z_stride, const float* bias, const int64_t* pos, int64_t m, int64_t rows,
                         int64_t width) override;
  void compressor_pool(const PoolArgs& a) override;
  void decode_pool(const DecodePoolArgs& a) override;
  void indexer_topk(const IndexerArgs& a) override;
  void sparse_attention(const AttentionArgs& a) override;
  void hc_site(const HcSiteArgs& a) override;
  bool hc_site_norms(int64_t tokens, DType h_dtype) const override;
  void hc_post(const HcPostArgs& a) override;
  void hc_collapse(const float* x, const float* prev_mix, float* u, int64_t tokens) override;
  void add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim) override;
  // V4.1 Engram (cuda_backend_v41.cpp): the step's rows uploaded in act() per layer, the gated
  // injection by ops/cuda/engram (run by the V4.1 GPU model, v41_cuda_model.h).
  void stage_engram_rows(std::vector<std::vector<float>> rows) override;
  bool stage_engram_ids(const std::vector<EngramStepIds>& layers) override;
  const void* engram_rows(int64_t layer) const override;
  void engram_inject(float* x, const float* kv, const float* w, int64_t tokens) override;
  void stream_mean(const float* x, float* out, int64_t out_stride, int64_t tokens) override;
  void moe_route(const MoeRef& M, const float* logits, int32_t* ids, float* wts) override;
  void moe_dispatch(const MoeRef& M) override;
  void moe_experts(const MoeRef& M) override;
  void moe_shared(const MoeRef& M) override;
  void moe_combine(const MoeRef& M) override;

 private:
  // kFixedGrouped: fixed-shape bf16 steps up to kMoeDecodeGroupedMaxTokens (moe_decode_grouped,
  // each touched expert read once); kFixed: the other fixed steps up to kMoeDecodeMaxTokens
  // (moe_decode, one expert read per (token, k) pair; f32 activations).
  enum class MoePath { kFixed, kFixedGrouped, kGrouped, kHostRouted };
  // queue_save_slots' staging: pinned bytes, their size, the event after the copies, and which
  // handle still holds them (0: none; shared with the handles: one outstanding at a time).
  std::shared_ptr<uint8_t> save_pool_;
  size_t save_pool_bytes_ = 0;
  std::shared_ptr<deepinfer::cuda::Event> save_done_;
  std::shared_ptr<uint64_t> save_owner_ = std::make_shared<uint64_t>(0);
  uint64_t save_handles_ = 0;
  MoePath moe_path(const MoeRef& M) const;
  bool grouped_moe() const;  // the device-permutation grouped MoE path exists (bf16, native or dequantised experts)
  void linear_fp8(const LinearRef& W, const void* x, int64_t ldx, int64_t bsx, int64_t M, void* y, DType y_dtype,
                  int64_t ldy, int64_t bsy, int64_t n, int64_t k, int64_t batch);
  void linear_bf16_fixed(const void* w, const void* x, int64_t ldx, int64_t bsx, int64_t M, void* y, DType y_dtype,
                         int64_t ldy, int64_t bsy, int64_t n, int64_t k, int64_t batch);
  // linear_fp8 of M rows runs the weight-only GEMM (gemm_fp8w), not dequantise + cuBLASLt.
  bool fp8_weight_only(const LinearRef& W, int64_t M) const;
  int64_t multi_linear_launches_ = 0;
  void swiglu_rows(void* gu, void* act, const float* row_weight, int64_t rows);
  void ep_dispatch(const MoeRef& M);
  void ep_experts(const MoeRef& M);
  void ep_combine();
  void ep_experts_device(const MoeRef& M);
  void ep_expert_gemms(const MoeRef& M, const std::vector<int32_t>& seg, int64_t m);
  ArenaSizes arena_sizes(const StepPlan& p, ops::cuda::AttnSplit* split) const;
  void ensure_fixed_buffers();
  template <typename T>
  T* at(size_t off) const { return reinterpret_cast<T*>(arena_base_ + off); }

  Arch arch_;
  std::vector<kv::LayerCacheSpec> specs_;
  std::unique_ptr<GpuWeightStore> weights_;
  CudaModelOptions opts_;
  deepinfer::cuda::MemoryPlan mem_;
  Fp8Workspace fp8_workspace_;
  deepinfer::cuda::Stream stream_;
  ops::cuda::CublasLt blas_;
  deepinfer::cuda::DeviceInfo info_;
  DType act_ = DType::kBF16;
  GpuCache cache_;
  std::vector<int64_t> cand_caps_;  // fixed-shape candidate capacity per compressor kind
  // The current step.
  StepPlan plan_;
  StepIndex index_;
  ArenaLayout L_{};
  char* arena_base_ = nullptr;
  ops::cuda::AttnSplit split_;
  // General steps: growable buffers. Fixed-shape steps: buffers sized once for the largest bucket
  // (graphs capture their addresses, so they are never reallocated).
  deepinfer::cuda::DeviceBuffer arena_, meta_, fixed_arena_, fixed_meta_;
  // The step's packed index lists in pinned memory (an async H2D copy from pageable memory may
  // wait for the stream, which would stall asynchronous scheduling): two buffers used in turn,
  // each reused only after the copy out of it two steps ago has run (meta_copied_).
  std::vector<char> meta_pack_;
  deepinfer::cuda::PinnedBuffer meta_h_[2];
  deepinfer::cuda::Event meta_copied_[2];
  int meta_turn_ = 0;
  // Profiling (set_profiling): timing events at each step's first upload and at mark_step_end;
  // a begin without an end (a drafter step) is replaced by the next begin.
  bool profiling_ = false;
  std::vector<std::pair<deepinfer::cuda::Event, deepinfer::cuda::Event>> profile_;
  bool profile_open_ = false;  // profile_.back() has a begin and no end yet
  // Op profiling (set_op_profiling): events around each top-level op; steps run eagerly.
  OpTimer op_timer_;
  OpTimer::Scope op_scope(const char* name);
  OpTimer::Scope linear_scope(const char* op, const LinearRef& W);  // "linear fp8 NxK"
  // Tokens of the next step read from device memory (set_device_inputs): [2k] (token, row).
  std::vector<int32_t> input_patch_;
  const int32_t* sampled_ids_ = nullptr;
  using GraphKey = std::tuple<int64_t, bool, int32_t>;  // (padded size, hidden rows, launch's graph)
  std::map<GraphKey, deepinfer::cuda::CudaGraph> graphs_;
  std::map<GraphKey, bool> warmed_;
  // Staged target streams of MTP steps: general steps grow it; fixed-shape steps use the fixed
  // one, sized once for the largest bucket (graphs capture its address).
  deepinfer::cuda::DeviceBuffer staged_hidden_, fixed_staged_hidden_;
  deepinfer::cuda::DeviceBuffer greedy_out_;  // greedy_rows: tokens then logprobs
  // V4.1 Engram rows of the current step per main layer (empty buffer: no Engram there), and the
  // host copies in act() they were uploaded from (kept until the next step's staging).
  std::vector<deepinfer::cuda::DeviceBuffer> engram_dev_;
  std::vector<std::vector<char>> engram_host_;
  // stage_engram_ids: the values staged per layer (0: none), the rows gathered in stored form
  // into pinned host memory per layer (reused once the event after its upload has passed), and
  // one device buffer they are uploaded to and widened from (stream-ordered, never captured).
  std::vector<int64_t> engram_staged_;
  std::vector<deepinfer::cuda::PinnedBuffer> engram_pinned_;
  std::vector<deepinfer::cuda::Event> engram_uploaded_;
  std::vector<bool> engram_upload_pending_;
  deepinfer::cuda::DeviceBuffer engram_stored_dev_;
  void reserve_engram_rows(size_t layer, int64_t values);  // grows engram_dev_[layer] (drops graphs if moved)
  std::vector<char> greedy_h_;
  // Exact-numerics MoE: the routing read back and the host permutation.
  std::vector<int32_t> moe_ids_;
  std::vector<float> moe_wts_, moe_perm_w_;
  std::vector<int64_t> moe_perm_src_, moe_comb_, moe_offset_;
  // Expert parallelism: the group's view, the layer in flight, host staging, device scratch sized
  // by the rows received (other ranks' tokens: not bounded by this rank's step).
  std::shared_ptr<ExpertParallel> ep_;
  std::shared_ptr<ContextParallel> cp_;
  // Expert store: a layer's regions of released experts, reused by the next adopted expert.
  std::map<int64_t, std::vector<std::array<void*, 4>>> spare_experts_;
  MoeRef& expert_layer(int64_t layer) const;
  const ExpertRef& expert_ref(int64_t layer, int32_t expert) const;
  std::array<int64_t, 4> expert_regions(int64_t layer) const;
  void set_expert_tables(MoeRef& M, int32_t expert);
  std::vector<uint8_t> cp_stage_;  // host copy of a split step's attention rows
  bool ep_step_ = false;
  std::vector<char> ep_stage_;
  std::vector<float> ep_rows_, ep_wts_;
  std::vector<int32_t> ep_ids_;
  std::unique_ptr<DeviceExpertExchange> ep_dev_;  // set: the device exchange serves the MoE layers
  DeviceExpertExchange::Received ep_recv_;        // the layer in flight (device path)
  deepinfer::cuda::DeviceBuffer ep_x_, ep_gu_, ep_act_, ep_ye_, ep_perm_w_, ep_perm_src_, ep_seg_, ep_tiles_, ep_out_,
      ep_comb_;
};

}  // namespace deepinfer::model::ds::cuda
