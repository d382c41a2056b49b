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

}  // namespace deepinfer::kv
