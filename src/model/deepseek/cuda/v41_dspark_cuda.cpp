#include "model/deepseek/cuda/v41_dspark_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "core/check.h"
#include "core/logging.h"
#include "deepinfer/error.h"
#include "model/deepseek/cuda/dspark_kernels.h"
#include "model/deepseek/cuda/glue_kernels.h"
#include "model/deepseek/cuda/moe_decode.h"
#include "model/deepseek_v41/dspark_weights.h"
#include "model/deepseek_v41/weights.h"
#include "model/plan/step_plan.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/gemm_fp8w.h"
#include "ops/cuda/hc.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/qat.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/router.h"
#include "ops/cuda/runtime.h"
#include "ops/cuda/swiglu.h"

namespace deepinfer::model::v41 {
namespace {
namespace oc = ops::cuda;
namespace gc = ds::cuda;
namespace dc = deepinfer::cuda;
using deepinfer::cuda::DeviceBuffer;

// A dense stage linear on the device: f32 [N, K], or (stored formats) the checkpoint's e4m3 bytes
// [N, K] with their e8m0 scales [ceil(N/blk), ceil(K/blk)] (gemm_fp8w, bf16 activations).
struct DevLinear {
  const float* f32 = nullptr;
  const uint8_t *fp8 = nullptr, *scale = nullptr;
};

struct StageDev {  // device copies of DSparkStageWeights
  const float *attn_norm, *ffn_norm, *hc_attn_fn, *hc_attn_base, *hc_attn_scale, *hc_ffn_fn, *hc_ffn_base,
      *hc_ffn_scale, *q_norm, *kv_norm, *sink, *gate, *gate_bias;
  DevLinear wq_a, wq_b, wkv, wo_a, wo_b, shared13, shared2;
  const void* const* w13 = nullptr;  // [E] device table of expert pointers (f32, or FP4 bytes)
  const void* const* w2 = nullptr;
  const uint8_t* const* w13_scale = nullptr;  // [E] e8m0 tables (FP4 only)
  const uint8_t* const* w2_scale = nullptr;
  oc::ExpertFormat format = oc::ExpertFormat::kPlain;
};

// The stored form of one checkpoint entry (its parts stacked by rows), when the device kernels can
// take it as stored: FP8 blocks the fp8w GEMM tiles (block rows dividing every part but the last,
// K % 16, scale exponents <= kFp8wMaxScaleExp), or FP4 per-32 scales (moe_decode). Empty otherwise.
struct StoredBytes {
  std::vector<uint8_t> w, scale;
  bool ok() const { return !w.empty(); }
};
StoredBytes stored_bytes(const V41Weights* sw, const std::string& name, v4::WeightFormat want, int64_t block) {
  StoredBytes b;
  if (!sw) return b;
  const int64_t i = sw->find(name);
  if (i < 0) return b;
  const std::vector<v4::Linear>& parts = sw->parts[size_t(i)];
  for (size_t j = 0; j < parts.size(); ++j) {
    const v4::Linear& L = parts[j];
    if (L.format != want || !L.weight.defined() || !L.scale.defined() || L.weight.dim() != 2) return {};
    if (want == v4::WeightFormat::kFP8Block && (L.in_features() % 16 || (j + 1 < parts.size() && L.out_features() % block)))
      return {};
    const Tensor w = L.weight.contiguous(), s = L.scale.contiguous();
    const uint8_t* sp = s.data<uint8_t>();
    if (want == v4::WeightFormat::kFP8Block)
      for (size_t e = 0; e < s.nbytes(); ++e)
        if (sp[e] > oc::kFp8wMaxScaleExp) return {};  // the GEMM's in-register dequantisation range
    b.w.insert(b.w.end(), w.data<uint8_t>(), w.data<uint8_t>() + w.nbytes());
    b.scale.insert(b.scale.end(), sp, sp + s.nbytes());
  }
  return b;
}

// Scratch buffers, each grown on demand and reused across rounds (same stream: no overlap).
enum Buf { kTaps, kM, kKvF, kX, kX2, kMixA, kMixF, kHcWs, kU, kH, kY, kQa, kQ, kKv, kKeys, kO, kZ, kGlog, kWts,
           kAct, kYe, kGu, kActS, kSh, kXhat, kHn, kBase, kI64, kBlk64, kBlk32, kIds, kOut, kXb, kXbF, kNumBufs };

// A block round's inputs, in fixed places of two device buffers for Sp (padded) sequences of B:
// int64 [pos T | embedding rows T*n | combine rows T*K | keys Sp*(cap+B)], int32 [begin T | count T |
// anchor Sp | drafts Sp], T = Sp*B. Sequence s's keys sit at s*(cap+B) whatever its ring length, so
// a round's kernels see the same pointers and sizes at every Sp: what a CUDA graph needs.
struct BlockLayout {
  int64_t Sp, B, T, n, K, cap;
  int64_t keys_per_seq() const { return cap + B; }
  int64_t emb() const { return T; }
  int64_t comb() const { return T + T * n; }
  int64_t keys() const { return comb() + T * K; }
  int64_t num_keys() const { return Sp * keys_per_seq(); }
  int64_t n64() const { return keys() + num_keys(); }
  int64_t n32() const { return 2 * T + 2 * Sp; }
};

class CudaDSparkStages final : public DSparkStages {
 public:
  CudaDSparkStages(const DeepseekV41Config& c, const DSparkWeights& w, int64_t cap, bool qat, int device, bool graphs,
                   bool stored_formats)
      : c_(c), cap_(cap), qat_(qat), device_(device), graphs_(graphs), lt_(size_t(32) << 20, device) {
    DI_CUDA_CHECK(cudaSetDevice(device));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
    const V41Weights* sw = stored_formats ? w.stored : nullptr;
    main_proj_ = up(w.main_proj), main_norm_ = up(w.main_norm), norm_ = up(w.norm);
    mk_embed_ = up(w.mk_embed), mk_head_ = up(w.mk_head), conf_ = up(w.conf), embed_ = up(w.embed);
    head_ = up(w.head), inv_freq_ = up_raw(w.inv_freq.data(), w.inv_freq.size());
    const size_t before_stages = weight_bytes_;
    for (size_t k = 0; k < w.stages.size(); ++k) {
      const DSparkStageWeights& s = w.stages[k];
      const std::string o = "mtp." + std::to_string(k) + ".", a = o + "attn.", f = o + "ffn.";
      StageDev d{up(s.attn_norm), up(s.ffn_norm), up(s.hc_attn_fn), up(s.hc_attn_base), up(s.hc_attn_scale),
                 up(s.hc_ffn_fn), up(s.hc_ffn_base), up(s.hc_ffn_scale), up(s.q_norm), up(s.kv_norm), up(s.sink),
                 up(s.gate), up(s.gate_bias)};
      d.wq_a = dense(sw, a + "wq_a.weight", s.wq_a), d.wq_b = dense(sw, a + "wq_b.weight", s.wq_b);
      d.wkv = dense(sw, a + "wkv.weight", s.wkv), d.wo_a = dense(sw, a + "wo_a.weight", s.wo_a);
      d.wo_b = dense(sw, a + "wo_b.weight", s.wo_b);
      d.shared13 = dense(sw, f + "shared_experts.w1.weight", s.shared13);
      d.shared2 = dense(sw, f + "shared_experts.w2.weight", s.shared2);
      experts(sw, f, s, d);
      stages_.push_back(d);
    }
    stage_bytes_ = weight_bytes_ - before_stages;
    stream_.synchronize();
  }

  std::string describe() const override {
    auto size = [](size_t b) {
      return b >= (size_t(1) << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
    };
    return "stages on GPU " + std::to_string(device_) + " (" + formats_ + "; stage weights " + size(stage_bytes_) +
           " (" + std::to_string(stage_bytes_) + " B), all weights " + size(weight_bytes_) + " on the device; " +
           (graphs_ ? "draft rounds on CUDA graphs: " + std::to_string(replays_) + " replays" : "eager") + ")";
  }

  void feed(const HiddenRows& taps, const std::vector<DSparkFeed>& feeds) override;
  void block(const std::vector<DSparkBlockSeq>& seqs, bool greedy, bool want_logits, DSparkBlockOut& out) override;
  void read_ring(int32_t slot, int64_t lo, int64_t hi, float* dst) override { ring_copy(slot, lo, hi, dst, true); }
  void write_ring(int32_t slot, int64_t lo, int64_t hi, const float* src) override {
    ring_copy(slot, lo, hi, const_cast<float*>(src), false);
  }

 private:
  const float* up(const Tensor& t) {
    if (!t.defined()) return nullptr;  // not kept in f32 (stored formats)
    DI_CHECK(t.defined() && t.dtype() == DType::kF32, "dspark device upload of a non-f32 tensor");
    return up_raw(t.data<float>(), size_t(t.numel()));
  }
  const float* up_raw(const void* p, size_t floats) {
    return static_cast<const float*>(up_bytes(p, floats * sizeof(float)));
  }
  const void* up_bytes(const void* p, size_t bytes) {
    DeviceBuffer b(std::max<size_t>(bytes, 16), device_);
    dc::copy_h2d(b.data(), p, bytes, stream_.get(), /*sync=*/false);
    stream_.synchronize();  // p may be a temporary of the caller (stored bytes): copy before it goes
    weight_bytes_ += b.size_bytes();
    weights_.push_back(std::move(b));
    return weights_.back().data();
  }
  // Stored FP8 when the GEMM takes it (the f32 copy is not uploaded then), else f32.
  DevLinear dense(const V41Weights* sw, const std::string& name, const Tensor& f32) {
    const StoredBytes b = stored_bytes(sw, name, v4::WeightFormat::kFP8Block, c_.fp8_block_in);
    if (!b.ok()) return {.f32 = up(f32)};
    DI_CHECK(int64_t(b.w.size()) == f32.numel(), "dspark: stored ", name, " does not match its f32 shape");
    ++stored_dense_;
    return {.fp8 = static_cast<const uint8_t*>(up_bytes(b.w.data(), b.w.size())),
            .scale = static_cast<const uint8_t*>(up_bytes(b.scale.data(), b.scale.size()))};
  }
  void experts(const V41Weights* sw, const std::string& f, const DSparkStageWeights& s, StageDev& d);
  template <typename T>
  T* buf(Buf id, int64_t n) {
    DeviceBuffer& b = bufs_[id];
    const size_t need = std::max<size_t>(size_t(n) * sizeof(T), 16);
    if (b.size_bytes() < need) {
      // Sizes inside a round depend on its padded batch only, which the eager run before each
      // capture has already sized for: growing here would be a bug (and a sync, failing the capture).
      DI_CHECK(!capturing_, "dspark: scratch buffer ", int(id), " grows inside a graph capture");
      b = DeviceBuffer(need * 2, device_);  // cudaFree syncs the device first
      // Graphs that captured the old pointer are stale (feed's own buffers are never captured).
      if (id != kTaps && id != kM && id != kKvF && id != kI64 && id != kXbF) ++generation_;
    }
    return b.as<T>();
  }
  template <typename T>
  T* upload(Buf id, const std::vector<T>& v) {
    T* d = buf<T>(id, int64_t(v.size()));
    dc::copy_h2d(d, v.data(), v.size() * sizeof(T), stream_.get(), /*sync=*/false);
    return d;
  }
  void linear(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
    lt_.gemm({.x = x, .ldx = K, .w = w, .ldw = K, .y = y, .ldy = N, .in_dtype = DType::kF32,
              .out_dtype = DType::kF32, .M = M, .N = N, .K = K},
             stream_.get());
  }
  // y [M, batch*N] f32 = x [M, ldx] · Wᵀ; batch > 1: the grouped wo_a (group g reads columns g*K..).
  // `scratch`: the bf16 copy of x for FP8 weights (feed has its own, kXbF: graphs never read it).
  void linear(const float* x, int64_t M, int64_t K, const DevLinear& w, int64_t N, float* y, int64_t ldx = 0,
              int64_t batch = 1, Buf scratch = kXb);
  void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t dim) {
    oc::rmsnorm({.x = x, .x_dtype = DType::kF32, .x_stride = dim, .w = w, .w_dtype = DType::kF32, .y = y,
                 .y_dtype = DType::kF32, .y_stride = dim, .rows = rows, .dim = dim, .eps = float(c_.rms_norm_eps)},
                stream_.get());
  }
  void rope(float* x, int64_t rows, int64_t heads, const int64_t* pos, bool inverse) {
    oc::rope({.x = x, .dtype = DType::kF32, .row_stride = heads * c_.head_dim, .head_stride = c_.head_dim,
              .rows = rows, .heads = heads, .head_dim = c_.head_dim, .rope_dim = c_.rope_head_dim, .pos = pos,
              .inv_freq = inv_freq_, .inverse = inverse},
             stream_.get());
  }
  void qat(float* kv, int64_t rows) {
    if (qat_)
      oc::qat_round_trip({.x = kv, .dtype = DType::kF32, .format = oc::QatFormat::kFp8Ue8m0Block32, .rows = rows,
                          .n = c_.head_dim, .ld = c_.head_dim},
                         stream_.get());
  }
  void ensure_slots(int64_t n);
  float* ring(int64_t stage) { return rings_.as<float>() + stage * cap_ * c_.head_dim; }
  int64_t ring_row(int32_t slot, int64_t p) const { return int64_t(slot) * c_.dspark.num_stages * cap_ + p % cap_; }
  void ring_copy(int32_t slot, int64_t lo, int64_t hi, float* host, bool to_host);
  // Sites of one stage: T tokens, streams X [T, n, D] -> X (through X2).
  void stage(int64_t k, int64_t T, const int64_t* pos, const int64_t* key_idx, int64_t num_keys,
             const int32_t* win_begin, const int32_t* win_count, const int64_t* comb_rows);
  void attention(const StageDev& W, int64_t k, int64_t T, const int64_t* pos, const int64_t* key_idx,
                 int64_t num_keys, const int32_t* win_begin, const int32_t* win_count);
  void moe(const StageDev& W, int64_t T, const int64_t* comb_rows);
  void hc_site(const float* fn, const float* base, const float* scale, const float* x, float* mix, int64_t T);
  BlockLayout layout(int64_t Sp) const {
    return {Sp, c_.dspark.block_size, Sp * c_.dspark.block_size, c_.hc_mult, c_.dspark.num_experts_per_tok, cap_};
  }
  void upload_block(const std::vector<DSparkBlockSeq>& seqs, const BlockLayout& L);
  void block_kernels(const BlockLayout& L, bool greedy);  // every launch of a round, nothing else
  void launch_round(const BlockLayout& L, bool greedy);   // block_kernels eagerly or as a graph

  struct RoundGraph {
    dc::CudaGraph graph;
    bool warmed = false, broken = false;
    uint64_t generation = 0;
  };

  DeepseekV41Config c_;
  int num_sms_ = 132;
  int stored_dense_ = 0, stored_experts_ = 0;
  size_t stage_bytes_ = 0;  // of the mtp.k.* tensors (weight_bytes_ adds the embedding, head, Markov head)
  std::string formats_ = "f32";
  int64_t cap_;
  bool qat_;
  int device_;
  bool graphs_;
  bool capturing_ = false;
  uint64_t generation_ = 0;  // bumped whenever a buffer a round reads or writes moves
  int64_t replays_ = 0;
  std::map<std::pair<int64_t, bool>, RoundGraph> round_graphs_;  // (padded sequences, greedy)
  dc::Stream stream_;
  dc::Event taps_ready_, taps_read_;
  oc::CublasLt lt_;
  std::vector<DeviceBuffer> weights_;
  size_t weight_bytes_ = 0;
  const float *main_proj_, *main_norm_, *norm_, *mk_embed_, *mk_head_, *conf_, *embed_, *head_, *inv_freq_;
  std::vector<StageDev> stages_;
  DeviceBuffer rings_;
  int64_t num_slots_ = 0;
  DeviceBuffer bufs_[kNumBufs];
};

void CudaDSparkStages::ensure_slots(int64_t n) {
  if (n <= num_slots_) return;
  const int64_t slots = std::max(n, 2 * num_slots_);
  const size_t per_slot = size_t(c_.dspark.num_stages * cap_ * c_.head_dim) * sizeof(float);
  DeviceBuffer grown(size_t(slots) * per_slot, device_);
  DI_CUDA_CHECK(cudaMemsetAsync(grown.data(), 0, grown.size_bytes(), stream_.get()));
  if (num_slots_ > 0)  // slot-major: the old slots are the prefix
    DI_CUDA_CHECK(cudaMemcpyAsync(grown.data(), rings_.data(), size_t(num_slots_) * per_slot,
                                  cudaMemcpyDeviceToDevice, stream_.get()));
  stream_.synchronize();
  rings_ = std::move(grown);
  num_slots_ = slots;
  ++generation_;
}

// Positions [lo, hi) of every stage, in at most two contiguous runs per stage (the wrap).
void CudaDSparkStages::ring_copy(int32_t slot, int64_t lo, int64_t hi, float* host, bool to_host) {
  DI_CUDA_CHECK(cudaSetDevice(device_));
  if (hi - lo > cap_ || lo < 0) DI_THROW(InvalidArgument, "dspark ring copy of positions [", lo, ", ", hi, ")");
  ensure_slots(int64_t(slot) + 1);
  const int64_t d = c_.head_dim, n = hi - lo;
  for (int64_t k = 0; k < c_.dspark.num_stages; ++k)
    for (int64_t p = lo; p < hi;) {
      const int64_t run = std::min(hi - p, cap_ - p % cap_);
      float* dev = ring(k) + ring_row(slot, p) * d;
      float* h = host + (k * n + (p - lo)) * d;
      const size_t bytes = size_t(run * d) * sizeof(float);
      if (to_host) dc::copy_d2h(h, dev, bytes, stream_.get(), false);
      else dc::copy_h2d(dev, h, bytes, stream_.get(), false);
      p += run;
    }
  stream_.synchronize();
}

void CudaDSparkStages::feed(const HiddenRows& taps, const std::vector<DSparkFeed>& feeds) {
  DI_CUDA_CHECK(cudaSetDevice(device_));
  const int64_t D = c_.hidden_size, d = c_.head_dim, W = taps.row_elems;
  std::vector<int64_t> idx;  // [src rows F | positions F | ring rows F]
  int32_t max_slot = 0;
  for (const DSparkFeed& f : feeds) {
    for (int64_t i = f.from; i < f.num; ++i) idx.push_back(f.first_row + i);
    max_slot = std::max(max_slot, f.slot);
  }
  const int64_t F = int64_t(idx.size());
  if (F == 0) return;
  ensure_slots(int64_t(max_slot) + 1);
  for (const DSparkFeed& f : feeds)
    for (int64_t i = f.from; i < f.num; ++i) idx.push_back(f.first_position + i);
  for (const DSparkFeed& f : feeds)
    for (int64_t i = f.from; i < f.num; ++i) idx.push_back(ring_row(f.slot, f.first_position + i));
  float* tap = buf<float>(kTaps, F * W);
  const int64_t* src = upload(kI64, idx);  // feed's own index buffer: a round's graphs never read it
  const int64_t* pos = src + F;
  const int64_t* dst_rows = pos + F;
  if (taps.device) {  // the target step's rows, where it left them: wait for that step
    taps_ready_.record(static_cast<cudaStream_t>(taps.stream));
    DI_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), taps_ready_.get(), 0));
    gc::gather_rows({.src_a = taps.device, .a_stride = W, .src_dtype = DType::kF32, .src_index = src, .dst = tap,
                     .dst_stride = W, .dst_dtype = DType::kF32, .rows = F, .width = W},
                    stream_.get());
    // The target's next step may overwrite its rows: it waits for this gather (no host wait).
    taps_read_.record(stream_.get());
    DI_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(taps.stream), taps_read_.get(), 0));
  } else {
    std::vector<float> rows(size_t(F * W));
    for (int64_t i = 0; i < F; ++i)
      std::memcpy(rows.data() + i * W, taps.host.data<float>() + idx[size_t(i)] * W, size_t(W) * sizeof(float));
    dc::copy_h2d(tap, rows.data(), rows.size() * sizeof(float), stream_.get(), false);
  }
  float* m = buf<float>(kM, F * D);
  float* kv = buf<float>(kKvF, F * d);
  linear(tap, F, W, main_proj_, D, m);
  rmsnorm(m, main_norm_, m, F, D);
  for (size_t k = 0; k < stages_.size(); ++k) {
    linear(m, F, D, stages_[k].wkv, d, kv, 0, 1, kXbF);
    rmsnorm(kv, stages_[k].kv_norm, kv, F, d);
    rope(kv, F, 1, pos, false);
    qat(kv, F);
    gc::gather_rows({.src_a = kv, .a_stride = d, .src_dtype = DType::kF32, .dst = ring(int64_t(k)), .dst_stride = d,
                     .dst_dtype = DType::kF32, .dst_index = dst_rows, .rows = F, .width = d},
                    stream_.get());
  }
}

void CudaDSparkStages::hc_site(const float* fn, const float* base, const float* scale, const float* x, float* mix,
                               int64_t T) {
  const int n = int(c_.hc_mult);
  float* ws = buf<float>(kHcWs, int64_t(oc::hc_pre_workspace_bytes(T, n, c_.hidden_size, oc::HcMode::kLayer) / 4 + 1));
  oc::hc_pre({.x = x, .dtype = DType::kF32, .x_stride = n * c_.hidden_size, .fn = fn, .base = base, .scale = scale,
              .u = nullptr, .mix = mix, .workspace = ws, .tokens = T, .n = n, .dim = c_.hidden_size,
              .mode = oc::HcMode::kLayer, .sinkhorn_iters = int(c_.hc_sinkhorn_iters),
              .norm_eps = float(c_.rms_norm_eps), .hc_eps = float(c_.hc_eps)},
             stream_.get());
}

// q = wq_b(q_norm(wq_a h)), keys [ring lo..last, block keys] per sequence, sinks, de-rotated
// output, grouped wo_a, wo_b: the host drafter's stage_attention.
void CudaDSparkStages::attention(const StageDev& W, int64_t k, int64_t T, const int64_t* pos, const int64_t* key_idx,
                                 int64_t num_keys, const int32_t* win_begin, const int32_t* win_count) {
  const int64_t D = c_.hidden_size, H = c_.num_heads, d = c_.head_dim, r = c_.q_lora_rank;
  const int64_t G = c_.o_groups, R = c_.o_lora_rank, gw = H * d / G;
  const float* h = buf<float>(kH, T * D);
  float* qa = buf<float>(kQa, T * r);
  float* q = buf<float>(kQ, T * H * d);
  float* kv = buf<float>(kKv, T * d);
  float* keys = buf<float>(kKeys, num_keys * d);
  float* o = buf<float>(kO, T * H * d);
  float* z = buf<float>(kZ, T * G * R);
  linear(h, T, D, W.wq_a, r, qa);
  rmsnorm(qa, W.q_norm, qa, T, r);
  linear(qa, T, r, W.wq_b, H * d, q);
  rope(q, T, H, pos, false);
  linear(h, T, D, W.wkv, d, kv);
  rmsnorm(kv, W.kv_norm, kv, T, d);
  rope(kv, T, 1, pos, false);
  qat(kv, T);
  gc::gather_rows({.src_a = ring(k), .a_stride = d, .src_b = kv, .b_stride = d, .src_dtype = DType::kF32,
                   .src_index = key_idx, .dst = keys, .dst_stride = d, .dst_dtype = DType::kF32, .rows = num_keys,
                   .width = d},
                  stream_.get());
  oc::sparse_attention({.q = q, .q_stride = H * d, .win_kv = keys, .kv_stride = d, .dtype = DType::kF32,
                        .win_begin = win_begin, .win_count = win_count, .sink = W.sink,
                        .scale = 1.0f / std::sqrt(float(d)), .out = o, .out_stride = H * d, .num_tokens = T,
                        .num_heads = H, .head_dim = d},
                       stream_.get());
  rope(o, T, H, pos, true);
  // Grouped wo_a: group g reads its H*d/G slice of o with the rows g*R.. of wo_a.
  linear(o, T, gw, W.wo_a, R, z, H * d, G);
  linear(z, T, G * R, W.wo_b, D, buf<float>(kY, T * D));
}

// Router (top-k of sqrt(softplus) + bias, normalised, scaled), routed experts in f32 through
// moe_decode (64 tokens per launch), shared expert, fixed-order combine into y.
void CudaDSparkStages::moe(const StageDev& W, int64_t T, const int64_t* comb_rows) {
  const int64_t D = c_.hidden_size, I = c_.moe_intermediate_size, E = c_.dspark.n_routed_experts;
  const int64_t K = c_.dspark.num_experts_per_tok;
  const float* h = buf<float>(kH, T * D);
  float* glog = buf<float>(kGlog, T * E);
  int32_t* ids = buf<int32_t>(kIds, T * K);
  float* wts = buf<float>(kWts, T * K);
  float* act = buf<float>(kAct, T * K * I);
  float* ye = buf<float>(kYe, T * K * D);
  float* gu = buf<float>(kGu, T * 2 * I);
  float* acts = buf<float>(kActS, T * I);
  float* sh = buf<float>(kSh, T * D);
  linear(h, T, D, W.gate, E, glog);
  oc::router({.logits = glog, .logits_stride = E, .bias = W.gate_bias, .expert_ids = ids, .weights = wts,
              .tokens = T, .num_experts = int(E), .topk = int(K), .route_scale = float(c_.routed_scaling_factor),
              .gate_temp = float(c_.gate_temp)},
             stream_.get());
  for (int64_t t0 = 0; t0 < T; t0 += gc::kMoeDecodeMaxTokens) {
    const int64_t n = std::min<int64_t>(gc::kMoeDecodeMaxTokens, T - t0);
    gc::moe_decode({.x = h + t0 * D, .expert_ids = ids + t0 * K, .weights = wts + t0 * K, .w13 = W.w13, .w2 = W.w2,
                    .format = W.format, .w13_scale = W.w13_scale, .w2_scale = W.w2_scale, .act = act + t0 * K * I, .ye = ye + t0 * K * D,
                    .tokens = n, .topk = K, .num_experts = E, .dim = D, .inter = I, .dtype = DType::kF32,
                    .limit = float(c_.swiglu_limit)},
                   stream_.get());
  }
  linear(h, T, D, W.shared13, 2 * I, gu);
  oc::swiglu({.gate = gu, .gate_stride = 2 * I, .up = gu + I, .up_stride = 2 * I, .in_dtype = DType::kF32,
              .out = acts, .out_stride = I, .out_dtype = DType::kF32, .rows = T, .inter = I,
              .limit = float(c_.swiglu_limit)},
             stream_.get());
  linear(acts, T, I, W.shared2, D, sh);
  gc::moe_combine({.ye = ye, .rows = comb_rows, .shared = sh, .out = buf<float>(kY, T * D), .tokens = T, .topk = K,
                   .dim = D},
                  stream_.get());
}

// Single-pass mHC: each site mixes its own input and collapses with the previous site's pre.
void CudaDSparkStages::stage(int64_t k, int64_t T, const int64_t* pos, const int64_t* key_idx, int64_t num_keys,
                             const int32_t* win_begin, const int32_t* win_count, const int64_t* comb_rows) {
  const StageDev& W = stages_[size_t(k)];
  const int n = int(c_.hc_mult);
  const int64_t D = c_.hidden_size, M = oc::hc_num_mix(n, oc::HcMode::kLayer);
  float* X = buf<float>(kX, T * n * D);
  float* X2 = buf<float>(kX2, T * n * D);
  float* mixA = buf<float>(kMixA, T * M);
  float* mixF = buf<float>(kMixF, T * M);  // the previous stage's FFN site (k > 0)
  float* u = buf<float>(kU, T * D);
  float* h = buf<float>(kH, T * D);
  const float* y = buf<float>(kY, T * D);
  auto collapse = [&](const float* x, const float* w, float* out) {
    oc::hc_collapse({.x = x, .x_stride = n * D, .w = w, .w_stride = M, .u = out, .u_stride = D,
                     .dtype = DType::kF32, .tokens = T, .n = n, .dim = D},
                    stream_.get());
  };
  auto post = [&](const float* x, const float* mix, float* out) {
    oc::hc_post({.x = x, .x_stride = n * D, .y = y, .y_stride = D, .mix = mix, .out = out, .out_stride = n * D,
                 .dtype = DType::kF32, .tokens = T, .n = n, .dim = D},
                stream_.get());
  };
  hc_site(W.hc_attn_fn, W.hc_attn_base, W.hc_attn_scale, X, mixA, T);
  collapse(X, k == 0 ? nullptr : mixF, u);
  rmsnorm(u, W.attn_norm, h, T, D);
  attention(W, k, T, pos, key_idx, num_keys, win_begin, win_count);
  post(X, mixA, X2);
  hc_site(W.hc_ffn_fn, W.hc_ffn_base, W.hc_ffn_scale, X2, mixF, T);
  collapse(X2, mixA, u);
  rmsnorm(u, W.ffn_norm, h, T, D);
  moe(W, T, comb_rows);
  post(X2, mixF, X);
}

// Host side of a round: the inputs of Sp >= S sequences in their fixed places. Padding sequences
// draft nothing: anchor 0, no ring keys (their block attends only to itself), results dropped.
void CudaDSparkStages::upload_block(const std::vector<DSparkBlockSeq>& seqs, const BlockLayout& L) {
  const int64_t S = int64_t(seqs.size()), B = L.B, V = c_.vocab_size;
  std::vector<int64_t> i64(size_t(L.n64()));
  std::vector<int32_t> i32(size_t(L.n32()));
  int32_t max_slot = 0;
  for (int64_t s = 0; s < L.Sp; ++s) {
    const DSparkBlockSeq q = s < S ? seqs[size_t(s)] : DSparkBlockSeq{.lo = 0, .last = -1};
    if (q.anchor < 0 || q.anchor >= V) DI_THROW(InvalidArgument, "dspark block: sequence ", s, " anchor ", q.anchor);
    if (q.num_drafts < 0 || q.num_drafts > B || q.last - q.lo + 1 > cap_ || q.lo < 0)
      DI_THROW(InvalidArgument, "dspark block: sequence ", s, ": ", q.num_drafts, " drafts, ring [", q.lo, ", ",
               q.last, "]");
    max_slot = std::max(max_slot, q.slot);
    const int64_t at = s * L.keys_per_seq(), n_ring = q.last - q.lo + 1;
    int64_t* keys = i64.data() + L.keys() + at;
    for (int64_t p = q.lo; p <= q.last; ++p) *keys++ = ring_row(q.slot, p);
    for (int64_t i = 0; i < B; ++i) *keys++ = -(s * B + i) - 1;  // block key i: row s*B + i of kv
    for (int64_t j = n_ring + B; j < L.keys_per_seq(); ++j) *keys++ = -(s * B) - 1;  // unread filler
    for (int64_t i = 0; i < B; ++i) {
      const int64_t t = s * B + i;
      i64[size_t(t)] = q.last + 1 + i;
      for (int64_t k = 0; k < L.n; ++k) i64[size_t(L.emb() + t * L.n + k)] = i == 0 ? q.anchor : c_.dspark.noise_token_id;
      i32[size_t(t)] = int32_t(at), i32[size_t(L.T + t)] = int32_t(n_ring + B);
    }
    i32[size_t(2 * L.T + s)] = q.anchor, i32[size_t(2 * L.T + L.Sp + s)] = q.num_drafts;
  }
  for (int64_t t = 0; t < L.T * L.K; ++t) i64[size_t(L.comb() + t)] = t;  // moe_decode: pair (t, k) at row t*K + k
  ensure_slots(int64_t(max_slot) + 1);
  upload(kBlk64, i64);
  upload(kBlk32, i32);
}

void CudaDSparkStages::block_kernels(const BlockLayout& L, bool greedy) {
  const int64_t T = L.T, n = L.n, D = c_.hidden_size, V = c_.vocab_size;
  const int64_t* d64 = buf<int64_t>(kBlk64, L.n64());
  const int32_t* d32 = buf<int32_t>(kBlk32, L.n32());
  float* X = buf<float>(kX, T * n * D);
  gc::gather_rows({.src_a = embed_, .a_stride = D, .src_dtype = DType::kF32, .src_index = d64 + L.emb(), .dst = X,
                   .dst_stride = D, .dst_dtype = DType::kF32, .rows = T * n, .width = D},
                  stream_.get());
  for (int64_t k = 0; k < int64_t(stages_.size()); ++k)
    stage(k, T, d64, d64 + L.keys(), L.num_keys(), d32, d32 + T, d64 + L.comb());
  const int64_t M = oc::hc_num_mix(int(n), oc::HcMode::kLayer);
  float* xhat = buf<float>(kXhat, T * D);
  float* hn = buf<float>(kHn, T * D);
  float* base = buf<float>(kBase, T * V);
  oc::hc_collapse({.x = X, .x_stride = n * D, .w = buf<float>(kMixF, T * M), .w_stride = M, .u = xhat, .u_stride = D,
                   .dtype = DType::kF32, .tokens = T, .n = int(n), .dim = D},
                  stream_.get());
  rmsnorm(xhat, norm_, hn, T, D);
  linear(hn, T, D, head_, V, base);
  if (!greedy) return;
  float* res = buf<float>(kOut, 3 * T);  // tokens (as int32 bits) | logprobs | confidence logits
  gc::dspark_tail({.logits = base, .xhat = xhat, .mk_embed = mk_embed_, .mk_head = mk_head_, .conf = conf_,
                   .anchor = d32 + 2 * T, .num_drafts = d32 + 2 * T + L.Sp,
                   .tokens = reinterpret_cast<int32_t*>(res), .logprobs = res + T, .conf_logits = res + 2 * T,
                   .seqs = L.Sp, .block = L.B, .vocab = V, .dim = D, .rank = c_.dspark.markov_rank},
                  stream_.get());
}

// One graph per (padded batch, greedy), as the backend's decode graphs (CudaBackend::launch): the
// first round at a shape runs eagerly (it sizes the scratch buffers and does the one-time lazy work:
// cuBLASLt heuristics, kernel attributes), the second captures (thread-local mode: a host sync in
// the round fails the capture) and replays, later ones replay. A buffer that moved (a larger batch
// grew it, the rings grew) makes every graph stale: they are captured again the same way. A capture
// that fails leaves that shape eager (logged once), never a wrong round.
void CudaDSparkStages::launch_round(const BlockLayout& L, bool greedy) {
  if (!graphs_) return block_kernels(L, greedy);
  RoundGraph& g = round_graphs_[{L.Sp, greedy}];
  if (g.generation != generation_ && !g.broken) g.graph = dc::CudaGraph(), g.warmed = false;
  if (g.graph.ready()) {
    g.graph.replay(stream_.get());
    ++replays_;
    return;
  }
  if (!g.warmed || g.broken) {
    block_kernels(L, greedy);
    g.warmed = true, g.generation = generation_;
    return;
  }
  const cudaStream_t st = stream_.get();
  capturing_ = true;
  try {
    g.graph.begin_capture(st);
    block_kernels(L, greedy);
    capturing_ = false;
    g.graph.end_capture();
  } catch (const std::exception& e) {
    capturing_ = false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t left = nullptr;
      cudaStreamEndCapture(st, &left);  // leave the stream usable
      if (left) cudaGraphDestroy(left);
    }
    (void)cudaGetLastError();
    g.graph = dc::CudaGraph(), g.broken = true;
    DI_WARN("dspark: draft round of ", L.Sp, " sequences stays eager, its graph capture failed: ", e.what());
    return block_kernels(L, greedy);
  }
  g.generation = generation_;
  g.graph.replay(st);
  ++replays_;
}

void CudaDSparkStages::block(const std::vector<DSparkBlockSeq>& seqs, bool greedy, bool want_logits,
                             DSparkBlockOut& out) {
  DI_CUDA_CHECK(cudaSetDevice(device_));
  const int64_t S = int64_t(seqs.size()), B = c_.dspark.block_size, T = S * B;
  const int64_t D = c_.hidden_size, V = c_.vocab_size;
  if (S == 0) return;
  // Padded as the engine's decode graphs (0 above the last bucket: no padding, eager). Eager rounds
  // pad too, so that both run the same shapes (cuBLASLt's f32 order depends on M) and agree bit for bit.
  const int64_t bucket = model::decode_bucket(S);
  const BlockLayout L = layout(bucket > 0 ? bucket : S);
  upload_block(seqs, L);
  if (bucket > 0) launch_round(L, greedy);
  else block_kernels(L, greedy);
  const float* base = buf<float>(kBase, L.T * V);
  if (!greedy) {  // rows of the S real sequences are the prefix
    out.base.resize(size_t(T * V));
    out.xhat.resize(size_t(T * D));
    dc::copy_d2h(out.base.data(), base, out.base.size() * sizeof(float), stream_.get(), false);
    dc::copy_d2h(out.xhat.data(), buf<float>(kXhat, L.T * D), out.xhat.size() * sizeof(float), stream_.get(), true);
    return;
  }
  const float* res = buf<float>(kOut, 3 * L.T);
  std::vector<float> host(size_t(3 * T));
  if (want_logits) {
    out.logits.resize(size_t(T * V));
    dc::copy_d2h(out.logits.data(), base, out.logits.size() * sizeof(float), stream_.get(), false);
  }
  for (int64_t part = 0; part < 3; ++part)
    dc::copy_d2h(host.data() + part * T, res + part * L.T, size_t(T) * sizeof(float), stream_.get(), part == 2);
  out.tokens.resize(size_t(T));
  std::memcpy(out.tokens.data(), host.data(), size_t(T) * sizeof(int32_t));
  out.logprobs.assign(host.begin() + T, host.begin() + 2 * T);
  out.conf_logits.assign(host.begin() + 2 * T, host.end());
}

// Routed experts: the stored FP4 bytes + per-32 scales (moe_decode kFP4, f32 activations) when
// every expert of the stage has them, else the f32 copies. Stored FP8 experts (V4.1: 32x32
// blocks) stay f32: moe_decode's FP8 reads one scale per 128 inputs of a row.
void CudaDSparkStages::experts(const V41Weights* sw, const std::string& f, const DSparkStageWeights& s, StageDev& d) {
  const int64_t E = int64_t(s.w13.size());
  std::vector<const void*> t13, t2;
  std::vector<const uint8_t*> s13, s2;
  const bool fp4_ok = sw && c_.hidden_size % 32 == 0 && c_.moe_intermediate_size % 32 == 0;
  for (int64_t e = 0; fp4_ok && e < E; ++e) {
    const std::string eo = f + "experts." + std::to_string(e) + ".";
    const StoredBytes a = stored_bytes(sw, eo + "w1.weight", v4::WeightFormat::kFP4, 32);
    const StoredBytes b = stored_bytes(sw, eo + "w2.weight", v4::WeightFormat::kFP4, 32);
    if (!a.ok() || !b.ok()) break;
    DI_CHECK(int64_t(a.w.size()) * 2 == s.w13[size_t(e)].numel() && int64_t(b.w.size()) * 2 == s.w2[size_t(e)].numel(),
             "dspark: stored FP4 expert ", e, " does not match its f32 shape");
    t13.push_back(up_bytes(a.w.data(), a.w.size())), t2.push_back(up_bytes(b.w.data(), b.w.size()));
    s13.push_back(static_cast<const uint8_t*>(up_bytes(a.scale.data(), a.scale.size())));
    s2.push_back(static_cast<const uint8_t*>(up_bytes(b.scale.data(), b.scale.size())));
  }
  if (int64_t(t13.size()) == E && E > 0) {
    d.format = oc::ExpertFormat::kFP4;
    d.w13_scale = static_cast<const uint8_t* const*>(up_bytes(s13.data(), s13.size() * sizeof(void*)));
    d.w2_scale = static_cast<const uint8_t* const*>(up_bytes(s2.data(), s2.size() * sizeof(void*)));
    stored_experts_ += int(E);
  } else {  // f32 (the buffers of a partial FP4 upload stay allocated: a checkpoint mixing formats is unexpected)
    t13.clear(), t2.clear();
    for (int64_t e = 0; e < E; ++e) t13.push_back(up(s.w13[size_t(e)])), t2.push_back(up(s.w2[size_t(e)]));
  }
  d.w13 = static_cast<const void* const*>(up_bytes(t13.data(), t13.size() * sizeof(void*)));
  d.w2 = static_cast<const void* const*>(up_bytes(t2.data(), t2.size() * sizeof(void*)));
  if (stored_dense_ + stored_experts_ > 0)
    formats_ = "stored formats: " + std::to_string(stored_dense_) + " FP8 linears, " + std::to_string(stored_experts_) +
               " FP4 experts, f32 activations (bf16 into the FP8 GEMM)";
}

void CudaDSparkStages::linear(const float* x, int64_t M, int64_t K, const DevLinear& w, int64_t N, float* y,
                              int64_t ldx, int64_t batch, Buf scratch) {
  if (ldx == 0) ldx = K;
  if (w.f32) {
    lt_.gemm({.x = x, .ldx = ldx, .w = w.f32, .ldw = K, .y = y, .ldy = batch * N, .in_dtype = DType::kF32,
              .out_dtype = DType::kF32, .M = M, .N = N, .K = K, .batch = batch, .batch_stride_x = batch > 1 ? K : 0,
              .batch_stride_w = batch > 1 ? N * K : 0, .batch_stride_y = batch > 1 ? N : 0},
             stream_.get());
    return;
  }
  // The FP8 GEMM takes bf16 activations: x rounded once (round to nearest even) into a scratch.
  const int64_t W = ldx;
  uint16_t* xb = buf<uint16_t>(scratch, M * W);
  gc::gather_rows({.src_a = x, .a_stride = W, .src_dtype = DType::kF32, .dst = xb, .dst_stride = W,
                   .dst_dtype = DType::kBF16, .rows = M, .width = W},
                  stream_.get());
  for (int64_t m0 = 0; m0 < M; m0 += oc::kFp8wMaxM) {
    const int64_t m = std::min<int64_t>(oc::kFp8wMaxM, M - m0);
    oc::gemm_fp8w({.x = xb + m0 * W, .ldx = W, .w = w.fp8, .scale = w.scale, .scale_rows = c_.fp8_block_out,
                   .scale_k = c_.fp8_block_in, .y = y + m0 * batch * N, .ldy = batch * N, .out_dtype = DType::kF32,
                   .M = m, .N = N, .K = K, .batch = batch, .batch_stride_x = K, .batch_stride_y = N,
                   .num_sms = num_sms_},
                  stream_.get());
  }
}

void check_stage_shapes(const DeepseekV41Config& c) {
  if (!c.norm_topk_prob || c.dspark.num_experts_per_tok <= 1)
    DI_THROW(ConfigError, c.origin, ": the GPU router always normalises the top-k weights; the DSpark stages' "
             "routing (top-", c.dspark.num_experts_per_tok, ") needs the host stages");
  if (c.head_dim % 32 || c.head_dim > 512 || c.hidden_size % 8 || c.moe_intermediate_size % 8)
    DI_THROW(ConfigError, c.origin, ": DSpark on the GPU needs head_dim a multiple of 32 (<= 512) and hidden / moe "
             "widths multiples of 8 (head_dim ", c.head_dim, ", hidden ", c.hidden_size, ", moe ",
             c.moe_intermediate_size, ")");
  if (c.dspark.n_routed_experts > 1024 || c.dspark.num_experts_per_tok > oc::kRouterMaxTopk)
    DI_THROW(ConfigError, c.origin, ": DSpark stages of ", c.dspark.n_routed_experts, " experts top-",
             c.dspark.num_experts_per_tok, " exceed the GPU router");
  if (c.hc_mult > oc::kHcMaxStreams)
    DI_THROW(ConfigError, c.origin, ": hc_mult ", c.hc_mult, " > ", oc::kHcMaxStreams, " on the GPU");
}
}  // namespace

DSparkStagesMaker cuda_dspark_stages(int device, bool graphs, bool stored_formats) {
  return [device, graphs, stored_formats](const DeepseekV41Config& c, const DSparkWeights& w, int64_t cap,
                                          bool qat) -> std::unique_ptr<DSparkStages> {
    check_stage_shapes(c);
    return std::make_unique<CudaDSparkStages>(c, w, cap, qat, device, graphs, stored_formats);
  };
}

}  // namespace deepinfer::model::v41
