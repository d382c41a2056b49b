#include "kv/kv_cache.h"

#include <cstdlib>
#include <cstring>
#include <numeric>

#include "core/check.h"

namespace deepinfer::kv {

LayerCacheBytes layer_cache_bytes(const LayerCacheSpec& s, int64_t block_tokens, size_t kv_bytes) {
  LayerCacheBytes b;
  b.window_per_slot = size_t(s.ring_rows * s.head_dim) * kv_bytes;
  if (s.owns_entries()) {
    const int64_t epb = block_tokens / s.ratio;
    b.state_per_slot = size_t(s.state_rows * 2 * s.comp_width) * sizeof(float);
    b.entries_per_block = size_t(epb * s.head_dim) * kv_bytes;
    b.keys_per_block = size_t(epb * s.index_dim) * kv_bytes;
    b.index_state_per_slot = size_t(s.index_state_rows * 2 * s.index_width) * sizeof(float);
  }
  return b;
}

size_t cache_block_bytes(const std::vector<LayerCacheSpec>& layers, int64_t block_tokens, size_t kv_bytes) {
  size_t n = 0;
  for (const auto& s : layers) n += layer_cache_bytes(s, block_tokens, kv_bytes).per_block();
  return n;
}

size_t cache_slot_bytes(const std::vector<LayerCacheSpec>& layers, size_t kv_bytes) {
  size_t n = 0;
  for (const auto& s : layers) n += layer_cache_bytes(s, 1, kv_bytes).per_slot();
  return n;
}

int64_t default_block_tokens(const std::vector<LayerCacheSpec>& layers) {
  int64_t l = 1;
  for (const auto& s : layers)
    if (s.owns_entries()) l = std::lcm(l, s.ratio);
  return l * ((256 + l - 1) / l);
}

CacheGeometry plan_cache_geometry(const std::vector<LayerCacheSpec>& layers, size_t budget_bytes, int64_t max_slots,
                                  size_t kv_bytes, const char* what) {
  if (max_slots <= 0) DI_THROW(InvalidArgument, what, ": max_slots must be > 0, got ", max_slots);
  CacheGeometry g;
  g.block_tokens = default_block_tokens(layers);
  g.num_slots = max_slots;
  g.bytes_per_block = cache_block_bytes(layers, g.block_tokens, kv_bytes);
  g.bytes_per_slot = cache_slot_bytes(layers, kv_bytes);
  const size_t fixed = g.bytes_per_slot * size_t(max_slots);
  if (fixed > budget_bytes)
    DI_THROW(OutOfMemory, what, ": ", max_slots, " slots need ", fixed, " bytes (", g.bytes_per_slot,
             " per slot), the cache budget is ", budget_bytes, " bytes");
  g.num_blocks = g.bytes_per_block ? int64_t((budget_bytes - fixed) / g.bytes_per_block) : 0;
  return g;
}

void check_geometry(const std::vector<LayerCacheSpec>& layers, const CacheGeometry& g, const char* what) {
  if (g.num_slots <= 0 || g.num_blocks < 0 || g.block_tokens <= 0)
    DI_THROW(InvalidArgument, what, ": geometry slots=", g.num_slots, " blocks=", g.num_blocks, " block_tokens=",
             g.block_tokens);
  for (const auto& s : layers)
    if (s.owns_entries() && g.block_tokens % s.ratio != 0)
      DI_THROW(InvalidArgument, what, ": block_tokens ", g.block_tokens, " is not a multiple of compress ratio ",
               s.ratio);
}

namespace {
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
// The per-slot tensors of a layer, in a fixed order (reset, save and restore walk the same list).
// Empty ones are skipped: a layer with no window or no compressor partial rows (V4.1's DSpark
// layers) has a zero-row tensor without storage, and memset / memcpy on its null pointer is
// undefined even for 0 bytes (UBSan: "null pointer passed as argument 1").
template <class L, class F>
void for_each_slot_tensor(L& c, F&& f) {
  for (auto* t : {&c.window, &c.comp_state, &c.index_state})
    if (t->defined() && t->numel() > 0) f(*t);
}
}  // namespace

KvCache::KvCache(const std::vector<LayerCacheSpec>& layers, const CacheGeometry& geometry) : geometry_(geometry) {
  check_geometry(layers, geometry, "kv cache");
  const int64_t S = geometry.num_slots, B = geometry.num_blocks, bt = geometry.block_tokens;
  for (const auto& s : layers) {
    LayerCache c;
    c.spec = s;
    c.window = Tensor::zeros({S, s.ring_rows, s.head_dim}, DType::kF32);
    if (s.owns_entries()) {
      c.entries_per_block = bt / s.ratio;
      c.comp = lazy_zeros({B, c.entries_per_block, s.head_dim});
      c.comp_state = Tensor::zeros({S, s.state_rows, 2 * s.comp_width}, DType::kF32);
      if (s.index_dim > 0) c.index_keys = lazy_zeros({B, c.entries_per_block, s.index_dim});
      if (s.index_width > 0) c.index_state = Tensor::zeros({S, s.index_state_rows, 2 * s.index_width}, DType::kF32);
    }
    layers_.push_back(std::move(c));
  }
  geometry_.bytes_per_block = block_bytes(layers, bt);
  geometry_.bytes_per_slot = slot_bytes(layers);
}

void KvCache::reset_slot(int32_t slot) {
  DI_CHECK(slot >= 0 && slot < geometry_.num_slots, "reset_slot ", slot, " of ", geometry_.num_slots);
  for (auto& c : layers_)
    for_each_slot_tensor(c, [&](Tensor& t) {
      Tensor v = t.select(0, slot);
      std::memset(v.raw_data(), 0, v.nbytes());
    });
}

std::vector<uint8_t> KvCache::save_slot(int32_t slot) const {
  DI_CHECK(slot >= 0 && slot < geometry_.num_slots, "save_slot ", slot, " of ", geometry_.num_slots);
  std::vector<uint8_t> out;
  for (const auto& c : layers_)
    for_each_slot_tensor(c, [&](const Tensor& t) {
      const Tensor v = t.select(0, slot);
      const uint8_t* p = static_cast<const uint8_t*>(v.raw_data());
      out.insert(out.end(), p, p + v.nbytes());
    });
  return out;
}

void KvCache::restore_slot(int32_t slot, const std::vector<uint8_t>& bytes) {
  DI_CHECK(slot >= 0 && slot < geometry_.num_slots, "restore_slot ", slot, " of ", geometry_.num_slots);
  size_t off = 0;
  for (auto& c : layers_)
    for_each_slot_tensor(c, [&](Tensor& t) {
      Tensor v = t.select(0, slot);
      DI_CHECK(off + v.nbytes() <= bytes.size(), "restore_slot: snapshot of ", bytes.size(), " bytes is too short");
      std::memcpy(v.raw_data(), bytes.data() + off, v.nbytes());
      off += v.nbytes();
    });
  DI_CHECK(off == bytes.size(), "restore_slot: snapshot of ", bytes.size(), " bytes, the slot holds ", off);
}

namespace {
// f(pointer to the block's rows, bytes) over every paged tensor of every layer, in a fixed order.
template <class L, class F>
void for_each_block_range(L& layers, int32_t block, F&& f) {
  for (auto& c : layers)
    for (auto* t : {&c.comp, &c.index_keys})
      if (t->defined() && t->numel() > 0) {  // empty: no storage (see for_each_slot_tensor)
        const Tensor v = t->select(0, block);
        f(static_cast<uint8_t*>(v.raw_data()), v.nbytes());
      }
}
}  // namespace

void KvCache::copy_block_out(int32_t block, uint8_t* dst) const {
  DI_CHECK(block >= 0 && block < geometry_.num_blocks, "copy_block_out: block ", block, " of ", geometry_.num_blocks);
  size_t off = 0;
  for_each_block_range(layers_, block, [&](const uint8_t* p, size_t n) {
    std::memcpy(dst + off, p, n);
    off += n;
  });
  DI_CHECK(off == geometry_.bytes_per_block, "copy_block_out: ", off, " bytes, the block holds ", geometry_.bytes_per_block);
}

void KvCache::copy_block_in(int32_t block, const uint8_t* src) {
  DI_CHECK(block >= 0 && block < geometry_.num_blocks, "copy_block_in: block ", block, " of ", geometry_.num_blocks);
  size_t off = 0;
  for_each_block_range(layers_, block, [&](uint8_t* p, size_t n) {
    std::memcpy(p, src + off, n);
    off += n;
  });
  DI_CHECK(off == geometry_.bytes_per_block, "copy_block_in: ", off, " bytes, the block holds ", geometry_.bytes_per_block);
}

}  // namespace deepinfer::kv
