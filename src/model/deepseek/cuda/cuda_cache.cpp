#include "model/deepseek/cuda/cuda_cache.h"

#include <cstring>

#include "deepinfer/error.h"
#include "model/deepseek/cuda/block_copy.h"

namespace deepinfer::model::ds::cuda {
namespace {
deepinfer::cuda::DeviceBuffer zeroed(size_t bytes, int device, cudaStream_t stream) {
  if (bytes == 0) return {};
  deepinfer::cuda::DeviceBuffer b(bytes, device);
  DI_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, bytes, stream));
  return b;
}
}  // namespace

GpuCache::GpuCache(const std::vector<kv::LayerCacheSpec>& layers, const kv::CacheGeometry& g, DType kv_dtype,
                   int device, cudaStream_t stream)
    : geometry_(g), device_(device) {
  if (kv_dtype != DType::kBF16 && kv_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "GPU cache: kv dtype ", dtype_name(kv_dtype), " not supported (bf16, f32)");
  kv::check_geometry(layers, g, "GPU cache");
  kv_bytes_ = kv_dtype == DType::kF32 ? 4 : 2;
  const size_t slots = size_t(g.num_slots), blocks = size_t(g.num_blocks);
  for (const auto& s : layers) {
    const kv::LayerCacheBytes b = kv::layer_cache_bytes(s, g.block_tokens, kv_bytes_);
    GpuLayerCache L;
    L.spec = s;
    L.window = zeroed(slots * b.window_per_slot, device, stream);
    if (s.owns_entries()) {
      L.entries_per_block = g.block_tokens / s.ratio;
      L.comp = zeroed(blocks * b.entries_per_block, device, stream);
      L.comp_state = zeroed(slots * b.state_per_slot, device, stream);
      L.index_keys = zeroed(blocks * b.keys_per_block, device, stream);
      L.index_state = zeroed(slots * b.index_state_per_slot, device, stream);
    }
    layers_.push_back(std::move(L));
  }
  DI_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// f(device pointer of the slot's range, bytes) over every per-slot tensor, in a fixed order.
template <class F>
void GpuCache::for_each_slot_range(int32_t slot, F&& f) const {
  if (slot < 0 || slot >= geometry_.num_slots)
    DI_THROW(InvalidArgument, "cache slot ", slot, " outside [0,", geometry_.num_slots, ")");
  for (const auto& L : layers_) {
    const kv::LayerCacheBytes b = kv::layer_cache_bytes(L.spec, geometry_.block_tokens, kv_bytes_);
    const std::pair<const deepinfer::cuda::DeviceBuffer*, size_t> parts[] = {
        {&L.window, b.window_per_slot}, {&L.comp_state, b.state_per_slot}, {&L.index_state, b.index_state_per_slot}};
    for (const auto& [buf, bytes] : parts)
      if (bytes) f(static_cast<char*>(buf->data()) + size_t(slot) * bytes, bytes);
  }
}

void GpuCache::reset_slot(int32_t slot, cudaStream_t stream) {
  for_each_slot_range(slot, [&](char* p, size_t n) { DI_CUDA_CHECK(cudaMemsetAsync(p, 0, n, stream)); });
}

std::vector<uint8_t> GpuCache::save_slot(int32_t slot, cudaStream_t stream) const {
  std::vector<uint8_t> out;
  for_each_slot_range(slot, [&](char* p, size_t n) {
    const size_t off = out.size();
    out.resize(off + n);
    deepinfer::cuda::copy_d2h(out.data() + off, p, n, stream, /*sync=*/false);
  });
  DI_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

size_t GpuCache::slot_bytes() const {
  size_t n = 0;
  if (geometry_.num_slots > 0) for_each_slot_range(0, [&](char*, size_t bytes) { n += bytes; });
  return n;
}

void GpuCache::queue_save_slot(int32_t slot, uint8_t* dst, cudaStream_t stream) const {
  size_t off = 0;
  for_each_slot_range(slot, [&](char* p, size_t n) {
    deepinfer::cuda::copy_d2h(dst + off, p, n, stream, /*sync=*/false);
    off += n;
  });
}

void GpuCache::restore_slot(int32_t slot, const std::vector<uint8_t>& bytes, cudaStream_t stream) {
  size_t off = 0;
  for_each_slot_range(slot, [&](char* p, size_t n) {
    if (off + n > bytes.size()) DI_THROW(InvalidArgument, "restore_slot: snapshot of ", bytes.size(), " bytes is too short");
    deepinfer::cuda::copy_h2d(p, bytes.data() + off, n, stream, /*sync=*/false);
    off += n;
  });
  if (off != bytes.size()) DI_THROW(InvalidArgument, "restore_slot: snapshot of ", bytes.size(), " bytes, the slot holds ", off);
  DI_CUDA_CHECK(cudaStreamSynchronize(stream));
}

size_t GpuCache::block_bytes() const {
  size_t n = 0;
  for (const auto& L : layers_) n += kv::layer_cache_bytes(L.spec, geometry_.block_tokens, kv_bytes_).per_block();
  return n;
}

void GpuCache::copy_blocks(std::span<const HostBlockCopy> copies, bool to_host, cudaStream_t stream) {
  for (const HostBlockCopy& c : copies) {
    if (c.block < 0 || c.block >= geometry_.num_blocks || !c.host)
      DI_THROW(InvalidArgument, "GPU cache block copy: block ", c.block, " of ", geometry_.num_blocks,
               c.host ? "" : " (no host memory)");
    size_t off = 0;
    for (const auto& L : layers_) {
      const kv::LayerCacheBytes b = kv::layer_cache_bytes(L.spec, geometry_.block_tokens, kv_bytes_);
      const std::pair<const deepinfer::cuda::DeviceBuffer*, size_t> parts[] = {{&L.comp, b.entries_per_block},
                                                                               {&L.index_keys, b.keys_per_block}};
      for (const auto& [buf, bytes] : parts) {
        if (!bytes) continue;
        char* dev = static_cast<char*>(buf->data()) + size_t(c.block) * bytes;
        if (to_host) deepinfer::cuda::copy_d2h(c.host + off, dev, bytes, stream, /*sync=*/false);
        else deepinfer::cuda::copy_h2d(dev, c.host + off, bytes, stream, /*sync=*/false);
        off += bytes;
      }
    }
  }
  // The host memory may be reused (or freed) as soon as this returns.
  DI_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void GpuCache::block_copy(std::span<const int32_t> blocks, char* staging, bool gather, cudaStream_t stream) {
  const char* what = gather ? "GPU cache gather_blocks" : "GPU cache scatter_blocks";
  check_block_list(blocks, geometry_.num_blocks, what);
  if (blocks.empty()) return;
  if (!staging) DI_THROW(InvalidArgument, what, ": no staging memory for ", blocks.size(), " blocks");
  // The parts in copy_blocks' order: per layer its entries row, then its index keys row.
  std::vector<BlockPart> parts;
  uint64_t off = 0;
  for (const auto& L : layers_) {
    const kv::LayerCacheBytes b = kv::layer_cache_bytes(L.spec, geometry_.block_tokens, kv_bytes_);
    const std::pair<const deepinfer::cuda::DeviceBuffer*, size_t> pools[] = {{&L.comp, b.entries_per_block},
                                                                             {&L.index_keys, b.keys_per_block}};
    for (const auto& [buf, bytes] : pools) {
      if (!bytes) continue;
      parts.push_back({static_cast<char*>(buf->data()), bytes, off});
      off += bytes;
    }
  }
  const std::vector<uint8_t> table = pack_block_copy_table(parts, blocks);
  if (copy_table_.size_bytes() < table.size()) copy_table_ = deepinfer::cuda::DeviceBuffer(table.size() * 2, device_);
  // A pageable source: the call returns once the bytes are staged, so `table` may go at once;
  // the kernel of a previous call (same stream) has read the old table before this copy runs.
  deepinfer::cuda::copy_h2d(copy_table_.data(), table.data(), table.size(), stream, /*sync=*/false);
  launch_block_copy(copy_table_.data(), int(parts.size()), int64_t(blocks.size()), staging, size_t(off),
                    block_copy_unit(parts, staging, size_t(off)), gather, stream);
}

void GpuCache::gather_blocks(std::span<const int32_t> blocks, void* staging, cudaStream_t stream) {
  block_copy(blocks, static_cast<char*>(staging), /*gather=*/true, stream);
}

void GpuCache::scatter_blocks(std::span<const int32_t> blocks, const void* staging, cudaStream_t stream) {
  // The scatter only reads the staging bytes (the kernel's shared signature takes char*).
  block_copy(blocks, const_cast<char*>(static_cast<const char*>(staging)), /*gather=*/false, stream);
}

}  // namespace deepinfer::model::ds::cuda
