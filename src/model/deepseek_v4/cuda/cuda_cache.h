// Device-resident DeepSeek-V4 cache (the GPU twin of kv::KvCache): per layer a window ring per
// slot, paged compressed entries and indexer keys addressed through the block table (all in the
// numerics mode's storage dtype: bf16, f32 in exact mode), f32 compressor partial rows per slot.
// Layouts in cuda_plan.h. Allocated zeroed.
#pragma once
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::v4::gpu {

struct GpuLayerCache {
  kv::LayerCacheSpec spec;
  int64_t entries_per_block = 0;
  DType dtype = DType::kBF16;      // of window, comp, index_keys
  cuda::DeviceBuffer window;       // dtype [slots*W, d]
  cuda::DeviceBuffer comp;         // dtype [blocks*epb, d]
  cuda::DeviceBuffer index_keys;   // dtype [blocks*epb, index_dim]
  cuda::DeviceBuffer comp_state;   // f32 [slots*S, 2c]
  cuda::DeviceBuffer index_state;  // f32 [slots*2m, 2*index_width]
};

class GpuCache {
 public:
  GpuCache() = default;
  // kv_dtype: bf16 or f32 (window rings, entries, indexer keys).
  GpuCache(const std::vector<kv::LayerCacheSpec>& layers, const kv::CacheGeometry& g, DType kv_dtype,
           cudaStream_t stream);
  bool allocated() const { return !layers_.empty(); }
  const kv::CacheGeometry& geometry() const { return geometry_; }
  GpuLayerCache& layer(int64_t i) { return layers_.at(size_t(i)); }
  // Zeroes the slot's window rows and pending compressor rows (async on `stream`).
  void reset_slot(int32_t slot, cudaStream_t stream);

 private:
  kv::CacheGeometry geometry_;
  size_t kv_bytes_ = 2;
  std::vector<GpuLayerCache> layers_;
};

}  // namespace deepinfer::model::v4::gpu
