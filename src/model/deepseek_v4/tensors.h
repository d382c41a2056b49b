// DeepSeek-V4's tensor table: every tensor the model reads, once, with its names in both checkpoint
// layouts, its shape, how the release stores it and where it goes. Four consumers walk the same
// entries: the loader (names, dtypes, shapes -> views in DeepseekV4Weights), the CPU preparation and
// the GPU upload (views -> the backend's prepared ModelRef), and the GPU memory plan (shapes and
// formats -> bytes, from the config alone). An entry is one prepared tensor; its parts are the
// checkpoint tensors stacked by rows into it (a compressor's Wkv|Wgate, an expert's W1|W3).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek/prepared.h"
#include "model/deepseek_v4/config.h"
#include "parallel/eplb.h"
#include "model/deepseek_v4/weights.h"
#include "model/plan/layer_plan.h"

namespace deepinfer::model::v4 {

enum class EntryKind : uint8_t {
  kLinear,  // y = x W^T in any stored format (bf16/f32, FP8 + block scale, packed FP4 + scale)
  kFloat,   // f32 parameters (norm weights, mHC, sinks, ape, router bias): bf16/f32 in the file
  kTable,   // hash-routing table [V, k] (i64/i32)
};
// What a linear is, for the backends' storage choices.
enum class LinearRole : uint8_t {
  kPlain,   // bf16 in the release: compressor, router, indexer head weights
  kDense,   // FP8 in the release (attention, indexer wq_b, shared expert, MTP projections)
  kExpert,  // routed expert (FP4 / FP8 in the release)
  kEmbed,   // input embedding (gathered by rows, never multiplied)
  kHead,    // lm head
};

struct TensorPart {
  std::string name;        // release name (`layers.3.attn.wq_a.weight`)
  std::string hf;          // transformers name without `model.` ("" = the release name only)
  std::string alias;       // another accepted spelling ("" = none)
  Shape shape;             // [out, in] for linears
  Linear* lin = nullptr;   // canonical view the loader fills (kLinear)
  Tensor* t = nullptr;     // canonical view the loader fills (kFloat / kTable)
};

struct TensorEntry {
  EntryKind kind = EntryKind::kFloat;
  LinearRole role = LinearRole::kPlain;
  std::vector<TensorPart> parts;   // stacked by rows
  int32_t layer = -1;              // main layer (or num_layers + k for MTP block k), -1 global
  int32_t expert = -1;             // routed expert index (role kExpert)
  bool expert_w13 = false;         // routed expert: the W1|W3 entry (else W2)
  int64_t groups = 1;              // block-diagonal grouped linear (wo_a: o_groups row groups)
  ds::LinearRef* lin = nullptr;    // prepared target (kLinear)
  ds::VecRef* vec = nullptr;       // prepared target (kFloat)
  const int32_t** table = nullptr; // prepared target (kTable)
  int64_t* table_rows = nullptr;
  int64_t rows() const;            // stacked rows (linears: out)
  int64_t cols() const;            // linears: in; floats: elements per row
  int64_t numel() const { return rows() * cols(); }
  std::string name() const { return parts.empty() ? std::string() : parts[0].name; }
};

struct TensorTable {
  std::vector<TensorEntry> entries;
};

// Builds the table of a config's main layers and `num_mtp` MTP blocks (`plan` decides which
// compressors and indexers each layer has). `canon` and `prep` are sized to the model (layers,
// experts, optional compressors) and the entries point into them; either may be null (the memory
// plan needs neither).
TensorTable v4_tensor_table(const DeepseekV4Config& cfg, const ModelPlan& plan, DeepseekV4Weights* canon,
                            ds::ModelRef* prep);

// Drops the main layers' routed-expert entries that `shard` does not hold (expert parallelism
// without weight moves): what is not in the table is neither planned nor prepared nor uploaded.
// MTP blocks keep every expert (drafting is not expert-parallel).
void keep_expert_shard(TensorTable& table, const parallel::ExpertShard& shard, int32_t experts, int64_t main_layers);

}  // namespace deepinfer::model::v4
