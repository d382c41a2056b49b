// Preparation of DeepSeek-V4's weights for a backend, driven by its tensor table (tensors.h): the
// CPU backend's f32 copies here; the GPU upload in deepseek/cuda.
#pragma once
#include <memory>

#include "model/deepseek/cpu/cpu_backend.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/tensors.h"

namespace deepinfer::model::v4 {

// rope inverse frequencies of the main (theta, no YaRN) and the compressed layers.
std::vector<float> inv_freq_main(const DeepseekV4Config& cfg);
std::vector<float> inv_freq_compress(const DeepseekV4Config& cfg);

// Every entry of `table` (whose canonical parts the loader filled) dequantised exactly to f32
// contiguous host tensors; the lm head repacked into panels; hash tables as int32; per-layer rope
// tables by plan. The returned store's refs are laid out like the table's prepared targets.
// With a shard, the main layers' routed experts other ranks hold stay unprepared (undefined refs;
// their mapped bytes are never read).
std::unique_ptr<ds::CpuWeightStore> prepare_cpu(const DeepseekV4Config& cfg, const ModelPlan& plan,
                                                const DeepseekV4Weights& canon,
                                                const std::optional<parallel::ExpertShard>& shard = std::nullopt);

}  // namespace deepinfer::model::v4
