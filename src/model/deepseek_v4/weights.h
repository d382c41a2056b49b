// DeepSeek-V4 weights in one canonical structure, whatever the checkpoint layout.
// Tensors are views into memory-mapped shards (no copies) in the stored dtype; quantised
// linears carry their scales. Backends convert once when they prepare a model (the CPU
// backend dequantises to f32, the CUDA backend uploads in its kernel formats).
// Shapes use the release names: D hidden, H heads, d head_dim, r q_lora_rank, I moe width.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer::model::v4 {

// y = x W^T. weight [out, in] in `format`; scale present for kFP8Block ([ceil(out/b), ceil(in/b)]
// e8m0 or f32) and kFP4 ([out, in/32] e8m0). kFP4 weights are packed: dtype kFP4E2M1 [out, in].
// Encodings (same as the release): fp4 element 2k in the LOW nibble of byte k, 2k+1 in the high
// nibble; e8m0 byte e means 2^(e-127) (0xFF is NaN and propagates). Dequantised value =
// decode(w) * scale of its block, computed exactly in f32.
struct Linear {
  Tensor weight;
  Tensor scale;
  WeightFormat format = WeightFormat::kBF16;
  int64_t out_features() const { return weight.size(0); }
  int64_t in_features() const { return weight.size(1); }
  // Dequantised f32 copy [out, in] (host).
  Tensor dequantize_f32(int64_t fp8_block = 128, int64_t fp4_block = 32) const;
  // The same values written to dst [out * in] (contiguous; e.g. a reused page-locked staging
  // buffer, so a large upload neither page-faults nor copies twice).
  void dequantize_f32_into(float* dst, int64_t fp8_block = 128, int64_t fp4_block = 32) const;
};

struct HcParams {      // one mHC site
  Tensor fn;           // [(2+n)n, n*D] f32
  Tensor base;         // [(2+n)n] f32
  Tensor scale;        // [3] f32
};
struct HcHeadParams {  // final stream collapse
  Tensor fn;           // [n, n*D] f32
  Tensor base;         // [n] f32
  Tensor scale;        // [1] f32
};

struct CompressorWeights {
  int64_t ratio = 0;   // m: 4 (CSA, overlapping) or 128 (HCA)
  Linear wkv;          // [c, D]  c = 2*d (CSA) or d (HCA); indexer: 2*idx_d or idx_d
  Linear wgate;        // [c, D]
  Tensor ape;          // [m, c] f32, added to gate logits
  Tensor norm;         // [d] (RMSNorm weight of the pooled entry)
};

struct IndexerWeights {  // CSA layers only
  Linear wq_b;           // [idx_H*idx_d, r]
  Linear weights_proj;   // [idx_H, D]
  CompressorWeights compressor;  // ratio 4, c = 2*idx_d, norm [idx_d]
};

struct AttentionWeights {
  Linear wq_a;         // [r, D]
  Tensor q_norm;       // [r]
  Linear wq_b;         // [H*d, r]
  Linear wkv;          // [d, D]
  Tensor kv_norm;      // [d]
  Linear wo_a;         // [o_groups*o_lora_rank, H*d/o_groups]
  Linear wo_b;         // [D, o_groups*o_lora_rank]
  Tensor sink;         // [H] f32
  std::optional<CompressorWeights> compressor;  // CSA/HCA layers
  std::optional<IndexerWeights> indexer;        // CSA layers
};

struct ExpertWeights {
  Linear w1;           // gate [I, D]
  Linear w3;           // up   [I, D]
  Linear w2;           // down [D, I]
};

struct MoEWeights {
  Tensor gate;         // router [E, D]
  Tensor bias;         // [E] f32 (bias-routed layers), undefined for hash layers
  Tensor tid2eid;      // [V, k] i64/i32 (hash layers), undefined otherwise
  std::vector<ExpertWeights> experts;  // [E]
  ExpertWeights shared;                // n_shared_experts == 1
};

struct LayerWeights {
  Tensor attn_norm;    // [D]
  Tensor ffn_norm;     // [D]
  HcParams hc_attn, hc_ffn;
  AttentionWeights attn;
  MoEWeights ffn;
};

struct MtpWeights {    // one next-token-prediction block (official layout `mtp.K.*`)
  Linear e_proj, h_proj;        // [D, D]
  Tensor enorm, hnorm, norm;    // [D]
  HcHeadParams hc_head;
  LayerWeights block;           // sliding-only attention, bias-routed MoE
};

struct LoadOptions {
  bool progress = true;   // one INFO line per shard while mapping
  bool warn_unused = true;  // WARN about tensors the model does not use
};

// Parameter counts (floating weights, scales excluded; fp4 counts unpacked elements).
struct ParamCounts {
  int64_t total = 0;        // main model + MTP
  int64_t mtp = 0;          // MTP blocks only (embedding/head are shared, not counted again)
  int64_t embed = 0;        // input embedding
  int64_t routed = 0;       // routed experts of the main model
  int64_t active = 0;       // per token in the main model: all but embed, routed scaled by k/E
};

struct DeepseekV4Weights {
  CheckpointLayout layout = CheckpointLayout::kTransformers;  // detected from the tensor names
  Tensor embed;        // [V, D]
  Tensor head;         // [V, D]
  Tensor norm;         // [D]
  HcHeadParams hc_head;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;
  std::shared_ptr<void> keepalive;  // the mapped shards (an io::Checkpoint)
  std::vector<std::string> ignored_tensors;  // in the checkpoint but not used by the model (warned)

  // Loads `<dir>` (config already parsed from it). Validates every tensor's presence,
  // dtype and shape; throws CheckpointError naming the file and tensor.
  static DeepseekV4Weights load(const std::string& dir, const DeepseekV4Config& cfg);
  static DeepseekV4Weights load(const std::string& dir, const DeepseekV4Config& cfg, const LoadOptions& opts);

  ParamCounts param_counts(const DeepseekV4Config& cfg) const;
};

}  // namespace deepinfer::model::v4
