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

// What one attention layer keeps per sequence. Filled by the model from its config.
struct LayerCacheSpec {
  int64_t window = 0;        // sliding window W (ring rows, keys p-W+1..p)
  int64_t head_dim = 0;      // d: width of kv rows and compressed entries
  int64_t ratio = 0;         // m: compress ratio, 0 = sliding only
  bool overlap = false;      // CSA (overlapping windows, width 2d) vs HCA (disjoint, width d)
  int64_t comp_width = 0;    // c: compressor projection width (2d CSA, d HCA)
  int64_t index_dim = 0;     // indexer key width (CSA only, else 0)
  int64_t index_width = 0;   // indexer compressor projection width (2*index_dim)

  // Source tokens whose (a, z) rows a slot keeps: enough for the earliest block a chunk can emit.
  int64_t state_rows() const { return ratio == 0 ? 0 : (overlap ? 2 * ratio : ratio); }
};

// Per-layer tensors (f32, host for the CPU backend). Row layouts:
//  window      [slots, W, d]            kv of position p at row p mod W
//  comp        [blocks, block_tokens/m, d]  entry i of a sequence at (block_table[i/epb], i%epb)
//  index_keys  [blocks, block_tokens/m, index_dim]  same addressing (CSA)
//  comp_state  [slots, state_rows, 2c]  (a | z) of source position p at row p mod state_rows
//  index_state [slots, 2m, 2*index_width]  same for the indexer's compressor (CSA)
struct LayerCache {
  LayerCacheSpec spec;
  Tensor window, comp, index_keys, comp_state, index_state;
  int64_t entries_per_block = 0;  // block_tokens / m (0 for sliding layers)
};

class KvCache {
 public:
  // Bytes each layer adds per paged block / per slot (f32 storage), summed.
  static size_t block_bytes(const std::vector<LayerCacheSpec>& layers, int64_t block_tokens);
  static size_t slot_bytes(const std::vector<LayerCacheSpec>& layers);
  // Smallest block size >= 256 tokens that every ratio divides.
  static int64_t default_block_tokens(const std::vector<LayerCacheSpec>& layers);
  // Side-effect free sizing: `max_slots` slots, the rest of `budget_bytes` as blocks.
  // Throws OutOfMemory when not even the slots fit.
  static CacheGeometry plan(const std::vector<LayerCacheSpec>& layers, size_t budget_bytes, int64_t max_slots);

  KvCache() = default;
  // Allocates zeroed storage for `geometry` (block_tokens must be a multiple of every ratio).
  KvCache(const std::vector<LayerCacheSpec>& layers, const CacheGeometry& geometry);

  bool allocated() const { return !layers_.empty(); }
  const CacheGeometry& geometry() const { return geometry_; }
  int64_t num_layers() const { return int64_t(layers_.size()); }
  LayerCache& layer(int64_t i) { return layers_.at(size_t(i)); }
  // Zeroes a slot's fixed state (window ring and pending rows) for a new sequence.
  void reset_slot(int32_t slot);

 private:
  CacheGeometry geometry_;
  std::vector<LayerCache> layers_;
};

}  // namespace deepinfer::kv
