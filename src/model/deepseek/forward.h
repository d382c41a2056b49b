// The DeepSeek-V4-family forward, written once for every backend (backend.h): embedding, the
// decoder layers as their plans describe them (mHC sites, attention with sliding window,
// compressors, indexers and sparse attention; the MoE seam), the head, and the V4 MTP block
// (MODEL-DEEPSEEK-V4.md §2-§7). It only enqueues backend ops: no allocation, no host sync, so the
// fixed-shape decode step a CUDA backend captures into a graph is exactly this code.
#pragma once
#include <cstdint>

#include "model/deepseek/backend.h"
#include "model/deepseek/prepared.h"
#include "model/plan/layer_plan.h"

namespace deepinfer::model::ds {

// The forward's view of a family's config.
struct Dims {
  int64_t vocab = 0;
  int64_t hidden = 0;            // D
  int64_t streams = 1;           // n (hc_mult)
  int64_t heads = 0;             // H
  int64_t head_dim = 0;          // d
  int64_t rope_dim = 0;          // trailing dims of each head that rotate
  int64_t q_lora = 0;            // r
  int64_t o_groups = 1;          // G
  int64_t o_lora = 0;            // R
  int64_t experts = 0;           // E
  int64_t topk = 1;              // K
  int64_t moe_inter = 0;         // I
  int64_t index_heads = 0;       // Hi
  int64_t index_dim = 0;         // di
  int64_t index_topk = 0;
  int64_t sinkhorn_iters = 20;
  float eps = 1e-6f;             // rms_norm_eps
  float hc_eps = 1e-6f;
  float swiglu_limit = 0.f;
  float routed_scale = 1.f;
  bool norm_topk = true;
  float gate_temp = 1.f;              // router logits are divided by it (V4.1; 1 in V4)
  int64_t candidate_block_size = 0;   // two-level top-k (V4.1): entries per candidate block, 0 = none
  int64_t candidate_topk_blocks = 0;  // candidate blocks kept per token
  bool engram = false;                // some layer injects Engram (V4.1): sizes its step buffer
  // Where the routed weight multiplies an expert's output: true = its SwiGLU output before w2
  // (V4.1's reference, and the CUDA backend's kernels for both families); false = w2's output in
  // the combine (V4 on the CPU backend, kept bit for bit).
  bool route_before_w2 = false;
  // DSpark tap layers (V4.1, MODEL-DEEPSEEK-V41.md §7): > 0 makes the hidden rows a step returns
  // the stream means at those layers' inputs, [taps·D] per row, instead of the final streams.
  int64_t taps = 0;
  int64_t mix_dim() const { return (2 + streams) * streams; }
  int64_t hidden_elems() const { return taps > 0 ? taps * hidden : streams * hidden; }
};

// A model as the forward sees it: dimensions and the layer plans.
struct Arch {
  Dims dims;
  ModelPlan plan;
};

// One target step over the backend's current StepPlan: embedding -> layers -> (hidden rows) ->
// head logits of the plan's `rows` logits rows into Buf::kLogits. rows = 0 skips the head.
void forward_step(Backend& be, const Arch& arch, const ModelRef& w, int64_t rows, int64_t hidden_rows);

// Bounded replay (LayerPlan::replay_tail): the layers before the tail layers, i.e. the encoder
// side that runs over every position of a prompt (num_layers when no layer is a tail layer).
int64_t replay_encoder_layers(const ModelPlan& plan);
// The encoder side of a step over the backend's current StepPlan (positions before their
// sequence's kept tail): embedding and the layers [0, replay_encoder_layers); no head.
void encoder_step(Backend& be, const Arch& arch, const ModelRef& w);

// A step with no tokens on a rank whose MoE layers are expert-parallel: only the MoE exchanges
// (dispatch -> experts -> combine of every expert-parallel layer, in layer order), so this rank
// still serves its experts to the peers that do have tokens. Nothing else runs.
void collectives_step(Backend& be, const Arch& arch, const ModelRef& w);

// One V4 MTP step with block k over the backend's current StepPlan (MODEL-DEEPSEEK-V4.md §7):
// token ids are the tokens that follow each main position, `main_hidden` [T, n, D] f32 (backend
// memory) the target's final streams there. Writes the block's window ring, its output streams
// into Buf::kX, the logits of `rows` rows into Buf::kLogits and the output streams of `hidden_rows`
// rows into Buf::kHidden (what a recursive draft feeds back).
void mtp_step(Backend& be, const Arch& arch, const ModelRef& w, int64_t k, const float* main_hidden, int64_t rows,
              int64_t hidden_rows);

}  // namespace deepinfer::model::ds
