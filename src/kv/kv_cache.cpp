#include "kv/kv_cache.h"

#include <cstdlib>
#include <cstring>
#include <numeric>

#include "core/check.h"

namespace deepinfer::kv {

namespace {
int64_t block_floats(const LayerCacheSpec& s, int64_t block_tokens) {
  if (s.ratio == 0) return 0;
  const int64_t epb = block_tokens / s.ratio;
  return epb * (s.head_dim + s.index_dim);
}
int64_t slot_floats(const LayerCacheSpec& s) {
  int64_t n = s.window * s.head_dim + s.state_rows() * 2 * s.comp_width;
  if (s.index_dim > 0) n += 2 * s.ratio * 2 * s.index_width;
  return n;
}
// Zero-filled host f32 tensor from calloc: large pools come straight from fresh mmap pages
// that the kernel supplies zeroed, so blocks that are never used are never touched (a 1 GiB
// budget costs no memset at start-up and no resident memory until sequences fill it).
Tensor lazy_zeros(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  const size_t nbytes = size_t(n) * sizeof(float);
  void* p = nbytes ? std::calloc(nbytes / sizeof(float), sizeof(float)) : nullptr;
  if (nbytes && !p) DI_THROW(OutOfMemory, "kv cache: allocation of ", nbytes, " bytes for ", shape_str(shape), " failed");
  auto storage = std::make_shared<Storage>(p, nbytes, Device::cpu(), [](void* q) { std::free(q); });
  return Tensor(std::move(storage), 0, shape, contiguous_strides(shape), DType::kF32);
}
void zero_slot(Tensor& t, int32_t slot) {
  if (!t.defined()) return;
  Tensor v = t.select(0, slot);
  std::memset(v.raw_data(), 0, v.nbytes());
}
}  // namespace

size_t KvCache::block_bytes(const std::vector<LayerCacheSpec>& layers, int64_t block_tokens) {
  size_t n = 0;
  for (const auto& s : layers) n += size_t(block_floats(s, block_tokens)) * sizeof(float);
  return n;
}

size_t KvCache::slot_bytes(const std::vector<LayerCacheSpec>& layers) {
  size_t n = 0;
  for (const auto& s : layers) n += size_t(slot_floats(s)) * sizeof(float);
  return n;
}

int64_t KvCache::default_block_tokens(const std::vector<LayerCacheSpec>& layers) {
  int64_t l = 1;
  for (const auto& s : layers)
    if (s.ratio > 0) l = std::lcm(l, s.ratio);
  return l * ((256 + l - 1) / l);
}

CacheGeometry KvCache::plan(const std::vector<LayerCacheSpec>& layers, size_t budget_bytes, int64_t max_slots) {
  CacheGeometry g;
  g.block_tokens = default_block_tokens(layers);
  g.num_slots = max_slots;
  g.bytes_per_block = block_bytes(layers, g.block_tokens);
  g.bytes_per_slot = slot_bytes(layers);
  const size_t fixed = g.bytes_per_slot * size_t(max_slots);
  if (fixed > budget_bytes)
    DI_THROW(OutOfMemory, "kv cache: ", max_slots, " slots need ", fixed, " bytes, budget is ", budget_bytes);
  g.num_blocks = g.bytes_per_block ? int64_t((budget_bytes - fixed) / g.bytes_per_block) : 0;
  return g;
}

KvCache::KvCache(const std::vector<LayerCacheSpec>& layers, const CacheGeometry& geometry) : geometry_(geometry) {
  const int64_t S = geometry.num_slots, B = geometry.num_blocks, bt = geometry.block_tokens;
  DI_CHECK(S > 0 && B >= 0 && bt > 0, "kv cache geometry slots=", S, " blocks=", B, " block_tokens=", bt);
  for (const auto& s : layers) {
    LayerCache c;
    c.spec = s;
    c.window = Tensor::zeros({S, s.window, s.head_dim}, DType::kF32);
    if (s.ratio > 0) {
      if (bt % s.ratio != 0)
        DI_THROW(InvalidArgument, "kv cache: block_tokens ", bt, " is not a multiple of compress ratio ", s.ratio);
      c.entries_per_block = bt / s.ratio;
      c.comp = lazy_zeros({B, c.entries_per_block, s.head_dim});
      c.comp_state = Tensor::zeros({S, s.state_rows(), 2 * s.comp_width}, DType::kF32);
      if (s.index_dim > 0) {
        c.index_keys = lazy_zeros({B, c.entries_per_block, s.index_dim});
        c.index_state = Tensor::zeros({S, 2 * s.ratio, 2 * s.index_width}, DType::kF32);
      }
    }
    layers_.push_back(std::move(c));
  }
  geometry_.bytes_per_block = block_bytes(layers, bt);
  geometry_.bytes_per_slot = slot_bytes(layers);
}

void KvCache::reset_slot(int32_t slot) {
  DI_CHECK(slot >= 0 && slot < geometry_.num_slots, "reset_slot ", slot, " of ", geometry_.num_slots);
  for (auto& c : layers_) {
    zero_slot(c.window, slot);
    zero_slot(c.comp_state, slot);
    zero_slot(c.index_state, slot);
  }
}

}  // namespace deepinfer::kv
