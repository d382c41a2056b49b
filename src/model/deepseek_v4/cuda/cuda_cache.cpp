#include "model/deepseek_v4/cuda/cuda_cache.h"

#include "deepinfer/error.h"

namespace deepinfer::model::v4::gpu {
namespace {
cuda::DeviceBuffer zeroed(size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return {};
  cuda::DeviceBuffer b(bytes);
  DI_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, bytes, stream));
  return b;
}
}  // namespace

GpuCache::GpuCache(const std::vector<kv::LayerCacheSpec>& layers, const kv::CacheGeometry& g, DType kv_dtype,
                   cudaStream_t stream)
    : geometry_(g) {
  if (kv_dtype != DType::kBF16 && kv_dtype != DType::kF32)
    DI_THROW(InvalidArgument, "GPU cache: kv dtype ", dtype_name(kv_dtype), " not supported (bf16, f32)");
  kv_bytes_ = kv_dtype == DType::kF32 ? 4 : 2;
  const size_t e = kv_bytes_;
  for (const auto& s : layers)
    if (s.ratio > 0 && g.block_tokens % s.ratio != 0)
      DI_THROW(InvalidArgument, "GPU cache: block_tokens ", g.block_tokens, " is not a multiple of ratio ", s.ratio);
  const size_t slots = size_t(g.num_slots), blocks = size_t(g.num_blocks);
  for (const auto& s : layers) {
    GpuLayerCache L;
    L.spec = s;
    L.dtype = kv_dtype;
    L.window = zeroed(slots * size_t(s.window * s.head_dim) * e, stream);
    if (s.ratio > 0) {
      L.entries_per_block = g.block_tokens / s.ratio;
      L.comp = zeroed(blocks * size_t(L.entries_per_block * s.head_dim) * e, stream);
      L.comp_state = zeroed(slots * size_t(s.state_rows() * 2 * s.comp_width) * 4, stream);
      if (s.index_dim > 0) {
        L.index_keys = zeroed(blocks * size_t(L.entries_per_block * s.index_dim) * e, stream);
        L.index_state = zeroed(slots * size_t(2 * s.ratio * 2 * s.index_width) * 4, stream);
      }
    }
    layers_.push_back(std::move(L));
  }
  DI_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void GpuCache::reset_slot(int32_t slot, cudaStream_t stream) {
  if (slot < 0 || slot >= geometry_.num_slots)
    DI_THROW(InvalidArgument, "reset_slot: slot ", slot, " outside [0,", geometry_.num_slots, ")");
  for (auto& L : layers_) {
    const auto& s = L.spec;
    const size_t win = size_t(s.window * s.head_dim) * kv_bytes_;
    if (win) DI_CUDA_CHECK(cudaMemsetAsync(L.window.as<char>() + size_t(slot) * win, 0, win, stream));
    const size_t st = size_t(s.state_rows() * 2 * s.comp_width) * 4;
    if (st) DI_CUDA_CHECK(cudaMemsetAsync(L.comp_state.as<char>() + size_t(slot) * st, 0, st, stream));
    const size_t ist = s.index_dim > 0 ? size_t(2 * s.ratio * 2 * s.index_width) * 4 : 0;
    if (ist) DI_CUDA_CHECK(cudaMemsetAsync(L.index_state.as<char>() + size_t(slot) * ist, 0, ist, stream));
  }
}

}  // namespace deepinfer::model::v4::gpu
