// DeepSeek-V4.1 weights as views into the mapped checkpoint, one per tensor-table part, in either
// layout (release `layers.*` FP8/FP4 or transformers `model.layers.*` floats; tensors.h). Every part
// is checked against the table (presence, dtype, shape, scale tiling) with a CheckpointError naming
// the file and tensor; checkpoint tensors neither listed nor skippable are refused by name (a later
// revision that adds tensors must be looked at). The DSpark stages (`mtp.*`) are loaded when the
// config has stages and the checkpoint holds them (v41_dspark_table); the vision tower is not read:
// its tensors are skipped with one message.
//  - linears keep their stored format (v4::Linear: bf16/f32, FP8 + 32x32 E8M0 scale, packed FP4 +
//    per-32 scale) and dequantise exactly to f32 on request;
//  - the Engram tables stay FP8 and are read by row (engram_rows_f32), never dequantised whole.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek_v4/weights.h"  // v4::Linear
#include "model/deepseek_v41/tensors.h"

namespace deepinfer::model::v41 {

enum class V41Layout : uint8_t { kRelease, kTransformers };

struct V41Weights {
  V41Layout layout = V41Layout::kRelease;
  V41TensorTable table;
  // Per entry, per part: a linear (kPlain/kDense/kExpert/kEmbed/kHead; the Engram table as a
  // weight + per-row scale) or a float tensor (kFloat).
  std::vector<std::vector<v4::Linear>> parts;
  std::shared_ptr<void> keepalive;       // the mapped shards
  std::vector<std::string> skipped;      // tensors of parts not run (vision; DSpark when the config has no stages)
  int64_t num_dspark = 0;                // DSpark stages loaded (their entries follow the main model's)

  static V41Weights load(const std::string& dir, const DeepseekV41Config& cfg, bool progress = false);

  // Index of the entry whose first part is `name` (release name), or -1.
  int64_t find(const std::string& name) const;
  // The entry's parts dequantised exactly and stacked by rows: f32 [rows, cols] (floats keep their shape).
  Tensor entry_f32(size_t entry, const DeepseekV41Config& cfg) const;
};

// Engram table rows -> f32: out[i, :] = row ids[i] of `table` (FP8 e4m3 [rows, dim] with an E8M0
// scale [rows, dim/32], or bf16/f32 [rows, dim] without one). Ids outside the table are
// InvalidArgument naming the position.
void engram_rows_f32(const v4::Linear& table, const int64_t* ids, int64_t n, float* out);

}  // namespace deepinfer::model::v41
