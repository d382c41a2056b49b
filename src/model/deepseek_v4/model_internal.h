// Internals of the CPU forward shared by model.cpp, layer_*.cpp and mtp.cpp (not a public API).
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/cpu_weights.h"
#include "model/forward_batch.h"
#include "ops/cpu/hc.h"

namespace deepinfer::model::v4 {

// One sequence's slice of the packed batch.
struct SeqView {
  int64_t tok0 = 0;    // first row of this sequence in the packed batch
  int64_t n = 0;       // new tokens
  int64_t pos0 = 0;    // absolute position of the first new token (= tokens already cached)
  int32_t slot = -1;
  const std::vector<int32_t>* block_table = nullptr;
};

struct BatchPlan {
  int64_t T = 0;
  std::vector<SeqView> seqs;
  std::vector<int64_t> pos;        // [T] absolute positions
  const int32_t* token_ids = nullptr;  // [T]
};

// Growable scratch buffers, reused across layers and calls (sizes only grow).
struct Workspace {
  std::vector<float> X, X2, u, post, comb, h, y;                 // streams and block io
  std::vector<float> qa, q, kv, o, z_o, win, az, stage, ent;    // attention
  std::vector<float> iaz, qi, iw;                                // indexer
  std::vector<int32_t> win_begin, win_count, cmp_rows, cmp_count, sel_rows, sel_count, cand_rows;
  std::vector<int64_t> cmp_offset, cand_offset, ent_pos;
  std::vector<float> logits, ids_w;                              // router
  std::vector<int32_t> ids;
};

template <typename T>
T* grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

ops::cpu::HcSpec hc_spec(const DeepseekV4Config& cfg);

// h [T, D] (attn-normed block input) -> out [T, D]; updates the layer's cache for every sequence.
void attention_block(const CpuAttention& A, const DeepseekV4Config& cfg, kv::LayerCache& cache, const BatchPlan& plan,
                     const float* h, float* out, Workspace& ws);
// x [T, D] (ffn-normed) -> out [T, D].
void moe_block(const CpuMoE& M, const DeepseekV4Config& cfg, const BatchPlan& plan, const float* x, float* out,
               Workspace& ws);
// One decoder layer on the streams X [T, n, D] in place (uses ws.X2/u/post/comb/h/y).
void decoder_layer(const CpuLayer& L, const DeepseekV4Config& cfg, kv::LayerCache& cache, const BatchPlan& plan,
                   float* X, Workspace& ws);

}  // namespace deepinfer::model::v4
