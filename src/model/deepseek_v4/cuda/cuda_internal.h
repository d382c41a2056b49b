// Internals of the GPU forward shared by cuda_model.cpp and cuda_layers.cpp (not a public API).
#pragma once
#include <cstdint>
#include <vector>

#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/cuda/arena.h"
#include "model/deepseek_v4/cuda/cuda_cache.h"
#include "model/deepseek_v4/cuda/cuda_plan.h"
#include "model/deepseek_v4/cuda/cuda_weights.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/gemm.h"

namespace deepinfer::model::v4::gpu {

// Device copies of one compressor kind's StepMeta lists.
struct DevKind {
  const CompressMeta* host = nullptr;
  const int64_t *stage_src = nullptr, *entry_pos = nullptr, *entry_dst = nullptr;
  const int64_t *state_src = nullptr, *state_dst = nullptr, *cand_offset = nullptr;
  const int32_t *cand_rows = nullptr, *cand_count = nullptr;
  const int64_t *stage_dst = nullptr, *block = nullptr;  // fixed-shape decode only (else null)
};
struct DevMeta {
  const int32_t* token_ids = nullptr;
  const int64_t *pos = nullptr, *embed_src = nullptr, *win_src = nullptr, *win_store_src = nullptr,
                *win_store_dst = nullptr, *sel_offset = nullptr, *logits_rows = nullptr;
  const int32_t *win_begin = nullptr, *win_count = nullptr;
  const int64_t *win_dst = nullptr, *comb_rows = nullptr;  // fixed-shape decode only (else null)
  std::vector<DevKind> kinds;
  const DevKind& kind(int64_t ratio, bool overlap) const;
};

// Host side of the MoE permutation: router output copied back, tokens sorted by expert.
struct MoeHost {
  std::vector<int32_t> ids;       // [T, K]
  std::vector<float> wts;         // [T, K]
  std::vector<int64_t> perm_src;  // [T*K] token of assignment a (assignments grouped by expert, tokens ascending)
  std::vector<float> perm_w;      // [T*K] routed weight of assignment a
  std::vector<int64_t> comb;      // [T, K] assignment of (t, k)
  std::vector<int64_t> offset;    // [E+1] first assignment of expert e
};

// Everything one forward step reads; built per call by the model.
struct StepCtx {
  const DeepseekV4Config* cfg = nullptr;
  Numerics numerics = Numerics::kExact;
  DType act = DType::kBF16;        // storage_dtype(numerics): the "bf16" activations (f32 in exact mode)
  size_t act_bytes = 2;            // its element size
  const StepMeta* meta = nullptr;
  const DevMeta* dmeta = nullptr;
  char* arena = nullptr;
  ArenaLayout L{};
  int num_sms = 1;
  cudaStream_t stream = nullptr;
  ops::cuda::CublasLt* blas = nullptr;
  ops::cuda::AttnSplit split;      // split-KV choice for this step (workspace in the arena)
  struct MoeHost* moe = nullptr;   // host scratch for the expert permutation (reused)
  template <typename T>
  T* at(size_t off) const { return reinterpret_cast<T*>(arena + off); }
};

// y[M, N] = x[M, K] · Wᵀ (x in W.dtype, fp32 accumulation; out bf16 or f32 — f32 when W is f32,
// where the GEMM is plain fp32 without TF32).
void linear(const StepCtx& c, const DevLinear& W, const void* x, int64_t ldx, int64_t M, void* y, DType out_dtype,
            int64_t ldy);
// One decoder layer on the f32 streams X [T, n, D] in place (X2, u, h, y from the arena).
void decoder_layer(const StepCtx& c, const GpuLayer& L, GpuLayerCache& cache);

}  // namespace deepinfer::model::v4::gpu
