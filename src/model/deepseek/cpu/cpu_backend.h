// The CPU backend of the shared DeepSeek forward: fp32 everywhere (the reference that runs in
// CI and the spec the CUDA backend is checked against), ops from src/ops/cpu, the cache in host
// memory (kv::KvCache), step buffers in one growable host arena. Weights come from a family's
// tensor table, dequantised exactly to f32 once at load (cpu_prepare.h).
#pragma once
#include <array>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "kv/kv_cache.h"
#include "model/deepseek/backend.h"
#include "model/deepseek/expert_parallel.h"
#include "model/deepseek/forward.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/hc.h"

namespace deepinfer::model::ds {

// Host storage behind a ModelRef: every prepared tensor the refs point into.
struct CpuWeightStore {
  std::vector<Tensor> tensors;                                  // f32 copies
  std::vector<std::unique_ptr<ops::cpu::PackedWeight>> packed;  // every linear's panels (LinearRef::packed)
  std::vector<std::unique_ptr<std::vector<int32_t>>> tables;    // hash-routing tables
  std::vector<std::unique_ptr<std::vector<float>>> rope;        // inv_freq tables
  std::shared_ptr<void> keepalive;  // mapped checkpoint memory refs point into (V4.1 Engram tables)
  ModelRef refs;
};

struct CpuBackendOptions {
  // DEEPINFER_BATCH_INVARIANT: every product through the fixed-order kernel (ops/cpu/gemm.h
  // gemm_fixed; the lm head's packed panels already sum in order), so a token's logits do not
  // depend on its batch. Everything else on the CPU is computed per row in a fixed order already.
  bool batch_invariant = false;
};

class CpuBackend final : public ModelBackend, public ExpertWeightStore {
 public:
  CpuBackend(const Arch& arch, std::vector<kv::LayerCacheSpec> specs, std::unique_ptr<CpuWeightStore> weights,
             const CpuBackendOptions& options = {});
  ~CpuBackend() override;

  // ---- ModelBackend ----
  std::string describe() const override { return gemm_ == ops::cpu::GemmKind::kFixedOrder ? "cpu fp32 (batch-invariant)" : "cpu fp32"; }
  const ModelRef& weights() const override { return store_->refs; }
  kv::CacheGeometry plan_cache(size_t budget_bytes, int64_t max_slots) const override;
  void allocate_cache(const kv::CacheGeometry& geometry) override;
  bool cache_allocated() const override { return cache_.allocated(); }
  const kv::CacheGeometry& cache_geometry() const override { return cache_.geometry(); }
  void reset_slot(int32_t slot) override { cache_.reset_slot(slot); }
  SlotSnapshot save_slot(int32_t slot, int64_t num_tokens) override;
  void restore_slot(int32_t slot, const SlotSnapshot& snapshot) override;
  void set_device_inputs(std::span<const DeviceInput> inputs, const int32_t*) override {
    DI_CHECK(inputs.empty(), "the CPU backend has no device inputs");
  }
  size_t paged_block_bytes() const override { return cache_.geometry().bytes_per_block; }
  void copy_blocks_to_host(std::span<const HostBlockCopy> copies) override;
  void copy_blocks_from_host(std::span<const HostBlockCopy> copies) override;
  void begin_step(StepPlan plan) override;
  void launch(const std::function<void()>& body, int32_t /*graph*/) override { body(); }
  ForwardOutput end_step(const ForwardOptions& options, int64_t rows, int64_t hidden_rows) override;
  const float* stage_hidden(const HiddenRows& rows, const RowRanges& ranges, int64_t padded_rows) override;
  void greedy_rows(int64_t rows, int32_t* tokens, float* logprobs) override;
  kv::KvCache& cache() { return cache_; }
  bool joins_collectives() const override { return ep_ != nullptr; }
  // Main layers' routed experts run expert-parallel over `ep` from now on (between steps only).
  // A store holding every expert serves any placement; a sharded one is moved by EPLB through
  // expert_weight_store().
  void set_expert_parallel(std::shared_ptr<ExpertParallel> ep) override;
  ExpertWeightStore* expert_weight_store() override { return this; }
  ExpertParallel* expert_parallel() { return ep_.get(); }
  void set_context_parallel(std::shared_ptr<ContextParallel> cp) override;
  ContextParallel* context_parallel() const override { return cp_.get(); }
  // Tests: take the fixed-shape path (the CUDA backend's plans, padded to token buckets) for every
  // batch it accepts, with candidate caps for contexts up to `max_context` tokens.
  void use_fixed_shapes(int64_t max_context, const FixedLimits& limits);
  std::optional<FixedShape> fixed_shape(const ForwardBatch& batch) const override;
  int64_t fixed_steps() const { return fixed_steps_; }  // steps that ran a fixed plan (tests)

  // ---- ExpertWeightStore (cpu_expert_store.cpp): an expert packs as its f32 w13 then w2 ----
  bool holds_expert(int64_t layer, int32_t expert) const override;
  int64_t expert_bytes(int64_t layer) const override;
  void pack_expert(int64_t layer, int32_t expert, std::span<std::byte> dst) const override;
  void adopt_expert(int64_t layer, int32_t expert, std::span<const std::byte> src) override;
  void release_expert(int64_t layer, int32_t expert) override;

  // ---- Backend ----
  DType act() const override { return DType::kF32; }
  void* buf(Buf b) const override;
  const StepPlan& plan() const override { return plan_; }
  const StepIndex& index() const override { return index_; }
  LayerCacheRef cache(int64_t layer) override;
  void gather(const GatherArgs& a) override;
  void linear(const LinearRef& W, const void* x, int64_t ldx, int64_t M, void* y, DType y_dtype, int64_t ldy) override;
  void linear_grouped(const LinearRef& W, int64_t groups, const void* x, int64_t ldx, int64_t M, void* y,
                      int64_t ldy) override;
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
  void hc_post(const HcPostArgs& a) override;
  void hc_collapse(const float* x, const float* prev_mix, float* u, int64_t tokens) override;
  void stream_mean(const float* x, float* out, int64_t out_stride, int64_t tokens) override;
  void add_streams(float* x, const float* v, int64_t tokens, int64_t streams, int64_t dim) override;
  const void* engram_rows(int64_t layer) const override;
  void engram_inject(float* x, const float* kv, const float* w, int64_t tokens) override;
  void stage_engram_rows(std::vector<std::vector<float>> rows) override { engram_rows_ = std::move(rows); }
  void moe_route(const MoeRef& M, const float* logits, int32_t* ids, float* wts) override;
  void moe_dispatch(const MoeRef& M) override;
  void moe_experts(const MoeRef& M) override;
  void moe_shared(const MoeRef& M) override;
  void moe_combine(const MoeRef& M) override;

 private:
  void size_buffers();
  ops::cpu::HcSpec hc_spec() const;

  Arch arch_;
  ops::cpu::GemmKind gemm_ = ops::cpu::GemmKind::kFast;
  std::vector<kv::LayerCacheSpec> specs_;
  std::unique_ptr<CpuWeightStore> store_;
  bool fixed_ = false;           // use_fixed_shapes
  int64_t fixed_steps_ = 0;
  FixedLimits fixed_limits_;
  std::vector<int64_t> fixed_caps_;
  kv::KvCache cache_;
  StepPlan plan_;
  StepIndex index_;
  std::vector<uint64_t> arena_;                    // the step's named buffers (8-byte aligned)
  std::array<size_t, size_t(Buf::kCount)> off_{};  // element offsets (in uint64 words) into arena_
  std::vector<float> staged_hidden_;
  std::vector<std::vector<float>> engram_rows_;  // per main layer: the step's Engram table rows
  // MoE dispatch state: (token, k) pairs grouped by expert, their gathered rows and outputs.
  std::vector<int64_t> moe_start_, moe_pairs_;
  std::vector<float> moe_x_, moe_g_, moe_u_, moe_out_;
  std::unordered_map<const float*, ops::cpu::PackedWeight> hc_packed_;  // mHC fn panels by weight address
  // Expert parallelism (null: every expert local).
  std::shared_ptr<ExpertParallel> ep_;
  std::shared_ptr<ContextParallel> cp_;
  bool ep_step_ = false;            // this layer's dispatch went through ep_
  std::vector<float> ep_out_;       // outputs of the received rows, arrival order
  void ep_experts(const MoeRef& M);
  void run_expert(const ExpertRef& ex, const float* x, int64_t n, const float* row_scale, float* out);
  const ops::cpu::PackedWeight* hc_fn_packed(const float* fn, int64_t rows);
  void ep_combine();
  const ExpertRef& expert_ref(int64_t layer, int32_t expert) const;
  void free_tensor(const void* data);  // drops the store's tensor holding `data`
  void free_packed(const void* packed);  // drops the store's PackedWeight at `packed` (if any)
};

}  // namespace deepinfer::model::ds
