// DeepSeek-V4.1's tensor table: every tensor the main model reads, once, with its name in both
// checkpoint layouts, its shape and how the release stores it (tests/data/golden/README.md,
// "V4.1 fixtures"; notes §8). It is the loader's contract: the release names are
// `layers.L.<suffix>`, `embed.weight`, `norm.weight`, `head.weight`; transformers' save_pretrained
// writes the same suffixes under `model.` except `lm_head.weight`. Release storage:
//  - dense linears (attention, indexer wq_b, shared expert, engram wkv): FP8 e4m3 with an E8M0
//    `.scale` per 32x32 block, [ceil(out/32), ceil(in/32)];
//  - routed experts: packed FP4 (I8 [out, in/2], element 2k in the low nibble) + `.scale` [out, in/32];
//  - the Engram table: FP8 rows + `.scale` [rows, head_dim/32] (per row, per 32), read by row and
//    never dequantised up front; the transformers layout stores it as floats and its all-ones
//    `.scale` must not be applied again;
//  - everything else bf16 (plain linears, embed, head, norms) or f32 (mHC, sinks, router biases).
// Checkpoint tensors the main model does not read: the DSpark stages `mtp.*` (the drafter's own
// table), the vision tower `vision.*`, `aligner.*`, `image_*` (not run: skipped with a message), and
// the router's `gate.bias_vl` (image-span routing; listed, unused until vision runs).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v41/config.h"
#include "model/plan/layer_plan.h"

namespace deepinfer::model::v41 {

enum class V41Store : uint8_t {
  kFloat,        // f32 parameters: norms, mHC, sinks, router biases, Engram q/k weights (bf16/f32 in the file)
  kPlain,        // bf16 linear in the release: compressor, indexer wk / weights_proj, router
  kDense,        // FP8 + 32x32 E8M0 scale in the release
  kExpert,       // routed expert: packed FP4 + E8M0 scale per 32 along K in the release
  kEmbed,        // input embedding (rows gathered)
  kHead,         // lm head
  kEngramTable,  // Engram rows: FP8 + E8M0 per row per 32 in the release
};
const char* v41_store_name(V41Store s);

struct V41Part {
  std::string name;  // release name (`layers.3.attn.wq_a.weight`)
  std::string hf;    // transformers name when it is not `model.` + name ("" = that)
  Shape shape;       // [out, in] for linears
};

struct V41Entry {
  V41Store store = V41Store::kFloat;
  std::vector<V41Part> parts;  // stacked by rows into one prepared tensor (Wkv|Wgate, W1|W3)
  int32_t layer = -1;          // main layer (DSpark stage k: num_layers + k), -1 global
  int32_t expert = -1;         // routed expert (kExpert)
  bool expert_w13 = false;     // routed expert: the W1|W3 entry (else W2)
  int64_t groups = 1;          // block-diagonal grouped linear (wo_a)
  bool used = true;            // false: listed so the loader knows it, not read by the forward (bias_vl)
  std::string name() const { return parts.empty() ? std::string() : parts[0].name; }
};

struct V41TensorTable {
  std::vector<V41Entry> entries;
};

// The table of a config's main layers as `plan` describes them (which layers own a compressor, a
// gate, index keys, an index query; where Engram sits).
V41TensorTable v41_tensor_table(const DeepseekV41Config& cfg, const ModelPlan& plan);

// The DSpark stages' tensors (`mtp.k.*`, release names only; entry layer = num_layers + k).
V41TensorTable v41_dspark_table(const DeepseekV41Config& cfg);

// Checkpoint tensors that belong to parts of the release the main model does not run.
bool v41_skipped_tensor(const std::string& name);

}  // namespace deepinfer::model::v41
