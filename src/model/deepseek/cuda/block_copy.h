// Device gather / scatter of paged cache blocks (prefill/decode disaggregation's device hop,
// issue #18; docs/ROUTER.md). A paged block's bytes are spread over two pools per layer (the
// compressed entries, the index keys); the host tier's copies (GpuCache::copy_blocks) lay one
// block out as every layer's entries row then its index keys row, in layer order. The gather
// packs a list of blocks in that very layout into one contiguous device buffer
// ([n, block_bytes]: a bundle's payload is the same bytes whichever path made it), the scatter
// writes such a buffer back into (other) blocks. One kernel launch per call: a CTA per
// (listed block, pool part), 16-byte copies when every address and size allows, else 4- or 1-byte.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::model::ds::cuda {

// One pool's share of a block: block b's bytes start at base + b * bytes; in the packed layout
// they sit at `offset` inside each block's block_bytes.
struct BlockPart {
  char* base = nullptr;
  uint64_t bytes = 0;
  uint64_t offset = 0;
};

// InvalidArgument (naming `what`, the position and the id) for an id outside [0, num_blocks) or
// one listed twice (a repeat would make a scatter write one block twice, racing; a gather of it
// is a caller's bug too). No CUDA call: tests run it without a GPU.
void check_block_list(std::span<const int32_t> blocks, int64_t num_blocks, const char* what);

// The widest copy unit (16, 4 or 1 bytes) every part base, size, offset, the staging pointer and
// block_bytes are multiples of.
int block_copy_unit(std::span<const BlockPart> parts, const void* staging, size_t block_bytes);

// gather: staging[i * block_bytes + p.offset ...] = p.base[blocks[i] * p.bytes ...] for every part p;
// scatter: the reverse. `table` is device memory holding parts then block ids
// (pack_block_copy_table's bytes); queued on `stream`, no sync.
void launch_block_copy(const void* table, int num_parts, int64_t num_blocks, char* staging, size_t block_bytes,
                       int unit, bool gather, cudaStream_t stream);

// The host bytes of the table launch_block_copy reads: the parts, then the ids (8-byte aligned).
std::vector<uint8_t> pack_block_copy_table(std::span<const BlockPart> parts, std::span<const int32_t> blocks);

}  // namespace deepinfer::model::ds::cuda
