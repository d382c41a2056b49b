// Cache storage for DeepSeek-V4's hybrid attention (MODEL-DEEPSEEK-V4.md §4).
//  - Paged part, addressed through a per-sequence block table shared by all layers: one block
//    covers `block_tokens` source tokens (a multiple of every compress ratio), i.e.
//    block_tokens/m compressed entries per compressed layer, plus the indexer keys of CSA layers.
//  - Fixed part, one slot per running sequence: each layer's sliding-window ring of kv and the
//    compressors' pending (a, z) rows (CSA: previous + current block; HCA: current block).
// The storage lives on one device; the KV cache manager (engine) owns which block ids and slots
// a sequence holds, and never touches tensors.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace deepinfer::kv {

struct CacheGeometry {
  int64_t block_tokens = 256;       // source tokens per paged block
  int64_t num_blocks = 0;           // paged blocks in the pool
  int64_t num_slots = 0;            // sequences that can hold fixed state at once
  size_t bytes_per_block = 0;       // summed over layers
  size_t bytes_per_slot = 0;        // summed over layers
};

// What one attention layer keeps, filled by the model from its layer plan (model/plan/cache_specs).
// Per sequence (slot): a ring of its own window rows, and, for a layer that owns compressed
// entries, the pending compressor rows of blocks not yet complete. Per paged block: the entries
// (and index keys) the layer owns. A layer that attends another layer's entries (V4.1 Reuse) owns
// none: its spec has ratio 0 and the forward reads the source layer's pools.
// Rings hold `max rollback` positions more than a step needs, so dropping the last positions of a
// sequence never loses a row the next step reads (model/causal_lm.h, rollback contract).
struct LayerCacheSpec {
  int64_t window = 0;          // W: keys p-W+1..p
  int64_t ring_rows = 0;       // window ring rows per slot (W + max rollback); row of position p: p mod ring_rows
  int64_t head_dim = 0;        // d: width of kv rows and compressed entries
  int64_t ratio = 0;           // m of the entries this layer owns, 0 = none
  bool overlap = false;        // two-series pooling (V4 CSA: projection width 2d) vs disjoint
  int64_t comp_width = 0;      // c: compressor projection width (a and z halves, each c wide)
  int64_t state_rows = 0;      // compressor partial rows per slot; row of position p: p mod state_rows
  int64_t index_dim = 0;       // width of the index keys this layer owns, 0 = none
  int64_t index_width = 0;     // projection width of its own key compressor (V4: 2*index_dim), 0 = none
  int64_t index_state_rows = 0;// key compressor partial rows per slot

  bool owns_entries() const { return ratio > 0; }
};

// Storage of one layer in bytes (`kv_bytes` per window / entry / key element: 4 for f32, 2 for
// bf16; compressor partials are always f32). The one place these sizes are computed.
struct LayerCacheBytes {
  size_t window_per_slot = 0, state_per_slot = 0, index_state_per_slot = 0;
  size_t entries_per_block = 0, keys_per_block = 0;
  size_t per_slot() const { return window_per_slot + state_per_slot + index_state_per_slot; }
  size_t per_block() const { return entries_per_block + keys_per_block; }
};
LayerCacheBytes layer_cache_bytes(const LayerCacheSpec& s, int64_t block_tokens, size_t kv_bytes);
// Summed over layers.
size_t cache_block_bytes(const std::vector<LayerCacheSpec>& layers, int64_t block_tokens, size_t kv_bytes);
size_t cache_slot_bytes(const std::vector<LayerCacheSpec>& layers, size_t kv_bytes);
// Smallest block size >= 256 tokens that every owned ratio divides.
int64_t default_block_tokens(const std::vector<LayerCacheSpec>& layers);
// Side-effect free sizing: `max_slots` slots, the rest of `budget_bytes` as blocks. Throws
// OutOfMemory (naming the sizes) when not even the slots fit, InvalidArgument for max_slots <= 0.
CacheGeometry plan_cache_geometry(const std::vector<LayerCacheSpec>& layers, size_t budget_bytes, int64_t max_slots,
                                  size_t kv_bytes, const char* what);
// Throws InvalidArgument when a geometry cannot hold these layers (block_tokens not a multiple
// of an owned ratio, no slots).
void check_geometry(const std::vector<LayerCacheSpec>& layers, const CacheGeometry& g, const char* what);

// Per-layer tensors (f32, host for the CPU backend). Row layouts:
//  window      [slots, ring_rows, d]    kv of position p at row p mod ring_rows
//  comp        [blocks, block_tokens/m, d]  entry i of a sequence at (block_table[i/epb], i%epb)
//  index_keys  [blocks, block_tokens/m, index_dim]  same addressing
//  comp_state  [slots, state_rows, 2c]  (a | z) of source position p at row p mod state_rows
//  index_state [slots, index_state_rows, 2*index_width]  same for the key compressor
struct LayerCache {
  LayerCacheSpec spec;
  Tensor window, comp, index_keys, comp_state, index_state;
  int64_t entries_per_block = 0;  // block_tokens / m (0 for sliding layers)
};

class KvCache {
 public:
  // Sizing in f32 storage (the byte formulas above with kv_bytes 4).
  static size_t block_bytes(const std::vector<LayerCacheSpec>& layers, int64_t block_tokens) {
    return cache_block_bytes(layers, block_tokens, 4);
  }
  static size_t slot_bytes(const std::vector<LayerCacheSpec>& layers) { return cache_slot_bytes(layers, 4); }
  static int64_t default_block_tokens(const std::vector<LayerCacheSpec>& layers) {
    return kv::default_block_tokens(layers);
  }
  static CacheGeometry plan(const std::vector<LayerCacheSpec>& layers, size_t budget_bytes, int64_t max_slots) {
    return plan_cache_geometry(layers, budget_bytes, max_slots, 4, "kv cache");
  }

  KvCache() = default;
  // Allocates zeroed storage for `geometry` (block_tokens must be a multiple of every ratio).
  KvCache(const std::vector<LayerCacheSpec>& layers, const CacheGeometry& geometry);

  bool allocated() const { return !layers_.empty(); }
  const CacheGeometry& geometry() const { return geometry_; }
  int64_t num_layers() const { return int64_t(layers_.size()); }
  LayerCache& layer(int64_t i) { return layers_.at(size_t(i)); }
  // Zeroes a slot's fixed state (window ring and pending rows) for a new sequence.
  void reset_slot(int32_t slot);
  // A slot's fixed state as bytes (every layer's window ring, partials), and its restore.
  std::vector<uint8_t> save_slot(int32_t slot) const;
  void restore_slot(int32_t slot, const std::vector<uint8_t>& bytes);
  // A paged block's rows (every layer's entries, then its index keys) as geometry().bytes_per_block
  // bytes, and their restore (prefix caching's host tier).
  void copy_block_out(int32_t block, uint8_t* dst) const;
  void copy_block_in(int32_t block, const uint8_t* src);

 private:
  CacheGeometry geometry_;
  std::vector<LayerCache> layers_;
};

}  // namespace deepinfer::kv
