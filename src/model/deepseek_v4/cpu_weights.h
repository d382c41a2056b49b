// DeepSeek-V4 weights prepared for the CPU backend: every linear dequantised to a contiguous
// f32 [out, in] matrix, norms and mHC parameters as f32, routing tables as int32.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/weights.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/rope.h"

namespace deepinfer::model::v4 {

struct CpuLinear {
  Tensor w;  // f32 [out, in]
  int64_t out = 0, in = 0;
  const float* data() const { return w.data<float>(); }
};

struct CpuCompressor {
  int64_t ratio = 0, width = 0;  // m, c
  CpuLinear wkv_gate;            // [2c, D]: rows [0,c) = Wkv, [c,2c) = Wgate (one GEMM gives a|z)
  Tensor ape;                    // f32 [m, c]
  Tensor norm;                   // f32 [d]
};

struct CpuAttention {
  AttnKind kind = AttnKind::kSliding;
  int64_t ratio = 0;
  CpuLinear wq_a, wq_b, wkv, wo_a, wo_b;
  Tensor q_norm, kv_norm, sink;  // f32
  std::optional<CpuCompressor> compressor;
  std::optional<CpuCompressor> index_compressor;
  CpuLinear index_wq_b, index_weights;  // CSA only
  const std::vector<float>* inv_freq = nullptr;  // rope table of this layer
};

struct CpuExpert {
  CpuLinear w1, w3, w2;
};

struct CpuMoE {
  CpuLinear gate;                 // [E, D]
  Tensor bias;                    // f32 [E] or undefined
  std::vector<int32_t> tid2eid;   // [V, k] or empty
  std::vector<CpuExpert> experts;
  CpuExpert shared;
};

struct CpuHc {
  Tensor fn, base, scale;  // f32
};

struct CpuLayer {
  Tensor attn_norm, ffn_norm;
  CpuHc hc_attn, hc_ffn;
  CpuAttention attn;
  CpuMoE ffn;
};

struct CpuMtp {
  CpuLinear e_proj, h_proj;
  Tensor enorm, hnorm, norm;
  CpuHc hc_head;
  CpuLayer block;
};

struct CpuModelWeights {
  Tensor embed, norm;        // f32 [V,D], [D]
  ops::cpu::PackedWeight head;  // lm head [V,D] in 16-column panels: streamed once per step

  CpuHc hc_head;
  std::vector<CpuLayer> layers;
  std::vector<CpuMtp> mtp;
  std::vector<float> inv_freq_main, inv_freq_compress;
};

CpuLinear to_cpu_linear(const Linear& l, const DeepseekV4Config& cfg);
Tensor to_f32_contig(const Tensor& t);
CpuLayer to_cpu_layer(const LayerWeights& lw, AttnKind kind, int64_t ratio, const DeepseekV4Config& cfg,
                      const CpuModelWeights& model);

}  // namespace deepinfer::model::v4
