// Device-resident DeepSeek-V4 cache (the GPU twin of kv::KvCache): per layer a bf16 window
// ring per slot, bf16 paged compressed entries and indexer keys addressed through the block
// table, f32 compressor partial rows per slot. Layouts in cuda_plan.h. Allocated zeroed.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4::gpu {

struct GpuLayerCache {
  kv::LayerCacheSpec spec;
  int64_t entries_per_block = 0;
  cuda::DeviceBuffer window;       // bf16 [slots*W, d]
  cuda::DeviceBuffer comp;         // bf16 [blocks*epb, d]
  cuda::DeviceBuffer index_keys;   // bf16 [blocks*epb, index_dim]
  cuda::DeviceBuffer comp_state;   // f32 [slots*S, 2c]
  cuda::DeviceBuffer index_state;  // f32 [slots*2m, 2*index_width]
};

class GpuCache {
 public:
  GpuCache() = default;
  GpuCache(const std::vector<kv::LayerCacheSpec>& layers, const kv::CacheGeometry& g, cudaStream_t stream);
  bool allocated() const { return !layers_.empty(); }
  const kv::CacheGeometry& geometry() const { return geometry_; }
  GpuLayerCache& layer(int64_t i) { return layers_.at(size_t(i)); }
  // Zeroes the slot's window rows and pending compressor rows (async on `stream`).
  void reset_slot(int32_t slot, cudaStream_t stream);

 private:
  kv::CacheGeometry geometry_;
  std::vector<GpuLayerCache> layers_;
};

}  // namespace deepinfer::model::v4::gpu
