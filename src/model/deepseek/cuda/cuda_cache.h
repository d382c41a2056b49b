// The device-resident cache of the CUDA backend (the GPU twin of kv::KvCache): per layer a window
// ring per slot, paged compressed entries and index keys addressed through the block table (in
// the numerics mode's storage dtype: bf16, f32 in exact mode), f32 compressor partial rows per
// slot. Layouts and sizes: kv/kv_cache.h (layer_cache_bytes), the same formulas as the host cache.
// Allocated zeroed on the backend's device.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/causal_lm.h"
#include "ops/cuda/runtime.h"

namespace deepinfer::model::ds::cuda {

struct GpuLayerCache {
  kv::LayerCacheSpec spec;
  int64_t entries_per_block = 0;
  deepinfer::cuda::DeviceBuffer window;       // dtype [slots*ring_rows, d]
  deepinfer::cuda::DeviceBuffer comp;         // dtype [blocks*epb, d]
  deepinfer::cuda::DeviceBuffer index_keys;   // dtype [blocks*epb, index_dim]
  deepinfer::cuda::DeviceBuffer comp_state;   // f32 [slots*state_rows, 2c]
  deepinfer::cuda::DeviceBuffer index_state;  // f32 [slots*index_state_rows, 2*index_width]
};

class GpuCache {
 public:
  GpuCache() = default;
  // kv_dtype: bf16 or f32 (window rings, entries, index keys).
  GpuCache(const std::vector<kv::LayerCacheSpec>& layers, const kv::CacheGeometry& g, DType kv_dtype, int device,
           cudaStream_t stream);
  bool allocated() const { return !layers_.empty(); }
  const kv::CacheGeometry& geometry() const { return geometry_; }
  GpuLayerCache& layer(int64_t i) { return layers_.at(size_t(i)); }
  // Zeroes the slot's window rows and pending compressor rows (async on `stream`).
  void reset_slot(int32_t slot, cudaStream_t stream);
  // The slot's fixed state as host bytes (every layer's window ring and partials; synchronous),
  // and its restore.
  std::vector<uint8_t> save_slot(int32_t slot, cudaStream_t stream) const;
  // save_slot's bytes of one slot, and its copies into `dst` (slot_bytes() of pinned host memory)
  // queued on `stream` without waiting.
  size_t slot_bytes() const;
  void queue_save_slot(int32_t slot, uint8_t* dst, cudaStream_t stream) const;
  void restore_slot(int32_t slot, const std::vector<uint8_t>& bytes, cudaStream_t stream);
  // Bytes of one paged block (every layer's entries, then its index keys), and copies of blocks
  // to (to_host) or from host memory of that size each; synchronous (the stream is synchronised).
  size_t block_bytes() const;
  void copy_blocks(std::span<const HostBlockCopy> copies, bool to_host, cudaStream_t stream);
  // Device staging of blocks (block_copy.h): gather packs blocks[i] into
  // staging + i * block_bytes() (device memory of this cache's device) in copy_blocks' host
  // layout; scatter writes such bytes back into `blocks`. Queued on `stream`, no sync; always
  // the same stream (the id table is reused in stream order). InvalidArgument for an id out of
  // range or listed twice, before any copy.
  void gather_blocks(std::span<const int32_t> blocks, void* staging, cudaStream_t stream);
  void scatter_blocks(std::span<const int32_t> blocks, const void* staging, cudaStream_t stream);

 private:
  template <class F>
  void for_each_slot_range(int32_t slot, F&& f) const;
  kv::CacheGeometry geometry_;
  size_t kv_bytes_ = 2;
  std::vector<GpuLayerCache> layers_;
  int device_ = 0;
  deepinfer::cuda::DeviceBuffer copy_table_;  // gather/scatter's parts and ids (block_copy.h)
  void block_copy(std::span<const int32_t> blocks, char* staging, bool gather, cudaStream_t stream);
};

}  // namespace deepinfer::model::ds::cuda
