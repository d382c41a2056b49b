// Weights as a backend prepared them, in one layout for every backend and family member: plain
// references (pointer, dtype, shape) into storage the backend owns (host tensors for the CPU,
// device allocations for the GPU). The shared forward (forward.h) reads only these; how a
// backend stores a linear (f32, bf16, FP8 e4m3 + e8m0 grid, FP4 e2m1 + e8m0 per 32) is the
// backend's business, named by LinearRef::dtype.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/dtype.h"

namespace deepinfer::model::ds {

// y = x W^T with W [out, in] row-major at `w` (row stride `in`; kFP4E2M1: in/2 bytes).
struct LinearRef {
  const void* w = nullptr;
  const void* scale = nullptr;  // dense kF8E4M3: e8m0 grid [ceil(out/scale_rows), ceil(in/scale_cols)];
                                // routed experts kFP4E2M1/kF8E4M3: e8m0 per row per 32/128 inputs
  DType dtype = DType::kF32;    // f32 | bf16 | kF8E4M3 | kFP4E2M1
  int64_t out = 0, in = 0;
  int64_t scale_rows = 128;     // dense kF8E4M3 only
  int64_t scale_cols = 128;     // dense kF8E4M3 only: inputs per scale column (V4 128, V4.1 32)
  bool panels = false;          // CPU: repacked in 16-column panels (ops::cpu::PackedWeight), see `packed`
  const void* packed = nullptr; // CPU: the PackedWeight when `panels`
  bool defined() const { return w != nullptr || packed != nullptr; }
};

// f32 parameters (norm weights, mHC, sinks, ape, router bias) in backend memory.
struct VecRef {
  const float* p = nullptr;
  int64_t n = 0;
  bool defined() const { return p != nullptr; }
};

struct HcRef { VecRef fn, base, scale; };  // one mHC site (or the final collapse)

struct CompressorRef {
  int64_t ratio = 0, width = 0;  // m, c (projection width: a and z halves each c wide)
  LinearRef wkv_gate;            // [2c, D]: rows [0, c) Wkv, [c, 2c) Wgate
  VecRef ape;                    // [m, c] or undefined
  VecRef norm;                   // [entry width]
};

struct ExpertRef {
  LinearRef w13;  // [2I, D]: rows [0, I) W1 (gate), [I, 2I) W3 (up)
  LinearRef w2;   // [D, I]
};

// Device tables the GPU's routed-expert kernels index by expert id (null on the CPU).
struct ExpertTables {
  const void* const* w13 = nullptr;
  const void* const* w2 = nullptr;
  const uint8_t* const* w13_scale = nullptr;
  const uint8_t* const* w2_scale = nullptr;
  DType dtype = DType::kBF16;  // how every routed expert of the layer is stored
};

struct MoeRef {
  LinearRef gate;               // router [E, D]
  VecRef bias;                  // [E] selection bias (biased routing)
  const int32_t* tid2eid = nullptr;  // [tid2eid_rows, k] (hash routing)
  int64_t tid2eid_rows = 0;
  std::vector<ExpertRef> experts;    // [E]
  ExpertTables tables;
  ExpertRef shared;
  bool host_routed = false;     // GPU test path: routing read back, one GEMM per expert
  // Main layer index into the expert-parallel placement (expert_parallel.h); -1 = not expert-
  // parallel (single rank, or an MTP block, whose experts every rank holds).
  int32_t ep_layer = -1;
};

struct AttentionRef {
  LinearRef wq_a, wq_b, wkv, wo_a, wo_b;
  VecRef q_norm, kv_norm, sink;
  std::optional<CompressorRef> comp;   // KV sources (V4.1 ratio 1: wkv_gate holds Wkv only, width c)
  std::optional<CompressorRef> icomp;  // V4 key compressor (CSA)
  LinearRef index_wq_b, index_weights; // index sources
  LinearRef index_wk;                  // V4.1 keys from the latent: [di, d] (KV sources)
  VecRef index_k_norm;                 // [di]
  const float* inv_freq = nullptr;     // rope table of this layer (backend memory)
};

// V4.1 Engram at a layer (MODEL-DEEPSEEK-V41.md §5): the table stays in its stored form in host
// memory and is read by row id (FP8 e4m3 rows with an E8M0 scale per 32, or bf16/f32 rows);
// the gathered rows go through wkv, then the gated injection (ops engram_inject).
struct EngramRef {
  const void* table = nullptr;        // [rows, dim] host memory
  const void* table_scale = nullptr;  // [rows, dim/32] e8m0, FP8 tables only
  DType table_dtype = DType::kF8E4M3;
  int64_t rows = 0, dim = 0;
  LinearRef wkv;                      // [(n+1)·D, columns·dim]: key (n·D) then value (D)
  VecRef w;                           // [n, D] q_weight ⊙ k_weight
  bool defined() const { return table != nullptr; }
};

struct LayerRef {
  VecRef attn_norm, ffn_norm;
  HcRef hc_attn, hc_ffn;
  AttentionRef attn;
  MoeRef ffn;
  EngramRef engram;  // V4.1 Engram layers only
};

struct MtpRef {            // V4 MTP block (MODEL-DEEPSEEK-V4.md §7)
  LinearRef e_proj, h_proj;
  VecRef enorm, hnorm, norm;
  HcRef hc_head;
  LayerRef block;
};

struct ModelRef {
  LinearRef embed;          // [V, D]
  LinearRef head;           // [V, D]
  VecRef norm;
  HcRef hc_head;
  std::vector<LayerRef> layers;
  std::vector<MtpRef> mtp;
  VecRef inv_freq_main, inv_freq_compress;
};

}  // namespace deepinfer::model::ds
